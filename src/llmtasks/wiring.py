"""Builds the real collaborators from `Settings` and the resources, once per process (a Lambda
sandbox).

Each handler module calls `cold_start` with its function's resource model when it is imported:
what the function needs is checked then. Handlers take each collaborator as an optional argument
and fall back to these, so tests pass their own without monkeypatching.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config

from llmtasks.aws.apikeys import ApiKeys
from llmtasks.aws.batch_store import BatchCancellations, BatchStore
from llmtasks.aws.idempotency import IdempotencyKeys
from llmtasks.aws.limits import KeyLimits, RunningCalls, work_ended
from llmtasks.aws.pacing import CallPacer
from llmtasks.aws.queues import Queue, TaskLanes
from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.store import TaskStore
from llmtasks.llm import provider_from_settings
from llmtasks.services.batch_items import BatchFanout, BatchProgress
from llmtasks.services.batches import BatchService
from llmtasks.services.tasks import TaskService
from llmtasks.services.webhooks import WebhookDelivery, WebhookRelay, WebhookSender, resolver_from_settings
from llmtasks.settings import (
    ApiResources,
    AuthorizerResources,
    BatchFanoutQueue,
    FunctionResources,
    Limits,
    TaskLanesQueues,
    TasksTable,
    WebhookResources,
    get_settings,
    resources,
)
from llmtasks.worker.runner import TaskRunner

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient


def cold_start(model: type[FunctionResources]) -> None:
    """Validates the settings and the function's resources as its handler module is imported:
    a missing or bad variable fails the cold start (settings.MissingConfiguration), naming it."""
    get_settings()
    resources(model)


# boto3's default session is not safe to create clients from concurrently (the local stack runs
# several sandboxes in threads of one process).
_client_lock = threading.Lock()


# One client per service serves every thread of a sandbox: the worker's concurrent records
# (and, locally, every sandbox of the process). botocore's pool of 10 connections would make the
# eleventh concurrent call open, and then drop, a connection of its own.
_CLIENT_CONFIG = Config(max_pool_connections=64)


def _client(service: str) -> Any:
    with _client_lock:
        return boto3.session.Session().client(service, config=_CLIENT_CONFIG)  # type: ignore[call-overload]


@lru_cache(maxsize=1)
def dynamodb() -> DynamoDBClient:
    client: DynamoDBClient = _client("dynamodb")
    return client


@lru_cache(maxsize=1)
def sqs() -> SQSClient:
    client: SQSClient = _client("sqs")
    return client


def task_store() -> TaskStore:
    return TaskStore(resources(TasksTable).tasks_table_name, dynamodb())


@lru_cache(maxsize=1)
def task_lanes() -> TaskLanes:
    return TaskLanes.of(resources(TaskLanesQueues), sqs())


def worker_call_slots() -> int:
    return get_settings().worker_call_slots


def batch_fanout_queue() -> Queue:
    # SubmitFunction sends to it, BatchFunction reads it: both resource models name it.
    return Queue(resources(BatchFanoutQueue).batch_fanout_queue_url, sqs())


def batch_store() -> BatchStore:
    return BatchStore(resources(TasksTable).tasks_table_name, dynamodb())


@lru_cache(maxsize=1)
def result_blobs() -> ResultBlobs:
    return ResultBlobs(resources(TasksTable).results_bucket)


@lru_cache(maxsize=1)
def key_limits() -> KeyLimits | None:
    """The per-key limits' counters; None where LimitsTable is not configured (no limits)."""
    table = resources(Limits).limits_table_name
    if table is None:
        return None
    return KeyLimits(table, dynamodb(), ended=work_ended(task_store(), batch_store()))


@lru_cache(maxsize=1)
def task_service() -> TaskService:
    settings = get_settings()
    return TaskService(
        settings,
        task_store(),
        task_lanes(),
        results=result_blobs(),
        idempotency=idempotency_keys(),
        limits=key_limits(),
    )


@lru_cache(maxsize=1)
def batch_service() -> BatchService:
    settings = get_settings()
    return BatchService(
        settings,
        task_store(),
        batch_store(),
        batch_fanout_queue(),
        results=result_blobs(),
        idempotency=idempotency_keys(),
        limits=key_limits(),
    )


@lru_cache(maxsize=1)
def batch_fanout() -> BatchFanout:
    return BatchFanout(get_settings(), task_store(), batch_store(), task_lanes(), results=result_blobs())


@lru_cache(maxsize=1)
def batch_progress() -> BatchProgress:
    return BatchProgress(batch_store())


def idempotency_keys() -> IdempotencyKeys | None:
    table = resources(ApiResources).idempotency_table_name
    if table is None:
        return None  # a function that takes no submits (StatusFunction)
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    persistence = DynamoDBPersistenceLayer(table_name=table, boto3_client=dynamodb())
    return IdempotencyKeys(persistence, ttl_s=get_settings().idempotency_ttl_s)


@lru_cache(maxsize=1)
def task_runner() -> TaskRunner:
    settings = get_settings()
    pacer = None
    if settings.llm_requests_per_second > 0:
        pacer = CallPacer(
            resources(TasksTable).tasks_table_name,
            dynamodb(),
            calls_per_second=settings.llm_requests_per_second,
        )
    return TaskRunner(
        settings,
        task_store(),
        task_lanes(),
        provider_from_settings(settings),
        results=result_blobs(),
        pacer=pacer,
        cancellations=BatchCancellations(batch_store()),
        running=running_calls(),
    )


def running_calls() -> RunningCalls | None:
    """The tenants' running calls, counted where a cap can apply (LimitsTable configured)."""
    table = resources(Limits).limits_table_name
    if table is None:
        if get_settings().tenant_max_running:
            raise RuntimeError(
                "TENANT_MAX_RUNNING needs LIMITS_TABLE_NAME: the running calls are counted there"
            )
        return None
    return RunningCalls(table, dynamodb())


def webhook_queue() -> Queue:
    return Queue(resources(WebhookResources).webhook_queue_url, sqs())


@lru_cache(maxsize=1)
def webhook_relay() -> WebhookRelay:
    return WebhookRelay(webhook_queue())


@lru_cache(maxsize=1)
def webhook_delivery() -> WebhookDelivery:
    settings = get_settings()
    sender = WebhookSender(
        timeout_s=settings.webhook_timeout_s,
        allowed_hosts=settings.webhook_allowed_hosts,
        resolve=resolver_from_settings(settings),
    )
    dead_letters = Queue(resources(WebhookResources).webhook_dlq_url, sqs())
    return WebhookDelivery(
        settings, task_store(), dead_letters, sender, results=result_blobs(), batches=batch_store()
    )


@lru_cache(maxsize=1)
def api_keys() -> ApiKeys:
    return ApiKeys(resources(AuthorizerResources).api_keys_table_name, dynamodb())
