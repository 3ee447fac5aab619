"""DynamoDB's Time to Live, which moto lacks: items whose TTL attribute has passed are deleted on
a schedule, and their deletions reach the table's stream as REMOVE records, as in AWS.

AWS deletes expired items within days, usually minutes; readers must not rely on the deletion
(ours ignore expired items already). Each delete is conditional on the item still being
expired, so an item whose TTL was moved on meanwhile stays.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# How often the local stack looks for expired items (`llmtasks up --ttl-sweep`).
DEFAULT_SWEEP_S = 60.0


@dataclass(frozen=True)
class TtlTable:
    name: str
    attribute: str  # TimeToLiveSpecification.AttributeName


class TtlSweeper:
    def __init__(
        self,
        dynamodb: DynamoDBClient,
        tables: list[TtlTable],
        *,
        interval_s: float = DEFAULT_SWEEP_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._dynamodb = dynamodb
        self._tables = tables
        self._interval_s = interval_s
        self._clock = clock

    def sweep(self) -> int:
        """Deletes every item expired now; returns how many."""
        return sum(self._sweep_table(table) for table in self._tables)

    def _sweep_table(self, table: TtlTable) -> int:
        description = self._dynamodb.describe_table(TableName=table.name)["Table"]
        keys = [key["AttributeName"] for key in description["KeySchema"]]
        names = {"#ttl": table.attribute}
        values: dict[str, Any] = {":now": {"N": str(int(self._clock()))}}
        key_names = {f"#key{i}": key for i, key in enumerate(keys)}
        deleted = 0
        pages = self._dynamodb.get_paginator("scan").paginate(
            TableName=table.name,
            FilterExpression="#ttl < :now",
            ProjectionExpression=", ".join(key_names),
            ExpressionAttributeNames=names | key_names,
            ExpressionAttributeValues=values,
        )
        for key in (item for page in pages for item in page.get("Items", [])):
            try:
                self._dynamodb.delete_item(
                    TableName=table.name,
                    Key=key,
                    ConditionExpression="#ttl < :now",
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    raise
                continue  # its TTL moved on since the scan
            deleted += 1
        return deleted

    def run(self, stop: threading.Event) -> None:
        """Sweeps every `interval_s` until `stop` is set; a failed sweep is tried again later."""
        while not stop.wait(self._interval_s):
            try:
                self.sweep()
            except Exception as exc:
                if not stop.is_set():
                    print(f"[ttl] sweep failed: {exc!r}", flush=True)
