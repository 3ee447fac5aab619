"""An invocation keeps its call slots full from its own queue (call_slots.py): against moto's SQS,
with recorded handlers, then through the worker with the mock LLM over HTTP."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from llmtasks.aws.queues import Queue
from llmtasks.domain.errors import RetryLater
from llmtasks.domain.models import TaskStatus
from llmtasks.records import sqs_record
from llmtasks.worker.call_slots import (
    RECHECK_S,
    CallSlots,
    QueueLooks,
    TakenRecord,
    keep_slots_full,
    run_in_lambda_loop,
)
from tests.conftest import Aws, RunningMock
from tests.unit.test_worker import Worker

pytestmark = pytest.mark.unit


class Context:
    """Lambda's context with a fixed time left."""

    def __init__(self, remaining_s: float) -> None:
        self.remaining_s = remaining_s

    def get_remaining_time_in_millis(self) -> int:
        return int(self.remaining_s * 1000)


# Longer than call_slots.RECHECK_S: an invocation whose calls last this long refills.
LONG_S = 1.2


class Recorder:
    """A record handler: counts what it runs and how many at once; `behave` picks an outcome.
    The bodies in `long` take LONG_S, the others `pause_s`."""

    def __init__(
        self,
        pause_s: float = 0.05,
        behave: Any = None,
        long: tuple[str, ...] = (),
        pauses: dict[str, float] | None = None,
    ) -> None:
        self.pause_s = pause_s
        self.long = long
        self.pauses = pauses or {}  # a call's time by body, for calls of other lengths
        self.behave = behave or (lambda _body: None)
        self.ran: Counter[str] = Counter()
        self.taken: set[str] = set()  # the bodies handed over as received by the invocation itself
        self.sources: set[str] = set()  # the queues their records name, as the event source's do
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, record: SQSRecord) -> None:
        self.ran[record.body] += 1
        if isinstance(record, TakenRecord):
            self.taken.add(record.body)
            self.sources.add(record.event_source_arn)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            pause = LONG_S if record.body in self.long else self.pauses.get(record.body, self.pause_s)
            await asyncio.sleep(pause)  # a call's time
            self.behave(record.body)
        finally:
            self.in_flight -= 1


@pytest.fixture
def queue(aws: Aws) -> Queue:
    return Queue(aws.queue_url("TaskQueue"), aws.sqs)


def send(queue: Queue, *bodies: str) -> None:
    for body in bodies:
        queue._client.send_message(QueueUrl=queue.url, MessageBody=body)


def event_of(aws: Aws, count: int) -> dict[str, Any]:
    """The event the event source would hand over: `count` messages received from TaskQueue."""
    arn = aws.resources.attributes[("TaskQueue", "Arn")]
    messages = aws.sqs.receive_message(
        QueueUrl=aws.queue_url("TaskQueue"), MaxNumberOfMessages=count, MessageSystemAttributeNames=["All"]
    )["Messages"]
    assert len(messages) == count
    return {"Records": [sqs_record(m, arn) for m in messages]}


