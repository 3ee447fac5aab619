"""BatchFunction's parts: a batch's fan-out into tasks, and its counters."""

from __future__ import annotations

from functools import lru_cache

from llmtasks.aws.queues import Queue
from llmtasks.services.batch_items import BatchFanout, BatchProgress
from llmtasks.settings import BatchFanoutQueue, BatchResources, FanoutSettings, resources, section
from llmtasks.wiring import check_configuration
from llmtasks.wiring.adapters import batch_store, key_budgets, result_blobs, sqs, task_lanes, task_store


def cold_start() -> None:
    check_configuration(BatchResources, FanoutSettings)


def batch_fanout_queue() -> Queue:
    return Queue(resources(BatchFanoutQueue).batch_fanout_queue_url, sqs())


@lru_cache(maxsize=1)
def batch_fanout() -> BatchFanout:
    return BatchFanout(
        section(FanoutSettings),
        task_store(),
        batch_store(),
        task_lanes(),
        results=result_blobs(),
        budgets=key_budgets(),
    )


@lru_cache(maxsize=1)
def batch_progress() -> BatchProgress:
    return BatchProgress(batch_store())
