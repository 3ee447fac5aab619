"""WorkerFunction: TaskQueue and BatchTaskQueue batches -> one LLM call per task, all records of
an event at once."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from llmtasks import wiring
from llmtasks.models import TaskMessage
from llmtasks.observability import logger, tracer
from llmtasks.queues import Queue
from llmtasks.records import process_sqs_concurrently, receive_count
from llmtasks.runner import Delivery, TaskRunner


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def lambda_handler(
    event: dict[str, Any],
    context: LambdaContext,
    runner: TaskRunner | None = None,
    queue: Queue | None = None,
) -> PartialItemFailureResponse:
    runner = runner or wiring.task_runner()

    async def run_one(record: SQSRecord) -> None:
        message = TaskMessage.model_validate_json(record.body)
        delivery = Delivery(
            message_id=record.message_id,
            receive_count=receive_count(record),
            sent_at=int(record.attributes.sent_timestamp) / 1000,
        )
        await runner.run(message.task_id, delivery, remaining_s=context.get_remaining_time_in_millis() / 1000)

    return process_sqs_concurrently(event, context, run_one, queue or wiring.worker_queue(event))
