"""WorkerFunction: claim, call the mock LLM over HTTP, record the outcome; batches run concurrently."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from llmtasks.llm.mock import reply_text
from llmtasks.llm.openai import OpenAIChat
from llmtasks.local.sources import sqs_record
from llmtasks.models import SubmitTaskRequest, TaskStatus
from llmtasks.queues import Queue
from llmtasks.service import TaskRunner, TaskService
from llmtasks.settings import Settings
from llmtasks.store import TaskStore
from tests.conftest import Aws, RunningMock
from tests.helpers import free_port, pending_task

pytestmark = pytest.mark.unit


class Worker:
    def __init__(self, aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> None:
        self.aws = aws
        self.settings = settings
        self.store = TaskStore(settings.tasks_table_name, aws.dynamodb)
        self.queue = Queue(settings.task_queue_url, aws.sqs)
        self.service = TaskService(settings, self.store, self.queue)
        self.fn, self.context = handler("WorkerFunction")
        self.llm_url = mock_llm.url
        self.clock = time.time

    def submit(self, prompt: str, **options: Any) -> str:
        return self.service.submit("default", SubmitTaskRequest(prompt=prompt, **options)).task_id

    def runner(self, **overrides: Any) -> TaskRunner:
        settings = self.settings.model_copy(update=overrides)
        llm = OpenAIChat(
            base_url=overrides.get("llm_base_url", self.llm_url), api_key=None, default_model="mock-model"
        )
        return TaskRunner(settings, self.store, self.queue, llm, clock=self.clock)

    def queued(self) -> list[dict[str, Any]]:
        return self.aws.messages("TaskQueue")

    def run(self, messages: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
        arn = self.aws.resources.attributes[("TaskQueue", "Arn")]
        event = {"Records": [sqs_record(m, arn) for m in messages]}  # type: ignore[arg-type]
        return self.fn(event, self.context, runner=self.runner(**overrides), queue=self.queue)  # type: ignore[no-any-return]

    def run_queued(self, **overrides: Any) -> dict[str, Any]:
        return self.run(self.queued(), **overrides)

    def task(self, task_id: str) -> Any:
        return self.store.get(task_id, now=time.time())


@pytest.fixture
def worker(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> Worker:
    return Worker(aws, handler, settings.model_copy(update={"retry_base_delay_s": 0.0}), mock_llm)


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


def test_a_permanent_error_fails_at_once(worker: Worker, mock_llm: RunningMock) -> None:
    task_id = worker.submit("to a wrong path")
    worker.run_queued(llm_base_url=mock_llm.url + "/missing")
    task = worker.task(task_id)
    assert (task.status, task.error_code, task.attempts) == (TaskStatus.FAILED, "llm_http_404", 1)
    assert worker.queued() == []


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


def test_a_task_past_its_deadline_fails_without_calling_the_llm(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id = worker.submit("too late", timeout_s=30)
    worker.clock = lambda: time.time() + 31
    worker.run_queued()
    task = worker.task(task_id)
    assert (task.status, task.error_code) == (TaskStatus.FAILED, "deadline_exceeded")
    assert mock_llm.stats.calls == 0


def test_a_malformed_message_is_reported_failed_so_it_ends_in_the_dlq(worker: Worker) -> None:
    worker.aws.sqs.send_message(QueueUrl=worker.settings.task_queue_url, MessageBody="not json")
    reply = worker.run_queued()
    assert len(reply["batchItemFailures"]) == 1


def test_the_sample_event_runs(worker: Worker) -> None:
    from tests.helpers import load_event

    reply = worker.fn(
        load_event("worker_sqs.json"), worker.context, runner=worker.runner(), queue=worker.queue
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


def test_a_result_under_the_threshold_stays_in_the_item(
    worker: Worker, mock_llm: RunningMock, aws: Aws
) -> None:
    mock_llm.configure(reply_chars=1000)
    task_id = worker.submit("small")
    worker.run_queued()
    item = aws.dynamodb.get_item(
        TableName=worker.settings.tasks_table_name, Key={"pk": {"S": f"task#{task_id}"}}
    )
    assert len(item["Item"]["result"]["S"]) == 1000
    bucket = worker.settings.results_bucket
    assert aws_objects(aws, bucket) == []


def aws_objects(aws: Aws, bucket: str) -> list[str]:
    import boto3

    return [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_a_message_that_arrives_before_its_item_comes_back_and_then_runs(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a message whose task item is not written yet (submit sends first, then writes)
    from llmtasks.models import TaskMessage

    worker.queue.send(TaskMessage(task_id="early"))
    [message] = worker.queued()
    # When the worker gets it, it is returned to the queue instead of dropped
    assert len(worker.run([message])["batchItemFailures"]) == 1
    assert mock_llm.stats.calls == 0
    # And once the item exists the next delivery runs it
    worker.store.create(pending_task("early", now=time.time()))
    assert worker.run([message]) == {"batchItemFailures": []}
    assert worker.task("early").status is TaskStatus.COMPLETED


def test_a_message_whose_submit_never_stored_the_task_is_dropped_after_the_grace(
    worker: Worker, mock_llm: RunningMock
) -> None:
    from llmtasks.models import TaskMessage

    worker.queue.send(TaskMessage(task_id="abandoned"))
    worker.clock = lambda: time.time() + worker.settings.unwritten_task_grace_s + 1
    assert worker.run_queued() == {"batchItemFailures": []}
    assert mock_llm.stats.calls == 0
