"""WorkerFunction: TaskQueue and BatchTaskQueue batches -> one LLM call per task, all records of
an event at once, and more from the queue as calls end (call_slots.py)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from llmtasks.aws.queues import Queue
from llmtasks.domain.messages import TaskMessage
from llmtasks.observability import logger, tracer
from llmtasks.records import process_sqs_concurrently, read_message, receive_count
from llmtasks.wiring import worker as wiring
from llmtasks.worker.call_slots import CallSlots, TakenRecord, keep_slots_full
from llmtasks.worker.runner import Delivery, TaskRunner

# What this function needs, checked as Lambda imports it: a missing variable fails the cold start.
wiring.cold_start()


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def lambda_handler(
    event: dict[str, Any],
    context: LambdaContext,
    runner: TaskRunner | None = None,
    queue: Queue | None = None,
    call_slots: int | None = None,
) -> PartialItemFailureResponse:
    runner = runner or wiring.task_runner()
    # The lane's queue the records came from: more come from there as calls end.
    source = str((event.get("Records") or [{}])[0].get("eventSourceARN", ""))
    queue = queue or wiring.task_lanes().of_source(source)
    slots = wiring.call_slots() if call_slots is None else call_slots
    # The event's records were handed over with the function's whole Timeout: when that can hold
    # a whole call, each is promised one, as the records the invocation takes itself are.
    began_whole = context.get_remaining_time_in_millis() / 1000 >= runner.whole_call_s

    async def run_one(record: SQSRecord) -> None:
        message = read_message(TaskMessage, record)
        delivery = Delivery(
            message_id=record.message_id,
            receive_count=receive_count(record),
            sent_at=int(record.attributes.sent_timestamp) / 1000,
            whole_call=began_whole or isinstance(record, TakenRecord),
        )
        await runner.run(
            message.task_id, delivery, remaining_s=lambda: context.get_remaining_time_in_millis() / 1000
        )

    if slots == 0:
        return process_sqs_concurrently(event, context, run_one, queue)
    return keep_slots_full(event, context, run_one, CallSlots(queue, slots, runner.whole_call_s))
