"""A task's item in TasksTable: its key (`task#<id>`), a task read back from an item, a write's
refusal or a stream record, and scans over the task items. The layout lives here; store.py writes
through it, and the stream's readers (batch counters, webhooks) decode with it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from llmtasks.aws.dynamo import deserialize, from_json_text, scan_by_prefix, stream_change
from llmtasks.domain.models import Task

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef


def task_key(task_id: str) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"task#{task_id}"}}


def task_from_item(item: Mapping[str, Any]) -> Task:
    """A task from a DynamoDB item (GetItem, UpdateItem or a stream image)."""
    fields = deserialize(item)
    if "metadata" in fields:
        fields["metadata"] = from_json_text(fields["metadata"])
    return Task.model_validate(fields)


def scan_tasks(client: DynamoDBClient, table: str, fields: list[str], *, limit: int) -> list[dict[str, Any]]:
    """Up to `limit` task items, with the given fields only (the overview: no prompt, no result)."""
    return scan_by_prefix(client, table, "task#", fields, limit=limit)


def task_change(record: Mapping[str, Any]) -> tuple[Task | None, Task]:
    """The task before and after one TasksTable stream record (NEW_AND_OLD_IMAGES)."""
    return stream_change(record, task_from_item)


def is_task_removal(record: Mapping[str, Any]) -> bool:
    """A REMOVE record of a task's item (its TTL passed, and DynamoDB deleted it)."""
    images = record.get("dynamodb") or {}
    return (
        record.get("eventName") == "REMOVE"
        and "OldImage" in images
        and str((images.get("Keys") or {}).get("pk", {}).get("S", "")).startswith("task#")
    )


def removed_task(record: Mapping[str, Any]) -> Task:
    """The task a REMOVE record deleted (its old image)."""
    return task_from_item(record["dynamodb"]["OldImage"])


def failed_task(exc: ClientError) -> Task | None:
    """The item as it was when a condition failed (ReturnValuesOnConditionCheckFailure=ALL_OLD)."""
    item: Mapping[str, Any] | None = exc.response.get("Item")  # type: ignore[assignment]
    return task_from_item(item) if item else None
