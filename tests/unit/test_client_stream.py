"""The SDK's `stream` against a server that fails between its pages (503s, a dropped
connection): every chunk once and in order, read on from the last one each time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import llmtasks_client
from tests.helpers import serve

pytestmark = pytest.mark.unit

TEXT = [f"piece {n} " for n in range(1, 8)]


class FlakyOutput:
    """`GET /tasks/t/output` over TEXT, two chunks a page; every other request fails (a 503, or
    a 500 without a body), and the last page says how the task ended."""

    def __init__(self, status: str = "completed") -> None:
        self.status = status
        self.asked: list[int] = []

    async def output(self, request: Request) -> Response:
        after = int(request.query_params["after"])
        self.asked.append(after)
        if len(self.asked) % 2 == 0:
            return Response("", 500) if len(self.asked) % 4 == 0 else JSONResponse({"message": "x"}, 503)
        chunks = [
            {"sequence": n, "text": TEXT[n - 1], "tokens": 1, "attempt": 1}
            for n in range(after + 1, min(after + 2, len(TEXT)) + 1)
        ]
        reached = chunks[-1]["sequence"] if chunks else after
        final = reached == len(TEXT)
        page: dict[str, Any] = {"task_id": "t", "chunks": chunks, "after": reached, "final": final}
        if final:
            page |= {"status": self.status, "error": "boom" if self.status == "failed" else None}
        return JSONResponse(page)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/tasks/t/output", self.output)])


def test_stream_reads_every_chunk_once_in_order_across_failures() -> None:
    server = FlakyOutput()
    with serve(server.app()) as url, llmtasks_client.Client(url, "k", max_retries=0) as client:
        chunks = list(client.stream("t", after=1))
    assert [c.sequence for c in chunks] == list(range(2, 8))
    assert "".join(c.text for c in chunks) == "".join(TEXT[1:])
    # Each request after a failure asked again from the last chunk it had
    assert server.asked == [1, 3, 3, 5, 5]


def test_async_stream_ends_with_the_task_s_failure() -> None:
    server = FlakyOutput(status="failed")

    seen: list[str] = []

    async def run() -> None:
        async with llmtasks_client.AsyncClient(url, "k", max_retries=0) as client:
            async for chunk in client.stream("t"):
                seen.append(chunk.text)

    with serve(server.app()) as url, pytest.raises(llmtasks_client.TaskFailedError) as failed:
        asyncio.run(run())
    assert failed.value.task.error == "boom"
    assert "".join(seen) == "".join(TEXT)


def test_stream_gives_up_on_a_refusal() -> None:
    async def refuse(request: Request) -> Response:
        return JSONResponse({"title": "Task not found", "status": 404}, 404)

    app = Starlette(routes=[Route("/tasks/t/output", refuse)])
    with (
        serve(app) as url,
        llmtasks_client.Client(url, "k") as client,
        pytest.raises(llmtasks_client.ProblemError) as refused,
    ):
        list(client.stream("t"))
    assert refused.value.status == 404


RUN_CHUNKS: list[dict[str, Any]] = [
    {
        "sequence": 1,
        "text": "",
        "event": {
            "type": "model_call",
            "step": 0,
            "model": "m",
            "usage": {"total_tokens": 9, "cost_usd": 0.001},
            "tool_calls": [{"id": "c1", "function": {"name": "lookup", "arguments": "{}"}}],
        },
    },
    {
        "sequence": 2,
        "text": "",
        "event": {
            "type": "tool_call",
            "step": 1,
            "tool_source": "endpoint",
            "tool_call": {"id": "c1", "function": {"name": "lookup", "arguments": "{}"}},
            "tool_output": "found",
        },
    },
    {
        "sequence": 3,
        "text": "",
        "event": {
            "type": "requires_action",
            "step": 2,
            "tool_calls": [{"id": "c2", "function": {"name": "ask", "arguments": "{}"}}],
        },
    },
    {
        "sequence": 4,
        "text": "",
        "event": {
            "type": "tool_call",
            "step": 3,
            "tool_source": "client",
            "tool_call": {"id": "c2", "function": {"name": "ask", "arguments": "{}"}},
            "tool_output": "yes",
        },
    },
    {"sequence": 5, "text": "done"},
]


class RunOutput:
    """A run's output, three chunks a page (the third its wait for the client), and the task in
    `status` (requires_action while it waits)."""

    def __init__(self, status: str) -> None:
        self.status = status
        self.asked: list[int] = []

    async def output(self, request: Request) -> Response:
        after = int(request.query_params["after"])
        self.asked.append(after)
        chunks = RUN_CHUNKS[after : after + 3] if self.status != "requires_action" else RUN_CHUNKS[after:3]
        reached = chunks[-1]["sequence"] if chunks else after
        final = reached == len(RUN_CHUNKS)
        page: dict[str, Any] = {"task_id": "t", "chunks": chunks, "after": reached, "final": final}
        return JSONResponse(page | ({"status": "completed"} if final else {}))

    async def task(self, request: Request) -> Response:
        at = "2026-12-03T00:00:00Z"
        return JSONResponse({"task_id": "t", "status": self.status, "created_at": at, "expires_at": at})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/tasks/t/output", self.output), Route("/tasks/t", self.task)])


def test_stream_gives_a_run_s_steps_as_typed_events_and_ends_at_its_wait() -> None:
    # Given a run waiting for its client after two steps
    server = RunOutput("requires_action")
    with serve(server.app()) as url, llmtasks_client.Client(url, "k", max_retries=0) as client:
        chunks = list(client.stream("t"))
    # Then the stream gives its steps as events, in order, and ends at the wait
    events = [chunk.event for chunk in chunks if chunk.event is not None]
    assert [(e.type, e.step) for e in events] == [("model_call", 0), ("tool_call", 1), ("requires_action", 2)]
    assert isinstance(events[0], llmtasks_client.StepEvent)
    assert events[0].usage is not None
    assert events[0].usage.total_tokens == 9
    assert events[0].line() == "step 0 model_call m 9 tokens $0.001000 -> lookup"
    assert events[1].line() == "step 1 tool_call lookup({}) [endpoint] -> found"
    assert events[2].line() == "requires_action after step 2: c2 ask({})"


def test_stream_reads_on_past_a_wait_the_run_has_left() -> None:
    # Given a run whose wait is on a page's end, but which has resumed since
    server = RunOutput("processing")

    async def run() -> list[Any]:
        async with llmtasks_client.AsyncClient(url, "k", max_retries=0) as client:
            return [chunk async for chunk in client.stream("t")]

    with serve(server.app()) as url:
        chunks = asyncio.run(run())
    # Then the stream reads on to the run's end
    assert [chunk.sequence for chunk in chunks] == [1, 2, 3, 4, 5]
    assert chunks[-1].text == "done"
    assert server.asked == [0, 3]


class FlakyEvents:
    """`GET /batches/b/events` over five events of one item each, two a page; every other
    request fails with a 503; the batch ends with the last."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def events(self, request: Request) -> Response:
        after = int(request.query_params["after"])
        self.asked.append(after)
        if len(self.asked) % 2 == 0:
            return JSONResponse({"message": "x"}, 503)
        events = [
            {
                "sequence": n,
                "items": [{"index": n - 1, "task_id": f"t{n}", "status": "completed"}],
                "counts": {"pending": 5 - n, "completed": n},
                "at": "2026-12-03T00:00:00Z",
            }
            for n in range(after + 1, min(after + 2, 5) + 1)
        ]
        reached = events[-1]["sequence"] if events else after
        final = reached == 5
        status = "completed" if final else "processing"
        return JSONResponse(
            {"batch_id": "b", "events": events, "after": reached, "final": final, "status": status}
        )

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/batches/b/events", self.events)])


def test_follow_batch_reads_every_event_once_in_order_across_failures() -> None:
    server = FlakyEvents()
    with serve(server.app()) as url, llmtasks_client.Client(url, "k", max_retries=0) as client:
        events = list(client.follow_batch("b"))
    assert [e.sequence for e in events] == [1, 2, 3, 4, 5]
    assert [e.counts.completed for e in events] == [1, 2, 3, 4, 5]
    assert server.asked == [0, 2, 2, 4, 4]

    async def follow() -> list[int]:
        async with llmtasks_client.AsyncClient(url, "k", max_retries=0) as client:
            return [event.sequence async for event in client.follow_batch("b", after=3)]

    with serve(server.app()) as url:
        assert asyncio.run(follow()) == [4, 5]
