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

from llmtasks.errors import LLMError
from llmtasks.llm import http_error_code, is_transient_status
from llmtasks.models import Completion, LLMRequest, Usage

if TYPE_CHECKING:
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient


def bedrock_client(*, timeout_s: float) -> BedrockRuntimeClient:
    import boto3
    from botocore.config import Config

    config = Config(read_timeout=timeout_s, retries={"total_max_attempts": 1, "mode": "standard"})
    client: BedrockRuntimeClient = boto3.session.Session().client("bedrock-runtime", config=config)
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

    async def complete(self, request: LLMRequest, *, timeout_s: float) -> Completion:
        arguments = converse_request(request, self._default_model)
        try:
            # boto3 blocks: in a thread, so the other records of the batch keep their calls going.
            async with asyncio.timeout(timeout_s):
                reply: Any = await asyncio.to_thread(self._client.converse, **arguments)
        except (TimeoutError, ReadTimeoutError, ConnectTimeoutError) as exc:
            raise LLMError(
                f"Bedrock did not answer within {timeout_s:.0f} s.", code="llm_timeout", transient=True
            ) from exc
        except ClientError as exc:
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500))
            error = exc.response.get("Error", {})
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
        blocks = reply.get("output", {}).get("message", {}).get("content", [])
        texts = [block["text"] for block in blocks if "text" in block]
        if not texts:
            raise LLMError("Bedrock's reply has no text.", code="llm_invalid_reply", transient=False)
        usage = reply.get("usage", {})
        return Completion(
            text="".join(texts),
            model=arguments["modelId"],
            usage=Usage(
                prompt_tokens=usage.get("inputTokens", 0),
                completion_tokens=usage.get("outputTokens", 0),
                total_tokens=usage.get("totalTokens", 0),
            ),
        )
