"""A run's calls of function endpoints (a tool with a `url`): the call's arguments POSTed as
JSON, signed as webhooks are (Standard Webhooks, with the tenant's secrets; `webhook-id` is the
call's id, the same on every try), under the webhooks' SSRF guard, with a timeout and retries.
The answer's body is the call's output; an endpoint that keeps failing gives the model an error
text as the output, so it can go on without the tool.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from llmtasks.domain.llm_request import ToolCall
from llmtasks.services.signing import signed_headers
from llmtasks.services.webhook_urls import Resolver, UnsafeWebhookUrl, check_webhook_url, system_resolver

if TYPE_CHECKING:
    import httpx

TOOL_TIMEOUT_S = 30.0
TOOL_ATTEMPTS = 3
TOOL_RETRY_BASE_S = 0.5
# An answer's body past this is cut: the model reads the output, and a step's item keeps it.
MAX_TOOL_OUTPUT_CHARS = 1_000_000


class EndpointTools:
    """Calls a run's function endpoints."""

    def __init__(
        self,
        *,
        allowed_hosts: frozenset[str],
        resolve: Resolver = system_resolver,
        timeout_s: float = TOOL_TIMEOUT_S,
        attempts: int = TOOL_ATTEMPTS,
        transport: httpx.AsyncBaseTransport | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._allowed_hosts = allowed_hosts
        self._resolve = resolve
        self.timeout_s = timeout_s
        self._attempts = attempts
        self._transport = transport
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._sleep = sleep

    async def call(self, url: str, call: ToolCall, *, secrets: list[str]) -> str:
        """The endpoint's answer to `call`: its body, or an error text once it has failed every try."""
        try:
            check_webhook_url(url, allowed_hosts=self._allowed_hosts, resolve=self._resolve)
        except UnsafeWebhookUrl as exc:
            return f"error: the tool's url is refused: {exc.detail}"
        import httpx  # here, not at the top: only the worker calls tools

        body = call.function.arguments or "{}"
        error = ""
        for attempt in range(self._attempts):
            if attempt:
                await self._sleep(self._rng.uniform(0, TOOL_RETRY_BASE_S * 2**attempt))
            headers = {
                "content-type": "application/json",
                "user-agent": "llmtasks-tools/1",
                "x-llmtasks-tool": call.function.name,
                **signed_headers(secrets, message_id=call.id, timestamp=datetime.now(tz=UTC), body=body),
            }
            try:
                async with httpx.AsyncClient(transport=self._transport, follow_redirects=False) as client:
                    response = await client.post(
                        url, content=body.encode(), headers=headers, timeout=self.timeout_s
                    )
            except httpx.TimeoutException:
                error = f"no answer within {self.timeout_s:g} s"
                continue
            except httpx.TransportError as exc:
                error = f"connection failed ({type(exc).__name__})"
                continue
            if 200 <= response.status_code < 300:
                return response.text[:MAX_TOOL_OUTPUT_CHARS]
            error = f"the endpoint answered {response.status_code}"
            if response.status_code < 500 and response.status_code not in (408, 429):
                break  # a refusal: trying again changes nothing
        return f"error: the tool {call.function.name!r} failed: {error}"
