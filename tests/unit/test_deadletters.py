"""Dead-letter queues: listing them with their tasks, and redriving them (StartMessageMoveTask)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from llmtasks.aws.store import TaskStore
from llmtasks.domain.messages import FanoutMessage, TaskMessage, WebhookMessage
from llmtasks.domain.models import Lease, TaskStatus, WebhookStatus
from llmtasks.ops.deadletters import DeadLetters
from llmtasks.ops.deployment import QUEUES, Deployment, QueueName
from tests.conftest import Aws
from tests.helpers import HANG_S, pending_task

pytestmark = pytest.mark.unit

MAX_RECEIVES = 5


@pytest.fixture
def store(aws: Aws) -> TaskStore:
    return TaskStore(aws.resources.table_names["TasksTable"], aws.dynamodb)


@pytest.fixture
def dead_letters(aws: Aws, store: TaskStore) -> DeadLetters:
    deployment = Deployment(
        tasks_table=store.table_name,
        api_keys_table=aws.resources.table_names["ApiKeysTable"],
        queue_urls={name: aws.queue_url(queue) for name, (queue, _) in QUEUES.items()},
        dlq_urls={name: aws.queue_url(dlq) for name, (_, dlq) in QUEUES.items()},
    )
    return DeadLetters(deployment, dynamodb=aws.dynamodb, sqs=aws.sqs)


def dead_lettered_task(aws: Aws, store: TaskStore, task_id: str, queue: str = "TaskQueue") -> None:
    """A task whose message died on each of its deliveries, moved to its DLQ by SQS itself."""
    now = time.time()
    store.create(pending_task(task_id, now=now, ttl_s=3600))
    url = aws.queue_url(queue)
    aws.sqs.send_message(QueueUrl=url, MessageBody=TaskMessage(task_id=task_id).model_dump_json())
    for receive in range(1, MAX_RECEIVES + 1):
        [message] = aws.sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"]
        # each delivery claims the task, then dies holding a lease that lapses at once
        lease = Lease(
            f"L{receive}",
            until=now - 1,
            message_id=message["MessageId"],
            receive_count=receive,
            # each delivery dies, and the last one's lease lapses at once
            dead_letter_at=now - 1 if receive == MAX_RECEIVES else now + 3600,
        )
        store.claim(task_id, lease, now=now)
    assert aws.sqs.receive_message(QueueUrl=url).get("Messages") is None  # this receive moved it


def test_a_listing_shows_each_message_with_its_task_and_leaves_them_in_place(
    aws: Aws, store: TaskStore, dead_letters: DeadLetters
) -> None:
    dead_lettered_task(aws, store, "t1")
    aws.sqs.send_message(QueueUrl=aws.queue_url("TaskDLQ"), MessageBody="not a task message")
    letters = dead_letters.letters("tasks")
    assert [(letter.task_id, letter.task_status) for letter in letters] == [("t1", "failed"), (None, None)]
    assert letters[0].attempts == MAX_RECEIVES
    assert "TaskDLQ" in (letters[0].error or "")
    # Listing hides nothing: both are still visible and counted
    assert dead_letters.depth("tasks") == 2
    assert len(aws.messages("TaskDLQ")) == 2


def test_a_listing_pages_past_ten_messages(aws: Aws, dead_letters: DeadLetters) -> None:
    for i in range(23):
        aws.sqs.send_message(
            QueueUrl=aws.queue_url("TaskDLQ"), MessageBody=TaskMessage(task_id=f"gone{i}").model_dump_json()
        )
    letters = dead_letters.letters("tasks")
    assert len({letter.message_id for letter in letters}) == 23
    assert all(letter.task_status is None for letter in letters)  # no such tasks: shown as gone
    assert len(dead_letters.letters("tasks", limit=5)) == 5


@pytest.mark.parametrize(("name", "queue"), [("tasks", "TaskQueue"), ("batches", "BatchTaskQueue")])
def test_redrive_moves_messages_back_and_puts_their_tasks_back_to_pending(
    aws: Aws, store: TaskStore, dead_letters: DeadLetters, name: QueueName, queue: str
) -> None:
    dead_lettered_task(aws, store, "t1", queue)
    redrive = dead_letters.redrive(name)
    assert (redrive.messages, redrive.requeued_tasks) == (1, ["t1"])
    # The message is back in its queue as a new message, with a fresh receive count
    [message] = aws.sqs.receive_message(QueueUrl=aws.queue_url(queue), MessageSystemAttributeNames=["All"])[
        "Messages"
    ]
    assert TaskMessage.model_validate_json(message["Body"]).task_id == "t1"
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    assert dead_letters.depth(name) == 0
    task = store.get("t1", now=time.time())
    assert task is not None
    assert (task.status, task.lease_id) == (TaskStatus.PENDING, None)
    # SQS reports the move as done
    [move] = dead_letters.moves(name)
    assert (move["Status"], move["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 1)


def test_a_redrive_during_a_listing_waits_for_it_and_moves_every_message(aws: Aws, store: TaskStore) -> None:
    # A console test failed in CI: its page's listing (every two seconds) held the DLQ's messages
    # hidden when its Redrive button's request came, and the redrive found nothing to move
    dead_lettered_task(aws, store, "t1")
    listing_holds_them = threading.Event()
    release = threading.Event()

    class SlowToShowAgain:
        """The SQS client, pausing a listing between hiding the messages and showing them again."""

        def __getattr__(self, name: str) -> Any:
            return getattr(aws.sqs, name)

        def change_message_visibility_batch(self, **request: Any) -> Any:
            listing_holds_them.set()
            assert release.wait(HANG_S)
            return aws.sqs.change_message_visibility_batch(**request)

    deployment = Deployment(
        tasks_table=store.table_name,
        api_keys_table=aws.resources.table_names["ApiKeysTable"],
        queue_urls={name: aws.queue_url(queue) for name, (queue, _) in QUEUES.items()},
        dlq_urls={name: aws.queue_url(dlq) for name, (_, dlq) in QUEUES.items()},
    )
    dead_letters = DeadLetters(deployment, dynamodb=aws.dynamodb, sqs=SlowToShowAgain())  # type: ignore[arg-type]
    listing = threading.Thread(target=dead_letters.letters, args=("tasks",))
    listing.start()
    assert listing_holds_them.wait(HANG_S)
    redrives: list[Any] = []
    redriving = threading.Thread(target=lambda: redrives.append(dead_letters.redrive("tasks")))
    redriving.start()
    redriving.join(0.5)
    assert redriving.is_alive()  # it waits for the listing to show the messages again
    release.set()
    listing.join(HANG_S)
    redriving.join(HANG_S)
    assert not listing.is_alive()
    assert not redriving.is_alive()
    [redrive] = redrives
    assert (redrive.messages, redrive.requeued_tasks) == (1, ["t1"])


def test_redriving_the_webhook_dlq_returns_events_to_the_webhook_queue(
    aws: Aws, store: TaskStore, dead_letters: DeadLetters
) -> None:
    task = pending_task(
        "t2", now=time.time(), webhook_url="https://example.test/hook", webhook_status=WebhookStatus.FAILED
    )
    store.create(task)
    event = WebhookMessage(webhook_id="msg_1", task_id="t2", event_type="task.completed")
    aws.sqs.send_message(QueueUrl=aws.queue_url("WebhookDLQ"), MessageBody=event.model_dump_json())
    [letter] = dead_letters.letters("webhooks")
    assert (letter.task_id, letter.task_status) == ("t2", "pending, webhook failed")
    redrive = dead_letters.redrive("webhooks")
    assert (redrive.messages, redrive.requeued_tasks) == (1, [])
    [message] = aws.messages("WebhookQueue")
    assert WebhookMessage.model_validate_json(message["Body"]) == event


def test_an_empty_dlq_starts_no_move(dead_letters: DeadLetters) -> None:
    redrive = dead_letters.redrive("tasks")
    assert (redrive.task_handle, redrive.messages) == (None, 0)
    assert dead_letters.moves("tasks") == []


def test_only_a_dead_letter_queue_can_be_redriven(aws: Aws) -> None:
    arn = aws.resources.attributes[("TaskQueue", "Arn")]
    with pytest.raises(ClientError, match="Dead Letter Queue"):
        aws.sqs.start_message_move_task(SourceArn=arn)


def test_a_deployed_stack_is_found_from_its_outputs() -> None:
    import boto3

    cloudformation = boto3.client("cloudformation", region_name="us-east-1")
    outputs = {
        "TasksTableName": "prod-TasksTable-1",
        "ApiKeysTableName": "prod-ApiKeysTable-1",
        "TaskQueueUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-TaskQueue",
        "WebhookQueueUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-WebhookQueue",
        "TaskDLQUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-TaskDLQ",
        "HighTaskQueueUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-HighTaskQueue",
        "HighTaskDLQUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-HighTaskDLQ",
        "WebhookDLQUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-WebhookDLQ",
        "BatchTaskQueueUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-BatchTaskQueue",
        "BatchTaskDLQUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-BatchTaskDLQ",
        "BatchFanoutQueueUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-BatchFanoutQueue",
        "BatchFanoutDLQUrl": "https://sqs.us-east-1.amazonaws.com/1/prod-BatchFanoutDLQ",
        "ApiUrl": "https://x.execute-api.us-east-1.amazonaws.com",
    }
    with Stubber(cloudformation) as stub:
        stub.add_response(
            "describe_stacks",
            {
                "Stacks": [
                    {
                        "StackName": "prod",
                        "CreationTime": "2026-11-29T00:00:00Z",
                        "StackStatus": "CREATE_COMPLETE",
                        "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()],
                    }
                ]
            },
            {"StackName": "prod"},
        )
        deployment = Deployment.of_stack("prod", cloudformation)
    assert deployment == Deployment(
        tasks_table="prod-TasksTable-1",
        api_keys_table="prod-ApiKeysTable-1",
        queue_urls={
            "tasks": outputs["TaskQueueUrl"],
            "high": outputs["HighTaskQueueUrl"],
            "batches": outputs["BatchTaskQueueUrl"],
            "fanout": outputs["BatchFanoutQueueUrl"],
            "webhooks": outputs["WebhookQueueUrl"],
        },
        dlq_urls={
            "tasks": outputs["TaskDLQUrl"],
            "high": outputs["HighTaskDLQUrl"],
            "batches": outputs["BatchTaskDLQUrl"],
            "fanout": outputs["BatchFanoutDLQUrl"],
            "webhooks": outputs["WebhookDLQUrl"],
        },
    )


def test_batch_dead_letters_are_listed_by_what_they_were_for(aws: Aws, dead_letters: DeadLetters) -> None:
    # A fan-out chunk and a batch's webhook event, parked in their DLQs.
    batch_id = "b" * 32
    aws.sqs.send_message(
        QueueUrl=aws.queue_url("BatchFanoutDLQ"),
        MessageBody=FanoutMessage(batch_id=batch_id, chunk=3).model_dump_json(),
    )
    event = WebhookMessage(webhook_id="msg_1", event_type="batch.completed", batch_id=batch_id)
    aws.sqs.send_message(QueueUrl=aws.queue_url("WebhookDLQ"), MessageBody=event.model_dump_json())
    [chunk] = dead_letters.letters("fanout")
    assert (chunk.task_id, chunk.task_status) == (None, f"batch {batch_id}, create chunk 3")
    [hook] = dead_letters.letters("webhooks")
    assert (hook.task_id, hook.task_status) == (None, f"batch {batch_id}")
    assert dead_letters.depth("batches") == 0
