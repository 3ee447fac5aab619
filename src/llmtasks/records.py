"""Event-source batches with partial failures (Powertools BatchProcessor).

SQS records of one batch run concurrently on one event loop: ten 60 s LLM calls take about
60 s. A record that raises is reported in `batchItemFailures`, so only it returns to the queue;
`RetryLater` first pushes that message's visibility out to the wanted delay. A message that
comes twice in one batch runs once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Literal, TypeVar

from aws_lambda_powertools.utilities.batch import (
    AsyncBatchProcessor,
    BatchProcessor,
    EventType,
    async_process_partial_response,
    process_partial_response,
)
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import BaseModel, ValidationError

from llmtasks.aws.queues import Queue
from llmtasks.aws.stream_skips import StreamSkips
from llmtasks.domain.errors import RetryLater
from llmtasks.observability import logger

Message = TypeVar("Message", bound=BaseModel)
Change = TypeVar("Change")
# The items of TasksTable a stream consumer reads, by their key's prefix (`task#<id>`, `batch#<id>`).
StreamItem = Literal["task", "batch"]


class UnreadableMessage(ValueError):
    """A message whose body is not what its function reads: the reason, in a sentence. It fails
    its record like any error (retried to maxReceiveCount, then its DLQ holds it), but is logged
    as one line: what was wrong with which message, the traceback only at DEBUG."""


def read_message(model: type[Message], record: SQSRecord) -> Message:
    """The record's body as `model`, or UnreadableMessage saying why not."""
    try:
        return model.model_validate_json(record.body)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            why = f"its body is not JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
        else:
            where = ".".join(str(part) for part in first["loc"]) or "the body"
            why = f"{where}: {first['msg']}"
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        raise UnreadableMessage(f"not a {model.__name__}: {why}{more}") from error


def queue_name(queue_arn: str) -> str:
    return queue_arn.rsplit(":", 1)[-1]


def receive_count(record: SQSRecord) -> int:
    return int(record.attributes.approximate_receive_count or 1)


def sqs_record(message: Any, queue_arn: str) -> dict[str, Any]:
    """A ReceiveMessage message as Lambda's SQS event source hands it to a function."""

    def lower_first(attribute: dict[str, Any]) -> dict[str, Any]:
        return {key[0].lower() + key[1:]: value for key, value in attribute.items()}

    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": dict(message.get("Attributes") or {}),
        "messageAttributes": {
            name: lower_first(dict(value)) for name, value in (message.get("MessageAttributes") or {}).items()
        },
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": queue_arn.split(":")[3] if queue_arn.startswith("arn:") else "",
    }


def process_sqs_concurrently(
    event: dict[str, Any],
    context: LambdaContext,
    handle: Callable[[SQSRecord], Awaitable[None]],
    queue: Queue,
) -> PartialItemFailureResponse:
    event = each_message_once(event)
    # A processor per invocation: it holds the batch's state, and the local stack may run several
    # invocations of one function at once. A batch whose records all failed is still a partial
    # response, not an exception, so the delays set above stand.
    processor = AsyncBatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    return async_process_partial_response(event, pushing_retries_out(handle, queue), processor, context)


def pushing_retries_out(
    handle: Callable[[SQSRecord], Awaitable[None]], queue: Queue
) -> Callable[[SQSRecord], Awaitable[None]]:
    """`handle`, with a RetryLater first pushing its message's next delivery out to the wanted
    delay (then raised: the record failed)."""

    async def record_handler(record: SQSRecord) -> None:
        try:
            await handle(record)
        except RetryLater as later:
            await asyncio.to_thread(queue.retry_later, record.receipt_handle, later.delay_s)
            raise
        except UnreadableMessage as error:
            # pragma: no mutate start, what a log line says
            logger.warning(
                "message unreadable",
                message_id=record.message_id,
                queue=queue_name(record.event_source_arn),
                reason=str(error),
            )
            logger.debug("message unreadable", message_id=record.message_id, exc_info=error)
            # pragma: no mutate end
            raise

    return record_handler


