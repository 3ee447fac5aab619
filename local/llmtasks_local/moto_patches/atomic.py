"""DynamoDB's conditional writes and SQS's receives made atomic in moto, as they are in AWS.

moto reads the old item (for ReturnValues), checks a ConditionExpression and applies the write
as separate steps with no lock, so two threads (the moto server serves each request on its own
thread; the unit tests run sandboxes in threads too) can both pass a condition only one of them
should, or both be told the same old value. The task lease and the LLM call pace rely on that
atomicity. `install()` serialises moto's handling of each DynamoDB write request behind one lock,
in whatever process runs moto, and of each item read, which DynamoDB answers whole.

It also makes TransactWriteItems cost what it costs in DynamoDB: moto deep-copies every table a
transaction touches, once per action, to roll back a refused one, so a transaction cost as much
as the tables it touched, under the lock, while every other write waited (the batch counters are
such transactions). Here every condition is checked first and nothing
is written unless all hold; only the touched items are kept for a rollback.

moto's SQS has the same gap: a receive checks that a message is visible, then marks it received,
with no lock between, so two pollers receiving at once can both get the same message (one task
then ran twice: a second delivery of a message takes its task over, as a redelivery after a
crash must); and a delete rebuilds the queue's list of messages, dropping one sent meanwhile.
Every SQS operation on messages runs behind one lock here too, released while a receive long-polls.

One more gap of moto's SQS is closed here: SendMessageBatch drops each entry's
MessageSystemAttributes, so a batch-sent message lost its AWSTraceHeader (the X-Ray trace the
function it triggers continues).

And one cost: moto's SendMessage reads the queue's whole attribute set to learn whether it
deduplicates by content, and that set counts the queue's visible, delayed and in-flight messages
by scanning all of them, so each send cost O(messages in the queue) and a backlog took
quadratic time to fill. A send never needs the
counts, so they are not counted while a send runs.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from moto.dynamodb.comparisons import get_filter_expression
from moto.dynamodb.exceptions import (
    MultipleTransactionsException,
    TooManyTransactionsException,
    TransactionCanceledException,
    TransactWriteSingleOpException,
)
from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.responses import DynamoHandler
from moto.sqs.models import Queue, SQSBackend

from llmtasks_local import moto_patches

_WRITES = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
# Item reads take the same lock: moto applies an UpdateItem's SETs to the stored item one by one,
# so a GetItem between them saw a task `completed` without its result (a CI run's README check).
# Queries and scans too: they iterate the table's dict, which a put beside them grows
# ("dictionary changed size during iteration", a 500 to GET /tasks during a batch).
_ITEM_READS = ("get_item", "batch_get_item", "transact_get_items", "query", "scan")
_lock = threading.RLock()
_SQS_MESSAGE_OPERATIONS = (
    "send_message",
    "send_message_batch",
    "receive_message",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
    "purge_queue",
)
_sqs_lock = threading.RLock()
_holds_sqs_lock = threading.local()
_sending = threading.local()
_COUNTS = (
    "approximate_number_of_messages",
    "approximate_number_of_messages_delayed",
    "approximate_number_of_messages_not_visible",
)


def write_lock() -> threading.RLock:
    """The lock every DynamoDB write holds (for a snapshot that no write may cut through)."""
    return _lock


def _atomic(write: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(write)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _lock:
            return write(*args, **kwargs)

    locked.__llmtasks_atomic__ = True  # type: ignore[attr-defined]
    return locked


def _sqs_atomic(operation: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(operation)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _sqs_lock:
            depth = getattr(_holds_sqs_lock, "depth", 0)
            _holds_sqs_lock.depth = depth + 1
            try:
                return operation(*args, **kwargs)
            finally:
                _holds_sqs_lock.depth = depth

    locked.__llmtasks_atomic__ = True  # type: ignore[attr-defined]
    return locked


_wait_for_messages = Queue.wait_for_messages


def _wait_unlocked(self: Queue, timeout: int) -> None:
    """A long poll waits without the lock, so that sends (which end the wait) can go on."""
    depth = getattr(_holds_sqs_lock, "depth", 0)
    for _ in range(depth):
        _sqs_lock.release()
    try:
        _wait_for_messages(self, timeout)
    finally:
        for _ in range(depth):
            _sqs_lock.acquire()


def _key_of(backend: DynamoDBBackend, op_type: str, op: dict[str, Any]) -> dict[str, Any]:
    if op_type != "Put":
        return dict(op["Key"])
    table = backend.get_table(op["TableName"])
    key = {table.hash_key_attr: op["Item"][table.hash_key_attr]}
    if table.range_key_attr is not None:
        key[table.range_key_attr] = op["Item"][table.range_key_attr]
    return key


_Action = tuple[str, dict[str, Any], dict[str, Any], Any]  # type, operation, key, item before


def transact_write_items(self: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> None:
    """All or nothing, as DynamoDB does it: every condition checked before any write."""
    if len(transact_items) > 100:
        raise TooManyTransactionsException()
    _apply(self, _checked(self, transact_items))


def _checked(backend: DynamoDBBackend, transact_items: list[dict[str, Any]]) -> list[_Action]:
    actions: list[_Action] = []
    targets: set[tuple[str, str]] = set()
    errors: list[tuple[str | None, str | None, dict[str, Any] | None]] = []
    for entry in transact_items:
        if len(entry) > 1:
            raise TransactWriteSingleOpException
        op_type, op = next(iter(entry.items()))
        if op_type not in {"ConditionCheck", "Put", "Delete", "Update"}:
            raise ValueError("Unsupported transaction operation")
        key = _key_of(backend, op_type, op)
        target = (str(op["TableName"]), str(dict(sorted(key.items()))))
        if target in targets:
            raise MultipleTransactionsException()
        targets.add(target)
        current = backend.get_item(op["TableName"], key)
        condition = op.get("ConditionExpression")
        if condition is not None:
            check = get_filter_expression(
                condition, op.get("ExpressionAttributeNames"), op.get("ExpressionAttributeValues")
            )
            if not check.expr(current):
                wants_old = op.get("ReturnValuesOnConditionCheckFailure") == "ALL_OLD"
                old = current.to_json()["Attributes"] if wants_old and current else None
                errors.append(("ConditionalCheckFailed", "The conditional request failed", old))
                continue
        errors.append((None, None, None))
        actions.append((op_type, op, key, current))
    if any(code is not None for code, _, _ in errors):
        raise TransactionCanceledException(errors)
    return actions


def _apply(backend: DynamoDBBackend, actions: list[_Action]) -> None:
    applied: list[tuple[str, dict[str, Any], Any]] = []
    try:
        for op_type, op, key, current in actions:
            table_name = op["TableName"]
            if op_type == "Put":
                backend.put_item(table_name, op["Item"])
            elif op_type == "Delete":
                backend.delete_item(table_name, key)
            elif op_type == "Update":
                backend.update_item(
                    table_name,
                    key,
                    update_expression=op["UpdateExpression"],
                    expression_attribute_names=op.get("ExpressionAttributeNames") or {},
                    expression_attribute_values=op.get("ExpressionAttributeValues") or {},
                )
            applied.append((table_name, key, current))
    except Exception:
        for table_name, key, current in reversed(applied):  # a write refused midway: undo the rest
            if current is None:
                backend.delete_item(table_name, key)
            else:
                backend.put_item(table_name, current.to_json()["Attributes"])
        raise


_send_message_batch = SQSBackend.send_message_batch


def _send_message_batch_keeping_system_attributes(
    self: SQSBackend, queue_name: str, entries: dict[str, dict[str, Any]]
) -> tuple[list[Any], list[dict[str, Any]]]:
    messages, failed = _send_message_batch(self, queue_name, entries)
    given = {entry["Id"]: entry.get("MessageSystemAttributes") for entry in entries.values()}
    for message in messages:
        system_attributes = given.get(getattr(message, "user_id", ""))
        if system_attributes:
            message.system_attributes = system_attributes
    return messages, failed


def while_flagged(flag: threading.local, operation: Callable[..., Any], marker: str) -> Callable[..., Any]:
    """`operation` run with `flag.active` set, for a patch deeper in the same call to read; the
    wrapper carries the attribute `marker`, so an install that finds it wraps nothing twice."""

    @functools.wraps(operation)
    def flagged(*args: Any, **kwargs: Any) -> Any:
        flag.active = True
        try:
            return operation(*args, **kwargs)
        finally:
            flag.active = False

    setattr(flagged, marker, True)
    return flagged


def _count_unless_sending(count: property) -> property:
    def counted(queue: Queue) -> int:
        if getattr(_sending, "active", False):
            return 0  # read by a send only for its other attributes
        value: int = count.fget(queue)  # type: ignore[misc]
        return value

    counted.__llmtasks_uncounted__ = True  # type: ignore[attr-defined]
    return property(counted)


def install() -> None:
    """Idempotent; must run before moto handles the first request."""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
    if DynamoDBBackend.transact_write_items is not transact_write_items:
        DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]
    for name in (*_WRITES, *_ITEM_READS):
        write = getattr(DynamoHandler, name, None)
        if write is not None and not getattr(write, "__llmtasks_atomic__", False):
            setattr(DynamoHandler, name, _atomic(write))
    if not getattr(SQSBackend.send_message_batch, "__llmtasks_atomic__", False):
        SQSBackend.send_message_batch = _send_message_batch_keeping_system_attributes  # type: ignore[method-assign]
    for name in _SQS_MESSAGE_OPERATIONS:
        operation = getattr(SQSBackend, name)
        if not getattr(operation, "__llmtasks_atomic__", False):
            setattr(SQSBackend, name, _sqs_atomic(operation))
    Queue.wait_for_messages = _wait_unlocked  # type: ignore[method-assign]
    if not getattr(SQSBackend.send_message, "__llmtasks_uncounted__", False):
        SQSBackend.send_message = while_flagged(  # type: ignore[method-assign]
            _sending, SQSBackend.send_message, "__llmtasks_uncounted__"
        )
    for name in _COUNTS:
        count = Queue.__dict__[name]
        if not getattr(count.fget, "__llmtasks_uncounted__", False):
            setattr(Queue, name, _count_unless_sending(count))


def sqs_lock() -> threading.RLock:
    """The lock every SQS operation on messages holds (for a move between queues)."""
    return _sqs_lock
