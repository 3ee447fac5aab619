"""A chat completion streamed as OpenAI streams it (server-sent chunks, then [DONE]), put back
together into one Completion as it comes, its progress reported on the way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import FunctionCall, ToolCall
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import Usage
from llmtasks.llm import OnProgress

# After [DONE], the longest a call waits for its body's end (a well-behaved server sends it with
# [DONE]), ending that wait this long before the call's own deadline.
FINISH_BODY_S = 1.0
FINISH_BODY_MARGIN_S = 0.1


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

    def completion(self, model: str, usage: Usage | None, service_tier: str | None = None) -> Completion:
        calls = [
            ToolCall(id=call["id"], function=FunctionCall(name=call["name"], arguments=call["arguments"]))
            for _, call in sorted(self.calls.items())
        ]
        return Completion(
            text="".join(self.parts),
            model=model,
            usage=(usage or Usage()).model_copy(update={"service_tier": service_tier}),
            finish_reason=self.finish_reason,
            refusal="".join(self.refusal) or None,
            tool_calls=calls or None,
            reasoning="".join(self.reasoning) or None,
        )


class _StreamChunk(BaseModel):
    model: str | None = None
    choices: list[_StreamChoice] = []
    usage: Usage | None = None
    service_tier: str | None = None


async def read_stream(
    response: httpx.Response, model: str, on_progress: OnProgress, *, deadline: float
) -> Completion:
    """Server-sent events (`data: {chunk}` lines, then `data: [DONE]`), as OpenAI streams them;
    a stream that breaks off or ends before [DONE] is a transient error, like a dropped call.
    `deadline` is the call's end on the loop's clock."""
    message = _StreamedMessage()
    usage: Usage | None = None
    tier: str | None = None  # each chunk names the tier that serves the call
    lines = response.aiter_lines()
    try:
        async for line in lines:
            data = line.removeprefix("data:").strip() if line.startswith("data:") else None
            if data == "[DONE]":
                await _finish_body(lines, deadline)
                return message.completion(model, usage, tier)
            if not data:
                continue
            chunk = _chunk(data)
            model = chunk.model or model
            usage = chunk.usage or usage
            tier = chunk.service_tier or tier
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
