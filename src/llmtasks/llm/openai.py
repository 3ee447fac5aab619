"""Any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, llama.cpp, the mock), and
OpenAI's background mode (the Responses API, llm/openai_responses.py) where a task asks for it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from llmtasks.domain.errors import RATE_LIMITED, LLMError
from llmtasks.domain.llm_request import FunctionCall, LLMRequest, ToolCall
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import Usage
from llmtasks.domain.rate_limits import RateHeaders
from llmtasks.domain.retry_after import parse_retry_after
from llmtasks.llm import BackgroundCall, OnProgress, http_error_code, is_transient_status
from llmtasks.llm.keys import KeyPool, LlmEndpoint
from llmtasks.llm.openai_responses import completion as response_completion
from llmtasks.llm.openai_responses import request_body, response_id

# After [DONE], the longest a call waits for its body's end (a well-behaved server sends it with
# [DONE]), ending that wait this long before the call's own deadline.
FINISH_BODY_S = 1.0
FINISH_BODY_MARGIN_S = 0.1


class _FunctionCall(BaseModel):
    name: str
    arguments: str


class _ToolCall(BaseModel):
    """A tool call of a reply, read leniently (servers add fields of their own)."""

    id: str
    function: _FunctionCall

    def call(self) -> ToolCall:
        return ToolCall(
            id=self.id, function=FunctionCall(name=self.function.name, arguments=self.function.arguments)
        )


class _Message(BaseModel):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None
    # What OpenAI-compatible servers of reasoning models (vLLM, DeepSeek) name their thinking.
    reasoning_content: str | None = None


class _Choice(BaseModel):
    message: _Message
    finish_reason: str | None = None


class _ChatReply(BaseModel):
    model: str | None = None
    choices: list[_Choice]
    usage: Usage | None = None


def chat_body(request: LLMRequest, model: str) -> dict[str, Any]:
    """The Chat Completions body of a request: a call's, and a batch line's (llm/openai_batches.py)."""
    return {"model": model, "messages": request.chat_messages(), **request.parameters()}


def _error_message(response: httpx.Response) -> str:
    """The provider's own words (kept in the task's error), without the key the call sent:
    some providers quote it back."""
    try:
        body: Any = response.json()
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    text = str(message or response.reason_phrase or "error")
    key = response.request.headers.get("authorization", "").partition(" ")[2].strip()
    if key:
        text = text.replace(key, "[its API key]")
    return text[:500]


class OpenAIChat:
    """Chat completions, with a pool of keys (see llm/keys.py): a key's 429 sends the same call
    at once to another key that is not resting, and only when none is left does the task wait."""

    def __init__(
        self,
        *,
        default_model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        pool: KeyPool | None = None,
    ) -> None:
        self._pool = pool or KeyPool([LlmEndpoint(base_url or "", api_key)])
        self._default_model = default_model
        # One AsyncClient per event loop, kept across invocations: in Lambda the loop (and so the
        # client's connection pool) lives as long as the sandbox. A plain dict, purged of closed
        # loops: a client refers to its loop, so weak keys would never let an entry go, and an
        # AsyncClient holds an SSL context of most of a megabyte.
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._unstreamed: set[str] = set()  # base URLs that refused a streamed request

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        for closed in [other for other in self._clients if other.is_closed()]:
            del self._clients[closed]  # its connections died with it
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = httpx.AsyncClient(limits=httpx.Limits(max_connections=100), follow_redirects=False)
            self._clients[loop] = client
        return client

    async def complete(
        self,
        request: LLMRequest,
        *,
        timeout_s: float,
        on_progress: OnProgress | None = None,
        tokens: int = 0,
    ) -> Completion:
        body = chat_body(request, request.model or self._default_model)
        give_up = time.monotonic() + timeout_s
        tried: set[int] = set()
        while True:
            # Raises KeysFull when the keys' limits leave no room: the call waits on the queue.
            index = await self._pool.take(tokens, besides=frozenset(tried))
            assert index is not None  # the loop ends before every key has been tried
            endpoint = self._pool.endpoints[index]
            reserved = tokens if self._pool.limits(index).tpm is not None else 0
            streamed = on_progress if endpoint.base_url not in self._unstreamed else None
            heard: dict[str, str] = {}
            try:
                completion = await self._call(endpoint, body, give_up - time.monotonic(), streamed, heard)
            except LLMError as error:
                if streamed is not None and error.code == "llm_http_400":
                    # A server that refuses `stream`/`stream_options` (some OpenAI-compatible
                    # ones do): this call and the next ones to it go without streaming.
                    self._unstreamed.add(endpoint.base_url)
                    await self._pool.answered(index, reserved, 0, heard)
                    continue
                if error.code != RATE_LIMITED:
                    raise  # the reservation stands: the provider may have counted the call
                await self._pool.refused(index, reserved, heard, error.retry_after)
                tried.add(index)
                others = [i for i in range(len(self._pool.endpoints)) if i not in tried]
                if not any(self._pool.is_ready(i) for i in others) or time.monotonic() >= give_up:
                    raise
                continue
            await self._pool.answered(index, reserved, completion.usage.total_tokens, heard)
            return completion.model_copy(update={"key_index": index})

    async def start_background(
        self, request: LLMRequest, *, timeout_s: float, tokens: int = 0
    ) -> BackgroundCall:
        """The call started in the provider's background mode (`POST /responses`): its response
        id and key. The key's reservation of `tokens` stands for the call, whose usage is known
        only when it ends."""
        body = request_body(request, request.model or self._default_model)
        tried: set[int] = set()
        while True:
            index = await self._pool.take(tokens, besides=frozenset(tried))
            assert index is not None  # the loop ends before every key has been tried
            endpoint = self._pool.endpoints[index]
            reserved = tokens if self._pool.limits(index).tpm is not None else 0
            heard: dict[str, str] = {}
            try:
                content = await self._exchange("POST", endpoint, "/responses", timeout_s, heard, body)
            except LLMError as error:
                if error.code != RATE_LIMITED:
                    raise
                await self._pool.refused(index, reserved, heard, error.retry_after)
                tried.add(index)
                others = [i for i in range(len(self._pool.endpoints)) if i not in tried]
                if not any(self._pool.is_ready(i) for i in others):
                    raise
                continue
            await self._pool.answered(index, reserved, reserved, heard)
            started, _ = response_id(content)
            return BackgroundCall(response_id=started, key_index=index, model=body["model"])

    async def poll_background(self, call: BackgroundCall, *, timeout_s: float) -> Completion | None:
        """The background call's answer once it has ended, else None (`GET /responses/{id}`)."""
        endpoint = self._pool.endpoints[call.key_index % len(self._pool.endpoints)]
        content = await self._exchange("GET", endpoint, f"/responses/{call.response_id}", timeout_s, {})
        done = response_completion(content, call.model)
        return done and done.model_copy(update={"key_index": call.key_index})

    async def cancel_background(self, call: BackgroundCall, *, timeout_s: float) -> None:
        """Cancels the background call at the provider (`POST /responses/{id}/cancel`)."""
        endpoint = self._pool.endpoints[call.key_index % len(self._pool.endpoints)]
        await self._exchange("POST", endpoint, f"/responses/{call.response_id}/cancel", timeout_s, {}, {})

    async def _exchange(
        self,
        method: str,
        endpoint: LlmEndpoint,
        path: str,
        timeout_s: float,
        heard: dict[str, str],
        body: dict[str, Any] | None = None,
    ) -> bytes:
        """One unstreamed request of the Responses API on one key: the answer's body."""
        url = endpoint.base_url.rstrip("/") + path
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        with transport_errors(timeout_s):
            async with asyncio.timeout(timeout_s):
                response = await self._client().request(
                    method, url, json=body, headers=headers, timeout=timeout_s
                )
        heard.update(response.headers)
        if response.status_code >= 400:
            raise http_error(response)
        return response.content

    async def _call(
        self,
        endpoint: LlmEndpoint,
        body: dict[str, Any],
        timeout_s: float,
        on_progress: OnProgress | None,
        heard: dict[str, str],
    ) -> Completion:
        """One call on one key; `heard` gets the answer's headers (its rate-limit counts)."""
        url = endpoint.base_url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        if on_progress is not None:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with transport_errors(timeout_s):
            # httpx's timeout bounds each read, not the call: a server that trickles bytes would
            # outlive it (and the function). asyncio.timeout bounds the whole call.
            deadline = asyncio.get_running_loop().time() + timeout_s
            async with (
                asyncio.timeout_at(deadline),
                self._client().stream("POST", url, json=body, headers=headers, timeout=timeout_s) as response,
            ):
                heard.update(response.headers)
                if response.status_code >= 400:
                    await response.aread()
                    raise http_error(response)
                if on_progress is not None and response.headers.get("content-type", "").startswith(
                    "text/event-stream"
                ):
                    return await _read_stream(response, body["model"], on_progress, deadline=deadline)
                return read_chat_reply(await response.aread(), body["model"])


