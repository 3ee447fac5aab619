"""The adapters and the template's queue wiring against a real endpoint over HTTP."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from llmtasks.aws.queues import Queue
from llmtasks.aws.store import ClaimRefused, TaskStore
from llmtasks.domain.messages import TaskMessage
from llmtasks.domain.models import Lease, TaskStatus
from tests.helpers import NEVER, pending_task

pytestmark = pytest.mark.integration


def test_the_task_lifecycle_over_http(remote: dict[str, Any]) -> None:
    store = TaskStore(remote["resources"].table_names["TasksTable"], remote["dynamodb"])
    now = time.time()
    store.create(pending_task("t", tenant="a", now=now))
    store.claim(
        "t",
        Lease("L", until=now + 30, message_id="m1", receive_count=1, dead_letter_at=NEVER),
        now=now,
    )
    with pytest.raises(ClaimRefused):
        store.claim(
            "t",
            Lease("M", until=now + 30, message_id="m1", receive_count=1, dead_letter_at=NEVER),
            now=now,
        )
    assert store.cancel("t", tenant_id="a", now=now).status is TaskStatus.CANCELLED


def test_a_delayed_retry_stays_invisible_until_its_time(remote: dict[str, Any]) -> None:
    url = remote["resources"].queue_urls["TaskQueue"]
    Queue(url, remote["sqs"]).send(TaskMessage(task_id="later"), delay_s=2)
    assert remote["sqs"].receive_message(QueueUrl=url).get("Messages", []) == []
    time.sleep(2.2)
    [message] = remote["sqs"].receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert "later" in message["Body"]


def test_each_service_is_served_where_boto3_s_endpoint_variables_say(
    remote: dict[str, Any], endpoint_url: str
) -> None:
    # scripts/localstack-tests names a LocalStack for SQS alone; DynamoDB stays on moto
    assert remote["sqs"].meta.endpoint_url == os.environ.get("AWS_ENDPOINT_URL_SQS", endpoint_url)
    assert remote["dynamodb"].meta.endpoint_url == endpoint_url
