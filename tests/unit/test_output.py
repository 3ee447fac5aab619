"""A task's output as numbered chunks (`GET /tasks/{id}/output?after=N&wait=S`): every delta once
and in order across reconnects, resumable from any point after the task ended, a retried attempt's
text started over, a cancel as the last word, one tenant's output unseen by another, bad offsets
refused and one past the end an empty page."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from llmtasks.api.openai_responses import segment
from llmtasks.domain.errors import TaskNotFound
from llmtasks.domain.models import TaskStatus
from llmtasks.domain.output import OutputChunk, TaskOutputPage
from llmtasks.worker import progress
from llmtasks_local.mock_llm import reply_text
from tests.conftest import RunningMock
from tests.helpers import HANG_S, eventually
from tests.unit.test_api import Api, api  # noqa: F401 - the fixture
from tests.unit.test_streaming import run_in_background
from tests.unit.test_worker import Worker

pytestmark = pytest.mark.unit


def follow(worker: Worker, task_id: str, after: int = 0, *, tenant: str = "default") -> list[TaskOutputPage]:
    """Every page a reader gets that follows the output to its end, each read a new request
    (a reconnect) with the last page's `after`, held up to 2 s."""
    pages = []
    while not pages or not pages[-1].final:
        page = worker.service.output(tenant, task_id, after=after, wait_s=2)
        pages.append(page)
        after = page.after
    return pages


def first_chunks(worker: Worker, task_id: str) -> TaskOutputPage:
    """The first page with chunks: a loaded machine's worker can take longer than one wait to
    start the call."""
    give_up = time.monotonic() + HANG_S
    while not (page := worker.service.output("default", task_id, after=0, wait_s=5)).chunks:
        assert time.monotonic() < give_up, f"no output within {HANG_S} s"
    return page


def chunks_of(pages: list[TaskOutputPage]) -> list[OutputChunk]:
    return [chunk for page in pages for chunk in page.chunks]


def test_a_reader_gets_every_chunk_once_in_order_while_the_call_runs_then_the_end(
    worker: Worker, mock_llm: RunningMock
) -> None:
    mock_llm.configure(latency_s=3, reply_chars=600)
    prompt = "tell a long story"
    task_id = worker.submit(prompt)
    thread = run_in_background(worker, progress_interval_s=0.3)
    # When a reader follows the output from the start
    first = first_chunks(worker, task_id)
    running_when_first_chunk_came = thread.is_alive()
    pages = [first, *follow(worker, task_id, first.after)]
    thread.join(timeout=HANG_S)
    assert not thread.is_alive()
    chunks = chunks_of(pages)
    whole = reply_text(prompt, 600)
    # Then it got chunks while the call ran, each once, numbered 1, 2, ..., that add up to the result
    assert running_when_first_chunk_came
    assert len(chunks) >= 4  # several progress writes in a 3 s call, one each 0.3 s, and the rest
    assert [c.sequence for c in chunks] == list(range(1, len(chunks) + 1))
    assert "".join(c.text for c in chunks) == whole
    assert {c.attempt for c in chunks} == {1}
    assert [p.final for p in pages] == [False] * (len(pages) - 1) + [True]
    assert (pages[-1].status, pages[-1].after) == (TaskStatus.COMPLETED, len(chunks))
    assert sum(c.tokens for c in chunks) == worker.task(task_id).usage.completion_tokens  # type: ignore[union-attr]
    # And any later reader resumes from any point, long after the end, and reads the same chunks
    assert chunks_of(follow(worker, task_id, after=2)) == chunks[2:]
    assert follow(worker, task_id, after=len(chunks)) == [
        TaskOutputPage(task_id=task_id, chunks=[], after=len(chunks), final=True, status=TaskStatus.COMPLETED)
    ]
    # And an offset past the end reads as an empty final page, at once, from where it was asked
    beyond = len(chunks) + 1
    started = time.monotonic()
    assert worker.service.output("default", task_id, after=beyond, wait_s=5) == TaskOutputPage(
        task_id=task_id, chunks=[], after=beyond, final=True, status=TaskStatus.COMPLETED
    )
    assert time.monotonic() - started < 4


