"""Any OpenAI-compatible chat-completions server (OpenAI, vLLM, Ollama, llama.cpp, the mock)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from llmtasks.errors import LLMError
from llmtasks.llm import http_error_code, is_transient_status
from llmtasks.models import Completion, LLMRequest, Usage
from llmtasks.retry_after import parse_retry_after
from llmtasks.settings import Settings


def api_key_from_settings(settings: Settings) -> str | None:
    if settings.llm_api_key is not None:
        return settings.llm_api_key.get_secret_value()
    if settings.llm_api_key_secret_arn:
        # Powertools caches the value for 5 minutes, so a warm function does not call
        # Secrets Manager per task; imported here so the local stack never needs it.
        from aws_lambda_powertools.utilities.parameters import get_secret

        return str(get_secret(settings.llm_api_key_secret_arn))
    return None


class _Message(BaseModel):
    content: str | None = None


class _Choice(BaseModel):
    message: _Message


class _ChatReply(BaseModel):
    model: str | None = None
    choices: list[_Choice]
    usage: Usage | None = None


def _error_message(response: httpx.Response) -> str:
    try:
        body: Any = response.json()
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    except ValueError:
        message = None
    return str(message or response.reason_phrase or "error")[:500]


class OpenAIChat:
    def __init__(self, *, base_url: str, api_key: str | None, default_model: str) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._default_model = default_model
        # One AsyncClient per event loop, kept across invocations: in Lambda the loop (and so the
        # client's connection pool) lives as long as the sandbox. A plain dict, purged of closed
        # loops: a client refers to its loop, so weak keys would never let an entry go, and an
        # AsyncClient holds an SSL context of most of a megabyte.
        self._clients: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        for closed in [other for other in self._clients if other.is_closed()]:
            del self._clients[closed]  # its connections died with it
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = httpx.AsyncClient(
                headers=self._headers, limits=httpx.Limits(max_connections=100), follow_redirects=False
            )
            self._clients[loop] = client
        return client

    async def complete(self, request: LLMRequest, *, timeout_s: float) -> Completion:
        body: dict[str, Any] = {
            "model": request.model or self._default_model,
            "messages": request.chat_messages(),
        }
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        try:
            # httpx's timeout bounds each read, not the call: a server that trickles bytes would
            # outlive it (and the function). asyncio.timeout bounds the whole call.
            async with asyncio.timeout(timeout_s):
                response = await self._client().post(self._url, json=body, timeout=timeout_s)
        except (httpx.TimeoutException, TimeoutError) as exc:
            raise LLMError(
                f"The LLM did not answer within {timeout_s:.0f} s.", code="llm_timeout", transient=True
            ) from exc
        except httpx.TransportError as exc:
            raise LLMError(
                f"The LLM could not be reached ({type(exc).__name__}).",
                code="llm_unreachable",
                transient=True,
            ) from exc
        if response.status_code >= 400:
            status = response.status_code
            raise LLMError(
                f"The LLM answered {status}: {_error_message(response)}",
                code=http_error_code(status),
                transient=is_transient_status(status),
                retry_after=parse_retry_after(response.headers.get("retry-after")),
            )
        try:
            reply = _ChatReply.model_validate_json(response.content)
            text = reply.choices[0].message.content if reply.choices else None
        except ValidationError as exc:
            raise LLMError(
                "The LLM's reply is not a chat completion.", code="llm_invalid_reply", transient=False
            ) from exc
        if text is None:
            raise LLMError("The LLM's reply has no text.", code="llm_invalid_reply", transient=False)
        return Completion(text=text, model=reply.model or body["model"], usage=reply.usage or Usage())
