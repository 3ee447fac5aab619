"""A run's calls of MCP servers over Streamable HTTP, through the official `mcp` SDK's client: the
list of a server's tools (once a run: the worker records it), and a call of one of them. The
server's URL passes the webhooks' SSRF guard before each connection; the task's headers go with
every request. A call that fails gives the model an error text as its output, as a function
endpoint's does; a list that fails after its tries is an McpUnavailable (the run cannot start).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from llmtasks.domain.llm_request import ToolCall
from llmtasks.domain.mcp_servers import McpServer, McpUnavailable
from llmtasks.services.tool_calls import MAX_TOOL_OUTPUT_CHARS
from llmtasks.services.webhook_urls import Resolver, UnsafeWebhookUrl, check_webhook_url, system_resolver

MCP_TIMEOUT_S = 30.0
MCP_LIST_ATTEMPTS = 3
MCP_RETRY_BASE_S = 0.5
CLIENT_NAME = "llmtasks"


def _described(exc: BaseException) -> str:
    """An error as a short text: the leaves of an exception group (the SDK's task groups raise
    them), by type and message."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_described(inner) for inner in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


class McpTools:
    """Lists and calls a run's MCP servers' tools."""

    def __init__(
        self,
        *,
        allowed_hosts: frozenset[str],
        resolve: Resolver = system_resolver,
        timeout_s: float = MCP_TIMEOUT_S,
        attempts: int = MCP_LIST_ATTEMPTS,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._allowed_hosts = allowed_hosts
        self._resolve = resolve
        self.timeout_s = timeout_s
        self._attempts = attempts
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._sleep = sleep

    async def list_tools(self, server: McpServer) -> list[dict[str, Any]]:
        """The server's tools, every page (each `name`, `description`, `input_schema`,
        `annotations`); McpUnavailable once every try has failed."""
        self._check(server)
        error = ""
        for attempt in range(self._attempts):
            if attempt:
                await self._sleep(self._rng.uniform(0, MCP_RETRY_BASE_S * 2**attempt))
            try:
                return await asyncio.wait_for(self._list(server), self.timeout_s)
            except TimeoutError:
                error = f"no answer within {self.timeout_s:g} s"
            except Exception as exc:
                error = _described(exc)
        raise McpUnavailable(f"MCP server '{server.server_label}' listed no tools: {error}")

    async def call(self, server: McpServer, tool: str, call: ToolCall) -> str:
        """The text of the tool's answer to `call` (an error result's text prefixed `error: `), or
        an error text when the call could not be made."""
        label = f"the tool '{tool}' of MCP server '{server.server_label}'"
        try:
            self._check(server)
            arguments = json.loads(call.function.arguments or "{}")
        except McpUnavailable as exc:
            return f"error: {exc.detail}"
        except ValueError:
            return f"error: the arguments of the call of {label} are not JSON"
        if not isinstance(arguments, dict):
            return f"error: the arguments of the call of {label} are not a JSON object"
        try:
            return await asyncio.wait_for(self._call(server, tool, arguments), self.timeout_s)
        except TimeoutError:
            return f"error: {label} gave no answer within {self.timeout_s:g} s"
        except Exception as exc:
            return f"error: {label} failed: {_described(exc)}"

    def _check(self, server: McpServer) -> None:
        try:
            check_webhook_url(server.server_url, allowed_hosts=self._allowed_hosts, resolve=self._resolve)
        except UnsafeWebhookUrl as exc:
            detail = exc.detail.replace(
                "webhook_url", f"The server_url of MCP server '{server.server_label}'", 1
            )
            raise McpUnavailable(detail, transient=False) from exc

    async def _list(self, server: McpServer) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        async with self._client(server) as client:
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools += [tool.model_dump(mode="json", exclude_none=True) for tool in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    return tools

    async def _call(self, server: McpServer, tool: str, arguments: dict[str, Any]) -> str:
        async with self._client(server) as client:
            result = await client.call_tool(tool, arguments)
        texts = [part.text for part in result.content if getattr(part, "type", None) == "text"]
        text = "\n".join(texts)
        if not texts and result.structured_content is not None:
            text = json.dumps(result.structured_content)
        if result.is_error:
            text = f"error: {text or 'the tool failed'}"
        return text[:MAX_TOOL_OUTPUT_CHARS]

    @contextlib.asynccontextmanager
    async def _client(self, server: McpServer) -> AsyncIterator[Any]:
        """An MCP client session to the server, its headers on every request. The SDK is imported
        here, not at the top: only the worker calls MCP servers, and the API's cold start matters."""
        import httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.types import Implementation

        async with (
            httpx2.AsyncClient(headers=server.headers or {}, timeout=self.timeout_s) as http,
            Client(
                streamable_http_client(server.server_url, http_client=http),
                read_timeout_seconds=self.timeout_s,
                client_info=Implementation(name=CLIENT_NAME, version="1"),
                cache=None,
            ) as client,
        ):
            yield client