def each_message_once(event: dict[str, Any]) -> dict[str, Any]:
    """The event with each message's first record only. At-least-once delivery may put one
    message in a batch twice, each copy with its own receive count; both would run it, and the
    later copy, seeing a lease of its own message, would take the task over and call again. A
    failure reported for the message covers every copy (Lambda reports by message id)."""
    records = event.get("Records") or []
    seen: set[str] = set()
    unique = []
    for record in records:
        message_id = record.get("messageId")
        if message_id in seen:
            logger.info("message repeated in its batch; it runs once", message_id=message_id)
            continue
        seen.add(message_id)
        unique.append(record)
    return event if len(unique) == len(records) else {**event, "Records": unique}


def process_stream(
    event: dict[str, Any], context: LambdaContext, handle: Callable[[DynamoDBRecord], None]
) -> PartialItemFailureResponse:
    processor = BatchProcessor(event_type=EventType.DynamoDBStreams, raise_on_entire_batch_failure=False)
    return process_partial_response(event, handle, processor, context)


def is_stream_event(event: dict[str, Any]) -> bool:
    records = event.get("Records") or [{}]
    return bool(records[0].get("eventSource") == "aws:dynamodb")


def stream_item(record: Mapping[str, Any]) -> StreamItem | None:
    """Whose change a TasksTable stream record is, by its key: a task's, a batch's, or None for a
    record that is not of this table's items (another table's shape, as SAM CLI's generic
    DynamoDB sample event is, or a delete, which has no new image)."""
    images = record.get("dynamodb") or {}
    if "NewImage" not in images:
        return None
    kind = str((images.get("Keys") or {}).get("pk", {}).get("S", "")).partition("#")[0]
    return "task" if kind == "task" else "batch" if kind == "batch" else None


def read_stream_record(
    record: Mapping[str, Any],
    wanted: Collection[StreamItem],
    decode: Callable[[Mapping[str, Any]], Change],
    skips: Callable[[], StreamSkips],
) -> Change | None:
    """The change `decode` reads from a record of a `wanted` item; None, logged once, for any other
    record (passed over: it is not this consumer's). A record of a wanted item that does not
    decode is logged in one line (its sequence number, key and the error) and raised: its retries
    hold the shard, and each round says which record holds it, until an operator marks it to be
    skipped (`llmtasks streams skip`): then it is passed over, and the log says who asked why."""
    if stream_item(record) not in wanted:
        logger.info("stream record not this function's; passed over", event_id=record.get("eventID"))
        return None
    return decoded_or_skipped(record, decode, skips)


def decoded_or_skipped(
    record: Mapping[str, Any],
    decode: Callable[[Mapping[str, Any]], Change],
    skips: Callable[[], StreamSkips],
) -> Change | None:
    """What `decode` reads from the record; one it cannot read is logged and raised, or passed
    over (None) once an operator marked it to be skipped (see `read_stream_record`): a deletion's
    record too, which `read_stream_record` does not take."""
    try:
        return decode(record)
    except (KeyError, TypeError, ValueError) as error:  # pydantic's ValidationError is a ValueError
        images = record.get("dynamodb") or {}
        sequence_number = str(images.get("SequenceNumber"))
        mark = skips().marked(sequence_number)  # built only here: a consumer rarely needs it
        # pragma: no mutate start, what a log line says
        if mark is not None:
            logger.warning(
                "stream record skipped, as an operator asked",
                sequence_number=sequence_number,
                key=images.get("Keys"),
                reason=mark.reason,
                marked_at=mark.marked_at,
            )
            return None
        logger.error(
            "stream record unreadable; its shard waits on it",
            sequence_number=sequence_number,
            key=images.get("Keys"),
            error=" ".join(str(error).split())[:500],
        )
        # pragma: no mutate end
        raise
