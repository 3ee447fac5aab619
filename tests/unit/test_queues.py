"""The SQS adapter's own rules, beyond what the services that use it assert."""

from __future__ import annotations

import pytest

from llmtasks.aws.queues import Queue
from llmtasks.domain.messages import TaskMessage
from tests.conftest import Aws

pytestmark = pytest.mark.unit


def test_received_messages_made_visible_again_are_delivered_again_at_once(aws: Aws) -> None:
    # Given 23 messages in flight (more than two ChangeMessageVisibilityBatch calls' worth),
    # one of them deleted since it was received
    queue = Queue(aws.queue_url("TaskQueue"), aws.sqs)
    queue.send_many([TaskMessage(task_id=f"t{i}") for i in range(23)])
    received = aws.messages("TaskQueue")
    assert len(received) == 23
    assert aws.messages("TaskQueue") == []
    queue.delete_many([received[0]["ReceiptHandle"]])

    # When every receipt is made visible again
    visible = queue.make_visible([m["ReceiptHandle"] for m in received])

    # Then the 22 not deleted are delivered again now, not after the queue's visibility timeout
    assert visible == 22
    again = aws.messages("TaskQueue")
    assert sorted(m["MessageId"] for m in again) == sorted(m["MessageId"] for m in received[1:])
