"""SubmitFunction's and StatusFunction's parts: the task and batch services."""

from __future__ import annotations

from functools import lru_cache

from llmtasks.aws.idempotency import IdempotencyKeys
from llmtasks.aws.provider_jobs import ProviderJobs
from llmtasks.aws.queues import Queue
from llmtasks.services.batches import BatchService
from llmtasks.services.provider_batches import JobEnds
from llmtasks.services.tasks import TaskService
from llmtasks.services.webhook_controls import WebhookControls
from llmtasks.settings import (
    ApiResources,
    BatchFanoutQueue,
    SubmitSettings,
    TasksTable,
    WebhookQueue,
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
    check_configuration(ApiResources, SubmitSettings)
    build_in_lambda(task_service)  # what SubmitFunction's and StatusFunction's routes share


@lru_cache(maxsize=1)
def task_service() -> TaskService:
    return TaskService(
        section(SubmitSettings),
        task_store(),
        task_lanes(),
        results=result_blobs(),
        idempotency=idempotency_keys(),
        limits=key_limits(),
        budgets=key_budgets(),
        # OpenAI's webhook of a provider batch's job: a look at it sent at once.
        job_ended=JobEnds(
            ProviderJobs(resources(TasksTable).tasks_table_name, dynamodb()),
            Queue(resources(BatchFanoutQueue).batch_fanout_queue_url, sqs()),
        ).ended,
    )


@lru_cache(maxsize=1)
def batch_service() -> BatchService:
    return BatchService(
        section(SubmitSettings),
        task_store(),
        batch_store(),
        # SubmitFunction sends to it, BatchFunction reads it: both resource models name it.
        Queue(resources(BatchFanoutQueue).batch_fanout_queue_url, sqs()),
        results=result_blobs(),
        idempotency=idempotency_keys(),
        limits=key_limits(),
    )


@lru_cache(maxsize=1)
def webhook_controls() -> WebhookControls:
    # SubmitFunction sends replays to it, WebhookFunction delivers them.
    queue = Queue(resources(WebhookQueue).webhook_queue_url, sqs())
    return WebhookControls(section(SubmitSettings), task_store().endpoints, queue)


@lru_cache(maxsize=1)
def idempotency_keys() -> IdempotencyKeys | None:
    """One for both services: the API registers each invocation's context with it (Powertools
    reads the time left from it), batches' submits included."""
    table = resources(ApiResources).idempotency_table_name
    if table is None:
        return None  # a function that takes no submits (StatusFunction)
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    persistence = DynamoDBPersistenceLayer(table_name=table, boto3_client=dynamodb())
    return IdempotencyKeys(persistence, ttl_s=section(SubmitSettings).idempotency_ttl_s)
