"""WorkerFunction: claim, call the mock LLM over HTTP, record the outcome; batches run concurrently."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest

from llmtasks.aws.key_limits import KeyRates
from llmtasks.aws.limits import RunningCalls
from llmtasks.aws.pacing import CallPacer
from llmtasks.aws.store import TaskStore
from llmtasks.domain.caller import Caller
from llmtasks.domain.errors import LLMError, RetryLater, TaskConflict, TaskNotFound
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion, Usage
from llmtasks.domain.models import SubmitTaskRequest, TaskStatus
from llmtasks.domain.rules import Lane
from llmtasks.llm import LLMProvider
from llmtasks.llm.openai import OpenAIChat
from llmtasks.ops.stats import overview
from llmtasks.records import sqs_record
from llmtasks.services.tasks import TaskService
from llmtasks.settings import Settings
from llmtasks.worker.runner import HELD_LEASE_RECHECK_S, ITEM_RECHECKS_S, Delivery, TaskRunner
from llmtasks_local.mock_llm import reply_text
from llmtasks_local.sam.provision import local_deployment
from tests.conftest import Aws, RunningMock, lambda_context
from tests.helpers import (
    HANG_S,
    SpanJitter,
    blobs,
    count_tasks,
    emf_records,
    emf_units,
    eventually,
    free_port,
    pending_task,
    task_lanes,
)

pytestmark = pytest.mark.unit


LANE_QUEUES = {Lane.NORMAL: "TaskQueue", Lane.HIGH: "HighTaskQueue", Lane.BACKGROUND: "BatchTaskQueue"}


class Worker:
    def __init__(self, aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> None:
        self.aws = aws
        self.settings = settings
        self.store = TaskStore(settings.tasks_table_name, aws.dynamodb)
        self.lanes = task_lanes(settings, aws.sqs)
        self.queue = self.lanes[Lane.NORMAL]
        self.service = TaskService(settings, self.store, self.lanes, results=blobs(settings))
        self.fn, self.context = handler("WorkerFunction")
        self.llm_url = mock_llm.url
        self.clock = time.time

    def submit(self, prompt: str, **options: Any) -> str:
        return self.service.submit("default", SubmitTaskRequest(prompt=prompt, **options)).task.task_id

    def runner(
        self, llm: LLMProvider | None = None, pacer: CallPacer | None = None, **overrides: Any
    ) -> TaskRunner:
        settings = self.settings.model_copy(update=overrides)
        llm = llm or OpenAIChat(
            base_url=overrides.get("llm_base_url", self.llm_url), api_key=None, default_model="mock-model"
        )
        assert settings.limits_table_name is not None
        return TaskRunner(
            settings,
            self.store,
            self.lanes,
            llm,
            clock=self.clock,
            pacer=pacer,
            results=blobs(settings),
            running=RunningCalls(settings.limits_table_name, self.aws.dynamodb),
            tenant_rates=KeyRates(settings.tasks_table_name, self.aws.dynamodb, prefix="tenantrate#"),
        )

    def queued(self, lane: Lane = Lane.NORMAL) -> list[dict[str, Any]]:
        return self.aws.messages(LANE_QUEUES[lane])

    def run(
        self,
        messages: list[dict[str, Any]],
        llm: LLMProvider | None = None,
        pacer: CallPacer | None = None,
        lane: Lane = Lane.NORMAL,
        **overrides: Any,
    ) -> dict[str, Any]:
        arn = self.aws.resources.attributes[(LANE_QUEUES[lane], "Arn")]
        event = {"Records": [sqs_record(m, arn) for m in messages]}  # type: ignore[arg-type]
        runner = self.runner(llm, pacer, **overrides)
        slots = self.settings.model_copy(update=overrides).worker_call_slots
        queue = self.lanes[lane]
        return self.fn(event, self.context, runner=runner, queue=queue, call_slots=slots)  # type: ignore[no-any-return]

    def run_queued(self, lane: Lane = Lane.NORMAL, **overrides: Any) -> dict[str, Any]:
        return self.run(self.queued(lane), lane=lane, **overrides)

    def crashed(self, prompt: str) -> tuple[str, dict[str, Any]]:
        """A submitted task whose first delivery died after its claim, and that delivery's message."""
        task_id = self.submit(prompt)
        [message] = self.queued()
        reply = self.run([message], llm=CrashingLLM())
        assert reply == {"batchItemFailures": [{"itemIdentifier": message["MessageId"]}]}
        return task_id, message

    def task(self, task_id: str) -> Any:
        """The task as a read finds it at the worker's clock's time (a test's own clock when it
        sets one): None once past its TTL."""
        return self.store.get(task_id, now=self.clock())


