"""The TTL sweep reads what has expired, not the tables (moto_patches.ttl_index, emulator/ttl.py):
counted on a crowded table of which a few items expire, not timed."""

from __future__ import annotations

import time
from typing import Any

import boto3
import httpx
import pytest
from botocore.client import BaseClient
from moto import mock_aws
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.models.table import Table

from llmtasks_local.emulator import state_format
from llmtasks_local.emulator.moto_activity import TTL_EXPIRED_PATH
from llmtasks_local.emulator.ttl import TtlSweeper, TtlTable, expired_on
from llmtasks_local.moto_patches import ttl_index
from tests.conftest import Aws
from tests.helpers import local_client, moto_endpoint

pytestmark = pytest.mark.unit
ITEMS = 5_000


@pytest.fixture
def operations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every AWS operation the test's process calls, in order."""
    called: list[str] = []
    make_api_call = BaseClient._make_api_call

    def recording(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        called.append(operation)
        return make_api_call(client, operation, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", recording)
    return called


@pytest.fixture
def table_walks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every walk over a whole table moto makes (Table.scan, Table.all_items)."""
    walks: list[str] = []
    for name in ("scan", "all_items"):
        walk = getattr(Table, name)

        def counted(table: Table, *args: Any, _walk: Any = walk, _name: str = name, **kwargs: Any) -> Any:
            walks.append(_name)
            return _walk(table, *args, **kwargs)

        monkeypatch.setattr(Table, name, counted)
    return walks


def _reads() -> int:
    return ttl_index.READS.entries + ttl_index.READS.items


def _in_process(backend: Any) -> Any:
    """The sweep's question, asked of the in-process moto as the endpoint asks it."""

    def expired(table: TtlTable, now: int) -> list[dict[str, Any]] | None:
        return ttl_index.expired_keys(backend.get_table(table.name), table.attribute, now)

    return expired


def _removes(aws: Aws, table: str, iterator: str) -> list[str]:
    records = aws.streams.get_records(ShardIterator=iterator)["Records"]
    return sorted(r["dynamodb"]["Keys"]["pk"]["S"] for r in records if r["eventName"] == "REMOVE")


def _latest(aws: Aws, table: str) -> str:
    arn = aws.dynamodb.describe_table(TableName=table)["Table"]["LatestStreamArn"]
    shard = aws.streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    return str(
        aws.streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="LATEST")[
            "ShardIterator"
        ]
    )


def test_a_sweep_reads_the_expired_items_alone_whatever_the_table_holds(
    aws: Aws, operations: list[str], table_walks: list[str]
) -> None:
    table = aws.resources.table_names["TasksTable"]
    backend = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    now = int(time.time())
    clock = [float(now)]
    sweeper = TtlSweeper(
        aws.dynamodb, [TtlTable(table, "expires_at")], clock=lambda: clock[0], expired=_in_process(backend)
    )
    # Given a crowded table: its items written straight to moto's backend (through the API, minutes)
    for i in range(ITEMS):
        backend.put_item(table, {"pk": {"S": f"task#{i}"}, "expires_at": {"N": str(now + 3600)}})
    assert sweeper.sweep() == 0  # its index made from the table, once
    # and a few expired items, written every way a task's item is written
    for i in range(3):
        aws.dynamodb.put_item(
            TableName=table, Item={"pk": {"S": f"gone#{i}"}, "expires_at": {"N": str(now - 1)}}
        )
    aws.dynamodb.batch_write_item(
        RequestItems={
            table: [{"PutRequest": {"Item": {"pk": {"S": "gone#batch"}, "expires_at": {"N": str(now - 5)}}}}]
        }
    )
    aws.dynamodb.transact_write_items(
        TransactItems=[
            {
                "Put": {
                    "TableName": table,
                    "Item": {"pk": {"S": "gone#transaction"}, "expires_at": {"N": str(now - 9)}},
                }
            }
        ]
    )
    aws.dynamodb.update_item(
        TableName=table,
        Key={"pk": {"S": "task#7"}},
        UpdateExpression="SET expires_at = :past",
        ExpressionAttributeValues={":past": {"N": str(now - 2)}},
    )
    # one whose TTL moved on after it expired, one deleted before the sweep, one without a TTL
    aws.dynamodb.put_item(TableName=table, Item={"pk": {"S": "moved"}, "expires_at": {"N": str(now - 1)}})
    aws.dynamodb.update_item(
        TableName=table,
        Key={"pk": {"S": "moved"}},
        UpdateExpression="SET expires_at = :later",
        ExpressionAttributeValues={":later": {"N": str(now + 60)}},
    )
    aws.dynamodb.delete_item(TableName=table, Key={"pk": {"S": "gone#2"}})
    aws.dynamodb.update_item(
        TableName=table, Key={"pk": {"S": "task#8"}}, UpdateExpression="REMOVE expires_at"
    )
    iterator = _latest(aws, table)
    reads, operations[:], table_walks[:] = _reads(), [], []

    # When the sweep runs
    assert sweeper.sweep() == 5

    # Then it read the index's expired entries (the five, the deleted one's, the moved one's old
    # TTL) and the five items it deletes: nothing of the table's thousands, no Scan
    assert _reads() - reads == 7 + 5
    assert table_walks == []
    assert operations == ["DeleteItem"] * 5
    assert _removes(aws, table, iterator) == [
        "gone#0",
        "gone#1",
        "gone#batch",
        "gone#transaction",
        "task#7",
    ]
    assert aws.dynamodb.get_item(TableName=table, Key={"pk": {"S": "moved"}}).get("Item")
    assert aws.dynamodb.get_item(TableName=table, Key={"pk": {"S": "task#8"}}).get("Item")

    # A minute on the moved one expires too, found by the TTL its update wrote; then nothing
    clock[0] = now + 61
    reads = _reads()
    assert sweeper.sweep() == 1
    # its entry and item, and the entries of the five deleted last time (kept until then, in
    # case a sweep is cut short before its deletes)
    assert _reads() - reads == 2 + 5
    assert sweeper.sweep() == 0
    assert table_walks == []
    assert "Scan" not in operations


def test_an_expired_item_whose_ttl_moves_on_before_its_delete_stays(aws: Aws) -> None:
    # Given an expired item the sweep has been told of
    table = aws.resources.table_names["TasksTable"]
    backend = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    now = int(time.time())
    aws.dynamodb.put_item(TableName=table, Item={"pk": {"S": "late"}, "expires_at": {"N": str(now - 1)}})
    [key] = ttl_index.expired_keys(backend.get_table(table), "expires_at", now) or []

    # When a write moves its TTL on before the sweep deletes it
    aws.dynamodb.put_item(TableName=table, Item={"pk": {"S": "late"}, "expires_at": {"N": str(now + 60)}})
    sweeper = TtlSweeper(aws.dynamodb, [TtlTable(table, "expires_at")], clock=lambda: float(now))

    # Then the delete's condition keeps it, and the index no longer names it
    assert sweeper._delete(TtlTable(table, "expires_at"), now, [key]) == 0
    assert aws.dynamodb.get_item(TableName=table, Key=key).get("Item")
    assert ttl_index.expired_keys(backend.get_table(table), "expires_at", now) == []


def test_the_index_follows_the_table_s_ttl_spec(aws: Aws) -> None:
    table = aws.resources.table_names["TasksTable"]
    backend = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    now = int(time.time())
    aws.dynamodb.put_item(
        TableName=table,
        Item={"pk": {"S": "t"}, "expires_at": {"N": str(now - 1)}, "gone_at": {"N": str(now + 60)}},
    )
    assert ttl_index.expired_keys(backend.get_table(table), "expires_at", now) == [{"pk": {"S": "t"}}]
    # a question of another attribute than the table's TTL is not answered: the sweep then scans
    assert ttl_index.expired_keys(backend.get_table(table), "gone_at", now) is None

    # When the table's TTL moves to another attribute, the index is made again of that one
    aws.dynamodb.update_time_to_live(
        TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "gone_at"}
    )
    assert ttl_index.expired_keys(backend.get_table(table), "gone_at", now) == []
    assert ttl_index.expired_keys(backend.get_table(table), "gone_at", now + 61) == [{"pk": {"S": "t"}}]
    # disabled: nothing answered; deleted: the index goes with the table
    aws.dynamodb.update_time_to_live(
        TableName=table, TimeToLiveSpecification={"Enabled": False, "AttributeName": "gone_at"}
    )
    assert ttl_index.expired_keys(backend.get_table(table), "gone_at", now + 61) is None
    aws.dynamodb.update_time_to_live(
        TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "gone_at"}
    )
    live = backend.get_table(table)
    assert live in ttl_index._indexes
    aws.dynamodb.delete_table(TableName=table)
    assert live not in ttl_index._indexes


