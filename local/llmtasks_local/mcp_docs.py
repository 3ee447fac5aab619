"""A test MCP server over a few documents, served over Streamable HTTP on 127.0.0.1 (the mcp SDK's
MCPServer, FastMCP's successor): the tools a local run's model calls through an `{"type": "mcp"}`
tool, beside the mock LLM.

Tools: `search_documents(query)` (the documents whose title or text hold each word of the query),
`read_document(doc_id)` (its text; an unknown id is an error result) and `list_documents()`. With a
token, every request must carry `Authorization: Bearer <token>` (a task's `headers` send it).

    python -m llmtasks_local.mcp_docs --port 8765   # serves http://127.0.0.1:8765/mcp
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

PATH = "/mcp"


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str


DOCUMENTS = (
    Document(
        "queues",
        "Queues between an API and its workers",
        "A queue lets an API answer at once while a worker does the long part. SQS keeps each"
        " message until a worker deletes it; a message not deleted within its visibility timeout"
        " is delivered again, so the work must be idempotent.",
    ),
    Document(
        "retries",
        "Retrying calls to a language model",
        "Transient errors (429, 5xx, timeouts) are retried with exponential backoff and full"
        " jitter, honouring Retry-After. Permanent errors fail at once. Long waits go back to the"
        " queue with a delay instead of holding a worker.",
    ),
    Document(
        "webhooks",
        "Signed webhooks",
        "A webhook tells the client a task ended. Standard Webhooks signs each delivery with an"
        " HMAC of its id, timestamp and body; the receiver checks it and drops replays. Failed"
        " deliveries are retried on a schedule and then dead-lettered.",
    ),
    Document(
        "costs",
        "What a serverless task costs",
        "Lambda bills the time an invocation runs. A call that waits on a provider for minutes"
        " pays for the wait; a background call that is checked back later pays only for the"
        " checks. DynamoDB on demand bills each write.",
    ),
    Document(
        "agents",
        "Agent runs",
        "An agent run calls the model, then the tools it asks for, then the model again. Each"
        " step is recorded before the next one starts, so a crash resumes the run without paying"
        " twice for a model call.",
    ),
)


def build(documents: tuple[Document, ...] = DOCUMENTS) -> Any:
    """The MCP server (an MCPServer) with its three tools over `documents`."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    server = MCPServer("llmtasks-docs", log_level="WARNING")
    by_id = {document.doc_id: document for document in documents}
    read_only = ToolAnnotations(read_only_hint=True)

    @server.tool(annotations=read_only)
    def search_documents(query: str) -> str:
        """The documents whose title or text hold every word of the query: id, title, first words."""
        words = query.lower().split()
        found = [
            document
            for document in documents
            if all(word in f"{document.title} {document.text}".lower() for word in words)
        ]
        if not found:
            return f"No document holds {query!r}. Documents: {', '.join(by_id)}."
        return "\n".join(f"{d.doc_id}: {d.title}. {d.text[:80]}..." for d in found)

    @server.tool(annotations=read_only)
    def read_document(doc_id: str) -> str:
        """A document's whole text, by its id (search_documents and list_documents give them)."""
        document = by_id.get(doc_id)
        if document is None:
            raise ToolError(f"No document {doc_id!r}. Documents: {', '.join(by_id)}.")
        return f"{document.title}\n\n{document.text}"

    @server.tool(annotations=read_only)
    def list_documents() -> str:
        """Every document's id and title."""
        return "\n".join(f"{d.doc_id}: {d.title}" for d in documents)

    return server


def app(token: str | None = None, documents: tuple[Document, ...] = DOCUMENTS) -> Any:
    """The server as an ASGI app (stateless Streamable HTTP at /mcp); with a token, a request
    without `Authorization: Bearer <token>` is answered 401."""
    inner = build(documents).streamable_http_app(streamable_http_path=PATH, stateless_http=True)
    if token is None:
        return inner
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"Unauthorized"})
            return
        await inner(scope, receive, send)

    return guarded


@contextmanager
def serving(port: int, *, token: str | None = None) -> Iterator[str]:
    """The server on 127.0.0.1:`port` in a thread, until the block ends; yields its URL."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app(token), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="mcp-docs", daemon=True)
    thread.start()
    give_up = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > give_up or not thread.is_alive():
            raise RuntimeError(f"the MCP docs server did not start on 127.0.0.1:{port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}{PATH}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A test MCP server over a few documents.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--token", help="require Authorization: Bearer TOKEN")
    args = parser.parse_args(argv)
    import uvicorn

    print(f"MCP server: http://127.0.0.1:{args.port}{PATH}", flush=True)
    uvicorn.run(app(args.token), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
