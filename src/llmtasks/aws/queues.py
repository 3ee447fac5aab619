"""The SQS adapter: send a typed body, or push an in-flight message's next delivery later; the
task queues by lane, each task message sent with its tenant as MessageGroupId (a fair queue)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel

from llmtasks.domain.errors import BackendError
from llmtasks.domain.messages import TaskMessage
from llmtasks.domain.models import Task
from llmtasks.domain.rules import Lane, lane_of
from llmtasks.observability import logger
from llmtasks.settings import TaskLanesQueues

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

# SQS limits: DelaySeconds <= 15 min, a message's visibility timeout <= 12 h.
MAX_DELAY_S = 900
MAX_VISIBILITY_S = 12 * 3600
SEND_BATCH = 10  # the limit of SendMessageBatch, DeleteMessageBatch, ChangeMessageVisibilityBatch
RECEIVE_BATCH = 10  # ReceiveMessage's limit
SEND_ATTEMPTS = 3


def queue_name(url_or_arn: str) -> str:
    """A queue's name from its URL (.../123456789012/name) or its ARN (arn:...:name)."""
    return url_or_arn.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]


def _message_extras(trace_header: str | None, group: str | None) -> dict[str, Any]:
    """A message's AWSTraceHeader attribute, if there is a trace to continue, and its group."""
    extra: dict[str, Any] = {} if group is None else {"MessageGroupId": group}
    if trace_header:
        extra["MessageSystemAttributes"] = {
            "AWSTraceHeader": {"DataType": "String", "StringValue": trace_header}
        }
    return extra


class Queue:
    def __init__(self, queue_url: str, client: SQSClient | None = None) -> None:
        self.url = queue_url
        self._client: SQSClient = client or boto3.client("sqs")

    def send(
        self,
        body: BaseModel,
        *,
        delay_s: float = 0,
        trace_header: str | None = None,
        group: str | None = None,
    ) -> str:
        """`trace_header` (X-Ray's) goes as the AWSTraceHeader attribute: the function the queue
        triggers continues that trace. `group` is the MessageGroupId: on a standard queue, the
        tenant a fair queue shares its consumers between."""
        extras = _message_extras(trace_header, group)
        try:
            reply = self._client.send_message(
                QueueUrl=self.url,
                MessageBody=body.model_dump_json(),
                DelaySeconds=min(MAX_DELAY_S, max(0, round(delay_s))),
                **extras,
            )
        except (BotoCoreError, ClientError) as exc:
            raise BackendError(f"SQS send failed: {exc}") from exc
        return reply["MessageId"]

    def send_many(
        self, bodies: Sequence[BaseModel], *, trace_header: str | None = None, group: str | None = None
    ) -> None:
        """Sends every body, ten to a SendMessageBatch call. Entries that failed on SQS's side are
        sent again; one it refuses as the sender's fault is an error."""
        extras = _message_extras(trace_header, group)
        for start in range(0, len(bodies), SEND_BATCH):
            entries = {
                str(i): body.model_dump_json() for i, body in enumerate(bodies[start : start + SEND_BATCH])
            }
            for _ in range(SEND_ATTEMPTS):
                try:
                    batch: list[Any] = [
                        {"Id": key, "MessageBody": body, **extras} for key, body in entries.items()
                    ]
                    reply = self._client.send_message_batch(QueueUrl=self.url, Entries=batch)
                except (BotoCoreError, ClientError) as exc:
                    raise BackendError(f"SQS send failed: {exc}") from exc
                entries = {
                    f["Id"]: entries[f["Id"]] for f in reply.get("Failed", []) if not f.get("SenderFault")
                }
                refused = [f for f in reply.get("Failed", []) if f.get("SenderFault")]
                if refused:
                    raise BackendError(f"SQS refused a message: {refused[0].get('Message')}")
                if not entries:
                    break
            else:
                raise BackendError(f"SQS did not take {len(entries)} messages")

    def receive(self, limit: int, *, wait_s: int = 0) -> list[MessageTypeDef]:
        """Up to `limit` messages (at most ten, SQS's cap), with the system attributes Lambda's
        event source passes on (the receive count, the send time); waits up to `wait_s` for the
        first. Each is in flight for the queue's visibility timeout."""
        try:
            reply = self._client.receive_message(
                QueueUrl=self.url,
                MaxNumberOfMessages=max(1, min(RECEIVE_BATCH, limit)),
                WaitTimeSeconds=max(0, min(20, wait_s)),
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
        except (BotoCoreError, ClientError) as exc:
            raise BackendError(f"SQS receive failed: {exc}") from exc
        return list(reply.get("Messages") or [])

    def delete_many(self, receipt_handles: Sequence[str]) -> None:
        """Deletes received messages, ten to a DeleteMessageBatch call. A receipt that no longer
        deletes (its message received again since) is left: that delivery deals with it."""
        for start in range(0, len(receipt_handles), SEND_BATCH):
            chunk = receipt_handles[start : start + SEND_BATCH]
            try:
                reply = self._client.delete_message_batch(
                    QueueUrl=self.url,
                    Entries=[{"Id": str(i), "ReceiptHandle": handle} for i, handle in enumerate(chunk)],
                )
            except (BotoCoreError, ClientError) as exc:
                raise BackendError(f"SQS delete failed: {exc}") from exc
            for failed in reply.get("Failed", []):
                logger.info("a handled message was not deleted", code=failed.get("Code"))

    def make_visible(self, receipt_handles: Sequence[str]) -> int:
        """Received messages become visible again at once, ten to a ChangeMessageVisibilityBatch
        call. Returns how many did: a receipt whose message was deleted or received again since
        no longer changes anything."""
        visible = 0
        for start in range(0, len(receipt_handles), SEND_BATCH):
            chunk = receipt_handles[start : start + SEND_BATCH]
            try:
                reply = self._client.change_message_visibility_batch(
                    QueueUrl=self.url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": 0}
                        for i, handle in enumerate(chunk)
                    ],
                )
            except (BotoCoreError, ClientError) as exc:
                raise BackendError(f"SQS visibility change failed: {exc}") from exc
            visible += len(reply.get("Successful", []))
        return visible

    def retry_later(self, receipt_handle: str, delay_s: float) -> None:
        """The message comes back after `delay_s` instead of the queue's visibility timeout.

        Used with a reported batch-item failure: the function does not sleep through a backoff.
        """
        self._client.change_message_visibility(
            QueueUrl=self.url,
            ReceiptHandle=receipt_handle,
            VisibilityTimeout=min(MAX_VISIBILITY_S, max(0, round(delay_s))),
        )


