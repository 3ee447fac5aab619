"""The adapters and the template's queue wiring against a real endpoint over HTTP."""

from __future__ import annotations

import time
from typing import Any

import pytest

from llmtasks.models import TaskMessage, TaskStatus
from llmtasks.queues import Queue
from llmtasks.store import ClaimRefused, TaskStore
from tests.helpers import NEVER, pending_task

pytestmark = pytest.mark.integration


def test_the_task_lifecycle_over_http(remote: dict[str, Any]) -> None:
    store = TaskStore(remote["resources"].table_names["TasksTable"], remote["dynamodb"])
    now = time.time()
    store.create(pending_task("t", tenant="a", now=now))
    store.claim(
        "t",
        lease_id="L",
        lease_until=now + 30,
        now=now,
        message_id="m1",
        receive_count=1,
        dead_letter_at=NEVER,
    )
    with pytest.raises(ClaimRefused):
        store.claim(
            "t",
            lease_id="M",
            lease_until=now + 30,
            now=now,
            message_id="m1",
            receive_count=1,
            dead_letter_at=NEVER,
        )
    assert store.cancel("t", tenant_id="a", now=now).status is TaskStatus.CANCELLED


def test_a_message_that_keeps_failing_moves_to_the_dlq_after_max_receive_count(
    remote: dict[str, Any],
) -> None:
    # Given TaskQueue as the template declares it (maxReceiveCount 5 into TaskDLQ)
    urls = remote["resources"].queue_urls
    sqs = remote["sqs"]
    Queue(urls["TaskQueue"], sqs).send(TaskMessage(task_id="poison"))
    # When five deliveries each fail (made visible again at once instead of after 90 minutes)
    for _ in range(5):
        [message] = sqs.receive_message(QueueUrl=urls["TaskQueue"], WaitTimeSeconds=1)["Messages"]
        Queue(urls["TaskQueue"], sqs).retry_later(message["ReceiptHandle"], 0)
    # Then the next receive finds nothing and the message waits in TaskDLQ
    assert sqs.receive_message(QueueUrl=urls["TaskQueue"], WaitTimeSeconds=1).get("Messages", []) == []
    [dead] = sqs.receive_message(QueueUrl=urls["TaskDLQ"], WaitTimeSeconds=1, VisibilityTimeout=0)["Messages"]
    assert TaskMessage.model_validate_json(dead["Body"]).task_id == "poison"
    # And a redrive (StartMessageMoveTask, asynchronous in AWS) brings it back to TaskQueue
    dlq_arn = remote["resources"].attributes[("TaskDLQ", "Arn")]
    sqs.start_message_move_task(SourceArn=dlq_arn)
    give_up = time.monotonic() + 30
    while (move := sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"][0])["Status"] == "RUNNING":
        assert time.monotonic() < give_up
        time.sleep(0.5)
    assert (move["Status"], move["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 1)
    [back] = sqs.receive_message(QueueUrl=urls["TaskQueue"], WaitTimeSeconds=1)["Messages"]
    assert TaskMessage.model_validate_json(back["Body"]).task_id == "poison"


def test_a_delayed_retry_stays_invisible_until_its_time(remote: dict[str, Any]) -> None:
    url = remote["resources"].queue_urls["TaskQueue"]
    Queue(url, remote["sqs"]).send(TaskMessage(task_id="later"), delay_s=2)
    assert remote["sqs"].receive_message(QueueUrl=url).get("Messages", []) == []
    time.sleep(2.2)
    [message] = remote["sqs"].receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert "later" in message["Body"]