def in_queue(aws: Aws) -> dict[str, str]:
    attributes = aws.sqs.get_queue_attributes(
        QueueUrl=aws.queue_url("TaskQueue"),
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return {
        "visible": attributes["ApproximateNumberOfMessages"],
        "in flight": attributes["ApproximateNumberOfMessagesNotVisible"],
    }


def test_an_invocation_runs_what_waits_in_the_queue_at_most_its_slots_at_once(aws: Aws, queue: Queue) -> None:
    send(queue, *(f"m{i}" for i in range(22)))
    event = event_of(aws, 2)
    recorder = Recorder(long=("m0", "m1"))  # the event's two outlast a second
    receives: list[dict[str, Any]] = []
    aws.sqs.meta.events.register(
        "provide-client-params.sqs.ReceiveMessage", lambda params, **_: receives.append(dict(params))
    )
    reply = keep_slots_full(event, Context(900), recorder, CallSlots(queue, slots=5, min_remaining_s=610))
    # Short receives only: a long poll still waiting after the last call would bill its wait.
    assert receives
    assert {r["WaitTimeSeconds"] for r in receives} == {0}
    assert max(r["MaxNumberOfMessages"] for r in receives) <= 5
    assert reply == {"batchItemFailures": []}
    assert recorder.ran == Counter({f"m{i}": 1 for i in range(22)})  # each once, the event's two too
    # The handler knows which it was handed on the promise of a whole call's time
    assert recorder.taken == {f"m{i}" for i in range(2, 22)}
    assert recorder.sources == {aws.resources.attributes[("TaskQueue", "Arn")]}  # shaped as Lambda's
    assert recorder.most_in_flight == 5
    # What it received, it deleted; the event's two are the event source's to delete.
    assert in_queue(aws) == {"visible": "0", "in flight": "2"}


def test_an_invocation_whose_time_left_cannot_hold_a_whole_call_takes_nothing_more(
    aws: Aws, queue: Queue
) -> None:
    send(queue, *(f"m{i}" for i in range(5)))
    event = event_of(aws, 2)
    recorder = Recorder(long=("m0", "m1"))
    reply = keep_slots_full(event, Context(609), recorder, CallSlots(queue, slots=10, min_remaining_s=610))
    assert reply == {"batchItemFailures": []}
    assert sum(recorder.ran.values()) == 2  # the event's records only
    # The event's two are the event source's to delete; the rest wait for another invocation.
    assert in_queue(aws) == {"visible": "3", "in flight": "2"}
    # One whose time left holds a whole call exactly takes them
    event = event_of(aws, 1)
    again = Recorder(long=("m2", "m3", "m4"))
    keep_slots_full(event, Context(610), again, CallSlots(queue, slots=10, min_remaining_s=610))
    assert sum(again.ran.values()) == 3


def test_calls_shorter_than_a_second_leave_the_queue_to_the_event_source(aws: Aws, queue: Queue) -> None:
    """Short calls gain nothing from a refill: the invocation ends with its batch, having made no
    receive (the event source's next batch costs what this one did)."""
    send(queue, *(f"m{i}" for i in range(5)))
    event = event_of(aws, 2)
    receives: list[str] = []
    aws.sqs.meta.events.register("provide-client-params.sqs.ReceiveMessage", lambda **_: receives.append("r"))
    # Calls of different lengths, each under a second: one ends while the other still runs
    recorder = Recorder(pauses={f"m{i}": 0.1 + 0.15 * i for i in range(5)})
    keep_slots_full(event, Context(900), recorder, CallSlots(queue, slots=10, min_remaining_s=610))
    assert sum(recorder.ran.values()) == 2
    assert receives == []
    assert in_queue(aws) == {"visible": "3", "in flight": "2"}


def test_a_message_that_arrives_while_calls_run_starts_in_the_same_invocation(aws: Aws, queue: Queue) -> None:
    send(queue, "first")
    event = event_of(aws, 1)

    def behave(body: str) -> None:
        if body == "first":
            send(queue, "late")  # sent while this invocation still runs a call

    recorder = Recorder(behave=behave, long=("first",))
    keep_slots_full(event, Context(900), recorder, CallSlots(queue, slots=10, min_remaining_s=610))
    assert recorder.ran == Counter({"first": 1, "late": 1})
    assert in_queue(aws) == {"visible": "0", "in flight": "1"}  # the event's, for the event source


def test_own_messages_follow_the_event_source_s_rules_when_they_fail(aws: Aws, queue: Queue) -> None:
    """An event record that fails is reported; a message the invocation took itself is not
    (Lambda would not know it), it is left in flight to come back after the visibility timeout,
    or after RetryLater's delay."""
    send(queue, "event-fails")
    event = event_of(aws, 1)
    send(queue, "crashes", "later", "fine")

    def behave(body: str) -> None:
        if body in ("event-fails", "crashes"):
            raise RuntimeError("injected")
        if body == "later":
            raise RetryLater(1, "not yet")

    recorder = Recorder(behave=behave, long=("event-fails",))
    reply = keep_slots_full(event, Context(900), recorder, CallSlots(queue, slots=10, min_remaining_s=610))
    assert reply == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["messageId"]}]}
    # "later" may come back within this invocation once its second passes: at least once, then again.
    assert recorder.ran["crashes"] == recorder.ran["fine"] == 1
    left = {m["Body"]: m for m in aws.messages("TaskQueue", wait_s=2)}
    assert "later" in left  # visible again after its delay, not after the queue's hours
    assert "fine" not in left
    assert "crashes" not in left
    in_flight = in_queue(aws)["in flight"]
    assert int(in_flight) == 3  # event-fails (the event source's), crashes, and later received just now


def test_a_copy_of_a_message_running_here_is_not_run_twice(aws: Aws, queue: Queue) -> None:
    send(queue, "once")
    event = event_of(aws, 1)
    receipt = event["Records"][0]["receiptHandle"]
    # At-least-once delivery: the same message visible again while this invocation runs it.
    aws.sqs.change_message_visibility(QueueUrl=queue.url, ReceiptHandle=receipt, VisibilityTimeout=0)
    send(queue, "another")  # and one more behind it, which the same receive takes
    recorder = Recorder(long=("once",))
    keep_slots_full(event, Context(900), recorder, CallSlots(queue, slots=10, min_remaining_s=610))
    assert recorder.ran == Counter({"once": 1, "another": 1})