@pytest.fixture
def worker(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> Worker:
    # One delivery per run, the event's records only: these tests follow each message through the
    # queue by hand. An invocation taking more from the queue is test_call_slots.py's.
    overrides = {"retry_base_delay_s": 0.0, "worker_call_slots": 0}
    return Worker(aws, handler, settings.model_copy(update=overrides), mock_llm)


def test_ten_records_of_one_batch_call_the_llm_at_the_same_time(
    worker: Worker, mock_llm: RunningMock
) -> None:
    mock_llm.configure(latency_s=0.5)
    ids = [worker.submit(f"question {i}") for i in range(10)]
    reply = worker.run_queued()
    assert reply == {"batchItemFailures": []}
    assert mock_llm.stats.max_in_flight == 10  # counted at the provider, not by wall time
    for i, task_id in enumerate(ids):
        task = worker.task(task_id)
        assert task.status is TaskStatus.COMPLETED
        assert task.result == reply_text(f"question {i}")
        assert task.usage.total_tokens > 0
        assert task.attempts == 1
    assert worker.queued() == []


def test_a_paced_batch_keeps_under_the_providers_rate_limit_instead_of_collecting_429s(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a provider that takes 5 calls a second and a batch of 10 tasks
    mock_llm.configure(max_rps=5)
    ids = [worker.submit(f"paced {i}") for i in range(10)]
    # paced at 4 a second, as a user sets LlmRequestsPerSecond under the provider's limit: at 5,
    # calls 0.2 s apart put the sixth exactly a second after the first, and any call that left
    # late (a fresh connection, a loaded CI machine: two once) landed within a second of another
    pacer = CallPacer(worker.settings.tasks_table_name, worker.aws.dynamodb, calls_per_second=4)
    # When the worker runs them at that pace, the calls get through at their first try (but for
    # at most one: the batch's first call leaves late, opening a fresh connection, and so may land
    # within a second of the fifth; its task retries as after any 429)
    worker.run(worker.queued(), pacer=pacer)
    assert mock_llm.stats.calls == 10
    assert mock_llm.stats.rps_limited <= 1
    statuses = Counter(worker.task(i).status for i in ids)
    assert statuses[TaskStatus.COMPLETED] >= 9
    assert statuses[TaskStatus.COMPLETED] + statuses[TaskStatus.PENDING] == 10
    # And without the pace the same batch is refused beyond the limit
    unpaced = {worker.submit(f"unpaced {i}"): f"unpaced {i}" for i in range(10)}
    worker.run([m for m in worker.queued() if json.loads(m["Body"])["task_id"] in unpaced])
    refused = [p for p in unpaced.values() if mock_llm.stats.outcomes_by_prompt[p] == ["rps"]]
    assert len(refused) >= 5


@pytest.mark.parametrize("retry_after_s", [3, 0])
def test_a_429_under_a_pace_holds_every_worker_for_its_retry_after_and_adds_no_wait_of_its_own(
    worker: Worker, mock_llm: RunningMock, retry_after_s: int
) -> None:
    # Given a paced worker with a backoff of 60 s, whose provider answers 429 with a Retry-After
    mock_llm.configure(rate_429=1.0, retry_after_s=retry_after_s)
    task_id = worker.submit("refused")
    pacer = CallPacer(worker.settings.tasks_table_name, worker.aws.dynamodb, calls_per_second=100)
    now = time.time()
    worker.clock = lambda: now
    worker.run(worker.queued(), pacer=pacer, retry_base_delay_s=60.0)
    # Then the task retries when the provider said (at once for 0: the pace spaces the calls),
    # with no backoff of its own on top
    task = worker.task(task_id)
    assert (task.status, task.last_error_code, task.next_attempt_at) == (
        TaskStatus.PENDING,
        "llm_rate_limited",
        now + retry_after_s,
    )
    # And no other worker's call starts before the provider said it may
    assert pacer.reserve(now=now) >= now + retry_after_s


def test_a_call_the_pace_cannot_fit_into_this_invocation_waits_in_the_queue(worker: Worker) -> None:
    task_id = worker.submit("backlogged")
    pacer = CallPacer(worker.settings.tasks_table_name, worker.aws.dynamodb, calls_per_second=0.001)
    pacer.reserve(now=time.time())  # the only slot for the next 1000 s is taken
    assert worker.run(worker.queued(), pacer=pacer) == {"batchItemFailures": []}
    task = worker.task(task_id)
    assert (task.status, task.last_error_code) == (TaskStatus.PENDING, "paced")
    assert task.last_error == "The LLM call pace is full."  # what GET /tasks shows as its error
    assert task.attempts == 0  # no call left, so none of its retries is spent
    assert task.attempt_log == []  # nor is an attempt shown in its timeline
    assert task.next_attempt_at == pytest.approx(time.time() + 900, abs=5)  # SQS's longest delay
    delayed = worker.aws.sqs.get_queue_attributes(
        QueueUrl=worker.queue.url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]["ApproximateNumberOfMessagesDelayed"]
    assert delayed == "1"  # its own message brings it back


def test_a_task_taken_for_a_whole_call_goes_back_unattempted_when_that_time_ran_out(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a task an invocation received itself when 15 s were left (LLM timeout 5 s + 10 s
    # to write the outcome), whose receive and claim took until fewer than that were left
    runner = worker.runner(llm_timeout_s=5.0)
    task_id = worker.submit("taken late")
    [message] = worker.queued()
    left = iter([30.0, 14.0])  # at the claim (the lease's length), then as the call would start
    delivery = Delivery(
        message_id=message["MessageId"], receive_count=1, sent_at=time.time(), whole_call=True
    )
    asyncio.run(runner.run(task_id, delivery, remaining_s=lambda: next(left)))
    # Then no call starts that the invocation's end could cut: the provider is never called, and
    # the task waits in its queue under a message of its own, none of its retries spent
    assert mock_llm.stats.calls == 0
    task = worker.task(task_id)
    assert (task.status, task.attempts, task.last_error_code) == (TaskStatus.PENDING, 0, "invocation_ending")
    assert task.last_error == "The invocation that took the task no longer had the time for a whole call."
    [retry] = worker.queued()  # a message of its own (the one taken is done with)
    assert json.loads(retry["Body"]) == {"task_id": task_id}
    # With the time there, the task runs on that message
    worker.run([retry])
    assert worker.task(task_id).status is TaskStatus.COMPLETED
    other = worker.submit("taken in time")
    fresh = Delivery(message_id="m2", receive_count=1, sent_at=time.time(), whole_call=True)
    asyncio.run(runner.run(other, fresh, remaining_s=lambda: 15.0))
    assert worker.task(other).status is TaskStatus.COMPLETED


class ScriptedTime:
    """A Lambda context whose time left reads `first_s` at the handler's start, then `later_s`:
    an invocation whose records waited on a loaded machine."""

    def __init__(self, context: Any, first_s: float, later_s: float) -> None:
        self._context = context
        self._reads = iter([first_s])
        self._later_s = later_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def get_remaining_time_in_millis(self) -> int:
        return int(next(self._reads, self._later_s) * 1000)


@pytest.mark.parametrize(
    ("began_with_s", "status", "calls"),
    [
        (30.0, TaskStatus.PENDING, 0),  # Timeout holds a whole call (15 s): none is cut short
        (14.0, TaskStatus.COMPLETED, 1),  # it never could: the call gets what is left
    ],
)
def test_an_event_record_whose_claim_waited_past_the_time_for_a_whole_call_goes_back_unattempted(
    worker: Worker, mock_llm: RunningMock, began_with_s: float, status: TaskStatus, calls: int
) -> None:
    # Given LLM_TIMEOUT_S 5 s (a whole call: 15 s with the outcome's write), and an event record
    # whose invocation had 14 s left by the time its claim was done
    task_id = worker.submit("claimed late")
    [message] = worker.queued()
    arn = worker.aws.resources.attributes[("TaskQueue", "Arn")]
    context = ScriptedTime(worker.context, first_s=began_with_s, later_s=14.0)
    reply = worker.fn(
        {"Records": [sqs_record(message, arn)]},  # type: ignore[arg-type]
        context,
        runner=worker.runner(llm_timeout_s=5.0),
        queue=worker.queue,
        call_slots=0,
    )
    assert reply == {"batchItemFailures": []}
    # Then it goes back unattempted when the function could have given it a whole call, and runs
    # on what is left when it never could (so a short Timeout never leaves a task stuck)
    task = worker.task(task_id)
    assert (task.status, mock_llm.stats.calls) == (status, calls)
    if status is TaskStatus.PENDING:
        assert (task.attempts, task.last_error_code) == (0, "invocation_ending")
        [retry] = worker.queued()
        assert json.loads(retry["Body"]) == {"task_id": task_id}


def test_a_transient_error_schedules_a_retry_through_the_queue_then_completes(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id = worker.submit("flaky")
    mock_llm.configure(rate_500=1.0)
    assert worker.run_queued() == {"batchItemFailures": []}  # the old message is done with
    task = worker.task(task_id)
    assert (task.status, task.attempts, task.last_error_code) == (TaskStatus.PENDING, 1, "llm_http_500")
    assert task.next_attempt_at is not None
    mock_llm.configure()
    [retry] = worker.queued()  # a fresh message, so SQS receive counts stay for real crashes
    assert json.loads(retry["Body"]) == {"task_id": task_id}
    worker.run([retry])
    task = worker.task(task_id)
    assert (task.status, task.attempts, task.result) == (TaskStatus.COMPLETED, 2, reply_text("flaky"))


def test_retries_stop_at_max_retries_with_the_providers_error(worker: Worker, mock_llm: RunningMock) -> None:
    task_id = worker.submit("always failing", max_retries=2)
    mock_llm.configure(rate_500=1.0)
    for _ in range(3):
        worker.run_queued()
    task = worker.task(task_id)
    assert (task.status, task.error_code, task.attempts) == (TaskStatus.FAILED, "llm_http_500", 3)
    assert "gave up after 3 attempts" in task.error
    assert worker.queued() == []
    assert mock_llm.stats.calls == 3


def test_a_provider_quoting_the_api_key_back_never_puts_it_in_the_task(
    worker: Worker, mock_llm: RunningMock
) -> None:
    key = "sk-test-" + "k" * 40
    task_id = worker.submit("to a careless provider", max_retries=0)
    mock_llm.configure(rate_500=1.0, echo_key=True)
    llm = OpenAIChat(base_url=mock_llm.url, api_key=key, default_model="mock-model")
    worker.run(worker.queued(), llm=llm)
    task = worker.task(task_id)
    assert mock_llm.stats.calls_with_key == 1  # the call did carry the key
    assert task.error_code == "llm_http_500"
    assert "you sent Bearer [its API key]" in task.error  # the provider's words, without the key
    assert key not in task.model_dump_json()


def test_a_permanent_error_fails_at_once(worker: Worker, mock_llm: RunningMock) -> None:
    task_id = worker.submit("to a wrong path")
    worker.run_queued(llm_base_url=mock_llm.url + "/missing")
    task = worker.task(task_id)
    assert (task.status, task.error_code, task.attempts) == (TaskStatus.FAILED, "llm_http_404", 1)
    assert "404" in task.error  # the provider's answer, as the client reads it
    assert worker.queued() == []


def test_the_retry_backoff_doubles_from_its_base_to_its_cap_with_full_jitter(worker: Worker) -> None:
    defaults = Settings.model_fields
    settings = worker.settings.model_copy(
        update={name: defaults[name].default for name in ("retry_base_delay_s", "retry_max_delay_s")}
    )
    rng = SpanJitter(at=1.0)  # the top of each span
    llm = OpenAIChat(base_url=worker.llm_url, api_key=None, default_model="mock-model")
    runner = TaskRunner(settings, worker.store, worker.lanes, llm, rng=rng, results=blobs(settings))
    # 2 s, doubled each attempt, up to 5 minutes; each delay drawn from zero to that ceiling
    assert [runner.backoff_s(attempt) for attempt in range(1, 10)] == [2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert [low for low, _ in rng.spans] == [0] * 9


def test_a_retry_after_at_the_cap_is_waited_one_past_it_fails(worker: Worker, mock_llm: RunningMock) -> None:
    waited, refused = worker.submit("at the cap"), worker.submit("past the cap")
    mock_llm.configure(rate_429=1.0, retry_after_s=40)
    messages = worker.queued()
    worker.run([m for m in messages if waited in m["Body"]], retry_after_cap_s=40)
    worker.run([m for m in messages if refused in m["Body"]], retry_after_cap_s=39)
    assert (worker.task(waited).status, worker.task(waited).last_error_code) == (
        TaskStatus.PENDING,
        "llm_rate_limited",
    )
    assert (worker.task(refused).status, worker.task(refused).error_code) == (
        TaskStatus.FAILED,
        "retry_after_too_long",
    )


def test_a_retry_that_would_start_at_the_deadline_fails_the_task_now(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a task with a minute to live, refused with Retry-After: 40 twenty seconds in
    task_id = worker.submit("a minute to live", timeout_s=60)
    created = worker.task(task_id).created_at
    worker.clock = lambda: created + 20
    mock_llm.configure(rate_429=1.0, retry_after_s=40)
    worker.run_queued()
    # Then its retry would start at its deadline exactly: it fails now, saying why
    task = worker.task(task_id)
    assert (task.status, task.error_code) == (TaskStatus.FAILED, "deadline_exceeded")
    assert "no time left for a retry before the deadline" in task.error


def test_an_unreachable_provider_is_transient(worker: Worker) -> None:
    task_id = worker.submit("nobody home")
    worker.run_queued(llm_base_url=f"http://127.0.0.1:{free_port()}/v1")
    task = worker.task(task_id)
    assert (task.status, task.last_error_code) == (TaskStatus.PENDING, "llm_unreachable")


def test_retry_after_is_honoured(worker: Worker, mock_llm: RunningMock) -> None:
    task_id = worker.submit("rate limited")
    mock_llm.configure(rate_429=1.0, retry_after_s=40)
    before = time.time()
    worker.run_queued()
    task = worker.task(task_id)
    assert (task.status, task.last_error_code) == (TaskStatus.PENDING, "llm_rate_limited")
    assert "429" in task.last_error  # what the retry waits out, in the provider's words
    assert task.next_attempt_at >= before + 40
    assert worker.queued() == []  # delayed by 40 s, so not visible yet


def test_a_retry_after_beyond_the_cap_fails_the_task_instead_of_stalling_it(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id = worker.submit("come back in 114 hours")
    mock_llm.configure(rate_429=1.0, retry_after_s=114 * 3600)
    worker.run_queued()
    task = worker.task(task_id)
    assert (task.status, task.error_code) == (TaskStatus.FAILED, "retry_after_too_long")


def test_a_cancelled_task_never_reaches_the_llm(worker: Worker, mock_llm: RunningMock) -> None:
    task_id = worker.submit("never mind")
    worker.service.cancel("default", task_id)
    assert worker.run_queued() == {"batchItemFailures": []}
    assert mock_llm.stats.calls == 0
    assert worker.task(task_id).status is TaskStatus.CANCELLED


def test_a_duplicate_delivery_while_the_lease_lives_does_not_call_the_llm_again(
    worker: Worker, mock_llm: RunningMock
) -> None:
    mock_llm.configure(latency_s=0.3)
    task_id = worker.submit("only once")
    [message] = worker.queued()
    duplicate = {**message, "MessageId": "duplicate-delivery"}
    reply = worker.run([message, duplicate])
    assert mock_llm.stats.calls == 1
    assert len(reply["batchItemFailures"]) == 1  # the loser comes back after the lease
    assert worker.task(task_id).status is TaskStatus.COMPLETED


def test_one_message_twice_in_a_batch_calls_the_llm_once(worker: Worker, mock_llm: RunningMock) -> None:
    # A fault-suite run saw a redriven message come four times in one batch (receive counts 1 to
    # 4): each later copy took its own message's lease over and called the provider again
    mock_llm.configure(latency_s=0.3)
    task_id = worker.submit("once per batch")
    [message] = worker.queued()
    reply = worker.run([redelivered(message, 1), redelivered(message, 2), redelivered(message, 3)])
    assert reply == {"batchItemFailures": []}
    assert mock_llm.stats.calls == 1
    task = worker.task(task_id)
    assert (task.status, task.attempts) == (TaskStatus.COMPLETED, 1)


def test_a_task_past_its_deadline_fails_without_calling_the_llm(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Claimed at its deadline to the second: no time is left for a call
    task_id = worker.submit("too late", timeout_s=30)
    deadline = worker.task(task_id).created_at + 30
    worker.clock = lambda: deadline
    worker.run_queued()
    task = worker.task(task_id)
    assert (task.status, task.error_code) == (TaskStatus.FAILED, "deadline_exceeded")
    assert task.error == "The task's deadline passed before it could run."
    assert mock_llm.stats.calls == 0


def test_a_claim_s_lease_outlasts_the_invocation_by_the_lease_margin(worker: Worker) -> None:
    # Given a claim at a known moment by an invocation with 42 s left
    now = time.time()
    worker.clock = lambda: now
    task_id = worker.submit("leased")
    delivery = Delivery(message_id="m", receive_count=1, sent_at=now)
    with pytest.raises(RuntimeError):
        asyncio.run(worker.runner(CrashingLLM()).run(task_id, delivery, remaining_s=lambda: 42.0))
    # Then its lease runs to the invocation's end and the margin after it: no other delivery
    # takes the task over while the invocation could still be writing its outcome
    assert worker.task(task_id).lease_until - now == pytest.approx(42.0 + worker.settings.lease_margin_s)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json", "not a TaskMessage: its body is not JSON (expected ident at line 1 column 2)"),
        ('{"task": "x"}', "not a TaskMessage: task_id: Field required"),
    ],
)
def test_a_malformed_message_is_reported_failed_so_it_ends_in_the_dlq_logged_in_one_line(
    worker: Worker, caplog: pytest.LogCaptureFixture, body: str, reason: str
) -> None:
    sent = worker.aws.sqs.send_message(QueueUrl=worker.settings.task_queue_url, MessageBody=body)
    with caplog.at_level(logging.INFO, logger="llmtasks"):
        reply = worker.run_queued()
    assert reply["batchItemFailures"] == [{"itemIdentifier": sent["MessageId"]}]
    # One line says which message, from which queue, and what was wrong with it; no traceback
    failures = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert [(f.getMessage(), f.message_id, f.reason) for f in failures] == [  # type: ignore[attr-defined]
        ("message unreadable", sent["MessageId"], reason)
    ]
    assert failures[0].queue == worker.settings.task_queue_url.rsplit("/", 1)[-1]  # type: ignore[attr-defined]
    assert failures[0].exc_info is None


def test_the_sample_event_runs(worker: Worker) -> None:
    from tests.helpers import load_event

    reply = worker.fn(
        load_event("worker_sqs.json"),
        worker.context,
        runner=worker.runner(),
        queue=worker.queue,
        call_slots=10,  # the template's default: then the invocation looks at the queue, empty here
    )
    assert reply == {"batchItemFailures": []}  # its task does not exist here: nothing to run


def test_a_result_too_large_for_the_item_goes_to_s3_and_reads_back_whole(
    worker: Worker, mock_llm: RunningMock, aws: Aws
) -> None:
    # Given a model whose answer (300 KB) would not fit beside a large prompt in one item
    mock_llm.configure(reply_chars=300_000)
    task_id = worker.submit("x" * 150_000)
    worker.run_queued()
    # Then the item keeps a reference, not the text
    item = aws.dynamodb.get_item(
        TableName=worker.settings.tasks_table_name, Key={"pk": {"S": f"task#{task_id}"}}
    )
    assert "result" not in item["Item"]
    assert item["Item"]["result_ref"]["S"] == f"results/{task_id}.txt"
    # And readers still get the whole text
    task = worker.service.get("default", task_id)
    assert task.status is TaskStatus.COMPLETED
    assert task.result == reply_text("x" * 150_000, 300_000)


def test_a_result_up_to_the_threshold_stays_in_the_item(
    worker: Worker, mock_llm: RunningMock, aws: Aws
) -> None:
    threshold = worker.settings.max_inline_result_bytes
    mock_llm.configure(reply_chars=threshold)  # ASCII: as many bytes
    task_id = worker.submit("small")
    worker.run_queued()
    item = aws.dynamodb.get_item(
        TableName=worker.settings.tasks_table_name, Key={"pk": {"S": f"task#{task_id}"}}
    )
    assert len(item["Item"]["result"]["S"].encode()) == threshold
    assert "result_ref" not in item["Item"]
    bucket = worker.settings.results_bucket
    assert aws_objects(aws, bucket) == []


def aws_objects(aws: Aws, bucket: str) -> list[str]:
    import boto3

    return [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_a_message_that_arrives_before_its_item_comes_back_and_then_runs(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a message whose task item is not written yet (submit sends first, then writes)
    from llmtasks.domain.messages import TaskMessage

    worker.queue.send(TaskMessage(task_id="early"))
    [message] = worker.queued()
    # When the worker gets it, it is returned to the queue instead of dropped
    assert len(worker.run([message])["batchItemFailures"]) == 1
    assert mock_llm.stats.calls == 0
    # And once the item exists the next delivery runs it
    worker.store.create(pending_task("early", now=time.time()))
    assert worker.run([message]) == {"batchItemFailures": []}
    assert worker.task("early").status is TaskStatus.COMPLETED


def test_a_first_delivery_a_moment_ahead_of_its_item_runs_without_going_back_to_the_queue(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a message whose item is written a few milliseconds after the worker receives it
    from llmtasks.domain.messages import TaskMessage

    worker.queue.send(TaskMessage(task_id="racing"))
    [message] = worker.queued()
    late_write = threading.Timer(0.05, lambda: worker.store.create(pending_task("racing", now=time.time())))
    late_write.start()
    # When the worker runs that first delivery, it runs the task at once
    assert worker.run([message]) == {"batchItemFailures": []}
    late_write.join()
    assert worker.task("racing").status is TaskStatus.COMPLETED
    assert mock_llm.stats.calls == 1


def test_a_message_whose_submit_never_stored_the_task_is_dropped_after_the_grace(
    worker: Worker, mock_llm: RunningMock
) -> None:
    from llmtasks.domain.messages import TaskMessage

    worker.queue.send(TaskMessage(task_id="abandoned"))
    worker.clock = lambda: time.time() + worker.settings.unwritten_task_grace_s + 1
    assert worker.run_queued() == {"batchItemFailures": []}
    assert mock_llm.stats.calls == 0


def test_a_message_without_its_task_waits_out_the_grace_to_the_second_then_is_dropped(
    worker: Worker, mock_llm: RunningMock
) -> None:
    sent_at = float(int(time.time()))  # whole seconds, so the sums below are exact
    grace = worker.settings.unwritten_task_grace_s

    def delivered_at(now: float, receive_count: int = 1) -> float | None:
        """The delay a delivery of a message naming no stored task comes back after, or None
        when it is dropped."""
        worker.clock = lambda: now
        delivery = Delivery(message_id="m", receive_count=receive_count, sent_at=sent_at)
        try:
            asyncio.run(worker.runner().run("never-written", delivery, remaining_s=lambda: 60))
        except RetryLater as later:
            return later.delay_s
        return None

    assert delivered_at(sent_at) == 1  # the item is usually milliseconds behind: a short wait
    assert delivered_at(sent_at + grace - 0.5) == 0.5  # never past the grace
    assert delivered_at(sent_at + grace) is None  # the grace is out: dropped
    assert mock_llm.stats.calls == 0
    # A first delivery looks for the item again for a moment; a later one has waited already
    claims: list[str] = []
    worker.aws.dynamodb.meta.events.register(
        "provide-client-params.dynamodb.UpdateItem", lambda **_: claims.append("claim")
    )
    delivered_at(sent_at, receive_count=1)
    assert len(claims) == 1 + len(ITEM_RECHECKS_S)
    claims.clear()
    delivered_at(sent_at, receive_count=2)
    assert claims == ["claim"]


# --- crashes, leases and dead letters -----------------------------------------------------


class CrashingLLM:
    """A worker that dies after its claim and before any token is spent (an unexpected bug)."""

    async def complete(
        self, request: LLMRequest, *, timeout_s: float, on_progress: Any = None, tokens: int = 0
    ) -> Completion:
        raise RuntimeError("injected crash")


def redelivered(message: dict[str, Any], receive_count: int, message_id: str | None = None) -> dict[str, Any]:
    """`message` as SQS hands it out again (or, with another id, a copy of it)."""
    attributes = {**message["Attributes"], "ApproximateReceiveCount": str(receive_count)}
    return {**message, "MessageId": message_id or message["MessageId"], "Attributes": attributes}


def test_a_crashed_delivery_is_taken_over_by_its_own_redelivery_without_waiting_for_the_lease(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # When the first delivery dies after its claim
    task_id, message = worker.crashed("crash once")
    crashed = worker.task(task_id)
    assert crashed.status is TaskStatus.PROCESSING
    assert crashed.lease_until > time.time() + 60  # the lease outlives the function's timeout
    # Then SQS's redelivery of that message (after its visibility timeout) runs it at once
    assert worker.run([redelivered(message, 2)]) == {"batchItemFailures": []}
    task = worker.task(task_id)
    assert (task.status, task.attempts) == (TaskStatus.COMPLETED, 2)
    assert mock_llm.stats.calls == 1


def test_a_copy_of_the_message_waits_for_the_lease_then_takes_over(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id, message = worker.crashed("crash, then a duplicate")
    copy = redelivered(message, 1, message_id="another-message")
    # While the crashed delivery's lease lives, a copy does not call the LLM and comes back later
    assert len(worker.run([copy])["batchItemFailures"]) == 1
    assert mock_llm.stats.calls == 0
    # Once the lease has lapsed, the copy's next delivery takes the task over
    lease_until = worker.task(task_id).lease_until
    worker.clock = lambda: lease_until + 1
    assert worker.run([redelivered(copy, 2)]) == {"batchItemFailures": []}
    assert worker.task(task_id).status is TaskStatus.COMPLETED
    assert mock_llm.stats.calls == 1


def test_a_message_finding_the_lease_held_looks_again_within_seconds_then_waits_for_the_lease(
    worker: Worker,
) -> None:
    # A retry's message can arrive before the release that follows its send is written: the
    # task still reads processing under the lease being given up, for a moment
    task_id, _message = worker.crashed("a retry message ahead of its release")
    now = time.time()
    worker.clock = lambda: now
    lease_until = worker.task(task_id).lease_until
    runner = worker.runner()

    def refused_for(receive_count: int) -> float:
        delivery = Delivery(message_id="the-retry", receive_count=receive_count, sent_at=time.time())
        with pytest.raises(RetryLater) as later:
            asyncio.run(runner.run(task_id, delivery, remaining_s=lambda: 60))
        return later.value.delay_s

    assert refused_for(1) == HELD_LEASE_RECHECK_S  # soon, not after the lease
    assert refused_for(2) == lease_until - now + 1  # a copy that still finds it held waits it out


def test_a_copy_on_its_last_delivery_is_dropped_rather_than_dead_lettered(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id, message = worker.crashed("held elsewhere")
    last = redelivered(message, worker.settings.task_max_receive_count, message_id="a-copy")
    assert worker.run([last]) == {"batchItemFailures": []}  # deleted, not sent to TaskDLQ
    assert worker.task(task_id).status is TaskStatus.PROCESSING  # its own message will resume it
    assert mock_llm.stats.calls == 0


def test_a_task_whose_last_delivery_died_reads_as_dead_lettered_until_redriven(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id = worker.submit("poison")
    [message] = worker.queued()
    last = worker.settings.task_max_receive_count
    for receive in range(1, last + 1):
        worker.run([redelivered(message, receive)], llm=CrashingLLM())
    # While the last delivery's lease lives, the task is still processing
    assert worker.service.get("default", task_id).status is TaskStatus.PROCESSING
    # Once it lapses nothing will run it again, so it reads as failed, with no write at all
    lapsed = worker.task(task_id).lease_until + 1
    worker.clock = lambda: lapsed
    worker.service = TaskService(
        worker.settings, worker.store, worker.lanes, clock=worker.clock, results=blobs(worker.settings)
    )
    task = worker.service.get("default", task_id)
    assert (task.status, task.error_code) == (TaskStatus.FAILED, "dead_lettered")
    assert f"delivered {last} times" in task.error
    assert "llmtasks dlq redrive" in task.error
    with pytest.raises(TaskConflict, match=r"already failed \(dead_lettered\)"):
        worker.service.cancel("default", task_id)
    with pytest.raises(TaskNotFound):  # and to another tenant it does not exist at all
        worker.service.cancel("globex", task_id)
    # A redrive puts it back to pending, and the moved message (a new one) runs it to completion
    assert worker.store.requeue_dead_lettered(task_id, now=lapsed)
    assert worker.service.get("default", task_id).status is TaskStatus.PENDING
    assert worker.run([redelivered(message, 1, message_id="redriven")]) == {"batchItemFailures": []}
    task = worker.service.get("default", task_id)
    assert (task.status, task.result) == (TaskStatus.COMPLETED, reply_text("poison"))
    assert mock_llm.stats.calls == 1


def test_requeue_leaves_a_task_alone_unless_it_is_dead_lettered(worker: Worker) -> None:
    task_id = worker.submit("fine")
    assert not worker.store.requeue_dead_lettered(task_id, now=time.time())
    worker.run_queued()
    assert not worker.store.requeue_dead_lettered(task_id, now=time.time() + 10_000)
    assert worker.task(task_id).status is TaskStatus.COMPLETED


@pytest.mark.parametrize(
    ("receive_count", "expected_delay"),
    # Exponential, then the delivery before the last waits out the 60 s grace and one second
    # more, so that the last delivery finds the grace over.
    [(1, 1.0), (2, 2.0), (3, 4.0), (4, 61.0)],
)
def test_a_message_ahead_of_its_item_backs_off_and_never_reaches_the_dlq_early(
    worker: Worker, receive_count: int, expected_delay: float
) -> None:
    now = time.time()
    worker.clock = lambda: now
    delivery = Delivery(message_id="m", receive_count=receive_count, sent_at=now)
    with pytest.raises(RetryLater) as later:
        asyncio.run(worker.runner().run("not-written-yet", delivery, remaining_s=lambda: 60))
    assert later.value.delay_s == pytest.approx(expected_delay)


def test_a_call_that_trickles_forever_is_cut_at_the_worker_s_deadline(mock_llm: RunningMock) -> None:
    # Given a provider that sends its headers and then a byte a second (no read timeout fires)
    mock_llm.configure(rate_hang=1.0, hang_s=30)
    llm = OpenAIChat(base_url=mock_llm.url, api_key=None, default_model="mock")
    with pytest.raises(LLMError) as error:
        asyncio.run(llm.complete(LLMRequest(prompt="hang"), timeout_s=1.5))
    # Then the call ends at its deadline as a transient timeout, before the 30 s trickle ends (its
    # end is a whole answer, which would have succeeded), not when the function is killed
    assert (error.value.code, error.value.transient) == ("llm_timeout", True)
    assert mock_llm.stats.outcomes_by_prompt == {"hang": ["hang"]}


def test_a_call_given_up_before_its_answer_is_counted_gone_at_the_mock(mock_llm: RunningMock) -> None:
    # Given calls slower than the caller's deadline, one drawn to succeed and one to fail
    llm = OpenAIChat(base_url=mock_llm.url, api_key=None, default_model="mock")
    # (The deadline must outlast the request's way to the mock: 0.5 s once did not, on a loaded
    # machine, and the call never reached it to be counted at all.)
    for prompt, rate_500 in (("slow ok", 0.0), ("slow 500", 1.0)):
        mock_llm.configure(latency_s=30, rate_500=rate_500)
        with pytest.raises(LLMError) as error:
            asyncio.run(llm.complete(LLMRequest(prompt=prompt), timeout_s=2))
        assert error.value.code == "llm_timeout"
    # Then the mock counts neither as what was drawn: the caller never saw an answer, so a retry
    # after it is no second charge (the fault suite's double-charge count reads this)
    eventually(
        lambda: dict(mock_llm.stats.outcomes_by_prompt),
        lambda seen: seen == {"slow ok": ["gone"], "slow 500": ["gone"]},
        timeout_s=HANG_S,
        what="both calls counted gone",
    )


def test_the_provider_keeps_one_http_client_per_live_event_loop(mock_llm: RunningMock) -> None:
    # Given a provider used from one event loop after another (each closed after its call, as
    # outside Lambda Powertools runs each batch on a fresh loop)
    # (each call's timeout a cap only a hang reaches: a CPU-starved run's local call took over 5 s)
    llm = OpenAIChat(base_url=mock_llm.url, api_key=None, default_model="mock")
    for i in range(5):
        asyncio.run(llm.complete(LLMRequest(prompt=f"loop {i}"), timeout_s=HANG_S))
    # Then it holds only the last loop's client: the others (each with an SSL context of most of
    # a megabyte) went with their loops instead of piling up in a warm sandbox
    assert len(llm._clients) == 1
    # And a loop that lives on keeps its client, and with it its pooled connection
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(llm.complete(LLMRequest(prompt="kept"), timeout_s=HANG_S))
        kept = llm._clients[loop]
        loop.run_until_complete(llm.complete(LLMRequest(prompt="kept again"), timeout_s=HANG_S))
        assert llm._clients[loop] is kept
    finally:
        loop.close()
    assert mock_llm.stats.calls == 7


def test_the_mock_draws_each_call_s_time_from_a_bounded_log_normal(mock_llm: RunningMock) -> None:
    """The bench's spread of call times: each call's own draw, within its bounds, summed in the stats."""
    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": "how long"}]}
    mock_llm.configure(latency_s=0.02)
    for _ in range(3):
        httpx.post(f"{mock_llm.url}/chat/completions", json=body).raise_for_status()
    assert mock_llm.stats.latency_total_s == pytest.approx(0.06)  # fixed without a sigma
    mock_llm.server.reset_stats()
    mock_llm.configure(latency_s=0.02, latency_sigma=1.5, latency_min_s=0.01, latency_max_s=0.04, seed=3)
    started = time.monotonic()
    for _ in range(20):
        httpx.post(f"{mock_llm.url}/chat/completions", json=body).raise_for_status()
    total = mock_llm.stats.latency_total_s
    assert 20 * 0.01 <= total <= 20 * 0.04
    assert total != pytest.approx(20 * 0.02)  # drawn, not the median each time
    assert time.monotonic() - started >= total  # each call took its draw (a lower bound)


def test_the_mock_s_requests_per_second_limit_is_a_429_with_retry_after(mock_llm: RunningMock) -> None:
    mock_llm.configure(max_rps=2)
    llm = OpenAIChat(base_url=mock_llm.url, api_key=None, default_model="mock")

    async def four_at_once() -> list[Completion | BaseException]:
        calls = [llm.complete(LLMRequest(prompt=f"p{i}"), timeout_s=5) for i in range(4)]
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = asyncio.run(four_at_once())
    limited = [o for o in outcomes if isinstance(o, LLMError)]
    assert len(limited) == 2
    assert all(e.code == "llm_rate_limited" and e.transient for e in limited)
    assert all(e.retry_after is not None and 0 < e.retry_after <= 1 for e in limited)
    assert mock_llm.stats.rps_limited == 2


def test_an_early_copy_of_a_task_waiting_for_its_retry_after_does_not_call_the_provider(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id = worker.submit("patience")
    [message] = worker.queued()
    mock_llm.configure(rate_429=1.0, retry_after_s=40)
    worker.run([message])
    waiting = worker.task(task_id)
    # When the first message comes again (its reply was lost) long before the Retry-After
    mock_llm.configure()
    assert worker.run([redelivered(message, 2)]) == {"batchItemFailures": []}
    # Then it is done with, and the task still waits for its retry's own message
    assert worker.task(task_id).status is TaskStatus.PENDING
    assert worker.task(task_id).next_attempt_at == waiting.next_attempt_at
    assert mock_llm.stats.calls == 1
    # Which runs it when due
    worker.clock = lambda: waiting.next_attempt_at
    assert worker.run([redelivered(message, 1, message_id="the-retry")]) == {"batchItemFailures": []}
    assert worker.task(task_id).status is TaskStatus.COMPLETED


def test_a_hanging_call_ends_before_the_function_s_timeout_and_is_retried(
    worker: Worker, mock_llm: RunningMock, aws: Aws
) -> None:
    mock_llm.configure(rate_hang=1.0, hang_s=60)
    task_id = worker.submit("hangs")
    # Given an invocation with 12 s left, of which the worker keeps 10 s to save the outcome
    worker.context = lambda_context(aws.function("WorkerFunction"), timeout_s=12)
    started = time.monotonic()
    assert worker.run_queued() == {"batchItemFailures": []}
    # Real time is the point: the call was cut before the function's own 12 s ran out (the
    # mock's hang is 60 s)
    assert time.monotonic() - started < 12
    task = worker.task(task_id)
    assert (task.status, task.last_error_code, task.lease_id) == (TaskStatus.PENDING, "llm_timeout", None)


def test_a_task_whose_last_delivery_died_before_the_handler_reads_as_dead_lettered_once_it_was_due(
    worker: Worker,
) -> None:
    task_id = worker.submit("the last delivery never reaches the handler")
    [message] = worker.queued()
    last = worker.settings.task_max_receive_count
    for receive in range(1, last):  # deliveries 1..4 claim and crash; the 5th dies before any code
        worker.run([redelivered(message, receive)], llm=CrashingLLM())
    lease_until = worker.task(task_id).lease_until
    due = lease_until + worker.settings.task_visibility_timeout_s + worker.settings.dead_letter_grace_s

    def read_at(now: float) -> Any:
        return TaskService(
            worker.settings, worker.store, worker.lanes, clock=lambda: now, results=blobs(worker.settings)
        ).get("default", task_id)

    assert read_at(lease_until + 1).status is TaskStatus.PROCESSING  # the 5th delivery may still come
    assert read_at(due - 1).status is TaskStatus.PROCESSING  # its pollers' grace, not yet out
    assert (read_at(due + 1).status, read_at(due + 1).error_code) == (TaskStatus.FAILED, "dead_lettered")
    assert worker.store.requeue_dead_lettered(task_id, now=due + 1)


def test_one_task_s_life_writes_its_metrics_as_emf(
    worker: Worker, mock_llm: RunningMock, capsys: pytest.CaptureFixture[str]
) -> None:
    # A task that fails once (a 500), then completes; another that fails for good; one cancelled
    mock_llm.configure(rate_500=1.0)
    task_id = worker.submit("measured", priority="high")
    worker.run_queued(Lane.HIGH)
    mock_llm.configure()
    worker.clock = lambda: time.time() + 60  # past the retry's backoff
    worker.run_queued(Lane.HIGH)  # the retry stays in the high lane
    assert worker.task(task_id).status is TaskStatus.COMPLETED
    mock_llm.configure(rate_500=1.0)
    worker.submit("doomed", max_retries=0)
    worker.run_queued()
    worker.service.cancel("default", worker.submit("unwanted"))
    emf = emf_records(capsys.readouterr().out)

    common = {"service": "llmtasks", "model": worker.settings.llm_model}
    assert emf["TasksSubmitted"][0] == {**common, "priority": "high", "value": 1}
    assert len(emf["TasksSubmitted"]) == 3
    assert [r["value"] for r in emf["TasksCompleted"]] == [1]
    [failed] = emf["TasksFailed"]
    assert failed == {**common, "priority": "normal", "error_code": "llm_http_500", "value": 1}
    assert len(emf["TasksCancelled"]) == 1
    assert len(emf["LlmLatency"]) == 3  # every call: the 500, the success, the doomed one
    assert all(r["value"] >= 0 for r in emf["LlmLatency"])
    assert emf["LlmTokens"][0]["value"] > 0
    assert len(emf["QueueWait"]) == 2  # first claims only
    assert emf["EndToEndLatency"][0]["value"] >= 0
    assert "measured" not in json.dumps(emf)  # no prompt text in a metric


class TimedLLM:
    """An LLM whose every call takes `call_s` on the worker's clock (it moves the clock), and
    that keeps the timeout each call was given."""

    def __init__(self, now: list[float], call_s: float) -> None:
        self.now = now
        self.call_s = call_s
        self.timeouts: list[float] = []
        self.called_at: list[float] = []  # time.monotonic() at each call

    async def complete(
        self, request: LLMRequest, *, timeout_s: float, on_progress: Any = None, tokens: int = 0
    ) -> Completion:
        self.timeouts.append(timeout_s)
        self.called_at.append(time.monotonic())
        self.now[0] += self.call_s
        return Completion(text="timed", model="m", usage=Usage(total_tokens=3))


def test_a_task_s_wait_call_and_whole_time_are_measured_on_the_worker_s_clock(
    worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a task claimed 0.25 s after its submit, whose call takes 0.5 s (under a second
    # each: no floor of a second hides them)
    task_id = worker.submit("timed", priority="high")
    now = [worker.task(task_id).created_at + 0.25]
    worker.clock = lambda: now[0]
    capsys.readouterr()
    worker.run(worker.queued(Lane.HIGH), llm=TimedLLM(now, call_s=0.5), lane=Lane.HIGH)
    output = capsys.readouterr().out
    # Then each is one record, by model and priority, in its unit
    dimensions = {"service": "llmtasks", "model": worker.settings.llm_model, "priority": "high"}
    emf, units = emf_records(output), emf_units(output)
    for metric, value, unit in [
        ("QueueWait", 0.25, "Seconds"),
        ("LlmLatency", 500, "Milliseconds"),
        ("EndToEndLatency", 0.75, "Seconds"),
        ("LlmTokens", 3, "Count"),
        ("TasksCompleted", 1, "Count"),
    ]:
        assert emf[metric] == [{**dimensions, "value": pytest.approx(value, abs=0.001)}], metric
        assert units[metric] == {unit}, metric


@pytest.mark.parametrize(
    ("remaining_s", "deadline_in_s", "timeout_s"),
    [
        (30.0, None, 5.0),  # the provider's whole timeout
        (12.5, None, 2.5),  # the time left less the 10 s the outcome's write keeps
        (10.5, None, 1.0),  # never under a second
        (3.0, None, 1.0),
        (30.0, 3.0, 3.0),  # nor past the task's own deadline
    ],
)
def test_a_call_gets_the_time_left_less_the_outcome_s_within_the_task_s_deadline(
    worker: Worker, remaining_s: float, deadline_in_s: float | None, timeout_s: float
) -> None:
    # Given LLM_TIMEOUT_S of 5 s and 10 s kept for writing the outcome
    now = [time.time()]
    worker.clock = lambda: now[0]
    task_id = worker.submit("timed", timeout_s=deadline_in_s)
    llm = TimedLLM(now, call_s=0.1)
    delivery = Delivery(message_id="m", receive_count=1, sent_at=now[0])
    asyncio.run(worker.runner(llm, llm_timeout_s=5.0).run(task_id, delivery, remaining_s=lambda: remaining_s))
    # (the deadline counts from the submit, a moment after the clock was read)
    assert llm.timeouts == [pytest.approx(timeout_s, abs=0.5 if deadline_in_s else 1e-9)]
    assert worker.task(task_id).status is TaskStatus.COMPLETED


def test_the_wait_for_a_paced_slot_comes_out_of_the_call_s_timeout(worker: Worker) -> None:
    # Given a pace of one call a second and two tasks in one invocation, LLM_TIMEOUT_S 120 s
    ids = [worker.submit(f"paced {i}") for i in range(2)]
    pacer = CallPacer(worker.settings.tasks_table_name, worker.aws.dynamodb, calls_per_second=1)
    llm = TimedLLM([0.0], call_s=0)
    began = time.monotonic()
    worker.run(worker.queued(), llm=llm, pacer=pacer, llm_timeout_s=120.0)
    assert all(worker.task(i).status is TaskStatus.COMPLETED for i in ids)
    # Then the second call starts a slot after the first slot, which came no earlier than the run
    # (real time: the pace waits on the clock). Measured from the run's start, not from the first
    # call: a loaded machine can start the first call late in its slot (a CI run's two calls began
    # 0.78 s apart), never the second one early. Each call's timeout is 120 s less its own wait for
    # its slot: more than nothing, and no more than the time since the run began. Each task's wait
    # begins at its own claim, which a loaded machine delays by a varying amount, so the two waits
    # are bounded, not compared (a loaded CI run's second call waited 0.73 s, the first 0.35).
    assert llm.called_at[0] <= llm.called_at[1]
    assert llm.called_at[1] - began >= 0.9
    for timeout_s, called_at in zip(llm.timeouts, llm.called_at, strict=True):
        assert 0.0 < 120.0 - timeout_s <= called_at - began


def test_a_task_s_last_delivery_failing_counts_it_dead_lettered(
    worker: Worker, capsys: pytest.CaptureFixture[str]
) -> None:
    task_id = worker.submit("poison")
    [message] = worker.queued()
    for receive in range(1, worker.settings.task_max_receive_count + 1):
        worker.run([redelivered(message, receive)], llm=CrashingLLM())
    emf = emf_records(capsys.readouterr().out)
    assert [r["value"] for r in emf["TasksDeadLettered"]] == [1]
    assert worker.task(task_id).status is TaskStatus.PROCESSING  # until its lease lapses


def test_the_overview_counts_tasks_and_shows_each_attempt_of_a_task_s_timeline(
    worker: Worker, mock_llm: RunningMock, handler: Any
) -> None:
    # One task that fails once and then completes, one that fails for good, one dead-lettered
    mock_llm.configure(rate_500=1.0)
    retried = worker.submit("retried")
    worker.run_queued()
    mock_llm.configure()
    worker.clock = lambda: time.time() + 5  # past the retry's backoff
    worker.run_queued()
    mock_llm.configure(rate_500=1.0)
    doomed = worker.submit("doomed", max_retries=0)
    worker.run_queued()
    dead, message = worker.crashed("poison")
    for receive in range(2, worker.settings.task_max_receive_count + 1):
        worker.run([redelivered(message, receive)], llm=CrashingLLM())
    later = worker.task(dead).lease_until + 1
    deployment = local_deployment(worker.aws.sqs)
    count_tasks(worker.aws, handler)  # BatchFunction's counters of tasks, from the stream

    view = overview(worker.aws.dynamodb, worker.aws.sqs, deployment, now=later)

    counts = view["tasks"]["by_status"]
    assert (counts["completed"], counts["failed"], counts["dead_lettered"], counts["pending"]) == (1, 1, 1, 0)
    assert counts["processing"] == 0
    # The dead-lettered task is stored as processing, but nothing runs it: not in flight
    assert view["scheduling"]["tenants"] == []
    assert view["scheduling"]["priorities"]["normal"] == {"backlog": 0, "in_flight": 0}
    timeline = {task["task_id"]: task for task in view["recent"]}
    log = timeline[retried]["attempt_log"]
    assert [(a["attempt"], a["outcome"], a.get("error_code")) for a in log] == [
        (1, "retry", "llm_http_500"),
        (2, "completed", None),
    ]
    # Each attempt from its claim to its end: an HTTP call between them, so never the same instant
    assert all(a["ended_at"] > a["started_at"] for a in log)
    [failed] = timeline[doomed]["attempt_log"]
    assert (failed["attempt"], failed["outcome"], failed["error_code"]) == (1, "failed", "llm_http_500")
    assert failed["ended_at"] > failed["started_at"]
    assert timeline[dead]["status"] == "dead_lettered"
    llm = view["latency"]["llm_s"]
    assert llm["n"] == 1
    assert llm["p50"] == pytest.approx(sum(a["ended_at"] - a["started_at"] for a in log), abs=0.01)
    assert sum(bucket["end_to_end_s"]["n"] for bucket in view["series"]) == 1
    assert "retried" not in json.dumps(view)  # no prompt in the overview


def test_a_tenant_at_its_running_cap_waits_queued_while_other_tenants_run(
    worker: Worker, mock_llm: RunningMock, handler: Any
) -> None:
    # Tenant acme's five tasks and globex's one reach one invocation; the stack caps a tenant at two
    # running calls, and acme's key at one for the task it sent with it
    mock_llm.configure(latency_s=1.0)
    for i in range(4):
        worker.service.submit("acme", SubmitTaskRequest(prompt=f"a{i}"))
    keyed = Caller(tenant_id="acme", key_id="k", max_running=1)
    worker.service.submit("acme", SubmitTaskRequest(prompt="a4"), caller=keyed)
    globex = worker.service.submit("globex", SubmitTaskRequest(prompt="g")).task.task_id
    before = time.time()
    worker.run_queued(tenant_max_running=2)
    # Two of acme's ran; its other three wait as pending, their attempt given back; globex ran
    assert worker.task(globex).status is TaskStatus.COMPLETED
    acme = worker.store.tenant_tasks("acme", limit=10)[0]
    waiting = [t for t in acme if t.status is TaskStatus.PENDING]
    assert sorted(t.status.value for t in acme) == ["completed"] * 2 + ["pending"] * 3
    assert {(t.last_error_code, t.attempts) for t in waiting} == {("tenant_capped", 0)}
    assert RunningCalls(worker.settings.limits_table_name or "", worker.aws.dynamodb).running("acme") == {}
    # Each comes back on a message of its own, delayed (5 to 10 s), costing none of its retries
    attributes = worker.aws.sqs.get_queue_attributes(
        QueueUrl=worker.queue.url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "3"
    assert all(before + 5 <= (t.next_attempt_at or 0) <= time.time() + 10 for t in waiting)
    # `llmtasks stats` and the console show who waits
    count_tasks(worker.aws, handler)
    view = overview(worker.aws.dynamodb, worker.aws.sqs, local_deployment(worker.aws.sqs), now=time.time())
    assert view["scheduling"]["tenants"] == [{"tenant_id": "acme", "backlog": 3, "in_flight": 0}]
    assert view["scheduling"]["priorities"]["normal"] == {"backlog": 3, "in_flight": 0}


def test_a_key_s_max_running_caps_its_tasks_without_a_stack_wide_cap(
    worker: Worker, mock_llm: RunningMock
) -> None:
    mock_llm.configure(latency_s=1.0)
    keyed = Caller(tenant_id="initech", key_id="k", max_running=1)
    for i in range(3):
        worker.service.submit("initech", SubmitTaskRequest(prompt=f"i{i}"), caller=keyed)
    worker.run_queued(tenant_max_running=0)
    statuses = sorted(t.status.value for t in worker.store.tenant_tasks("initech", limit=10)[0])
    assert statuses == ["completed", "pending", "pending"]
