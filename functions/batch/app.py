"""BatchFunction: a batch's fan-out and its counters.

- BatchFanoutQueue: one chunk of a batch's items becomes tasks on BatchTaskQueue, or is
  cancelled.
- TasksTable's stream (filtered to tasks' inserts, changes and deletions): the batch's counters
  move, exactly once per change, and the batch ends when every item is terminal; the counters of
  every task by status, tenant and priority (aws/task_counts.py) move the same way. The records of one
  invocation are counted together (one transaction per batch, not one per record), so a failure
  returns the whole batch of records; counting is idempotent, so the retry is harmless.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from llmtasks.aws.queues import Queue
from llmtasks.aws.stream_skips import StreamSkips
from llmtasks.aws.task_items import is_task_removal, removed_task, task_change
from llmtasks.domain.messages import FanoutMessage
from llmtasks.domain.models import Task
from llmtasks.observability import logger, tracer
from llmtasks.records import (
    decoded_or_skipped,
    is_stream_event,
    process_sqs_concurrently,
    read_message,
    read_stream_record,
)
from llmtasks.services.batch_items import BatchFanout, BatchProgress
from llmtasks.services.task_tally import TaskTally
from llmtasks.wiring import batch as wiring
from llmtasks.wiring.adapters import stream_skips

# What this function needs, checked as Lambda imports it: a missing variable fails the cold start.
wiring.cold_start()


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def lambda_handler(
    event: dict[str, Any],
    context: LambdaContext,
    fanout: BatchFanout | None = None,
    progress: BatchProgress | None = None,
    queue: Queue | None = None,
    skips: StreamSkips | None = None,
    tally: TaskTally | None = None,
) -> PartialItemFailureResponse | None:
    if is_stream_event(event):
        changes: list[tuple[Task | None, Task]] = []
        removed: list[tuple[Task | None, Task | None]] = []

        def marks() -> StreamSkips:  # built only for a record that does not read
            return skips or stream_skips()

        for record in event["Records"]:
            if is_task_removal(record):
                gone = decoded_or_skipped(record, removed_task, marks)
                if gone is not None:
                    removed.append((gone, None))
                continue
            change = read_stream_record(record, {"task"}, task_change, marks)
            if change is not None:
                changes.append(change)
        (progress or wiring.batch_progress()).apply(changes)
        (tally or wiring.task_tally()).apply([*changes, *removed])
        return None

    fanout = fanout or wiring.batch_fanout()

    async def fan_out_one(record: SQSRecord) -> None:
        message = read_message(FanoutMessage, record)
        await asyncio.to_thread(fanout.handle, message, sent_at=int(record.attributes.sent_timestamp) / 1000)

    return process_sqs_concurrently(event, context, fan_out_one, queue or wiring.batch_fanout_queue())