@contextlib.contextmanager
def transport_errors(timeout_s: float) -> Iterator[None]:
    """httpx's timeouts and connection failures (and asyncio's timeout) as the transient
    LLMErrors every call of this provider raises."""
    try:
        yield
    except (httpx.TimeoutException, TimeoutError) as exc:
        raise LLMError(
            f"The LLM did not answer within {timeout_s:.0f} s.", code="llm_timeout", transient=True
        ) from exc
    except httpx.TransportError as exc:
        raise LLMError(
            f"The LLM could not be reached ({type(exc).__name__}).", code="llm_unreachable", transient=True
        ) from exc


def http_error(response: httpx.Response) -> LLMError:
    status = response.status_code
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    if status == 429 and retry_after is None:
        # OpenAI's rate-limit 429s say when the exhausted count is whole again in their headers.
        retry_after = RateHeaders.read(response.headers).reset_s()
    return LLMError(
        f"The LLM answered {status}: {_error_message(response)}",
        code=http_error_code(status),
        transient=is_transient_status(status),
        retry_after=retry_after,
    )


def read_chat_reply(content: bytes | dict[str, Any], model: str) -> Completion:
    """A chat completion (its JSON, or the object a batch's output line holds) as a Completion."""
    try:
        reply = (
            _ChatReply.model_validate_json(content)
            if isinstance(content, bytes)
            else _ChatReply.model_validate(content)
        )
    except ValidationError as exc:
        raise LLMError(
            "The LLM's reply is not a chat completion.", code="llm_invalid_reply", transient=False
        ) from exc
    if not reply.choices:
        raise LLMError("The LLM's reply has no message.", code="llm_invalid_reply", transient=False)
    choice = reply.choices[0]
    message = choice.message
    if message.content is None and message.refusal is None and not message.tool_calls:
        raise LLMError("The LLM's reply has no text.", code="llm_invalid_reply", transient=False)
    return Completion(
        text=message.content or "",
        model=reply.model or model,
        usage=reply.usage or Usage(),
        finish_reason=choice.finish_reason,
        refusal=message.refusal,
        tool_calls=[call.call() for call in message.tool_calls or []] or None,
        reasoning=message.reasoning_content,
    )