def test_a_task_that_streamed_nothing_has_its_whole_result_as_one_chunk(worker: Worker) -> None:
    task_id = worker.submit("short")
    assert worker.service.output("default", task_id, after=0).chunks == []  # pending: nothing yet
    # Past its end while it is pending: an empty page, not final, that reads on from there
    assert worker.service.output("default", task_id, after=7) == TaskOutputPage(
        task_id=task_id, chunks=[], after=7, final=False
    )
    # Progress is written (the writer is on) from the call's first 30 s: a short call ends well
    # before. (At 0.5 s, a call slowed by a loaded machine wrote its text once as it ran.)
    worker.run_queued(progress_interval_s=30)
    [page] = follow(worker, task_id)
    assert [(c.sequence, c.text, c.attempt) for c in page.chunks] == [(1, worker.task(task_id).result, 1)]


def a_first_attempt_broken_after_some_chunks(
    worker: Worker, mock_llm: RunningMock, prompt: str, *, retry_latency_s: float
) -> tuple[str, Any]:
    """A task whose first attempt's stream broke halfway, after some chunks, and its retry's
    message (the mock then answers whole, after `retry_latency_s`)."""
    mock_llm.configure(latency_s=2, rate_break=1.0, reply_chars=400)
    task_id = worker.submit(prompt)
    worker.run_queued(progress_interval_s=0.2)
    first = worker.service.output("default", task_id, after=0)
    assert first.chunks
    assert not first.final
    mock_llm.configure(latency_s=retry_latency_s, reply_chars=400)
    return task_id, eventually(worker.queued, bool, timeout_s=HANG_S, what="the retry's message")


def test_a_retried_attempt_writes_its_text_again_in_chunks_numbered_on(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a first attempt whose stream breaks halfway, after some chunks
    prompt = "a stream that breaks"
    task_id, retry = a_first_attempt_broken_after_some_chunks(worker, mock_llm, prompt, retry_latency_s=1)
    # When the retry runs to the end
    worker.run(retry, progress_interval_s=0.2)
    chunks = chunks_of(follow(worker, task_id))
    # Then the numbers go on; the first attempt's text was a start of the result, the second's is all of it
    whole = reply_text(prompt, 400)
    assert [c.sequence for c in chunks] == list(range(1, len(chunks) + 1))
    by_attempt = {n: "".join(c.text for c in chunks if c.attempt == n) for n in (1, 2)}
    assert whole.startswith(by_attempt[1])
    assert by_attempt[1]
    assert by_attempt[2] == whole
    assert [c.attempt for c in chunks] == sorted(c.attempt for c in chunks)


def test_a_running_task_shows_its_attempt_s_text_so_far_from_its_chunks(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a first attempt whose stream broke after some chunks
    prompt = "a stream that breaks, then streams again"
    task_id, retry = a_first_attempt_broken_after_some_chunks(worker, mock_llm, prompt, retry_latency_s=2)
    # When the retry streams, GET /tasks/{id} is read as it runs
    thread = threading.Thread(target=worker.run, args=(retry,), kwargs={"progress_interval_s": 0.2})
    thread.start()
    seen = []
    while thread.is_alive():
        task = worker.service.get("default", task_id)
        if task.status is TaskStatus.PROCESSING and task.partial_result:
            seen.append(task.partial_result)
        thread.join(0.1)
    # Then each read showed the second attempt's text alone (joined with the first's chunks, it
    # would not be a start of the answer), growing; the task's item never held it
    whole = reply_text(prompt, 400)
    assert len(set(seen)) >= 2
    assert all(whole.startswith(text) for text in seen)
    assert [len(text) for text in seen] == sorted(len(text) for text in seen)
    assert worker.task(task_id).result == whole


def test_a_chunk_is_counted_only_by_its_own_attempt_or_a_later_one_while_the_task_runs(
    worker: Worker,
) -> None:
    output = worker.store.output
    task = worker.store.get(worker.submit("chunks of two attempts"), now=time.time())
    assert task is not None

    def append(sequence: int, attempt: int) -> bool:
        chunk = OutputChunk(
            sequence=sequence, text=f"{attempt}", tokens=1, attempt=attempt, written_at=datetime.now(UTC)
        )
        return output.append(
            task.task_id,
            chunk,
            tenant_id=task.tenant_id,
            offset=1,
            tokens=1,
            expires_at=task.expires_at,
            next_at=time.time(),
            first_sequence=sequence,
        )

    # An attempt's chunk, then a later attempt's; an earlier attempt's (a call that should have
    # stopped) is then refused, as is any once the head says the task ended
    assert append(1, attempt=1)
    assert append(2, attempt=2)
    assert not append(3, attempt=1)
    head = output.head(task.task_id, consistent=True)
    assert head is not None
    assert (head.last_sequence, head.attempt, head.tokens) == (2, 2, 1)
    assert head.written_at is not None
    output.ended(task.model_copy(update={"attempts": 2}), TaskStatus.CANCELLED)
    assert not append(3, attempt=2)


def test_a_cancelled_task_s_output_ends_with_the_cancel(worker: Worker, mock_llm: RunningMock) -> None:
    mock_llm.configure(latency_s=6, reply_chars=400)
    task_id = worker.submit("cancel me while I stream")
    thread = run_in_background(worker, progress_interval_s=0.3)
    first = first_chunks(worker, task_id)
    # A reader waiting for more is answered by the cancel
    waiting: list[TaskOutputPage] = []
    reader = threading.Thread(target=lambda: waiting.extend(follow(worker, task_id, first.after)))
    reader.start()
    worker.service.cancel("default", task_id)
    reader.join(timeout=HANG_S)
    thread.join(timeout=HANG_S)
    assert not reader.is_alive()
    assert not thread.is_alive()
    assert waiting[-1].final
    assert waiting[-1].status is TaskStatus.CANCELLED
    # No chunk after the cancel's end: a late one of the call is never counted
    assert follow(worker, task_id, after=waiting[-1].after)[-1].chunks == []


def test_another_tenant_s_output_is_not_found(worker: Worker, mock_llm: RunningMock) -> None:
    task_id = worker.submit("mine")
    with pytest.raises(TaskNotFound):  # before it has any output
        worker.service.output("intruder", task_id, after=0)
    mock_llm.configure(latency_s=1, reply_chars=300)
    worker.run_queued(progress_interval_s=0.2)
    with pytest.raises(TaskNotFound):  # and after
        worker.service.output("intruder", task_id, after=0)
    with pytest.raises(TaskNotFound):
        worker.service.output("default", "0" * 32, after=0)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("after=-1", "after"),
        ("after=abc", "after"),
        ("after=1.5", "after"),
        ("wait=26", "wait"),
        ("after=10000001", "after"),  # over the document's maximum
    ],
)
def test_bad_offsets_are_refused_with_a_422(api: Api, query: str, field: str) -> None:  # noqa: F811
    task_id = api.call("POST", "/tasks", {"prompt": "p"})["json"]["task_id"]
    reply = api.call("GET", f"/tasks/{task_id}/output", query=query)
    assert reply["statusCode"] == 422, reply
    assert field in reply["body"]


