"""What every DynamoDB adapter shares: items to and from Python values (numbers as Decimals
in DynamoDB, ints and floats here), and botocore's failures as the domain's BackendError, with a
condition that did not hold told apart from an outage."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.domain.errors import BackendError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()
_CONDITION_FAILED = "ConditionalCheckFailedException"
BATCH_GET_ATTEMPTS = 5
BATCH_GET_KEYS = 100  # BatchGetItem's limit per call
T = TypeVar("T")


@contextmanager
def dynamodb_errors(action: str) -> Iterator[None]:
    """DynamoDB's failures as the domain's BackendError: nothing above this adapter sees botocore."""
    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise BackendError(f"DynamoDB {action} failed: {exc}") from exc


def _to_dynamo(value: Any) -> Any:
    """DynamoDB numbers are Decimals; floats are refused by boto3's serializer."""
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, dict):
        return {k: _to_dynamo(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_dynamo(v) for v in value]
    return value


def _from_dynamo(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_dynamo(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_dynamo(v) for v in value]
    return value


def json_text(value: dict[str, Any] | None) -> str | None:
    """A client's JSON object (metadata) as an item holds it: its text, so that any JSON object
    is kept exactly (a map refuses empty keys, nesting past 32, numbers past 38 digits)."""
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def from_json_text(value: Any) -> Any:
    """The object back; an item written when metadata was a map reads as it is."""
    return json.loads(value) if isinstance(value, str) else value


def serialize(values: Mapping[str, Any]) -> dict[str, AttributeValueTypeDef]:
    return {k: _serializer.serialize(_to_dynamo(v)) for k, v in values.items() if v is not None}


def deserialize(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _from_dynamo(_deserializer.deserialize(v)) for k, v in item.items()}


def updated_if(
    client: DynamoDBClient,
    table_name: str,
    key: Mapping[str, AttributeValueTypeDef],
    update: str,
    *,
    condition: str,
    values: Mapping[str, Any],
    names: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """One conditional UpdateItem: the item after it, or None when the condition did not hold
    (any other failure is a BackendError)."""
    optional: dict[str, Any] = {"ExpressionAttributeNames": dict(names)} if names else {}
    with dynamodb_errors("update"):
        try:
            reply = client.update_item(
                TableName=table_name,
                Key=dict(key),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeValues=serialize(values),
                ReturnValues="ALL_NEW",
                **optional,
            )
        except ClientError as exc:
            if is_condition_failure(exc):
                return None
            raise
    return dict(reply["Attributes"])


def is_condition_failure(exc: ClientError) -> bool:
    """A conditional write refused because its condition did not hold (not an outage)."""
    return exc.response.get("Error", {}).get("Code") == _CONDITION_FAILED


def projection(fields: list[str]) -> dict[str, Any]:
    """A read's ProjectionExpression and ExpressionAttributeNames for these fields (paths with
    dots). Every name goes through a placeholder: several (status, total) are reserved words."""
    names = sorted({name for path in fields for name in path.split(".")})
    placeholder = {name: f"#n{i}" for i, name in enumerate(names)}
    return {
        "ProjectionExpression": ", ".join(
            ".".join(placeholder[name] for name in path.split(".")) for path in fields
        ),
        "ExpressionAttributeNames": {alias: name for name, alias in placeholder.items()},
    }


def stream_change(record: Mapping[str, Any], decode: Callable[[Mapping[str, Any]], T]) -> tuple[T | None, T]:
    """An item before and after one stream record (NEW_AND_OLD_IMAGES), each image decoded."""
    images = record["dynamodb"]
    old = images.get("OldImage")
    return (decode(old) if old else None), decode(images["NewImage"])


def numbered_items(
    client: DynamoDBClient, table: str, prefix: str, first: int, last: int
) -> list[tuple[int, dict[str, Any]]]:
    """The items `<prefix><n>` for n in `first`..`last` (at most a hundred), read together, in
    order, up to the first one missing (a task's output chunks, a batch's events: each exists
    before anything counts it, so only its TTL makes one missing); each with its fields."""
    if last < first:
        return []
    items = batch_get(client, table, [{"pk": {"S": f"{prefix}{n}"}} for n in range(first, last + 1)])
    found: list[tuple[int, dict[str, Any]]] = []
    for sequence in range(first, last + 1):
        item = items.get(f"{prefix}{sequence}")
        if item is None:
            break
        found.append((sequence, deserialize(item)))
    return found


def batch_get(
    client: DynamoDBClient,
    table: str,
    keys: list[dict[str, AttributeValueTypeDef]],
    *,
    fields: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """The items of up to 100 keys, by pk, read consistently (with `fields`, those only: pk must
    be one); keys DynamoDB leaves unprocessed (throttling) are asked again, with a backoff."""
    found: dict[str, dict[str, Any]] = {}
    pending: list[Any] = list(keys)
    projected: Any = projection(fields) if fields else {}
    for attempt in range(BATCH_GET_ATTEMPTS):
        if not pending:
            break
        if attempt:
            time.sleep(0.05 * 2**attempt)
        wanted: Any = {"Keys": pending, "ConsistentRead": True, **projected}
        reply = client.batch_get_item(RequestItems={table: wanted})
        for item in reply.get("Responses", {}).get(table, []):
            found[str(item["pk"]["S"])] = dict(item)
        unprocessed: Any = reply.get("UnprocessedKeys", {}).get(table) or {}
        pending = list(unprocessed.get("Keys", []))
    if pending:
        raise BackendError(f"DynamoDB left {len(pending)} of {len(keys)} items unread")
    return found