class _FunctionDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(BaseModel):
    index: int = 0
    id: str | None = None
    function: _FunctionDelta = _FunctionDelta()


class _Delta(BaseModel):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None
    reasoning_content: str | None = None


class _StreamChoice(BaseModel):
    delta: _Delta = _Delta()
    finish_reason: str | None = None


class _StreamedMessage:
    """A message put together from its deltas, as OpenAI streams them: text and refusal in
    pieces, each tool call's id and name in its first delta and its arguments in pieces."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None

    def add(self, choice: _StreamChoice) -> None:
        delta = choice.delta
        if delta.content:
            self.parts.append(delta.content)
        if delta.refusal:
            self.refusal.append(delta.refusal)
        if delta.reasoning_content:
            self.reasoning.append(delta.reasoning_content)
        for call in delta.tool_calls or []:
            whole = self.calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            whole["id"] = call.id or whole["id"]
            whole["name"] += call.function.name or ""
            whole["arguments"] += call.function.arguments or ""
        self.finish_reason = choice.finish_reason or self.finish_reason

    def completion(self, model: str, usage: Usage | None) -> Completion:
        calls = [
            ToolCall(id=call["id"], function=FunctionCall(name=call["name"], arguments=call["arguments"]))
            for _, call in sorted(self.calls.items())
        ]
        return Completion(
            text="".join(self.parts),
            model=model,
            usage=usage or Usage(),
            finish_reason=self.finish_reason,
            refusal="".join(self.refusal) or None,
            tool_calls=calls or None,
            reasoning="".join(self.reasoning) or None,
        )


class _StreamChunk(BaseModel):
    model: str | None = None
    choices: list[_StreamChoice] = []
    usage: Usage | None = None


async def _read_stream(
    response: httpx.Response, model: str, on_progress: OnProgress, *, deadline: float
) -> Completion:
    """Server-sent events (`data: {chunk}` lines, then `data: [DONE]`), as OpenAI streams them;
    a stream that breaks off or ends before [DONE] is a transient error, like a dropped call.
    `deadline` is the call's end on the loop's clock."""
    message = _StreamedMessage()
    usage: Usage | None = None
    lines = response.aiter_lines()
    try:
        async for line in lines:
            data = line.removeprefix("data:").strip() if line.startswith("data:") else None
            if data == "[DONE]":
                await _finish_body(lines, deadline)
                return message.completion(model, usage)
            if not data:
                continue
            chunk = _chunk(data)
            model = chunk.model or model
            usage = chunk.usage or usage
            before = len(message.parts)
            for choice in chunk.choices[:1]:
                message.add(choice)
            if len(message.parts) > before:
                await on_progress("".join(message.parts), len(message.parts))
    except httpx.TransportError as exc:  # the connection dropped mid-reply
        raise LLMError(
            f"The LLM's stream broke off ({type(exc).__name__}).", code="llm_stream_broken", transient=True
        ) from exc
    raise LLMError("The LLM's stream ended before it finished.", code="llm_stream_broken", transient=True)


async def _finish_body(lines: AsyncIterator[str], deadline: float) -> None:
    """Reads what follows [DONE], the end of the chunked body, so that the connection goes back
    to the pool for the next call, as the openai SDK consumes a stream to its end. Left unread,
    httpx closes the connection with the reply: every streamed call paid a new connection (a TLS
    handshake, with a provider). A server that keeps sending has its connection closed instead,
    after at most FINISH_BODY_S and before the call's own deadline: the answer is whole already."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(min(loop.time() + FINISH_BODY_S, deadline - FINISH_BODY_MARGIN_S)):
            async for _ in lines:
                pass
    except (TimeoutError, httpx.TransportError):
        pass


def _chunk(data: str) -> _StreamChunk:
    try:
        return _StreamChunk.model_validate_json(data)
    except ValidationError as exc:
        raise LLMError(
            "The LLM's stream is not chat completion chunks.", code="llm_invalid_reply", transient=False
        ) from exc
