"""Whose a batch is: the local console retries an ended batch through the HTTP API as its tenant."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from llmtasks.aws.batch_store import BatchStore
from llmtasks.domain.rules import is_task_id

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


def batch_tenant(dynamodb: DynamoDBClient, tasks_table: str, batch_id: str) -> str | None:
    """The tenant of a batch; None when there is no such batch (or it has expired)."""
    if not is_task_id(batch_id):
        return None
    batch = BatchStore(tasks_table, dynamodb).get(batch_id, now=time.time())
    return None if batch is None else batch.tenant_id