def test_a_queue_that_cannot_be_read_still_lets_the_event_s_records_finish(aws: Aws) -> None:
    gone = Queue(aws.queue_url("TaskQueue") + "-gone", aws.sqs)
    send(Queue(aws.queue_url("TaskQueue"), aws.sqs), "a", "b")
    event = event_of(aws, 2)
    receives: list[str] = []
    aws.sqs.meta.events.register("provide-client-params.sqs.ReceiveMessage", lambda **_: receives.append("r"))
    # Calls well past the first second: the invocation tries to refill, and after its failed
    # receive it tries no other
    recorder = Recorder(pauses={"a": 2.5, "b": 2.5})
    reply = keep_slots_full(event, Context(900), recorder, CallSlots(gone, slots=10, min_remaining_s=610))
    assert reply == {"batchItemFailures": []}
    assert recorder.ran == Counter({"a": 1, "b": 1})
    assert receives == ["r"]


def test_while_calls_run_an_empty_queue_is_looked_at_once_a_second(aws: Aws, queue: Queue) -> None:
    send(queue, "alone")
    event = event_of(aws, 1)
    receives: list[str] = []
    aws.sqs.meta.events.register("provide-client-params.sqs.ReceiveMessage", lambda **_: receives.append("r"))
    keep_slots_full(event, Context(900), Recorder(pauses={"alone": 3.5}), CallSlots(queue, 10, 610))
    # From the first second on, once a second while the call runs, and once as it ends: about
    # four; a loop that looked on every turn would make hundreds (real time is the point here:
    # the spacing is in seconds of the invocation's clock)
    assert 2 <= len(receives) <= 6


# When an invocation looks at its queue, at set times on its loop's clock (it began at 100)
T0 = 100.0


def looks(**state: Any) -> QueueLooks:
    return QueueLooks(started=T0, **state)


@pytest.mark.parametrize(
    ("state", "now", "due"),
    [
        ({}, T0, False),  # the event source has just looked
        ({}, T0 + RECHECK_S - 0.01, False),
        ({}, T0 + RECHECK_S, True),  # the first look, a RECHECK_S in
        ({"received_at": T0 + 1.5}, T0 + 1.5 + RECHECK_S - 0.01, False),  # looked just now
        ({"received_at": T0 + 1.5}, T0 + 1.5 + RECHECK_S, True),  # and again a RECHECK_S on
        ({"received_at": T0 + 1.5, "call_ended": True}, T0 + 1.6, True),  # at once as a call ends
        ({"call_ended": True}, T0 + 0.5, False),  # but never in the first RECHECK_S
    ],
)
def test_the_queue_is_due_a_look_a_second_in_then_each_second_and_as_calls_end(
    state: dict[str, Any], now: float, due: bool
) -> None:
    assert looks(**state).due(now) is due


@pytest.mark.parametrize(
    ("state", "now", "running", "finished"),
    [
        ({}, T0 + 0.5, {}, True),  # calls shorter than a RECHECK_S: the event source serves more
        ({}, T0 + 0.5, {"call": 1}, False),
        ({}, T0 + 5, {}, False),  # calls that ran long, the queue never looked at: one look
        ({"drained": True}, T0 + 5, {}, True),  # the last look found nothing
        ({"drained": True, "call_ended": True}, T0 + 5, {}, False),  # a call ended since: once more
        ({"drained": False}, T0 + 5, {}, False),  # the last look found work: again
        ({"drained": True}, T0 + 5, {"call": 1}, False),  # calls running: never done
    ],
)
def test_an_invocation_is_done_when_no_call_runs_and_the_queue_has_nothing_more(
    state: dict[str, Any], now: float, running: dict[str, int], finished: bool
) -> None:
    assert looks(**state).finished(now, running) is finished


@pytest.mark.parametrize(
    ("state", "now", "free", "wait"),
    [
        ({}, T0, 1, RECHECK_S),  # one free slot is enough to look
        ({}, T0 + 0.25, 3, RECHECK_S - 0.25),  # the first look's time, counted from the start
        ({"received_at": T0 + 2}, T0 + 2.5, 3, RECHECK_S - 0.5),  # then from the last look
        ({"received_at": T0 + 2}, T0 + 4, 3, 0.0),  # overdue: at once, never a wait below zero
        ({}, T0, 0, None),  # no free slot: wait for a call to end, however long
        ({"received_at": T0 + 2, "receiving": True}, T0 + 4, 3, None),  # or for the receive
    ],
)
def test_a_free_slot_waits_for_a_call_to_end_until_the_next_look_is_due(
    state: dict[str, Any], now: float, free: int, wait: float | None
) -> None:
    receiving = state.pop("receiving", False)
    expected = None if wait is None else pytest.approx(wait)
    assert looks(**state).next_in(now, free=free, receiving=receiving) == expected