@pytest.mark.parametrize("after", [0, 10_000_000])
def test_the_route_answers_the_page(api: Api, after: int) -> None:  # noqa: F811
    # The first page, and one past the end (the document's largest `after`): both an empty page
    task_id = api.call("POST", "/tasks", {"prompt": "p"})["json"]["task_id"]
    reply: dict[str, Any] = api.call("GET", f"/tasks/{task_id}/output", query=f"after={after}&wait=0")
    assert reply["statusCode"] == 200
    assert reply["json"] == {
        "task_id": task_id,
        "chunks": [],
        "after": after,
        "final": False,
        "status": None,
        "error": None,
        "error_code": None,
    }
    assert api.call("GET", "/tasks/abc/output")["statusCode"] == 404


def test_a_failed_task_s_output_ends_with_its_error(worker: Worker, mock_llm: RunningMock) -> None:
    mock_llm.configure(rate_500=1.0)
    task_id = worker.submit("fails", max_retries=0)
    worker.run_queued(progress_interval_s=0.2)
    [page] = follow(worker, task_id)
    task = worker.task(task_id)
    assert (page.final, page.status, page.chunks) == (True, TaskStatus.FAILED, [])
    assert (page.error, page.error_code) == (task.error, task.error_code)
    assert page.error


def sse_events(body: str) -> list[dict[str, Any]]:
    """The events of a text/event-stream body, each `data` parsed, its `event` line checked."""
    events = []
    for block in body.split("\n\n"):
        if not block:
            continue
        kind, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


