"""The AWS clients and the adapters that several functions share, each built once per sandbox."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from botocore.config import Config

from llmtasks.aws.batch_store import BatchStore
from llmtasks.aws.budgets import KeyBudgets
from llmtasks.aws.clients import new_client
from llmtasks.aws.limits import KeyLimits, work_ended
from llmtasks.aws.queues import TaskLanes
from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.store import TaskStore
from llmtasks.aws.stream_skips import StreamSkips
from llmtasks.settings import Limits, TaskLanesQueues, TasksTable, resources

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient


# One client per service serves every thread of a sandbox: the worker's concurrent records
# (and, locally, every sandbox of the process). botocore's pool of 10 connections would make the
# eleventh concurrent call open, and then drop, a connection of its own.
_CLIENT_CONFIG = Config(max_pool_connections=64)


def _client(service: str) -> Any:
    return new_client(service, _CLIENT_CONFIG)


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


def stream_skips() -> StreamSkips:
    return StreamSkips(resources(TasksTable).tasks_table_name, dynamodb())


@lru_cache(maxsize=1)
def task_lanes() -> TaskLanes:
    return TaskLanes.of(resources(TaskLanesQueues), sqs())


def batch_store() -> BatchStore:
    return BatchStore(resources(TasksTable).tasks_table_name, dynamodb())


@lru_cache(maxsize=1)
def key_budgets() -> KeyBudgets | None:
    """The API keys' budgets, counted in LimitsTable (submits, fan-outs and retries reserve);
    None where LimitsTable is not configured."""
    table = resources(Limits).limits_table_name
    return None if table is None else KeyBudgets(table, dynamodb(), tasks=task_store())


@lru_cache(maxsize=1)
def key_limits() -> KeyLimits | None:
    """The per-key limits' counters; None where LimitsTable is not configured (no limits)."""
    table = resources(Limits).limits_table_name
    if table is None:
        return None
    return KeyLimits(table, dynamodb(), ended=work_ended(task_store(), batch_store()))


@lru_cache(maxsize=1)
def result_blobs() -> ResultBlobs:
    return ResultBlobs(resources(TasksTable).results_bucket)
