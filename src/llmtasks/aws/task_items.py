"""A task's item in TasksTable: its key (`task#<id>`), a task read back from an item, a write's
refusal or a stream record, and the newest tasks of some tenants. The layout lives here; store.py
writes through it, and the stream's readers (batch counters, webhooks) decode with it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from llmtasks.aws.dynamo import (
    BATCH_GET_KEYS,
    batch_get,
    deserialize,
    dynamodb_errors,
    from_json_text,
    stream_change,
)
from llmtasks.domain.fields import STORED
from llmtasks.domain.models import Task

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

# A tenant's tasks, newest first (GET /tasks): the keys and each task's status.
TENANT_INDEX = "by_tenant_with_status"


def task_key(task_id: str) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"task#{task_id}"}}


def task_from_item(item: Mapping[str, Any]) -> Task:
    """A task from a DynamoDB item (GetItem, UpdateItem or a stream image)."""
    fields = deserialize(item)
    if "metadata" in fields:
        fields["metadata"] = from_json_text(fields["metadata"])
    return Task.model_validate(fields, context=STORED)


def newest_tasks(
    client: DynamoDBClient,
    table: str,
    tenant_ids: list[str],
    fields: list[str],
    *,
    per_tenant: int,
    limit: int,
) -> list[dict[str, Any]]:
    """The newest `limit` tasks among the newest `per_tenant` of each tenant, newest first, with
    the given fields only (pk among them): a query of the tenant index each, and the items read
    by key; never more than len(tenant_ids) * per_tenant index entries and `limit` items."""
    entries: list[tuple[float, dict[str, Any]]] = []
    for tenant_id in tenant_ids:
        with dynamodb_errors("query"):
            reply = client.query(
                TableName=table,
                IndexName=TENANT_INDEX,
                KeyConditionExpression="tenant_id = :tenant",
                ExpressionAttributeValues={":tenant": {"S": tenant_id}},
                ProjectionExpression="pk, created_at",
                ScanIndexForward=False,
                Limit=per_tenant,
            )
        entries += [(float(entry["created_at"]["N"]), {"pk": entry["pk"]}) for entry in reply["Items"]]
    entries.sort(key=lambda entry: -entry[0])
    keys: list[Any] = [key for _, key in entries[:limit]]
    items: dict[str, dict[str, Any]] = {}
    for start in range(0, len(keys), BATCH_GET_KEYS):
        with dynamodb_errors("read"):
            items |= batch_get(client, table, keys[start : start + BATCH_GET_KEYS], fields=fields)
    # In the index's order; a task deleted between the query and the read is left out.
    return [deserialize(items[key["pk"]["S"]]) for key in keys if key["pk"]["S"] in items]


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
