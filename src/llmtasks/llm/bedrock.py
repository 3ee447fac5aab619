"""Amazon Bedrock through boto3's Converse API (one request shape for every Bedrock model).

Errors are classified by the HTTP status Bedrock documents for each, by the same rule as the
OpenAI-compatible provider: throttling (429), timeouts (408) and service errors (5xx) are
transient; validation (400), access (403), unknown models (404) and model errors (424) fail the
task at once. botocore's own retries are off: the task's retries, with their backoff and
Retry-After, are the one retry policy.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, ReadTimeoutError

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import Usage
from llmtasks.llm import OnProgress, http_error_code, is_transient_status

if TYPE_CHECKING:
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient


def bedrock_client(*, timeout_s: float) -> BedrockRuntimeClient:
    from botocore.config import Config

    from llmtasks.aws.clients import new_client

    config = Config(read_timeout=timeout_s, retries={"total_max_attempts": 1, "mode": "standard"})
    client: BedrockRuntimeClient = new_client("bedrock-runtime", config)
    return client


def converse_request(request: LLMRequest, default_model: str) -> dict[str, Any]:
    """Converse's arguments: system prompts apart, each message's text as one content block."""
    chat = request.chat_messages()
    body: dict[str, Any] = {
        "modelId": request.model or default_model,
        "messages": [
            {"role": m["role"], "content": [{"text": m["content"]}]} for m in chat if m["role"] != "system"
        ],
    }
    system = [{"text": m["content"]} for m in chat if m["role"] == "system"]
    if system:
        body["system"] = system
    inference: dict[str, Any] = {}
    if request.max_tokens is not None:
        inference["maxTokens"] = request.max_tokens
    if request.temperature is not None:
        inference["temperature"] = request.temperature
    if inference:
        body["inferenceConfig"] = inference
    return body


class BedrockConverse:
    def __init__(self, *, default_model: str, client: BedrockRuntimeClient) -> None:
        self._default_model = default_model
        self._client = client

    async def complete(
        self, request: LLMRequest, *, timeout_s: float, on_progress: OnProgress | None = None
    ) -> Completion:
        arguments = converse_request(request, self._default_model)
        loop = asyncio.get_running_loop()
        try:
            # boto3 blocks: in a thread, so the other records of the batch keep their calls going.
            async with asyncio.timeout(timeout_s):
                if on_progress is None:
                    reply: Any = await asyncio.to_thread(self._client.converse, **arguments)
                else:
                    reply = await asyncio.to_thread(self._stream, arguments, on_progress, loop)
        except (TimeoutError, ReadTimeoutError, ConnectTimeoutError) as exc:
            raise LLMError(
                f"Bedrock did not answer within {timeout_s:.0f} s.", code="llm_timeout", transient=True
            ) from exc
        except ClientError as exc:
            error = exc.response.get("Error", {})
            status = self._status_of(exc)
            raise LLMError(
                f"Bedrock answered {status} {error.get('Code', '')}: {error.get('Message', '')[:500]}",
                code=http_error_code(status),
                transient=is_transient_status(status),
            ) from exc
        except BotoCoreError as exc:  # the endpoint could not be reached, or the connection broke
            raise LLMError(
                f"Bedrock could not be reached ({type(exc).__name__}).",
                code="llm_unreachable",
                transient=True,
            ) from exc
        return self._completion(reply, arguments["modelId"])

    def _stream(
        self, arguments: dict[str, Any], on_progress: OnProgress, loop: asyncio.AbstractEventLoop
    ) -> dict[str, Any]:
        """ConverseStream, read to its end in this thread; each text delta is reported on the
        caller's loop. Returns what Converse would have."""
        parts: list[str] = []
        usage: Any = {}
        for event in self._client.converse_stream(**arguments)["stream"]:
            text = event.get("contentBlockDelta", {}).get("delta", {}).get("text")
            if text:
                parts.append(text)
                asyncio.run_coroutine_threadsafe(on_progress("".join(parts), len(parts)), loop).result()
            usage = event.get("metadata", {}).get("usage", usage)
        return {"output": {"message": {"content": [{"text": "".join(parts)}]}}, "usage": usage}

    def _status_of(self, exc: ClientError) -> int:
        """The HTTP status of an error: its reply's, or for an error inside an event stream (which
        arrives with a 200), the one Bedrock documents for that error."""
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        if status >= 400:
            return status
        code = str(exc.response.get("Error", {}).get("Code", ""))
        try:
            shape = self._client.meta.service_model.shape_for(code[:1].upper() + code[1:])
        except Exception:
            return 500
        return int(shape.metadata.get("error", {}).get("httpStatusCode", 500))

    def _completion(self, reply: Any, model: str) -> Completion:
        blocks = reply.get("output", {}).get("message", {}).get("content", [])
        texts = [block["text"] for block in blocks if "text" in block]
        if not texts:
            raise LLMError("Bedrock's reply has no text.", code="llm_invalid_reply", transient=False)
        usage = reply.get("usage", {})
        return Completion(
            text="".join(texts),
            model=model,
            # Converse counts cache reads apart from inputTokens; Usage has them inside the
            # prompt's tokens, as OpenAI does, so that one price rule serves both.
            usage=Usage(
                prompt_tokens=usage.get("inputTokens", 0) + usage.get("cacheReadInputTokens", 0),
                completion_tokens=usage.get("outputTokens", 0),
                total_tokens=usage.get("totalTokens", 0),
                cached_tokens=usage.get("cacheReadInputTokens", 0),
            ),
        )
