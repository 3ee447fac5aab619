"""DynamoDB's TTL on the local stack: expired items are deleted, and the deletions reach the
stream as REMOVE records, as in AWS."""

from __future__ import annotations

import time

import pytest

from llmtasks.local.ttl import TtlSweeper, TtlTable
from tests.conftest import Aws

pytestmark = pytest.mark.unit


def test_expired_items_are_deleted_and_appear_on_the_stream_as_removes(aws: Aws) -> None:
    table = aws.resources.table_names["TasksTable"]
    attribute = aws.resources.ttl_attributes["TasksTable"]
    assert attribute == "expires_at"  # as template.yaml declares it
    now = int(time.time())
    items = {"task#gone": now - 10, "task#kept": now + 3600}
    for pk, expires_at in items.items():
        aws.dynamodb.put_item(TableName=table, Item={"pk": {"S": pk}, "expires_at": {"N": str(expires_at)}})
    aws.dynamodb.put_item(TableName=table, Item={"pk": {"S": "tenant#no-ttl"}})
    arn = aws.resources.attributes[("TasksTable", "StreamArn")]
    shard = aws.streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = aws.streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="LATEST")[
        "ShardIterator"
    ]

    assert TtlSweeper(aws.dynamodb, [TtlTable(table, attribute)]).sweep() == 1

    left = {item["pk"]["S"] for item in aws.dynamodb.scan(TableName=table)["Items"]}
    assert left == {"task#kept", "tenant#no-ttl"}
    records = aws.streams.get_records(ShardIterator=iterator)["Records"]
    assert [(r["eventName"], r["dynamodb"]["Keys"]["pk"]["S"]) for r in records] == [("REMOVE", "task#gone")]
    assert TtlSweeper(aws.dynamodb, [TtlTable(table, attribute)]).sweep() == 0  # nothing left to do