@pytest.mark.parametrize(
    ("state", "free", "may"),
    [
        ({}, 1, True),  # due, a slot free, the queue never looked at
        ({}, 0, False),  # no slot free
        ({"receiving": True}, 5, False),  # one receive at a time
        ({"drained": True}, 5, False),  # finished: no call runs, the queue has nothing more
        ({"received_at": T0 + 4.5}, 5, False),  # not due
    ],
)
def test_a_look_needs_a_free_slot_no_receive_on_its_way_and_its_time(
    state: dict[str, Any], free: int, may: bool
) -> None:
    receiving = state.pop("receiving", False)
    assert looks(**state).may_look(T0 + 5, free=free, running={}, receiving=receiving) is may


def test_a_look_resets_the_ended_call_and_its_answer_sets_drained() -> None:
    state = looks(call_ended=True)
    state.receiving(T0 + 3)
    assert (state.received_at, state.call_ended) == (T0 + 3, False)
    state.received(0)
    assert state.drained is True
    state.received(2)
    assert state.drained is False


def test_a_single_slot_refills_one_message_at_a_time(aws: Aws, queue: Queue) -> None:
    send(queue, "first", "second", "third")
    event = event_of(aws, 1)
    recorder = Recorder(long=("first", "second", "third"))
    keep_slots_full(event, Context(900), recorder, CallSlots(queue, slots=1, min_remaining_s=610))
    assert recorder.ran == Counter({"first": 1, "second": 1, "third": 1})
    assert recorder.most_in_flight == 1


def test_the_worker_keeps_ten_calls_at_the_provider_while_tasks_wait(
    worker: Worker, mock_llm: RunningMock
) -> None:
    """Through the worker with the template's ten slots: one record in the event, 25 tasks in
    the queue; the invocation runs them all, ten at once, each task once."""
    mock_llm.configure(latency_s=LONG_S)
    ids = [worker.submit(f"slot {i}") for i in range(25)]
    [first, *_] = worker.aws.sqs.receive_message(
        QueueUrl=worker.queue.url, MaxNumberOfMessages=1, MessageSystemAttributeNames=["All"]
    )["Messages"]
    reply = worker.run([first], worker_call_slots=10)
    assert reply == {"batchItemFailures": []}
    assert mock_llm.stats.max_in_flight == 10
    assert sorted(len(v) for v in mock_llm.stats.outcomes_by_prompt.values()) == [1] * 25
    assert {worker.task(t).status for t in ids} == {TaskStatus.COMPLETED}
    assert worker.queued() == []


def test_a_retry_the_worker_scheduled_runs_in_the_same_invocation_once_due(
    worker: Worker, mock_llm: RunningMock
) -> None:
    """A transient error sends the task's retry message with its delay (0 s here): an invocation
    still holding calls takes it and the task completes, the first message done with."""
    mock_llm.configure(latency_s=LONG_S, rate_500=0.5, seed=7)
    ids = [worker.submit(f"flaky {i}") for i in range(10)]
    reply = worker.run(worker.queued(), worker_call_slots=10)
    assert reply == {"batchItemFailures": []}
    statuses = {worker.task(t).status for t in ids}
    assert statuses <= {TaskStatus.COMPLETED, TaskStatus.FAILED}  # nothing left pending
    retried = [p for p, outcomes in mock_llm.stats.outcomes_by_prompt.items() if outcomes[0] == "500"]
    assert retried  # the seed gives some first calls a 500, and their retries ran here
    assert worker.queued() == []  # every message handled and deleted


def test_in_lambda_one_event_loop_serves_every_invocation_of_a_sandbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As Powertools' batch processor does: a loop closed at the end of an invocation would break
    the clients bound to it after a thaw. Outside Lambda each run has a fresh loop."""

    async def running_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    monkeypatch.setenv("LAMBDA_TASK_ROOT", "/var/task")
    first, second = run_in_lambda_loop(running_loop()), run_in_lambda_loop(running_loop())
    try:
        assert first is second
        assert not first.is_closed()
    finally:
        first.close()
        asyncio.set_event_loop(None)
    monkeypatch.delenv("LAMBDA_TASK_ROOT")
    fresh, again = run_in_lambda_loop(running_loop()), run_in_lambda_loop(running_loop())
    assert fresh is not again
    assert fresh.is_closed()
