"""Batches through the handlers the template names: submit, fan-out, the worker, the stream's
counters and the batch webhook, on moto in-process with the mock LLM over HTTP."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer
from botocore.exceptions import ClientError

from llmtasks.api.openai_batch_files import ENDPOINTS, OpenAIBatchFiles, line_parser
from llmtasks.aws.batch_store import BatchCancellations, BatchStore, CountedChange, CountsRefused
from llmtasks.aws.idempotency import IdempotencyKeys
from llmtasks.aws.queues import Queue
from llmtasks.aws.store import TaskStore
from llmtasks.aws.stream_skips import StreamSkips
from llmtasks.aws.task_counts import TaskCounts
from llmtasks.aws.task_items import task_change
from llmtasks.domain.batches import ITEM_COUNTS, MAX_BATCH_ITEMS, Batch, BatchStatus
from llmtasks.domain.errors import BatchNotFound, RetryLater
from llmtasks.domain.messages import FanoutMessage, WebhookMessage
from llmtasks.domain.models import TaskStatus
from llmtasks.llm.openai import OpenAIChat
from llmtasks.ops.stats import overview
from llmtasks.records import sqs_record
from llmtasks.services.batch_inputs import BatchInputReader
from llmtasks.services.batch_items import BatchEnds, BatchFanout, BatchProgress
from llmtasks.services.batch_outcomes import batch_task_id
from llmtasks.services.batches import BatchService
from llmtasks.services.task_tally import TaskTally
from llmtasks.services.webhooks import WebhookRelay
from llmtasks.settings import Settings
from llmtasks.worker.runner import TaskRunner
from llmtasks_local.mock_llm import reply_text
from llmtasks_local.sam.events import pattern_matcher, stream_record
from llmtasks_local.sam.provision import local_deployment
from tests.conftest import Aws, RunningMock
from tests.helpers import (
    HANG_S,
    blobs,
    count_tasks,
    emf_records,
    eventually,
    load_event,
    replay_batch_events,
    task_lanes,
)
from tests.unit.test_api import Api, assert_problem, task_service, webhook_controls

pytestmark = pytest.mark.unit
CHUNK = 4


class Rig:
    """A batch's whole path, one step at a time: each step delivers what its queue or the
    table's stream holds to the function the template names, as Lambda would."""

    def __init__(self, aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> None:
        self.aws = aws
        self.settings = settings
        self.store = TaskStore(settings.tasks_table_name, aws.dynamodb)
        self.batches = BatchStore(settings.tasks_table_name, aws.dynamodb)
        self.fanout_queue = Queue(settings.batch_fanout_queue_url, aws.sqs)
        self.item_queue = Queue(settings.batch_task_queue_url, aws.sqs)
        assert settings.idempotency_table_name is not None
        persistence = DynamoDBPersistenceLayer(
            table_name=settings.idempotency_table_name, boto3_client=aws.dynamodb
        )
        self.service = BatchService(
            settings,
            self.store,
            self.batches,
            self.fanout_queue,
            idempotency=IdempotencyKeys(persistence, ttl_s=60),
            results=blobs(settings),
        )
        self.api = Api(
            aws,
            handler,
            task_service(aws, settings),
            batches=self.service,
            webhooks=webhook_controls(aws, settings),
        )
        self.handler = handler
        self._batch_fn, self.batch_ctx = handler("BatchFunction")
        self.lanes = task_lanes(settings, aws.sqs)
        # An OpenAI batch's output files, written as it ends, as BatchFunction is wired.
        self.ends = BatchEnds(
            self.batches, self.fanout_queue, files=OpenAIBatchFiles(self.service.outcomes).write
        )
        self.fanout = BatchFanout(
            settings,
            self.store,
            self.batches,
            self.lanes,
            ends=self.ends,
            results=blobs(settings),
            inputs=BatchInputReader(
                settings,
                self.batches,
                blobs(settings),
                self.fanout_queue,
                parsers={endpoint: line_parser(endpoint) for endpoint in ENDPOINTS},
            ),
        )
        self.progress = BatchProgress(self.batches, ends=self.ends)
        self.worker_fn, self.worker_ctx = handler("WorkerFunction")
        self.webhook_fn, self.webhook_ctx = handler("WebhookFunction")
        llm = OpenAIChat(base_url=mock_llm.url, api_key=None, default_model="mock-model")
        self.runner = TaskRunner(
            settings,
            self.store,
            self.lanes,
            llm,
            cancellations=BatchCancellations(self.batches, ttl_s=0),
            results=blobs(settings),
        )
        arn = aws.resources.attributes[("TasksTable", "StreamArn")]
        shard = aws.streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
        self._stream_arn = arn
        self._iterator = aws.streams.get_shard_iterator(
            StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]

    def submit(self, items: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        reply = self.api.call(
            "POST", "/batches", {"items": items, **fields}, headers=fields.pop("headers", None)
        )
        assert reply["statusCode"] == 202, reply
        return reply["json"]  # type: ignore[no-any-return]

    def batch_fn(self, event: dict[str, Any], context: Any) -> Any:
        """BatchFunction's handler, with this rig's collaborators."""
        return self._batch_fn(
            event,
            context,
            fanout=self.fanout,
            progress=self.progress,
            queue=self.fanout_queue,
            skips=StreamSkips(self.settings.tasks_table_name, self.aws.dynamodb),
            tally=TaskTally(TaskCounts(self.settings.tasks_table_name, self.aws.dynamodb)),
        )

    def _sqs_event(self, logical_id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        arn = self.aws.resources.attributes[(logical_id, "Arn")]
        return {"Records": [sqs_record(m, arn) for m in messages]}  # type: ignore[arg-type]

    def fan_out(self) -> list[dict[str, Any]]:
        """Every fan-out message to BatchFunction, one invocation each (BatchSize 1); returns them."""
        messages = self.aws.messages("BatchFanoutQueue")
        for message in messages:
            reply = self.batch_fn(self._sqs_event("BatchFanoutQueue", [message]), self.batch_ctx)
            assert reply == {"batchItemFailures": []}
        return messages

    def run_items(self, *, allow_retries: bool = False) -> int:
        """Every queued batch item to the worker, ten to an invocation; how many ran. A copy of a
        message whose task another holds comes back later (allow_retries)."""
        messages = self.aws.messages("BatchTaskQueue")
        for start in range(0, len(messages), 10):
            event = self._sqs_event("BatchTaskQueue", messages[start : start + 10])
            # The event's records only (the worker's refill has its own tests: test_call_slots.py).
            reply = self.worker_fn(
                event, self.worker_ctx, runner=self.runner, queue=self.item_queue, call_slots=0
            )
            assert allow_retries or reply == {"batchItemFailures": []}
        return len(messages)

    def stream(self) -> list[dict[str, Any]]:
        """The table's stream records since the last read, as Lambda hands them over."""
        records: list[dict[str, Any]] = []
        while True:
            reply = self.aws.streams.get_records(ShardIterator=self._iterator)
            self._iterator = reply["NextShardIterator"]
            if not reply["Records"]:
                return records
            records += [stream_record(dict(r), self._stream_arn) for r in reply["Records"]]

    def count(self, records: list[dict[str, Any]]) -> None:
        """Records to BatchFunction's stream source, through its filter."""
        matches = pattern_matcher(self.aws.function("BatchFunction").stream_sources[0].filter_patterns)
        chosen = [r for r in records if matches(r)]
        if chosen:
            assert self.batch_fn({"Records": chosen}, self.batch_ctx) is None

    def relay(self, records: list[dict[str, Any]]) -> list[WebhookMessage]:
        """Records to WebhookFunction's stream source; the events it queued."""
        matches = pattern_matcher(self.aws.function("WebhookFunction").stream_sources[0].filter_patterns)
        chosen = [r for r in records if matches(r)]
        if chosen:
            relay = WebhookRelay(Queue(self.settings.webhook_queue_url, self.aws.sqs))
            self.webhook_fn({"Records": chosen}, self.webhook_ctx, relay=relay)
        return [WebhookMessage.model_validate_json(m["Body"]) for m in self.aws.messages("WebhookQueue")]

    def batch(self, batch_id: str) -> Batch:
        batch = self.batches.get(batch_id, now=time.time())
        assert batch is not None
        return batch

    def full_count(self, batch: Batch) -> Counter[str]:
        """Every item's status, read one by one: what the counters must agree with."""
        tasks = self.store.get_many([batch_task_id(batch.batch_id, i) for i in range(batch.total)])
        counts: Counter[str] = Counter({status.value: 0 for status in TaskStatus})
        for index in range(batch.total):
            task = tasks.get(batch_task_id(batch.batch_id, index))
            counts[task.status.value if task else "pending"] += 1
        return counts


def counters(batch: Batch) -> Counter[str]:
    return Counter({name: getattr(batch, name) for name in ITEM_COUNTS})  # a batch item is never a run


@pytest.fixture
def rig(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> Rig:
    overrides = {"batch_chunk_size": CHUNK, "retry_base_delay_s": 0.0}
    return Rig(aws, handler, settings.model_copy(update=overrides), mock_llm)


def test_a_batch_is_accepted_whole_with_its_exact_total_before_any_task_exists(rig: Rig) -> None:
    accepted = rig.submit([{"prompt": f"q{i}", "custom_id": f"c{i}"} for i in range(10)])
    assert accepted["total"] == 10
    assert accepted["status"] == "pending"
    fanouts = [FanoutMessage.model_validate_json(m["Body"]) for m in rig.aws.messages("BatchFanoutQueue")]
    assert sorted(m.chunk for m in fanouts) == [0, 1, 2]  # 10 items, 4 a chunk
    assert rig.aws.messages("BatchTaskQueue") == []
    view = rig.api.call("GET", f"/batches/{accepted['batch_id']}")
    assert view["statusCode"] == 200
    assert {k: view["json"][k] for k in ("status", "total", "pending", "processing", "completed")} == {
        "status": "pending",
        "total": 10,
        "pending": 10,
        "processing": 0,
        "completed": 0,
    }
    # Not fanned out yet, the items read as pending, with their custom_ids, in order.
    results = rig.api.call("GET", f"/batches/{accepted['batch_id']}/results")["json"]["data"]
    assert [(r["index"], r["custom_id"], r["status"]) for r in results] == [
        (i, f"c{i}", "pending") for i in range(10)
    ]


def test_a_batch_runs_once_per_item_and_its_counts_match_a_full_count_at_every_step(
    rig: Rig, mock_llm: RunningMock
) -> None:
    batch_id = rig.submit(
        [{"prompt": f"item {i}"} for i in range(10)], webhook_url="http://127.0.0.1:9/hook"
    )["batch_id"]
    # A fan-out message delivered twice (SQS is at-least-once) creates its tasks once.
    fanouts = rig.aws.messages("BatchFanoutQueue")
    for delivered in (fanouts[:1], fanouts):
        reply = rig.batch_fn(rig._sqs_event("BatchFanoutQueue", delivered), rig.batch_ctx)
        assert reply == {"batchItemFailures": []}
    # (The second delivery sends the messages of its unclaimed tasks again, in case the first
    # died before sending them: a copy costs a redelivery, never a call.)
    assert len(rig.store.get_many([batch_task_id(batch_id, i) for i in range(10)])) == 10
    rig.run_items(allow_retries=True)
    assert mock_llm.stats.calls == 10
    records = rig.stream()
    rig.count(records)
    batch = rig.batch(batch_id)
    assert (
        counters(batch)
        == rig.full_count(batch)
        == Counter({"completed": 10, "pending": 0, "processing": 0, "failed": 0, "cancelled": 0})
    )
    assert batch.status is BatchStatus.COMPLETED
    assert batch.completed_at is not None
    # The same records again (a retried or duplicated stream batch) change nothing.
    rig.count(records)
    assert counters(rig.batch(batch_id)) == counters(batch)
    # The batch's end is on the stream too: one batch.completed event (the items have no webhooks).
    ending = rig.stream()
    events = rig.relay(records + ending)
    assert [(e.event_type, e.batch_id) for e in events] == [("batch.completed", batch_id)]
    # Its tenant may have that event sent again, under the same webhook-id
    replay = rig.api.call("POST", f"/batches/{batch_id}/webhook/replay")
    assert (replay["statusCode"], replay["json"]["webhook_id"]) == (202, events[0].webhook_id)
    results = rig.api.call("GET", f"/batches/{batch_id}/results", query="limit=3")["json"]
    assert [r["result"] for r in results["data"]] == [reply_text(f"item {i}") for i in range(3)]
    # The overview (`llmtasks stats`, the console) shows the batch ended, all ten finished
    count_tasks(rig.aws, rig.handler, rig.progress)
    [shown] = overview(rig.aws.dynamodb, rig.aws.sqs, local_deployment(rig.aws.sqs), now=time.time())[
        "batches"
    ]
    assert (shown["batch_id"], shown["status"], shown["finished"], shown["total"]) == (
        batch_id,
        "completed",
        10,
        10,
    )


def test_counts_stay_exact_when_records_come_in_pieces_and_some_are_replayed(
    rig: Rig, mock_llm: RunningMock
) -> None:
    # Given items that fail once each (a 500, retried) so each goes pending -> processing ->
    # pending -> processing -> completed, and stream records delivered piecemeal, with overlaps
    mock_llm.configure(rate_500=1.0)
    batch_id = rig.submit([{"prompt": f"x{i}", "max_retries": 2} for i in range(6)])["batch_id"]
    rig.fan_out()
    assert rig.run_items() == 6
    first = rig.stream()  # inserts, claims, releases
    mock_llm.configure()
    runs = [0]  # the retries' messages come due after their (rounded-up) delays

    def run_due() -> int:
        runs[0] += rig.run_items()
        return runs[0]

    eventually(run_due, lambda done: done >= 6, timeout_s=HANG_S, every_s=0.2, what="six retries run")
    second = rig.stream()
    every = first + second
    half = len(every) // 2
    rig.count(every[:half])
    middle = rig.batch(batch_id)
    assert sum(counters(middle).values()) == 6
    rig.count(every[half - 3 :])  # a replayed overlap, then the rest
    rig.count(every)  # and the whole again
    batch = rig.batch(batch_id)
    assert counters(batch) == rig.full_count(batch)
    assert batch.completed == 6
    assert batch.status is BatchStatus.COMPLETED


def test_a_plain_task_s_change_among_the_records_leaves_the_items_after_it_counted(rig: Rig) -> None:
    # Given a task of no batch, then a batch whose items run
    plain = rig.api.call("POST", "/tasks", {"prompt": "on its own"})["json"]["task_id"]
    batch_id = rig.submit([{"prompt": f"x{i}"} for i in range(2)])["batch_id"]
    rig.fan_out()
    assert rig.run_items() == 2
    records = rig.stream()
    matches = pattern_matcher(rig.aws.function("BatchFunction").stream_sources[0].filter_patterns)
    items = [task_change(r) for r in records if matches(r)]
    [alone] = [task_change(r) for r in records if r["dynamodb"]["Keys"]["pk"]["S"].endswith(plain)]
    # When its change comes first in what the progress is handed (the stream filter would drop it)
    watched = WatchedCounts(rig)
    BatchProgress(watched, ends=rig.ends).apply([alone, *items])
    # Then it is passed over, and the items after it are counted, in one transaction
    assert watched.transactions == 1
    batch = rig.batch(batch_id)
    assert counters(batch) == rig.full_count(batch)
    assert batch.completed == 2


def events_page(
    rig: Rig, batch_id: str, query: str = "after=0", *, tenant: str = "default"
) -> dict[str, Any]:
    reply = rig.api.call("GET", f"/batches/{batch_id}/events", query=query, tenant=tenant)
    assert reply["statusCode"] == 200, reply
    return reply["json"]  # type: ignore[no-any-return]


def test_a_batch_s_events_name_each_item_s_moves_once_in_order_with_the_counts_after_them(
    rig: Rig, mock_llm: RunningMock
) -> None:
    # Given a batch whose items ran, their records counted in pieces, some twice
    batch_id = rig.submit([{"prompt": f"e{i}", "custom_id": f"c-{i}"} for i in range(6)])["batch_id"]
    assert events_page(rig, batch_id) == {
        "batch_id": batch_id,
        "events": [],
        "after": 0,
        "final": False,
        "status": "pending",
    }
    # And past its last event, while it runs: an empty page that reads on from there, not a refusal
    assert events_page(rig, batch_id, "after=9999999") == {
        "batch_id": batch_id,
        "events": [],
        "after": 9999999,
        "final": False,
        "status": "pending",
    }
    rig.fan_out()
    rig.run_items()
    records = rig.stream()
    half = len(records) // 2
    rig.count(records[:half])
    middle = events_page(rig, batch_id)
    rig.count(records[half - 3 :])
    rig.count(records)
    # When they are read from the start, and from the middle page's end
    page = events_page(rig, batch_id)
    rest = events_page(rig, batch_id, f"after={middle['after']}")
    # Then the events are numbered from 1 on, the middle page their start, the rest their end
    events = page["events"]
    assert middle["events"] == events[: len(middle["events"])]
    assert rest["events"] == events[len(middle["events"]) :]
    # Each item's moves appear once, in the order they happened, with its index and custom_id
    moves: dict[int, list[str]] = {}
    for event in events:
        for item in event["items"]:
            assert item["custom_id"] == f"c-{item['index']}"
            assert item["task_id"] == batch_task_id(batch_id, item["index"])
            moves.setdefault(item["index"], []).append(item["status"])
    assert set(moves) == set(range(6))
    assert all(statuses in (["processing", "completed"], ["completed"]) for statuses in moves.values())
    # Each event's counts are the counts before it moved by its items; the last, the batch's
    counts, _ = replay_batch_events(events, 6)
    assert counts == dict(counters(rig.batch(batch_id)))
    # The batch ended: its page is final, and reading on from its end is an empty final page
    assert (page["final"], page["status"], page["after"]) == (True, "completed", len(events))
    assert rest["final"] is True
    end = events_page(rig, batch_id, f"after={len(events)}&wait=5")
    assert (end["events"], end["final"], end["after"]) == ([], True, len(events))
    # And so is reading on from past its end, at once (no wait held)
    started = time.monotonic()
    beyond = events_page(rig, batch_id, f"after={len(events) + 1}&wait=5")
    assert (beyond["events"], beyond["final"], beyond["after"]) == ([], True, len(events) + 1)
    assert time.monotonic() - started < 4
    # A negative, a word or a wait too long is refused; another tenant's batch is not found
    for query in ("after=-1", "after=x", "wait=26"):
        assert_problem(rig.api.call("GET", f"/batches/{batch_id}/events", query=query), 422)
    for path in (f"/batches/{batch_id}/events", f"/batches/{'f' * 32}/events", "/batches/nope/events"):
        assert_problem(rig.api.call("GET", path, tenant="someone-else"), 404)


def test_a_waiting_events_reply_is_held_until_the_batch_s_next_event(rig: Rig, mock_llm: RunningMock) -> None:
    # Given a batch whose items ran but are not counted yet, and a reader waiting on it
    batch_id = rig.submit([{"prompt": f"w{i}"} for i in range(3)])["batch_id"]
    rig.fan_out()
    rig.run_items()
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(events_page, rig, batch_id, "after=0&wait=20")
        # When the records are counted while it waits (with no event, it would have answered)
        time.sleep(1.5)
        held = not waiting.done()
        rig.count(rig.stream())
        page = waiting.result(timeout=30)
    # Then it answered after the count, with the events the count made
    assert held
    assert page["events"][0]["sequence"] == 1
    assert {item["index"] for e in page["events"] for item in e["items"]} == {0, 1, 2}


def test_a_retry_runs_the_failed_items_again_in_the_same_batch_with_exact_counts_and_a_second_webhook(
    rig: Rig, mock_llm: RunningMock
) -> None:
    # Given a batch whose four items failed (every call a 500, no retries)
    mock_llm.configure(rate_500=1.0)
    items = [{"prompt": f"again {i}", "custom_id": f"r-{i}", "max_retries": 0} for i in range(4)]
    batch_id = rig.submit(items, webhook_url="http://127.0.0.1:9/hook")["batch_id"]
    rig.fan_out()
    rig.run_items()
    first = rig.stream()
    rig.count(first)
    ended = rig.batch(batch_id)
    assert (ended.status, ended.failed) == (BatchStatus.COMPLETED_WITH_ERRORS, 4)
    # A running batch, a status nothing has, or an unknown status cannot be retried
    assert_problem(rig.api.call("POST", f"/batches/{batch_id}/retry", {"statuses": ["cancelled"]}), 409)
    assert_problem(rig.api.call("POST", f"/batches/{batch_id}/retry", {"statuses": ["completed"]}), 422)
    assert_problem(rig.api.call("POST", f"/batches/{batch_id}/retry", {"statuses": []}), 422)
    assert_problem(rig.api.call("POST", f"/batches/{batch_id}/retry", tenant="someone-else"), 404)
    assert rig.batch(batch_id) == ended  # nothing changed
    assert rig.aws.messages("BatchFanoutQueue") == []
    # When it is retried, twice under one Idempotency-Key
    key = {"Idempotency-Key": "retry-1"}
    retried = rig.api.call("POST", f"/batches/{batch_id}/retry", headers=key)
    again = rig.api.call("POST", f"/batches/{batch_id}/retry", headers=key)
    assert retried["statusCode"] == again["statusCode"] == 202
    assert again["json"] == retried["json"]
    assert again["headers"].get("Idempotent-Replayed") == "true"
    assert (retried["json"]["status"], retried["json"]["retries"]) == ("processing", 1)
    assert_problem(rig.api.call("POST", f"/batches/{batch_id}/retry"), 409)  # no key: it runs
    # Then the items go back to pending once (one fan-out message a chunk), the counts with them
    assert len(rig.fan_out()) == rig.batch(batch_id).chunks
    moved = rig.batch(batch_id)
    assert (moved.pending, moved.failed, moved.retrying) == (4, 0, 0)
    assert counters(moved) == rig.full_count(moved)
    middle = rig.stream()
    rig.count(middle)  # the stream's records of those moves are not counted twice
    assert counters(rig.batch(batch_id)) == counters(moved)
    # And they run as new attempts of the same tasks, the batch ending completed
    mock_llm.configure()
    rig.run_items()
    second = rig.stream()
    rig.count(second)
    done = rig.batch(batch_id)
    assert (done.status, done.completed, done.retries) == (BatchStatus.COMPLETED, 4, 1)
    assert counters(done) == rig.full_count(done)
    tasks = rig.store.get_many([batch_task_id(batch_id, i) for i in range(4)])
    assert {(t.attempts, t.status) for t in tasks.values()} == {(2, TaskStatus.COMPLETED)}
    assert all([a.outcome for a in t.attempt_log] == ["failed", "completed"] for t in tasks.values())
    results = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"]
    assert [(r["custom_id"], r["result"]) for r in results] == [
        (f"r-{i}", reply_text(f"again {i}")) for i in range(4)
    ]
    # Each item's moves are in the batch's events, in order; the counts add up at each
    page = events_page(rig, batch_id)
    _, last = replay_batch_events(page["events"], 4)
    assert set(last.values()) == {"completed"}
    moves = [[i["status"] for e in page["events"] for i in e["items"] if i["index"] == n] for n in range(4)]
    assert all(
        m[-3:] == ["failed", "pending", "completed"]
        or m[-4:] == ["failed", "pending", "processing", "completed"]
        for m in moves
    ), moves
    # Each end sent its own batch.completed, under a webhook-id of its own
    events = rig.relay(first + middle + second + rig.stream())
    assert [e.event_type for e in events] == ["batch.completed", "batch.completed"]
    assert events[0].webhook_id != events[1].webhook_id


def test_a_cancelled_batch_s_items_run_when_it_is_retried_with_cancelled(
    rig: Rig, mock_llm: RunningMock
) -> None:
    # Given a batch cancelled before any item ran
    batch_id = rig.submit([{"prompt": f"later {i}"} for i in range(6)])["batch_id"]
    rig.api.call("POST", f"/batches/{batch_id}/cancel")
    rig.fan_out()
    rig.run_items()
    rig.count(rig.stream())
    cancelled = rig.batch(batch_id)
    assert (cancelled.status, cancelled.cancelled, mock_llm.stats.calls) == (BatchStatus.CANCELLED, 6, 0)
    assert_problem(rig.api.call("POST", f"/batches/{batch_id}/retry"), 409)  # none failed
    # When it is retried with its cancelled items
    reply = rig.api.call("POST", f"/batches/{batch_id}/retry", {"statuses": ["cancelled", "failed"]})
    assert reply["statusCode"] == 202
    rig.fan_out()
    rig.run_items()
    rig.count(rig.stream())
    # Then each ran once, and the batch ends completed
    done = rig.batch(batch_id)
    assert (done.status, done.completed, mock_llm.stats.calls) == (BatchStatus.COMPLETED, 6, 6)
    assert counters(done) == rig.full_count(done)


class RacingCounts(BatchStore):
    """The batch store, where another counter's transaction lands between this one's read of the
    batch and its own transaction, once."""

    def __init__(self, rig: Rig, other: list[CountedChange]) -> None:
        super().__init__(rig.settings.tasks_table_name, rig.aws.dynamodb)
        self._other = other
        self.events_read = 0

    def _counted_event(self, batch_id: str, changes: list[CountedChange], delta: Any, *, now: float) -> Any:
        actions = super()._counted_event(batch_id, changes, delta, now=now)
        self.events_read += 1
        if self._other:
            other, self._other = self._other, []
            BatchStore(self.table_name, self._client).count_changes(batch_id, other, now=now)
        return actions


def test_two_counters_of_one_batch_at_once_number_their_events_apart_with_exact_counts(rig: Rig) -> None:
    # Given a batch's two items, each counted by its own counter, the second landing between the
    # first's read of the batch and its transaction
    batch_id = rig.submit([{"prompt": f"r{i}"} for i in range(2)])["batch_id"]
    expires = rig.batch(batch_id).expires_at

    def started(index: int) -> CountedChange:
        task_id = batch_task_id(batch_id, index)
        return CountedChange(task_id, 0, 1, TaskStatus.PENDING, TaskStatus.PROCESSING, expires, index=index)

    racing = RacingCounts(rig, [started(1)])
    with pytest.raises(CountsRefused) as refused:
        racing.count_changes(batch_id, [started(0)], now=time.time())
    assert refused.value.conflict
    assert not refused.value.batch_gone
    # When the first tries again, as BatchProgress does after a conflict
    racing.count_changes(batch_id, [started(0)], now=time.time())
    assert racing.events_read == 2
    # Then each landed once as its own event, numbered apart, each with the counts after it
    page = events_page(rig, batch_id)
    assert [(e["sequence"], [i["index"] for i in e["items"]]) for e in page["events"]] == [(1, [1]), (2, [0])]
    assert [e["counts"]["processing"] for e in page["events"]] == [1, 2]
    assert [e["counts"]["pending"] for e in page["events"]] == [1, 0]
    batch = rig.batch(batch_id)
    assert (batch.pending, batch.processing, batch.events) == (0, 2, 2)


class WatchedCounts(BatchStore):
    """The batch store, with its count transactions and its reads of counted marks counted; its
    first `conflicts` transactions meet another one (DynamoDB's TransactionConflict)."""

    def __init__(self, rig: Rig, *, conflicts: int = 0) -> None:
        super().__init__(rig.settings.tasks_table_name, rig.aws.dynamodb)
        self.transactions = self.mark_reads = 0
        self._conflicts = conflicts

    def count_changes(self, batch_id: str, changes: list[CountedChange], *, now: float) -> None:
        self.transactions += 1
        if self._conflicts:
            self._conflicts -= 1
            raise CountsRefused({}, conflict=True, batch_gone=False)
        super().count_changes(batch_id, changes, now=now)

    def counted_revision(self, task_id: str) -> int | None:
        self.mark_reads += 1
        return super().counted_revision(task_id)


class RefusalsWithoutItems(WatchedCounts):
    """A refused count as DynamoDB may report it: the reasons without the items they refused
    (a cancellation reason carries the item only when the transaction asked for it)."""

    @staticmethod
    def _refusal(changes: list[CountedChange], exc: ClientError) -> CountsRefused:
        told = BatchStore._refusal(changes, exc)
        return CountsRefused(dict.fromkeys(told.counted), conflict=told.conflict, batch_gone=told.batch_gone)


def counted_batch(rig: Rig, items: int) -> tuple[str, list[dict[str, Any]]]:
    """A batch whose items ran, counted to its end; its id and the stream records counted."""
    batch_id = rig.submit([{"prompt": f"x{i}"} for i in range(items)])["batch_id"]
    rig.fan_out()
    assert rig.run_items() == items
    records = rig.stream()
    rig.count(records)
    assert rig.batch(batch_id).completed == items
    return batch_id, records


def test_a_replay_is_refused_by_the_marks_it_finds_without_reading_them_again(rig: Rig) -> None:
    batch_id, records = counted_batch(rig, 3)
    watched = WatchedCounts(rig)
    rig.progress = BatchProgress(watched, ends=rig.ends)
    rig.count(records)
    # One refused transaction, whose reasons hold each mark's revision: nothing more is read
    assert (watched.transactions, watched.mark_reads) == (1, 0)
    assert rig.batch(batch_id).completed == 3


def test_counts_that_meet_another_transaction_back_off_and_apply(rig: Rig) -> None:
    batch_id = rig.submit([{"prompt": f"x{i}"} for i in range(2)])["batch_id"]
    rig.fan_out()
    assert rig.run_items() == 2
    slept: list[float] = []
    watched = WatchedCounts(rig, conflicts=2)
    rig.progress = BatchProgress(watched, ends=rig.ends, sleep=slept.append)
    rig.count(rig.stream())
    # Two conflicts, each waited out longer than the one before (0.05 s, doubled), then applied
    assert slept == pytest.approx([0.05, 0.1])
    assert watched.transactions == 3
    batch = rig.batch(batch_id)
    assert counters(batch) == rig.full_count(batch)
    assert batch.completed == 2


def test_a_replay_whose_refusal_names_no_revision_reads_what_the_counters_include(
    rig: Rig, mock_llm: RunningMock
) -> None:
    # Given a batch counted to its end
    batch_id, records = counted_batch(rig, 3)
    # When its records come again and each refusal leaves out the revision it holds
    watched = RefusalsWithoutItems(rig)
    rig.progress = BatchProgress(watched, ends=rig.ends)
    rig.count(records)
    # Then the progress reads each task's counted revision itself, and counts nothing twice
    assert watched.mark_reads == 3
    batch = rig.batch(batch_id)
    assert counters(batch) == rig.full_count(batch)
    assert (batch.completed, batch.status) == (3, BatchStatus.COMPLETED)


def test_a_cancelled_batch_cancels_its_pending_items_and_those_not_yet_fanned_out(
    rig: Rig, mock_llm: RunningMock
) -> None:
    batch_id = rig.submit([{"prompt": f"c{i}"} for i in range(10)])["batch_id"]
    # One chunk fanned out and run, one fanned out and waiting, one not fanned out at all.
    fanouts = rig.aws.messages("BatchFanoutQueue")
    by_chunk = {FanoutMessage.model_validate_json(m["Body"]).chunk: m for m in fanouts}
    rig.batch_fn(rig._sqs_event("BatchFanoutQueue", [by_chunk[0]]), rig.batch_ctx)
    assert rig.run_items() == 4
    rig.batch_fn(rig._sqs_event("BatchFanoutQueue", [by_chunk[1]]), rig.batch_ctx)
    reply = rig.api.call("POST", f"/batches/{batch_id}/cancel")
    assert reply["statusCode"] == 200
    assert reply["json"]["status"] == "cancelling"
    assert rig.api.call("POST", f"/batches/{batch_id}/cancel")["json"]["status"] == "cancelling"
    # The cancel sweep, then the late fan-out of the last chunk.
    rig.fan_out()
    rig.batch_fn(rig._sqs_event("BatchFanoutQueue", [by_chunk[2]]), rig.batch_ctx)
    # The waiting items' messages find them cancelled: no call.
    rig.run_items()
    assert mock_llm.stats.calls == 4
    rig.count(rig.stream())
    batch = rig.batch(batch_id)
    assert counters(batch) == rig.full_count(batch)
    assert (batch.completed, batch.cancelled, batch.pending) == (4, 6, 0)
    assert batch.status is BatchStatus.CANCELLED
    assert_problem(rig.api.call("POST", f"/batches/{batch_id}/cancel"), 409)
    # The sweep told each item's output readers (their head says cancelled); an item created
    # cancelled had none: it was not there to read before.
    heads = {i: rig.store.output.head(batch_task_id(batch_id, i)) for i in range(10)}
    swept = {i for i, head in heads.items() if head is not None and head.status is TaskStatus.CANCELLED}
    assert swept == {4, 5, 6, 7}
    assert {i for i, head in heads.items() if head is not None and head.ended} == set(range(8))


def test_a_worker_runs_no_item_of_a_batch_being_cancelled_even_before_the_sweep(
    rig: Rig, mock_llm: RunningMock, capsys: pytest.CaptureFixture[str]
) -> None:
    batch_id = rig.submit([{"prompt": f"w{i}"} for i in range(4)])["batch_id"]
    rig.fan_out()
    assert rig.api.call("POST", f"/batches/{batch_id}/cancel")["statusCode"] == 200
    capsys.readouterr()
    assert rig.run_items() == 4  # before the cancel sweep's messages are handled
    assert mock_llm.stats.calls == 0
    # Each counted cancelled by the worker, with a task's dimensions as every task metric
    model = rig.settings.llm_model
    cancelled = emf_records(capsys.readouterr().out)["TasksCancelled"]
    assert cancelled == [{"service": "llmtasks", "model": model, "priority": "normal", "value": 1}] * 4
    tasks = rig.store.get_many([batch_task_id(batch_id, i) for i in range(4)])
    assert {task.status for task in tasks.values()} == {TaskStatus.CANCELLED}
    rig.fan_out()  # the sweep now finds nothing left to cancel
    rig.count(rig.stream())
    batch = rig.batch(batch_id)
    assert (batch.cancelled, batch.status) == (4, BatchStatus.CANCELLED)


def test_the_same_batch_sent_twice_with_one_idempotency_key_fans_out_once(rig: Rig) -> None:
    items = [{"prompt": f"same {i}"} for i in range(5)]
    first = rig.api.call("POST", "/batches", {"items": items}, headers={"Idempotency-Key": "k1"})
    again = rig.api.call("POST", "/batches", {"items": items}, headers={"Idempotency-Key": "k1"})
    assert first["json"]["batch_id"] == again["json"]["batch_id"]
    assert again["headers"].get("Idempotent-Replayed") == "true"
    assert len(rig.aws.messages("BatchFanoutQueue")) == 2  # 5 items, 4 a chunk: sent once
    other = rig.api.call("POST", "/batches", {"items": items[:1]}, headers={"Idempotency-Key": "k1"})
    assert_problem(other, 422)


def test_fanned_out_items_count_as_submitted_tasks_by_model_and_priority(
    rig: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    items = [{"prompt": f"item {i}", **({"model": "big"} if i % 2 else {})} for i in range(5)]
    rig.submit(items)
    capsys.readouterr()
    rig.fan_out()
    submitted = emf_records(capsys.readouterr().out)["TasksSubmitted"]
    by_model = Counter[str]()
    for record in submitted:
        by_model[record["model"]] += record["value"]
    assert by_model == {"big": 2, rig.settings.llm_model: 3}


def test_a_batch_s_trace_header_rides_on_its_fan_out_and_on_every_item(rig: Rig) -> None:
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"
    reply = rig.api.call(
        "POST",
        "/batches",
        {"items": [{"prompt": f"traced {i}"} for i in range(5)]},
        headers={"x-amzn-trace-id": header},
    )
    batch_id = reply["json"]["batch_id"]
    fanout = rig.fan_out()
    assert {m["Attributes"]["AWSTraceHeader"] for m in fanout} == {header}
    items = rig.aws.messages("BatchTaskQueue")
    assert len(items) == 5
    assert {m["Attributes"]["AWSTraceHeader"] for m in items} == {header}
    task = rig.store.get(batch_task_id(batch_id, 0), now=time.time())
    assert task is not None
    assert task.trace_header == header


def test_a_submit_retried_after_its_key_record_lapsed_finds_the_batch_it_began(rig: Rig) -> None:
    # The batch id follows from the tenant and the key, so even without the key's record (its
    # TTL passed, or the first request died before storing it) the same batch comes back.
    items = [{"prompt": "once"}]
    first = rig.api.call("POST", "/batches", {"items": items}, headers={"Idempotency-Key": "k2"})
    table = rig.settings.idempotency_table_name
    for record in rig.aws.dynamodb.scan(TableName=table)["Items"]:
        rig.aws.dynamodb.delete_item(TableName=table, Key={"id": record["id"]})
    again = rig.api.call("POST", "/batches", {"items": items}, headers={"Idempotency-Key": "k2"})
    assert again["json"]["batch_id"] == first["json"]["batch_id"]
    assert again["json"]["created_at"] == first["json"]["created_at"]
    rig.fan_out()  # its fan-out message, sent by both submits, makes one task
    named = {m["Body"] for m in rig.aws.messages("BatchTaskQueue")}
    assert named == {f'{{"task_id":"{batch_task_id(again["json"]["batch_id"], 0)}"}}'}


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"items": []}, 422, "items"),
        ({"items": [{"prompt": "a"}] * (MAX_BATCH_ITEMS + 1)}, 422, "items"),
        ({"items": [{"prompt": "a"}], "input_file_id": "file-" + "0" * 32}, 422, "body"),
        ({"input_file_id": "file-nope"}, 422, "input_file_id"),
        ({"input_file_id": "file-" + "0" * 32}, 404, None),
        ({"items": [{"prompt": "a", "webhook_url": "https://x.example"}]}, 422, "items.0.webhook_url"),
        ({"items": [{"prompt": "a", "custom_id": "d"}, {"prompt": "b", "custom_id": "d"}]}, 422, "items"),
        ({"items": [{"messages": []}]}, 422, "items.0.messages"),
        ({"items": [{"prompt": "a"}], "webhook_events": ["batch.completed"]}, 422, "body"),
        ({"items": [{"prompt": "a"}], "webhook_url": "https://10.0.0.1/h"}, 422, "webhook_url"),
        ({"items": [{"prompt": "a", "metadata": {"k": "v" * 3000}}]}, 422, "items[0].metadata"),
        ({"items": [{"prompt": "a" * 300_000}]}, 413, None),
    ],
)
def test_bad_batches_are_refused_and_change_nothing(
    rig: Rig, body: dict[str, Any], status: int, field: str | None
) -> None:
    problem = assert_problem(rig.api.call("POST", "/batches", body), status)
    if field is not None:
        assert any(e["field"].startswith(field) for e in problem["errors"]), problem
    assert rig.aws.messages("BatchFanoutQueue") == []


def test_a_batch_lists_its_items_among_the_tenants_tasks_but_not_itself(rig: Rig) -> None:
    batch_id = rig.submit([{"prompt": f"listed {i}"} for i in range(3)])["batch_id"]
    rig.fan_out()
    listed = rig.api.call("GET", "/tasks", query="limit=10")
    assert listed["statusCode"] == 200, listed
    assert sorted(task["batch_id"] for task in listed["json"]["data"]) == [batch_id] * 3


def test_a_fan_out_queue_that_refuses_is_a_503_and_no_batch_exists(
    aws: Aws, handler: Any, settings: Settings
) -> None:
    # The submit sequence tasks share (services/submits.py): an outage says nothing was kept.
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    gone = Queue(settings.batch_fanout_queue_url + "-gone", aws.sqs)
    batches = BatchStore(settings.tasks_table_name, aws.dynamodb)
    service = BatchService(settings, store, batches, gone, results=blobs(settings))
    api = Api(aws, handler, task_service(aws, settings), batches=service)
    reply = api.call("POST", "/batches", {"items": [{"prompt": "a"}, {"prompt": "b"}]})
    problem = assert_problem(reply, 503)
    assert problem["detail"] == "The batch could not be stored or queued; nothing was kept. Retry."
    assert reply["headers"]["Retry-After"] == "1"
    assert aws.dynamodb.scan(TableName=settings.tasks_table_name)["Count"] == 0


def test_another_tenants_or_an_unknown_batch_is_404(rig: Rig) -> None:
    batch_id = rig.submit([{"prompt": "mine"}])["batch_id"]
    for path in (f"/batches/{'f' * 32}", "/batches/not-an-id", f"/batches/{'f' * 32}/results"):
        assert_problem(rig.api.call("GET", path), 404)
    assert_problem(rig.api.call("POST", f"/batches/{'f' * 32}/cancel"), 404)
    service = BatchService(
        rig.settings, rig.store, rig.batches, rig.fanout_queue, results=blobs(rig.settings)
    )
    assert service.get("default", batch_id).batch_id == batch_id
    for action in (service.get, service.cancel):
        with pytest.raises(BatchNotFound):
            action("someone-else", batch_id)


def test_results_page_in_submission_order_and_as_json_lines(rig: Rig) -> None:
    batch_id = rig.submit([{"prompt": f"r{i}", "custom_id": f"id-{i}"} for i in range(7)])["batch_id"]
    rig.fan_out()
    rig.run_items()
    seen: list[str] = []
    cursor = None
    while True:
        query = "limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = rig.api.call("GET", f"/batches/{batch_id}/results", query=query)["json"]
        seen += [r["custom_id"] for r in page["data"]]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    assert seen == [f"id-{i}" for i in range(7)]
    lines = rig.api.call("GET", f"/batches/{batch_id}/results", query="format=jsonl&limit=5")
    assert lines["headers"]["Content-Type"] == "application/jsonl"
    assert lines["body"].count("\n") == 5
    assert 'rel="next"' in lines["headers"]["Link"]
    foreign = rig.api.call("GET", f"/batches/{batch_id}/results", query="cursor=bm90LWEtY3Vyc29y")
    assert_problem(foreign, 422)  # off the cursor's pattern
    # A cursor is an item's index: from any, the page goes on from there; past the last, none
    from_five = rig.api.call("GET", f"/batches/{batch_id}/results", query="cursor=5")["json"]
    assert ([r["custom_id"] for r in from_five["data"]], from_five["next_cursor"]) == (["id-5", "id-6"], None)
    past = rig.api.call("GET", f"/batches/{batch_id}/results", query="cursor=99")["json"]
    assert (past["data"], past["next_cursor"]) == ([], None)


def test_a_batch_fan_out_message_without_its_batch_waits_then_is_dropped(rig: Rig) -> None:
    fanout = BatchFanout(
        rig.settings, rig.store, rig.batches, rig.lanes, ends=rig.ends, results=blobs(rig.settings)
    )
    message = FanoutMessage(batch_id="e" * 32, chunk=0)
    with pytest.raises(RetryLater):
        fanout.handle(message, sent_at=time.time())
    fanout.handle(message, sent_at=time.time() - rig.settings.unwritten_task_grace_s - 1)
    assert rig.aws.messages("BatchTaskQueue") == []


def test_the_sample_events_drive_the_batch_function(rig: Rig) -> None:
    """events/submit_batch.json, batch_fanout.json and batch_stream.json (for `sam local invoke`
    too) name one batch and its first item: submitted, fanned out, counted."""
    submitted = load_event("submit_batch.json")
    reply = rig.api.submit_fn(submitted, rig.api.submit_ctx, service=rig.api.service, batches=rig.service)
    assert reply["statusCode"] == 202
    sample_id = load_event("batch_fanout.json")["Records"][0]["body"]
    # The sample's batch id is fixed; this submit's is random: point the sample at it.
    batch_id = json.loads(reply["body"])["batch_id"]
    fanout = load_event("batch_fanout.json")
    fanout["Records"][0]["body"] = sample_id.replace(json.loads(sample_id)["batch_id"], batch_id)
    fanout["Records"][0]["attributes"]["SentTimestamp"] = str(int(time.time() * 1000))
    assert rig.batch_fn(fanout, rig.batch_ctx) == {"batchItemFailures": []}
    assert len(rig.aws.messages("BatchTaskQueue")) == 2
    stream = load_event("batch_stream.json")
    record = stream["Records"][0]
    task_id = batch_task_id(batch_id, 0)
    for image in ("NewImage", "OldImage"):
        record["dynamodb"][image]["batch_id"] = {"S": batch_id}
        record["dynamodb"][image]["task_id"] = {"S": task_id}
        record["dynamodb"][image]["pk"] = {"S": f"task#{task_id}"}
    assert pattern_matcher(rig.aws.function("BatchFunction").stream_sources[0].filter_patterns)(record)
    assert rig.batch_fn(stream, rig.batch_ctx) is None
    batch = rig.batch(batch_id)
    # The sample is the item's claim: one item moves from pending to processing.
    assert (batch.pending, batch.processing, batch.completed) == (1, 1, 0)


def test_the_counter_passes_over_foreign_records_names_its_own_that_holds_the_shard_and_skips_it_when_told(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    # SAM's generic stream sample (another table's items): nothing to count, nothing failed
    assert rig.batch_fn(load_event("foreign_stream.json"), rig.batch_ctx) is None
    # A batch item's record that cannot be read: the invocation fails (the stream retries it, and
    # the shard waits), and each round says which record in one line
    stream = load_event("batch_stream.json")
    [record] = stream["Records"]
    record["dynamodb"]["NewImage"]["status"] = {"S": "exploded"}
    with caplog.at_level(logging.ERROR, logger="llmtasks"), pytest.raises(ValueError, match="status"):
        rig.batch_fn(stream, rig.batch_ctx)
    [line] = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "llmtasks"]
    assert line.getMessage() == "stream record unreadable; its shard waits on it"
    assert line.sequence_number == record["dynamodb"]["SequenceNumber"]  # type: ignore[attr-defined]
    assert line.key == record["dynamodb"]["Keys"]  # type: ignore[attr-defined]
    assert "status" in line.error  # type: ignore[attr-defined]
    # When an operator marks it to be skipped (`llmtasks streams skip`), the next round passes it
    # over and says so, with the operator's reason
    skips = StreamSkips(rig.settings.tasks_table_name, rig.aws.dynamodb)
    skips.mark(record["dynamodb"]["SequenceNumber"], reason="written by the 1.4 bug", now=time.time())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="llmtasks"):
        assert rig.batch_fn(stream, rig.batch_ctx) is None
    [skipped] = [r for r in caplog.records if r.name == "llmtasks"]
    assert skipped.getMessage() == "stream record skipped, as an operator asked"
    assert skipped.reason == "written by the 1.4 bug"  # type: ignore[attr-defined]
    assert skipped.sequence_number == record["dynamodb"]["SequenceNumber"]  # type: ignore[attr-defined]


def test_a_batch_s_webhook_attempts_and_replay_are_its_tenant_s_alone(rig: Rig) -> None:
    batch_id = rig.submit([{"prompt": "a"}], webhook_url="http://127.0.0.1:9/hook")["batch_id"]
    reply = rig.api.call("GET", f"/batches/{batch_id}/webhook/attempts")
    assert (reply["statusCode"], reply["json"]) == (200, {"data": [], "next_cursor": None})
    assert (
        rig.api.call("GET", f"/batches/{batch_id}/webhook/attempts", tenant="intruder")["statusCode"] == 404
    )
    pending = rig.api.call("POST", f"/batches/{batch_id}/webhook/replay")
    assert (pending["statusCode"], pending["json"]["detail"]) == (
        409,
        f"Batch '{batch_id}' is pending: its event is sent when it ends.",
    )
    assert rig.api.call("POST", f"/batches/{batch_id}/webhook/replay", tenant="intruder")["statusCode"] == 404