class TaskLanes:
    """The task queues, one per lane (domain.rules.lane_of). Every task message goes out here,
    on its task's lane, grouped by its tenant: SQS fair queues then keep one tenant's backlog
    from holding up the others'."""

    def __init__(self, queues: Mapping[Lane, Queue]) -> None:
        missing = set(Lane) - set(queues)
        if missing:
            raise ValueError(f"no queue for the lanes {sorted(missing)}")
        self._queues = dict(queues)

    @classmethod
    def of(cls, queues: TaskLanesQueues, client: SQSClient) -> TaskLanes:
        """The lanes' queues by the URLs a function is configured with."""
        return cls(
            {
                Lane.NORMAL: Queue(queues.task_queue_url, client),
                Lane.HIGH: Queue(queues.high_task_queue_url, client),
                Lane.BACKGROUND: Queue(queues.batch_task_queue_url, client),
            }
        )

    def __getitem__(self, lane: Lane) -> Queue:
        return self._queues[lane]

    def of_source(self, arn_or_url: str) -> Queue:
        """The lane's queue an event source's ARN (or a queue URL) names; the normal lane's for
        one no lane has (a sample event given to `llmtasks invoke`)."""
        name = queue_name(arn_or_url)
        return next((q for q in self._queues.values() if queue_name(q.url) == name), self[Lane.NORMAL])

    def send(self, task: Task, *, delay_s: float = 0) -> str:
        return self[lane_of(task)].send(
            TaskMessage(task_id=task.task_id),
            delay_s=delay_s,
            trace_header=task.trace_header,
            group=task.tenant_id,
        )

    def send_many(self, tasks: Sequence[Task]) -> None:
        """Each task's message on its lane, batched per lane and tenant."""

        def key(task: Task) -> tuple[Lane, str, str]:
            return lane_of(task), task.tenant_id, task.trace_header or ""

        for (lane, tenant, trace), together in groupby(sorted(tasks, key=key), key=key):
            self[lane].send_many(
                [TaskMessage(task_id=t.task_id) for t in together], trace_header=trace or None, group=tenant
            )