@pytest.fixture
def moto_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def _ttl_table(dynamodb: Any, name: str) -> None:
    dynamodb.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_time_to_live(
        TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
    )


def test_a_state_load_leaves_the_index_as_the_writes_left_it(moto_env: None) -> None:
    # Given a TTL table of a thousand items, two expired, saved in the state dir's format
    now = int(time.time())
    with mock_aws():
        dynamodb = boto3.client("dynamodb")
        _ttl_table(dynamodb, "t")
        backend = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
        for i in range(1000):
            backend.put_item("t", {"pk": {"S": f"k{i}"}, "expires_at": {"N": str(now + 3600)}})
        for pk in ("old#1", "old#2"):
            dynamodb.put_item(TableName="t", Item={"pk": {"S": pk}, "expires_at": {"N": str(now - 1)}})
        snapshot = state_format.decode(state_format.dump(0, clean=True))

    # When a fresh moto loads it (through the backends' create_table, update_time_to_live, put_item)
    with mock_aws():
        state_format.load(snapshot)
        table = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_table("t")
        assert table in ttl_index._indexes  # made when the load set the table's TTL, then kept
        reads = _reads()

        # Then its first question reads the two expired entries and items, not the thousand
        keys = ttl_index.expired_keys(table, "expires_at", now)
        assert sorted(key["pk"]["S"] for key in keys or []) == ["old#1", "old#2"]
        assert _reads() - reads == 4


