"""SQS dead-letter redrive (StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask)
for moto, which lacks it (5.2). LocalStack and AWS have it natively.

`install()` adds the three actions to moto's SQS backend and responses, in whatever process
runs moto: the embedded server of `llmtasks up` and the in-process `mock_aws` of the unit tests.
Differences from AWS, by design: a move runs to completion inside the Start call (AWS moves in
the background, so a task is RUNNING for a while) and ignores MaxNumberOfMessagesPerSecond.
Like AWS, a moved message is a new message in the destination (new id, receive count 0).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from moto.core.responses import ActionResult
from moto.sqs.exceptions import InvalidParameterValue, QueueDoesNotExist
from moto.sqs.models import Message, Queue, SQSBackend
from moto.sqs.responses import SQSResponse

from llmtasks_local import moto_patches
from llmtasks_local.moto_patches import queue_index
from llmtasks_local.moto_patches.atomic import sqs_lock


@dataclass
class MoveTask:
    handle: str
    source_arn: str
    destination_arn: str | None
    rate: int | None
    started_ms: int
    to_move: int
    moved: int = 0
    status: str = "RUNNING"
    failure: str | None = None

    def entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "TaskHandle": self.handle,
            "Status": self.status,
            "SourceArn": self.source_arn,
            "ApproximateNumberOfMessagesMoved": self.moved,
            "ApproximateNumberOfMessagesToMove": self.to_move,
            "StartedTimestamp": self.started_ms,
        }
        if self.destination_arn:
            entry["DestinationArn"] = self.destination_arn
        if self.rate is not None:
            entry["MaxNumberOfMessagesPerSecond"] = self.rate
        if self.failure:
            entry["FailureReason"] = self.failure
        return entry


@dataclass
class _Moves:
    by_source: dict[str, list[MoveTask]] = field(default_factory=dict)


def _moves(backend: SQSBackend) -> _Moves:
    moves: _Moves | None = getattr(backend, "_llmtasks_moves", None)
    if moves is None:
        moves = _Moves()
        backend._llmtasks_moves = moves  # type: ignore[attr-defined]
    return moves


def _queue_by_arn(backend: SQSBackend, arn: str) -> Queue:
    for queue in backend.queues.values():
        if queue.queue_arn == arn:
            return queue
    raise QueueDoesNotExist()


def start_message_move_task(
    backend: SQSBackend, source_arn: str, destination_arn: str | None, rate: int | None
) -> MoveTask:
    dlq = _queue_by_arn(backend, source_arn)
    sources = backend.list_dead_letter_source_queues(dlq.name)
    if not sources:
        raise InvalidParameterValue("Source queue must be configured as a Dead Letter Queue.")
    if destination_arn is not None:
        destination = _queue_by_arn(backend, destination_arn)
    elif len(sources) == 1:
        destination = sources[0]
    else:
        # AWS remembers each message's original source; moto does not record it.
        raise InvalidParameterValue(
            "This dead-letter queue has several sources; the local emulator needs a DestinationArn."
        )
    tasks = _moves(backend).by_source.setdefault(source_arn, [])
    if any(task.status == "RUNNING" for task in tasks):
        raise InvalidParameterValue("There is already a task running. Only one active task is allowed.")
    # No receive or delete of the DLQ's messages cuts through the move.
    with sqs_lock():
        messages = list(dlq.messages)
        handle = base64.b64encode(
            json.dumps({"taskId": str(uuid.uuid4()), "sourceArn": source_arn}).encode()
        ).decode()
        task = MoveTask(handle, source_arn, destination_arn, rate, int(time.time() * 1000), len(messages))
        tasks.insert(0, task)
        for message in messages:
            backend.send_message(
                destination.name,
                message.body,
                message_attributes=dict(message.message_attributes),
                # The tenant it belonged to: a fair queue groups the replayed message as before.
                group_id=message.group_id,
            )
            remove_message(dlq, message)
            task.moved += 1
        task.status = "COMPLETED"
    return task


def list_message_move_tasks(backend: SQSBackend, source_arn: str, max_results: int) -> list[MoveTask]:
    _queue_by_arn(backend, source_arn)
    return _moves(backend).by_source.get(source_arn, [])[:max_results]


def cancel_message_move_task(backend: SQSBackend, handle: str) -> MoveTask:
    for tasks in _moves(backend).by_source.values():
        for task in tasks:
            if task.handle == handle:
                if task.status != "RUNNING":
                    raise InvalidParameterValue("Only active tasks can be cancelled.")
                task.status = "CANCELLED"
                return task
    raise InvalidParameterValue("Value for parameter TaskHandle is invalid.")


def _start(self: SQSResponse) -> ActionResult:
    rate = self._get_param("MaxNumberOfMessagesPerSecond")
    task = start_message_move_task(
        self.sqs_backend,
        self._get_param("SourceArn"),
        self._get_param("DestinationArn"),
        int(rate) if rate is not None else None,
    )
    return ActionResult({"TaskHandle": task.handle})


def _list(self: SQSResponse) -> ActionResult:
    tasks = list_message_move_tasks(
        self.sqs_backend, self._get_param("SourceArn"), int(self._get_param("MaxResults") or 1)
    )
    return ActionResult({"Results": [task.entry() for task in tasks]})


def _cancel(self: SQSResponse) -> ActionResult:
    task = cancel_message_move_task(self.sqs_backend, self._get_param("TaskHandle"))
    return ActionResult({"ApproximateNumberOfMessagesMoved": task.moved})


def remove_message(queue: Queue, message: Message) -> None:
    """Takes `message` off `queue` without a receipt handle (a redrive moving it away). A module
    function, looked up at each call, so that the local stack's journal can record it."""
    with sqs_lock(), queue._messages_lock:
        queue._messages.remove(message)
        queue_index.removed(queue, message)


def install() -> None:
    """Idempotent; must run before moto handles the first request."""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
    SQSResponse.start_message_move_task = _start  # type: ignore[attr-defined]
    SQSResponse.list_message_move_tasks = _list  # type: ignore[attr-defined]
    SQSResponse.cancel_message_move_task = _cancel  # type: ignore[attr-defined]
