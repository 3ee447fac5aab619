"""BatchFunction's parts: a batch's fan-out into tasks, and its counters."""

from __future__ import annotations

from functools import lru_cache

from llmtasks.api.openai_batch_files import ENDPOINTS, OpenAIBatchFiles, line_parser
from llmtasks.aws.provider_jobs import ProviderJobs
from llmtasks.aws.queues import Queue
from llmtasks.aws.task_counts import TaskCounts
from llmtasks.domain.provider_batches import provider_refusal
from llmtasks.llm.openai_batches import OpenAIBatchJobs
from llmtasks.services.batch_inputs import BatchInputReader
from llmtasks.services.batch_items import BatchEnds, BatchFanout, BatchProgress
from llmtasks.services.batch_outcomes import BatchOutcomes
from llmtasks.services.provider_batches import ProviderBatches
from llmtasks.services.task_tally import TaskTally
from llmtasks.settings import (
    BatchFanoutQueue,
    BatchResources,
    FanoutSettings,
    LlmSettings,
    TasksTable,
    resources,
    section,
)
from llmtasks.wiring import build_in_lambda, check_configuration
from llmtasks.wiring.adapters import (
    batch_store,
    dynamodb,
    key_budgets,
    key_limits,
    result_blobs,
    sqs,
    task_lanes,
    task_store,
)


def cold_start() -> None:
    check_configuration(BatchResources, FanoutSettings)
    build_in_lambda(batch_fanout, batch_progress, task_tally)


def batch_fanout_queue() -> Queue:
    return Queue(resources(BatchFanoutQueue).batch_fanout_queue_url, sqs())


@lru_cache(maxsize=1)
def batch_ends() -> BatchEnds:
    # A batch made through the OpenAI surface ends with its outcomes in OpenAI's files.
    files = OpenAIBatchFiles(BatchOutcomes(task_store(), result_blobs()))
    return BatchEnds(batch_store(), batch_fanout_queue(), files=files.write)


@lru_cache(maxsize=1)
def batch_fanout() -> BatchFanout:
    return BatchFanout(
        section(FanoutSettings),
        task_store(),
        batch_store(),
        task_lanes(),
        ends=batch_ends(),
        results=result_blobs(),
        budgets=key_budgets(),
        provider=provider_batches(),
        inputs=BatchInputReader(
            section(FanoutSettings),
            batch_store(),
            result_blobs(),
            batch_fanout_queue(),
            # A batch made through the OpenAI surface reads OpenAI's request lines.
            parsers={endpoint: line_parser(endpoint) for endpoint in ENDPOINTS},
            limits=key_limits(),
        ),
    )


def provider_batches() -> ProviderBatches | None:
    """A provider batch's jobs, on a stack whose provider has a batch API (else None: such a
    batch is refused at submit)."""
    llm = section(LlmSettings)
    if provider_refusal(llm.llm_provider) is not None:
        return None
    return ProviderBatches(
        section(FanoutSettings),
        task_store(),
        ProviderJobs(resources(TasksTable).tasks_table_name, dynamodb()),
        OpenAIBatchJobs.from_settings(llm),
        batch_fanout_queue(),
        result_blobs(),
    )


@lru_cache(maxsize=1)
def batch_progress() -> BatchProgress:
    return BatchProgress(batch_store(), ends=batch_ends())


@lru_cache(maxsize=1)
def task_tally() -> TaskTally:
    return TaskTally(TaskCounts(resources(TasksTable).tasks_table_name, dynamodb()))
