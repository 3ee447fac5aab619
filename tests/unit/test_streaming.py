"""Progress while a task runs: the reply streams from the provider, its text so far is written to
the task at most once an interval, a broken stream is retried like any transient error, and a
cancel stops the call at the next write."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.models import TaskStatus, TaskView
from llmtasks.llm.bedrock import BedrockConverse
from llmtasks.llm.openai import OpenAIChat
from llmtasks_local.mock_llm import reply_text
from llmtasks_local.sam.events import pattern_matcher
from tests.conftest import Aws, RunningMock
from tests.helpers import HANG_S, eventually, load_event, serve
from tests.unit.test_worker import Worker

pytestmark = pytest.mark.unit


def run_in_background(worker: Worker, **overrides: Any) -> threading.Thread:
    messages = worker.queued()
    thread = threading.Thread(target=worker.run, args=(messages,), kwargs=overrides, daemon=True)
    thread.start()
    return thread


def test_a_streaming_call_shows_its_text_as_it_grows_then_the_whole_result(
    worker: Worker, mock_llm: RunningMock
) -> None:
    mock_llm.configure(latency_s=3, reply_chars=400)
    prompt = "tell a long story"
    task_id = worker.submit(prompt)
    thread = run_in_background(worker, progress_interval_s=0.5)
    seen: list[tuple[str, int]] = []
    while thread.is_alive():
        task = worker.service.get("default", task_id)  # GET /tasks/{id}: the text from the chunks
        stored = worker.task(task_id)  # the item holds no text, and progress writes skip it
        assert (stored.partial_result, stored.progress_at) == (None, None)
        if task.status is TaskStatus.PROCESSING and task.partial_result:
            view = TaskView.of(task)
            assert view.partial_result == task.partial_result
            assert view.progress is not None
            if not seen or seen[-1][0] != task.partial_result:
                seen.append((task.partial_result, view.progress.tokens))
        time.sleep(0.1)  # the sampling interval while the call runs; the loop ends with the call
    done = worker.task(task_id)
    whole = reply_text(prompt, 400)
    assert len(seen) >= 3  # several writes during a 3 s call, one every half second
    assert all(whole.startswith(text) for text, _ in seen)
    assert [tokens for _, tokens in seen] == sorted(tokens for _, tokens in seen)
    assert (done.status, done.result) == (TaskStatus.COMPLETED, whole)
    assert (done.partial_result, done.progress_tokens) == (None, None)
    assert TaskView.of(done).progress is None


def test_a_stream_cut_off_halfway_is_retried_like_a_dropped_call(
    worker: Worker, mock_llm: RunningMock
) -> None:
    mock_llm.configure(rate_break=1.0, reply_chars=200)
    task_id = worker.submit("a stream that breaks")
    worker.run_queued(progress_interval_s=0.1)
    task = worker.task(task_id)
    assert (task.status, task.last_error_code, task.partial_result) == (
        TaskStatus.PENDING,
        "llm_stream_broken",
        None,
    )
    mock_llm.configure(reply_chars=200)
    retry = eventually(worker.queued, bool, timeout_s=HANG_S, what="the retry's message")
    worker.run(retry, progress_interval_s=0.1)
    assert worker.task(task_id).result == reply_text("a stream that breaks", 200)


def test_cancelling_a_streaming_task_stops_its_call(worker: Worker, mock_llm: RunningMock) -> None:
    mock_llm.configure(latency_s=6, reply_chars=400)
    task_id = worker.submit("cancel me while I stream")
    thread = run_in_background(worker, progress_interval_s=0.3)
    eventually(
        lambda: worker.service.get("default", task_id).progress_at,
        bool,
        timeout_s=HANG_S,
        what="a first progress write",
    )
    worker.service.cancel("default", task_id)
    thread.join(timeout=HANG_S)
    assert not thread.is_alive()
    assert worker.task(task_id).status is TaskStatus.CANCELLED
    # Stopped at a progress write, before the 6 s call's stream reached its end
    assert mock_llm.stats.completed == 0


def test_progress_writes_do_not_reach_the_batch_counters(aws: Aws) -> None:
    [record] = load_event("batch_stream.json")["Records"]
    matches = pattern_matcher(aws.function("BatchFunction").stream_sources[0].filter_patterns)
    assert matches(record)
    record["dynamodb"]["NewImage"]["progress_at"] = {"N": "1764000000.5"}
    assert not matches(record)


class FakeBedrockStream:
    """A bedrock-runtime client whose ConverseStream yields the documented event shapes (botocore's
    Stubber cannot stand in for an event stream)."""

    meta: Any = None

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.asked: dict[str, Any] = {}

    def converse_stream(self, **arguments: Any) -> dict[str, Any]:
        self.asked = arguments
        return {"stream": iter(self.events)}


def test_bedrock_streams_through_converse_stream() -> None:
    events = [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"delta": {"text": "Queues "}, "contentBlockIndex": 0}},
        {"contentBlockDelta": {"delta": {"text": "decouple."}, "contentBlockIndex": 0}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"messageStop": {"stopReason": "end_turn"}},
        {
            "metadata": {
                "usage": {"inputTokens": 5, "outputTokens": 3, "totalTokens": 8},
                "metrics": {"latencyMs": 9},
            }
        },
    ]
    client = FakeBedrockStream(events)
    progress: list[tuple[str, int]] = []

    async def record(text: str, tokens: int) -> None:
        progress.append((text, tokens))

    provider = BedrockConverse(default_model="m", client=client)  # type: ignore[arg-type]
    completion = asyncio.run(
        provider.complete(LLMRequest(prompt="why queues?"), timeout_s=5, on_progress=record)
    )
    assert client.asked["messages"] == [{"role": "user", "content": [{"text": "why queues?"}]}]
    assert progress == [("Queues ", 1), ("Queues decouple.", 2)]
    assert (completion.text, completion.usage.total_tokens) == ("Queues decouple.", 8)


def test_a_bedrock_stream_error_is_classified_by_its_documented_status() -> None:
    import boto3
    from botocore.exceptions import EventStreamError

    real = boto3.client(
        "bedrock-runtime", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )

    class Throttled(FakeBedrockStream):
        meta = real.meta

        def converse_stream(self, **arguments: Any) -> dict[str, Any]:
            def events() -> Any:
                yield {"contentBlockDelta": {"delta": {"text": "Half"}, "contentBlockIndex": 0}}
                error = {"Error": {"Code": "throttlingException", "Message": "slow down"}}
                raise EventStreamError(error, "ConverseStream")  # type: ignore[arg-type]

            return {"stream": events()}

    async def record(text: str, tokens: int) -> None:
        return None

    provider = BedrockConverse(default_model="m", client=Throttled([]))  # type: ignore[arg-type]
    with pytest.raises(LLMError) as raised:
        asyncio.run(provider.complete(LLMRequest(prompt="hi"), timeout_s=5, on_progress=record))
    assert (raised.value.code, raised.value.transient) == ("llm_rate_limited", True)


def test_a_server_that_refuses_to_stream_is_called_without_streaming(
    worker: Worker, mock_llm: RunningMock
) -> None:
    mock_llm.configure(refuse_stream=True)
    first, second = worker.submit("no streams here"), worker.submit("nor here")
    worker.run_queued(progress_interval_s=0.1)
    assert [worker.task(t).result for t in (first, second)] == [
        reply_text("no streams here"),
        reply_text("nor here"),
    ]
    assert [worker.task(t).attempts for t in (first, second)] == [1, 1]


def sse_server(clients: list[tuple[str, int]], *, after_done: int = 0) -> Any:
    """An ASGI app streaming a two-word answer as OpenAI does, noting each request's client
    (address, port): one port for several requests is one connection kept. With `after_done`,
    that many more lines follow [DONE], one every 0.1 s, before the body ends."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        clients.append(tuple(scope["client"]))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for word in ("Queues", " decouple."):
            chunk = {"model": "m", "choices": [{"index": 0, "delta": {"content": word}}]}
            await send(
                {
                    "type": "http.response.body",
                    "body": f"data: {json.dumps(chunk)}\n\n".encode(),
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        for _ in range(after_done):
            await asyncio.sleep(0.1)
            await send({"type": "http.response.body", "body": b": still here\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def streamed_calls(url: str, calls: int) -> list[str]:
    chat = OpenAIChat(base_url=url, default_model="m")
    seen: list[str] = []

    async def progress(text: str, _pieces: int) -> None:
        seen.append(text)

    texts = []
    for i in range(calls):
        completion = await chat.complete(LLMRequest(prompt=f"call {i}"), timeout_s=30, on_progress=progress)
        texts.append(completion.text)
    assert seen[-1] == "Queues decouple."  # the calls were streamed
    return texts


def test_streamed_calls_keep_their_connection_for_the_next_call() -> None:
    clients: list[tuple[str, int]] = []
    with serve(sse_server(clients)) as url:
        texts = asyncio.run(streamed_calls(url + "/v1", 3))
    assert texts == ["Queues decouple."] * 3
    # The body is read to its end after [DONE]: the connection goes back to the pool, and the
    # three calls made one (unread, each call's reply closed its connection).
    assert len(clients) == 3
    assert len(set(clients)) == 1


def test_a_server_that_keeps_sending_after_done_costs_the_connection_not_the_answer() -> None:
    clients: list[tuple[str, int]] = []
    # 30 lines after [DONE], one every 0.1 s: 3 s, past the wait for the body's end.
    with serve(sse_server(clients, after_done=30)) as url:
        texts = asyncio.run(streamed_calls(url + "/v1", 2))
    assert texts == ["Queues decouple."] * 2
    assert len(set(clients)) == 2  # each connection closed after a bounded wait, a new one for the next