def test_a_response_s_events_are_numbered_alike_for_every_reader_and_parse_as_the_sdk_s(
    worker: Worker, mock_llm: RunningMock
) -> None:
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    mock_llm.configure(latency_s=1.5, reply_chars=500)
    task_id = worker.submit("a streamed response")
    queued = sse_events(segment(worker.service, "default", task_id, starting_after=-1, segment_s=0))
    assert [e["type"] for e in queued] == ["response.created"]  # queued: nothing more yet
    worker.run_queued(progress_interval_s=0.2)
    events = sse_events(segment(worker.service, "default", task_id, starting_after=-1))
    chunks = chunks_of(follow(worker, task_id))
    # Then: 0-3 the response and its one text part begun, a delta a chunk, the four ends
    deltas = len(chunks)
    assert [e["sequence_number"] for e in events] == list(range(4 + deltas + 4))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    whole = worker.task(task_id).result
    assert "".join(e["delta"] for e in events[4 : 4 + deltas]) == whole
    parsed = [TypeAdapter(ResponseStreamEvent).validate_python(e) for e in events]
    assert parsed[-1].response.output_text == whole  # type: ignore[union-attr]
    # And a reader that resumes after any event gets the ones after it, the same
    for n in (0, 3, 5, len(events) - 2):
        assert sse_events(segment(worker.service, "default", task_id, starting_after=n)) == events[n + 1 :]
    assert sse_events(segment(worker.service, "default", task_id, starting_after=len(events) + 5)) == []


def test_a_failed_and_a_cancelled_response_end_their_events_with_failed_and_incomplete(
    worker: Worker, mock_llm: RunningMock
) -> None:
    mock_llm.configure(rate_500=1.0)
    failed = worker.submit("fails", max_retries=0)
    worker.run_queued()
    cancelled = worker.submit("cancelled while queued")
    worker.service.cancel("default", cancelled)
    ends = {
        task_id: [
            e["type"] for e in sse_events(segment(worker.service, "default", task_id, starting_after=-1))
        ]
        for task_id in (failed, cancelled)
    }
    header = [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert ends == {failed: [*header, "response.failed"], cancelled: [*header, "response.incomplete"]}


def test_a_task_whose_head_never_heard_of_its_end_still_ends_its_output(
    worker: Worker, mock_llm: RunningMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a streaming task whose head could not be told of the cancel (that write failed), and
    # whose call reads the task at each progress write (TASK_CHECK_S: every 30 s in a real one)
    monkeypatch.setattr(progress, "TASK_CHECK_S", 0.0)
    mock_llm.configure(latency_s=6, reply_chars=400)
    task_id = worker.submit("cancel me, quietly")
    thread = run_in_background(worker, progress_interval_s=0.3)
    first = first_chunks(worker, task_id)
    real_update = worker.aws.dynamodb.update_item

    def head_writes_fail(**request: Any) -> Any:
        if request["Key"]["pk"]["S"] == f"output#{task_id}" and "#status" in request["UpdateExpression"]:
            raise worker.aws.dynamodb.exceptions.InternalServerError(
                {"Error": {"Code": "InternalServerError", "Message": "down"}}, "UpdateItem"
            )
        return real_update(**request)

    monkeypatch.setattr(worker.aws.dynamodb, "update_item", head_writes_fail)
    worker.service.cancel("default", task_id)
    thread.join(timeout=HANG_S)
    assert not thread.is_alive()
    # When a reader waits on it: the head says nothing of the end
    page = worker.service.output("default", task_id, after=first.after, wait_s=1)
    # Then the wait's end reads the task, and the page is the final one
    assert (page.final, page.status) == (True, TaskStatus.CANCELLED)


@pytest.mark.parametrize(("max_chunks", "max_bytes"), [(2, 10_000_000), (100, 1)])
def test_a_page_holds_at_most_its_chunks_and_bytes_and_the_rest_follows(
    worker: Worker, mock_llm: RunningMock, monkeypatch: pytest.MonkeyPatch, max_chunks: int, max_bytes: int
) -> None:
    mock_llm.configure(latency_s=1.5, reply_chars=500)
    task_id = worker.submit("paged")
    worker.run_queued(progress_interval_s=0.2)
    from llmtasks.services import task_output

    monkeypatch.setattr(task_output, "MAX_PAGE_CHUNKS", max_chunks)
    monkeypatch.setattr(task_output, "MAX_PAGE_BYTES", max_bytes)
    pages = follow(worker, task_id)
    chunks = chunks_of(pages)
    assert len(chunks) >= 3
    per_page = 1 if max_bytes == 1 else max_chunks  # a page's first chunk comes whatever its size
    assert all(len(page.chunks) <= per_page for page in pages)
    assert [c.sequence for c in chunks] == list(range(1, len(chunks) + 1))
    assert "".join(c.text for c in chunks) == worker.task(task_id).result