def test_a_table_without_an_index_is_indexed_once_at_its_first_question(aws: Aws) -> None:
    # Given a TTL table loaded as moto's objects (the unit tests' fixture, a state dir of the
    # release before): written before any index followed it
    table_name = aws.resources.table_names["TasksTable"]
    backend = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    table = backend.get_table(table_name)
    now = int(time.time())
    for i in range(300):
        table.put_item({"pk": {"S": f"k{i}"}, "expires_at": {"N": str(now + (-1 if i < 3 else 3600))}})
    ttl_index._indexes.pop(table, None)
    reads = _reads()

    # When asked, it reads the table once; afterwards, what expires
    assert len(ttl_index.expired_keys(table, "expires_at", now) or []) == 3
    assert _reads() - reads == 300 + 3 + 3
    reads = _reads()
    assert ttl_index.expired_keys(table, "expires_at", now - 10) == []
    assert _reads() - reads == 0


def test_the_embedded_endpoint_names_the_expired_items_for_the_stack_s_sweep(
    operations: list[str],
) -> None:
    # Given the moto server the stack embeds, with a TTL table of two items, one expired
    with moto_endpoint() as url:
        dynamodb = local_client("dynamodb", url)
        _ttl_table(dynamodb, "t")
        now = int(time.time())
        for pk, expires_at in (("old", now - 10), ("new", now + 3600)):
            dynamodb.put_item(TableName="t", Item={"pk": {"S": pk}, "expires_at": {"N": str(expires_at)}})
        expired = expired_on(url, dynamodb.meta.region_name)
        sweeper = TtlSweeper(dynamodb, [TtlTable("t", "expires_at")], expired=expired)
        operations[:] = []

        # When the stack's sweep asks it, the expired one alone is deleted, with no Scan
        assert sweeper.sweep() == 1
        assert operations == ["DeleteItem"]
        assert [item["pk"]["S"] for item in dynamodb.scan(TableName="t")["Items"]] == ["new"]
        # and what it cannot answer it says so: a table it does not know the sweep scans, an
        # attribute that is not the table's TTL expires nothing (no scan of the table for it)
        assert expired(TtlTable("missing", "expires_at"), now) is None
        assert expired(TtlTable("t", "other"), now) == []
        assert httpx.get(f"{url}{TTL_EXPIRED_PATH}?table=t").status_code == 400
