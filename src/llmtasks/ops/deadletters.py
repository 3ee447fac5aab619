"""What is in the dead-letter queues, and redriving them (`llmtasks dlq list|redrive`).

Redrive is SQS's own (StartMessageMoveTask: each message goes back to the queue it came from);
the tasks of a TaskDLQ redrive are then put back to `pending`, so they read as queued again
rather than as failed until the worker picks them up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import boto3
from pydantic import BaseModel, ValidationError

from llmtasks.aws.queues import Queue
from llmtasks.aws.store import TaskStore
from llmtasks.domain.messages import FanoutMessage, TaskMessage, WebhookMessage
from llmtasks.ops.deployment import Deployment, QueueName

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

QUEUE_NAMES: tuple[QueueName, ...] = ("tasks", "high", "batches", "fanout", "webhooks")
# Queues whose messages each run one task: a redrive puts their tasks back to pending.
_TASK_QUEUES: tuple[QueueName, ...] = ("tasks", "high", "batches")
# While listing, messages already seen are hidden this long so the next receive returns others;
# they are made visible again as soon as the listing ends.
_LISTING_HIDE_S = 60


class DeadLetter(BaseModel):
    """One message in a dead-letter queue, with what its task says now."""

    queue: QueueName
    message_id: str
    task_id: str | None  # None: a body that names no task
    sent_at: float
    task_status: str | None = None  # as a client reads it; None when the task is gone
    attempts: int | None = None
    error: str | None = None


class Redrive(BaseModel):
    queue: QueueName
    task_handle: str | None  # None: the DLQ was empty, so no move was started
    messages: int  # in the DLQ when the move started
    requeued_tasks: list[str]  # put back to pending (TaskDLQ only)


class DeadLetters:
    def __init__(
        self,
        deployment: Deployment,
        *,
        dynamodb: DynamoDBClient | None = None,
        sqs: SQSClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._deployment = deployment
        self._store = TaskStore(deployment.tasks_table, dynamodb or boto3.client("dynamodb"))
        self._sqs: SQSClient = sqs or boto3.client("sqs")
        self._clock = clock
        # A listing hides the messages it reads until it ends; a redrive meanwhile would find the
        # queue empty and move nothing (the console lists every two seconds beside its Redrive
        # button). So listings and redrives of one DeadLetters take turns.
        self._turns = threading.Lock()

    def depth(self, queue: QueueName) -> int:
        attributes = self._sqs.get_queue_attributes(
            QueueUrl=self._deployment.dlq_urls[queue], AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes.get("ApproximateNumberOfMessages", 0))

    def letters(self, queue: QueueName, *, limit: int = 100) -> list[DeadLetter]:
        """Up to `limit` messages, left in the queue and visible."""
        with self._turns:
            return self._letters(queue, limit=limit)

    def _letters(self, queue: QueueName, *, limit: int) -> list[DeadLetter]:
        url = self._deployment.dlq_urls[queue]
        seen: dict[str, DeadLetter] = {}
        handles: list[str] = []
        while len(seen) < limit:
            batch = self._sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=min(10, limit - len(seen)),
                VisibilityTimeout=_LISTING_HIDE_S,
                MessageSystemAttributeNames=["SentTimestamp"],
            ).get("Messages", [])
            if not batch:
                break
            for message in batch:
                handles.append(message["ReceiptHandle"])
                seen[message["MessageId"]] = self._describe(queue, message)
        Queue(url, self._sqs).make_visible(handles)
        return sorted(seen.values(), key=lambda letter: letter.sent_at)

    def _describe(self, queue: QueueName, message: MessageTypeDef) -> DeadLetter:
        sent_at = int(message.get("Attributes", {}).get("SentTimestamp", 0)) / 1000
        body = message.get("Body", "")
        message_id = message["MessageId"]
        models: dict[QueueName, type[BaseModel]] = {"fanout": FanoutMessage, "webhooks": WebhookMessage}
        model = models.get(queue, TaskMessage)
        try:
            parsed: Any = model.model_validate_json(body)
        except ValidationError:
            return DeadLetter(queue=queue, message_id=message_id, task_id=None, sent_at=sent_at)
        if isinstance(parsed, FanoutMessage) or (isinstance(parsed, WebhookMessage) and parsed.batch_id):
            what = f"batch {parsed.batch_id}" + (
                f", {parsed.action} chunk {parsed.chunk}" if isinstance(parsed, FanoutMessage) else ""
            )
            return DeadLetter(
                queue=queue, message_id=message_id, task_id=None, sent_at=sent_at, task_status=what
            )
        task_id: str = parsed.task_id
        now = self._clock()
        stored = self._store.get(task_id, now=now)
        if stored is None:
            return DeadLetter(queue=queue, message_id=message_id, task_id=task_id, sent_at=sent_at)
        task = stored.as_read(now)
        if queue == "webhooks":
            status = task.webhook_status.value if task.webhook_status else None
            return DeadLetter(
                queue=queue,
                message_id=message_id,
                task_id=task_id,
                sent_at=sent_at,
                task_status=f"{task.status.value}, webhook {status}",
                attempts=task.webhook_attempts,
            )
        return DeadLetter(
            queue=queue,
            message_id=message_id,
            task_id=task_id,
            sent_at=sent_at,
            task_status=task.status.value,
            attempts=task.attempts,
            error=task.error or task.last_error,
        )

    def redrive(self, queue: QueueName) -> Redrive:
        """Moves every message back to its source queue (SQS StartMessageMoveTask)."""
        with self._turns:
            return self._redrive(queue)

    def _redrive(self, queue: QueueName) -> Redrive:
        url = self._deployment.dlq_urls[queue]
        letters = self._letters(queue, limit=10_000)
        if not letters:
            return Redrive(queue=queue, task_handle=None, messages=0, requeued_tasks=[])
        arn = self._arn(url)
        handle = self._sqs.start_message_move_task(SourceArn=arn)["TaskHandle"]
        # After the move has started, never before: a task put back to pending whose message
        # failed to move would wait for nothing. A worker that claims first wins; the requeue
        # then finds a live lease and leaves the task alone.
        requeued: list[str] = []
        if queue in _TASK_QUEUES:
            now = self._clock()
            for letter in letters:
                if letter.task_id and self._store.requeue_dead_lettered(letter.task_id, now=now):
                    requeued.append(letter.task_id)
        return Redrive(queue=queue, task_handle=handle, messages=len(letters), requeued_tasks=requeued)

    def _arn(self, url: str) -> str:
        return self._sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]

    def moves(self, queue: QueueName) -> list[dict[str, object]]:
        """The latest redrives of this queue, as SQS reports them (ListMessageMoveTasks)."""
        url = self._deployment.dlq_urls[queue]
        arn = self._arn(url)
        return [
            dict(entry)
            for entry in self._sqs.list_message_move_tasks(SourceArn=arn, MaxResults=10)["Results"]
        ]
