"""DynamoDB's Time to Live, which moto lacks: items whose TTL attribute has passed are deleted on
a schedule, and their deletions reach the table's stream as REMOVE records, as in AWS.

AWS deletes expired items within days, usually minutes; readers must not rely on the deletion
(ours ignore expired items already). Each delete is conditional on the item still being
expired, so an item whose TTL was moved on meanwhile stays.

On the embedded endpoint with the moto patches, a sweep asks which items have expired
(`expired_on`: the index moto_patches.ttl_index keeps as items are written), so its reads follow
what expires, not the tables' sizes. On stock moto or an endpoint of your own it scans each
table for them.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from botocore.exceptions import ClientError

from llmtasks_local.emulator.moto_activity import TTL_EXPIRED_PATH

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# How often the local stack looks for expired items (`llmtasks up --ttl-sweep`).
DEFAULT_SWEEP_S = 60.0


@dataclass(frozen=True)
class TtlTable:
    name: str
    attribute: str  # TimeToLiveSpecification.AttributeName


# The keys (DynamoDB JSON) of up to EXPIRED_PAGE of a table's items expired at a time, or None
# when the endpoint cannot tell (the sweep then scans the table).
ExpiredKeys = Callable[[TtlTable, int], list[dict[str, Any]] | None]
EXPIRED_PAGE = 1000  # keys asked for at once (moto_patches.ttl_index.MAX_KEYS)


def expired_on(endpoint_url: str, region: str) -> ExpiredKeys:
    """What the embedded endpoint answers at moto_activity.TTL_EXPIRED_PATH: None when it does
    not know the path (stock moto) or the table (404)."""
    address = urlsplit(endpoint_url)

    def expired(table: TtlTable, now: int) -> list[dict[str, Any]] | None:
        query = {"table": table.name, "region": region, "attribute": table.attribute, "now": now}
        connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=30)
        try:
            connection.request("GET", f"{TTL_EXPIRED_PATH}?{urlencode(query | {'limit': EXPIRED_PAGE})}")
            reply = connection.getresponse()
            body = reply.read()
        finally:
            connection.close()
        if reply.status == 404:
            return None  # stock moto, or a table it does not index: the sweep scans
        if reply.status != 200:
            return []  # nothing this round rather than a scan of the whole table; the next asks again
        keys: list[dict[str, Any]] = json.loads(body)["keys"]
        return keys

    return expired


class TtlSweeper:
    def __init__(
        self,
        dynamodb: DynamoDBClient,
        tables: list[TtlTable],
        *,
        interval_s: float = DEFAULT_SWEEP_S,
        clock: Callable[[], float] = time.time,
        expired: ExpiredKeys | None = None,
    ) -> None:
        self._dynamodb = dynamodb
        self._tables = tables
        self._interval_s = interval_s
        self._clock = clock
        self._expired = expired  # None: each sweep scans each table

    def sweep(self) -> int:
        """Deletes every item expired now; returns how many."""
        return sum(self._sweep_table(table) for table in self._tables)

    def _sweep_table(self, table: TtlTable) -> int:
        now = int(self._clock())
        keys = None if self._expired is None else self._expired(table, now)
        if keys is None:  # the endpoint cannot tell: a scan finds them
            return sum(self._delete(table, now, page) for page in self._scanned(table, now))
        deleted = 0
        while keys:  # a page at a time, each asked once the one before is deleted
            done = self._delete(table, now, keys)
            deleted += done
            if len(keys) < EXPIRED_PAGE or not done:
                break
            keys = self._expired(table, now) if self._expired is not None else None
        return deleted

    def _scanned(self, table: TtlTable, now: int) -> Iterator[list[dict[str, Any]]]:
        """Every page of a Scan of the table for its expired items' keys."""
        description = self._dynamodb.describe_table(TableName=table.name)["Table"]
        key_names = {f"#key{i}": key["AttributeName"] for i, key in enumerate(description["KeySchema"])}
        pages = self._dynamodb.get_paginator("scan").paginate(
            TableName=table.name,
            FilterExpression="#ttl < :now",
            ProjectionExpression=", ".join(key_names),
            ExpressionAttributeNames={"#ttl": table.attribute} | key_names,
            ExpressionAttributeValues={":now": {"N": str(now)}},
        )
        return (page.get("Items", []) for page in pages)

    def _delete(self, table: TtlTable, now: int, keys: list[dict[str, Any]]) -> int:
        """Deletes each item still expired at `now`; returns how many."""
        deleted = 0
        for key in keys:
            try:
                self._dynamodb.delete_item(
                    TableName=table.name,
                    Key=key,
                    ConditionExpression="#ttl < :now",
                    ExpressionAttributeNames={"#ttl": table.attribute},
                    ExpressionAttributeValues={":now": {"N": str(now)}},
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    raise
                continue  # its TTL moved on since it was found
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
