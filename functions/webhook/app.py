"""WebhookFunction: two event sources, one job.

- TasksTable's stream (filtered to tasks and batches that just ended and have a webhook_url):
  relay each to WebhookQueue. The terminal write itself is the outbox, so a worker that dies
  right after storing its result still gets its webhook sent.
- WebhookQueue: sign and POST one event; retries are visibility delays, the last failure goes
  to WebhookDLQ.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from llmtasks.aws.batch_store import change_of
from llmtasks.aws.queues import Queue
from llmtasks.aws.stream_skips import StreamSkips
from llmtasks.domain.messages import WebhookMessage
from llmtasks.observability import logger, tracer
from llmtasks.records import (
    is_stream_event,
    process_sqs_concurrently,
    process_stream,
    read_message,
    read_stream_record,
    receive_count,
)
from llmtasks.services.webhooks import WebhookDelivery, WebhookRelay
from llmtasks.wiring import webhook as wiring
from llmtasks.wiring.adapters import stream_skips

# What this function needs, checked as Lambda imports it: a missing variable fails the cold start.
wiring.cold_start()


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def lambda_handler(
    event: dict[str, Any],
    context: LambdaContext,
    relay: WebhookRelay | None = None,
    delivery: WebhookDelivery | None = None,
    queue: Queue | None = None,
    skips: StreamSkips | None = None,
) -> PartialItemFailureResponse:
    if is_stream_event(event):
        relay = relay or wiring.webhook_relay()

        def relay_one(record: DynamoDBRecord) -> None:
            change = read_stream_record(
                record.raw_event, ("task", "batch"), change_of, lambda: skips or stream_skips()
            )
            if change is not None:
                relay.relay_change(*change)

        return process_stream(event, context, relay_one)

    delivery = delivery or wiring.webhook_delivery()

    async def deliver_one(record: SQSRecord) -> None:
        await delivery.deliver(read_message(WebhookMessage, record), receive_count=receive_count(record))

    return process_sqs_concurrently(event, context, deliver_one, queue or wiring.webhook_queue())
