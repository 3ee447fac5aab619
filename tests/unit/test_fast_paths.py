"""moto_patches.fast_paths, index_queries and queue_index compute what moto's own code computes: each reply
parsed by boto3, and each item written, equal with the patches and without them."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from llmtasks_local.moto_patches import fair_queues, fast_paths, queue_index

# 25 CPU-s and no wait: make test runs it in the last phase's idle cores (pyproject's markers)
pytestmark = [pytest.mark.unit, pytest.mark.cpu_bound]

T = TypeVar("T")

# Every kind of AttributeValue, blobs and sets of each included.
ITEM = {
    "pk": {"S": "task#a"},
    "n": {"N": "1.50"},
    "b": {"B": b"\x00\x01\xff"},
    "bs": {"BS": [b"\x02", b"\x03"]},
    "l": {"L": [{"S": "x"}, {"NULL": True}, {"N": "3"}]},
    "m": {"M": {"k": {"BOOL": False}, "deep": {"M": {"s": {"S": "é"}}}}},
    "ss": {"SS": ["p", "q"]},
    "ns": {"NS": ["1", "2"]},
}


def with_and_without(run: Callable[[Any, str], T], aws: Any) -> tuple[T, T]:
    """`run` with the patches (the suite installs them), then with moto's own code, on resources
    of their own each time."""
    fast = run(aws, "fast")
    fast_paths.uninstall()
    queue_index.uninstall()
    try:
        return fast, run(aws, "moto-s-own")
    finally:
        queue_index.install()
        fast_paths.install()


def stream_records(aws: Any, name: str) -> list[dict[str, Any]]:
    """Every record of a fresh table's stream (an insert, a modify and a remove of ITEM), read
    in two pages, so the next iterator is used too."""
    dynamodb, streams = aws.dynamodb, aws.streams
    arn = dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )["TableDescription"]["LatestStreamArn"]
    dynamodb.put_item(TableName=name, Item=ITEM)
    dynamodb.update_item(
        TableName=name,
        Key={"pk": ITEM["pk"]},
        UpdateExpression="SET n = :v REMOVE b",
        ExpressionAttributeValues={":v": {"N": "2"}},
    )
    dynamodb.delete_item(TableName=name, Key={"pk": ITEM["pk"]})
    shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON")
    reply = streams.get_records(ShardIterator=iterator["ShardIterator"], Limit=2)
    records = reply["Records"]
    records += streams.get_records(ShardIterator=reply["NextShardIterator"])["Records"]
    return records


def test_get_records_replies_as_moto_s_serializer_does(aws: Any) -> None:
    fast, slow = with_and_without(stream_records, aws)
    assert [r["eventName"] for r in fast] == ["INSERT", "MODIFY", "REMOVE"]
    assert fast[0]["dynamodb"]["NewImage"] == {**ITEM, "bs": {"BS": [b"\x02", b"\x03"]}}

    def comparable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # A record's id, its table's sequence numbers, its time and the size moto counts with
        # that time in it differ between two tables.
        unique = {"SequenceNumber": "", "ApproximateCreationDateTime": "", "SizeBytes": 0}
        return [{**r, "eventID": "", "dynamodb": {**r["dynamodb"], **unique}} for r in records]

    assert comparable(fast) == comparable(slow)
    # boto3 reads the timestamp into the same type (a datetime), to the millisecond.
    stamps = [r["dynamodb"]["ApproximateCreationDateTime"] for r in fast + slow]
    assert all(type(stamp) is type(stamps[0]) and stamp.microsecond % 1000 == 0 for stamp in stamps)


def table_holding(aws: Any, name: str, item: dict[str, Any]) -> Any:
    """A fresh table (key pk, no stream) holding `item`; the DynamoDB client."""
    aws.dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    aws.dynamodb.put_item(TableName=name, Item=item)
    return aws.dynamodb


def updated_items(aws: Any, name: str) -> list[dict[str, Any]]:
    """One item after each of three updates (one expression twice with other values: a kept tree
    must not keep the first request's values; then one of every action), then the messages of
    four refused updates."""
    dynamodb = table_holding(aws, name, ITEM)
    claim = "SET #s = :s, lease = :lease, attempts = if_not_exists(attempts, :zero) + :one REMOVE b"
    seen = []
    for status, lease in (("processing", "first"), ("processing", "second")):
        seen.append(
            dynamodb.update_item(
                TableName=name,
                Key={"pk": ITEM["pk"]},
                UpdateExpression=claim,
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={
                    ":s": {"S": status},
                    ":lease": {"S": lease},
                    ":zero": {"N": "0"},
                    ":one": {"N": "1"},
                },
                ReturnValues="ALL_NEW",
            )["Attributes"]
        )
    seen.append(
        dynamodb.update_item(
            TableName=name,
            Key={"pk": ITEM["pk"]},
            UpdateExpression=(
                "SET m.deep.s = :t, l[0] = :t, l = list_append(l, :more), n = n - :one"
                " REMOVE lease ADD ns :two DELETE ss :p"
            ),
            ExpressionAttributeValues={
                ":t": {"S": "done"},
                ":more": {"L": [{"S": "y"}]},
                ":one": {"N": "1"},
                ":two": {"NS": ["3"]},
                ":p": {"SS": ["p"]},
            },
            ReturnValues="ALL_NEW",
        )["Attributes"]
    )
    # What moto refuses, it refuses in the same words: a type mismatch, overlapping paths (twice:
    # a refused tree is checked again), a key attribute, a path that does not exist, two SET
    # clauses; and one tree with other attribute names: passed with two, refused when both name
    # one attribute (a tree's shape is kept as passed only with the names it passed with).
    two_names = "SET #a = :t, #b = :t"
    for expression, values, names in (
        ("SET n = n + :t", {":t": {"S": "text"}}, None),
        ("SET m.k = :t, m = :t", {":t": {"S": "x"}}, None),
        ("SET m.k = :t, m = :t", {":t": {"S": "x"}}, None),
        ("SET pk = :t", {":t": {"S": "x"}}, None),
        ("SET nowhere.deep = :t", {":t": {"S": "x"}}, None),
        ("SET a = :t SET b = :t", {":t": {"S": "x"}}, None),
        (two_names, {":t": {"S": "x"}}, {"#a": "named_a", "#b": "named_b"}),
        (two_names, {":t": {"S": "x"}}, {"#a": "named_a", "#b": "named_a"}),
    ):
        try:
            reply = dynamodb.update_item(
                TableName=name,
                Key={"pk": ITEM["pk"]},
                UpdateExpression=expression,
                ExpressionAttributeValues=values,
                **({"ExpressionAttributeNames": names} if names else {}),
                ReturnValues="UPDATED_NEW",
            )
            seen.append(reply["Attributes"])
        except dynamodb.exceptions.ClientError as refused:
            seen.append({"refused": {"S": refused.response["Error"]["Message"]}})
    return seen


def test_update_expressions_parsed_once_apply_as_moto_s_own_parse_does(aws: Any) -> None:
    fast, slow = with_and_without(updated_items, aws)
    assert fast == slow
    assert [item.get("lease") for item in fast[:3]] == [{"S": "first"}, {"S": "second"}, None]
    assert fast[1]["attempts"] == {"N": "2"}
    assert fast[2]["m"]["M"]["deep"]["M"]["s"] == {"S": "done"}
    assert fast[2]["l"]["L"][-1] == {"S": "y"}
    assert fast[2]["n"] == {"N": "0.50"}
    assert [sorted(outcome) for outcome in fast[3:]] == [
        ["refused"],
        ["refused"],
        ["refused"],
        ["refused"],
        ["refused"],
        ["refused"],
        ["named_a", "named_b"],
        ["refused"],
    ]


def test_an_update_expression_is_parsed_once() -> None:
    from moto.dynamodb.exceptions import InvalidUpdateExpression
    from moto.dynamodb.parsing.expressions import UpdateExpressionParser

    expression = "SET a = :a, b = if_not_exists(b, :zero) + :one"
    assert UpdateExpressionParser.make(expression) is UpdateExpressionParser.make(expression)
    for _ in range(2):  # a refused expression is refused every time (an error is not kept)
        with pytest.raises(InvalidUpdateExpression, match="Syntax error"):
            UpdateExpressionParser.make("SET = :a")


def conditional_writes(aws: Any, name: str) -> list[Any]:
    """What each of a run of conditional updates gets: one condition text with values that
    pass it, then values that fail it (kept tokens must not keep a request's values), then
    other names; a condition moto cannot lex, twice (a refused text is not kept)."""
    dynamodb = table_holding(aws, name, {**ITEM, "status": {"S": "pending"}})
    claim = "attribute_exists(pk) AND (#s = :pending OR (#s = :processing AND n < :limit))"
    outcomes: list[Any] = []
    for condition, names, pending, limit in (
        (claim, {"#s": "status"}, "pending", "1"),
        (claim, {"#s": "status"}, "other", "1"),
        (claim, {"#s": "status"}, "other", "2"),
        (claim, {"#s": "n"}, "pending", "2"),
        ("attribute_exists(pk) AND #s = :pending $", {"#s": "status"}, "pending", "1"),
        ("attribute_exists(pk) AND #s = :pending $", {"#s": "status"}, "pending", "1"),
    ):
        values = {":pending": {"S": pending}, ":processing": {"S": "processing"}, ":limit": {"N": limit}}
        uses = {key: value for key, value in values.items() if key in condition}
        try:
            reply = dynamodb.update_item(
                TableName=name,
                Key={"pk": ITEM["pk"]},
                UpdateExpression="SET #s = :processing",
                ConditionExpression=condition,
                ExpressionAttributeNames={"#s": "status"} if names["#s"] == "status" else names,
                ExpressionAttributeValues={**uses, ":processing": values[":processing"]},
                ReturnValues="UPDATED_NEW",
            )
            outcomes.append(reply["Attributes"])
        except dynamodb.exceptions.ClientError as refused:
            outcomes.append(refused.response["Error"]["Message"])
        except ValueError as unparsed:  # moto's parser lets its own error out, in-process
            outcomes.append(f"ValueError: {unparsed}")
    return outcomes


def test_condition_expressions_lexed_once_judge_as_moto_s_own_do(aws: Any) -> None:
    fast, slow = with_and_without(conditional_writes, aws)
    assert fast == slow
    assert fast[0] == {"status": {"S": "processing"}}
    assert fast[1] == "The conditional request failed"
    assert fast[2] == {}  # n (1.50) < 2: passed by the other branch (status already processing)
    assert all(isinstance(outcome, str) for outcome in fast[3:])
    assert fast[4] == fast[5] == "ValueError: Cannot parse condition starting at:$"  # each time


def test_a_conditional_write_s_condition_is_parsed_once_a_request(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The handler's parse (placeholders) and the backend's (the item judged) share one tree; the
    # answers are moto's own (test_condition_expressions_lexed_once_judge_as_moto_s_own_do).
    parsed: list[str] = []
    moto_parse = fast_paths._moto_parse_condition
    monkeypatch.setattr(
        fast_paths, "_moto_parse_condition", lambda parser: parsed.append("") or moto_parse(parser)
    )
    dynamodb = table_holding(aws, "parsed-once", {**ITEM, "status": {"S": "pending"}})
    parsed.clear()  # the table's first item (no condition: moto's parse returns at once)
    key = {"pk": ITEM["pk"]}
    pending = {":pending": {"S": "pending"}}
    claim = {"ConditionExpression": "#s = :pending", "ExpressionAttributeNames": {"#s": "status"}}
    for _ in range(2):  # the same text again, in a request of its own: parsed again
        dynamodb.update_item(
            TableName="parsed-once",
            Key=key,
            UpdateExpression="SET n = :pending",
            ExpressionAttributeValues=pending,
            **claim,
        )
    dynamodb.put_item(
        TableName="parsed-once",
        Item={**ITEM, "status": {"S": "pending"}},
        ExpressionAttributeValues=pending,
        **claim,
    )
    with pytest.raises(dynamodb.exceptions.ConditionalCheckFailedException):
        dynamodb.delete_item(
            TableName="parsed-once", Key=key, ExpressionAttributeValues={":pending": {"S": "done"}}, **claim
        )
    assert len(parsed) == 4
    # What a parse found is the request's own: a placeholder it does not use is still refused
    with pytest.raises(dynamodb.exceptions.ClientError, match="unused in expressions"):
        dynamodb.delete_item(
            TableName="parsed-once",
            Key=key,
            ExpressionAttributeValues=pending,
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames={"#s": "status"},
        )
    assert dynamodb.get_item(TableName="parsed-once", Key=key)["Item"]["status"] == {"S": "pending"}


def received_within_retention(aws: Any, name: str) -> list[str]:
    """The bodies a receive returns from a queue that keeps messages 60 s, of a message sent
    59 s ago and one sent 61 s ago (the send times set in moto's model)."""
    from moto.sqs.models import sqs_backends

    url = aws.sqs.create_queue(QueueName=name, Attributes={"MessageRetentionPeriod": "60"})["QueueUrl"]
    for body in ("kept", "expired"):
        aws.sqs.send_message(QueueUrl=url, MessageBody=body)
    queue = sqs_backends["123456789012"]["us-east-1"].queues[name]
    now_ms = time.time() * 1000
    for message in queue._messages:
        message.sent_timestamp = int(now_ms - (59_000 if message.body == "kept" else 61_000))
    return [
        m["Body"] for m in aws.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    ]


def test_a_receive_checks_retention_as_moto_does(aws: Any) -> None:
    fast, slow = with_and_without(received_within_retention, aws)
    assert fast == slow == ["kept"]


def item_replies(aws: Any, name: str) -> list[dict[str, Any]]:
    """Every item reply the service reads, as boto3 parses it (less the request's metadata): a
    GetItem of an item and of none, a BatchGetItem with a key that has no item, pages of a Query
    of the table and of an index, a Scan with consumed capacity, the old item of a PutItem and of
    a DeleteItem, and a TransactGetItems."""
    dynamodb = aws.dynamodb
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "owner", "AttributeType": "S"},
            {"AttributeName": "n", "AttributeType": "N"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by_owner",
                "KeySchema": [
                    {"AttributeName": "owner", "KeyType": "HASH"},
                    {"AttributeName": "n", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    items = [{**ITEM, "pk": {"S": f"task#{i}"}, "owner": {"S": "acme"}, "n": {"N": str(i)}} for i in range(3)]
    for item in items:
        dynamodb.put_item(TableName=name, Item=item)
    keys = [{"pk": item["pk"]} for item in items]
    replies = [
        dynamodb.get_item(TableName=name, Key=keys[0]),
        dynamodb.get_item(TableName=name, Key={"pk": {"S": "none"}}),
        dynamodb.get_item(TableName=name, Key=keys[1], ProjectionExpression="m.deep, l[0]"),
        dynamodb.batch_get_item(RequestItems={name: {"Keys": [*keys, {"pk": {"S": "none"}}]}}),
        dynamodb.query(
            TableName=name,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": keys[2]["pk"]},
        ),
    ]
    start: dict[str, Any] = {}
    while True:
        page = dynamodb.query(
            TableName=name,
            IndexName="by_owner",
            KeyConditionExpression="#o = :o",
            ExpressionAttributeNames={"#o": "owner"},
            ExpressionAttributeValues={":o": {"S": "acme"}},
            ScanIndexForward=False,
            Limit=2,
            **start,
        )
        replies.append(page)
        if "LastEvaluatedKey" not in page:
            break
        start = {"ExclusiveStartKey": page["LastEvaluatedKey"]}
    replies += [
        dynamodb.scan(TableName=name, ReturnConsumedCapacity="TOTAL"),
        dynamodb.put_item(TableName=name, Item={**items[0], "n": {"N": "9"}}, ReturnValues="ALL_OLD"),
        dynamodb.delete_item(TableName=name, Key=keys[1], ReturnValues="ALL_OLD"),
        dynamodb.transact_get_items(TransactItems=[{"Get": {"TableName": name, "Key": key}} for key in keys]),
    ]
    return [{k: v for k, v in reply.items() if k != "ResponseMetadata"} for reply in replies]


def test_item_replies_reply_as_moto_s_serializer_does(aws: Any) -> None:
    fast, slow = with_and_without(item_replies, aws)

    def comparable(replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # The table's name is in the replies that name their table.
        return [json.loads(json.dumps(r, default=repr).replace("moto-s-own", "fast")) for r in replies]

    assert comparable(fast) == comparable(slow)
    assert fast[0]["Item"]["b"] == {"B": b"\x00\x01\xff"}  # a blob read back as bytes, as boto3 reads it
    assert "Item" not in fast[1]
    assert fast[2]["Item"] == {"m": {"M": {"deep": ITEM["m"]["M"]["deep"]}}, "l": {"L": [{"S": "x"}]}}
    assert len(fast[3]["Responses"]["fast"]) == 3
    assert fast[3]["UnprocessedKeys"] == {}
    assert [[key["n"] for key in page["Items"]] for page in fast[5:7]] == [
        [{"N": "2"}, {"N": "1"}],
        [{"N": "0"}],
    ]


def test_an_update_copies_the_item_only_for_a_table_with_a_stream(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import copy

    from moto.dynamodb.models.dynamo_type import Item

    copied: list[Any] = []
    deepcopy = copy.deepcopy

    def counted(value: Any, memo: Any = None) -> Any:
        if isinstance(value, Item):  # a whole item (its lists and maps are copied to be read)
            copied.append(value)
        return deepcopy(value, memo)

    monkeypatch.setattr(copy, "deepcopy", counted)
    for name, stream in (
        ("streamless", None),
        ("streamed", {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}),
    ):
        aws.dynamodb.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
            **({"StreamSpecification": stream} if stream else {}),
        )
        aws.dynamodb.put_item(TableName=name, Item=ITEM)
        copied.clear()
        aws.dynamodb.update_item(
            TableName=name,
            Key={"pk": ITEM["pk"]},
            UpdateExpression="SET n = n + :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
        )
        item = aws.dynamodb.get_item(TableName=name, Key={"pk": ITEM["pk"]})["Item"]
        assert item["n"] == {"N": "2.50"}
        # The stream's old image is the item's only use of a copy
        assert bool(copied) is (stream is not None), name


def queue_outcomes(aws: Any, name: str) -> dict[str, Any]:
    """What a queue answers through the paths the fast ones replace: which messages a receive
    returns (a delayed one is not), a handle kept after a later receive gave a new one, deletes
    by that old handle, again, and by a handle never given, and the queue's counts after."""
    sqs = aws.sqs
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="delayed", DelaySeconds=900)
    for body in ("a", "b"):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)["Messages"]
    old_handle = next(m["ReceiptHandle"] for m in first if m["Body"] == "a")
    sqs.change_message_visibility(
        QueueUrl=url,
        ReceiptHandle=next(m["ReceiptHandle"] for m in again if m["Body"] == "b"),
        VisibilityTimeout=0,
    )
    deletes = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "old", "ReceiptHandle": old_handle},
            {"Id": "never", "ReceiptHandle": "not-a-handle"},
        ],
    )
    sqs.delete_message(QueueUrl=url, ReceiptHandle=old_handle)  # deleted already: succeeds
    counts = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    left = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    return {
        "received": sorted(m["Body"] for m in first),
        "again": sorted(m["Body"] for m in again),
        "deleted": sorted(entry["Id"] for entry in deletes.get("Successful", [])),
        "refused": [(entry["Id"], entry["Code"]) for entry in deletes.get("Failed", [])],
        "counts": counts,
        "left": [m["Body"] for m in left],
    }


def test_a_queue_s_receives_deletes_and_counts_answer_as_moto_s_own_do(aws: Any) -> None:
    fast, slow = with_and_without(queue_outcomes, aws)
    assert fast == slow
    assert fast["received"] == fast["again"] == ["a", "b"]
    assert (fast["deleted"], fast["refused"], fast["left"]) == (
        ["old"],
        [("never", "ReceiptHandleIsInvalid")],
        ["b"],
    )


def test_a_response_class_s_method_names_are_moto_s_own_made_once() -> None:
    from moto.cloudwatch.responses import CloudWatchResponse
    from moto.core import responses
    from moto.dynamodb.responses import DynamoHandler
    from moto.logs.responses import LogsResponse
    from moto.s3.responses import S3Response
    from moto.sqs.responses import SQSResponse

    for handler in (DynamoHandler, SQSResponse, S3Response, LogsResponse, CloudWatchResponse):
        kept = responses.method_names_from_class(handler)  # type: ignore[attr-defined]
        assert responses.method_names_from_class(handler) is kept  # type: ignore[attr-defined]
        fast_paths.uninstall()
        try:
            assert responses.method_names_from_class(handler) == kept  # type: ignore[attr-defined]
        finally:
            fast_paths.install()
    assert "update_item" in responses.method_names_from_class(DynamoHandler)  # type: ignore[attr-defined]


def test_names_turn_to_underscores_as_moto_s_own_turns_them_once_each() -> None:
    from moto.core import responses
    from moto.core.utils import camelcase_to_underscores as moto_s_own
    from moto.dynamodb.responses import DynamoHandler
    from moto.sqs import models
    from moto.sqs.responses import SQSResponse

    names = [
        *models.Queue.BASE_ATTRIBUTES,
        *models.Queue.FIFO_ATTRIBUTES,
        *models.Queue.KMS_ATTRIBUTES,
        *(name for handler in (DynamoHandler, SQSResponse) for name in dir(handler)),
        "GetItem",
        "ReceiveMessage",
        "ApproximateNumberOfMessagesNotVisible",
        "theNewAttribute",
        "KMSMasterKeyId",
        "a b",
        "",
    ]
    for module in (responses, models):
        kept = module.camelcase_to_underscores  # type: ignore[attr-defined]
        assert kept is not moto_s_own
        assert [kept(name) for name in names] == [moto_s_own(name) for name in names]
    responses.camelcase_to_underscores.cache_clear()  # type: ignore[attr-defined]
    responses.camelcase_to_underscores("GetItem")  # type: ignore[attr-defined]
    responses.camelcase_to_underscores("GetItem")  # type: ignore[attr-defined]
    assert responses.camelcase_to_underscores.cache_info().misses == 1  # type: ignore[attr-defined]
    fast_paths.uninstall()
    try:
        assert responses.camelcase_to_underscores is moto_s_own  # type: ignore[attr-defined]
        assert models.camelcase_to_underscores is moto_s_own  # type: ignore[attr-defined]
    finally:
        fast_paths.install()


def test_request_ids_are_in_moto_s_form_and_differ(aws: Any) -> None:
    def request_ids(aws: Any, _name: str) -> list[str]:
        replies = [aws.dynamodb.describe_limits(), aws.sqs.list_queues(), aws.dynamodb.list_tables()]
        return [reply["ResponseMetadata"]["RequestId"] for reply in replies]

    fast, slow = with_and_without(request_ids, aws)
    for ids in (fast, slow):
        assert len(set(ids)) == len(ids)
        assert all(len(i) == 52 and i.isascii() and i.isalnum() for i in ids), ids


def scans(aws: Any, name: str) -> list[Any]:
    """A table's scans, whole, filtered, projected, in pages, of an index; then an item changed
    after a scan, and the scan's reply left as it was read."""
    aws.dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "g", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-g",
                "KeySchema": [{"AttributeName": "g", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    for i in range(7):
        item = {**ITEM, "pk": {"S": f"task#{i}"}, "g": {"S": f"g{i % 2}"}, "exp": {"N": str(i)}}
        aws.dynamodb.put_item(TableName=name, Item=item)
    filtered = {
        "FilterExpression": "#e < :n",
        "ExpressionAttributeNames": {"#e": "exp"},
        "ExpressionAttributeValues": {":n": {"N": "3"}},
    }
    replies = [
        aws.dynamodb.scan(TableName=name),
        aws.dynamodb.scan(TableName=name, **filtered),
        aws.dynamodb.scan(TableName=name, ProjectionExpression="pk, m.deep", **filtered),
        aws.dynamodb.scan(TableName=name, IndexName="by-g"),
    ]
    pages = aws.dynamodb.get_paginator("scan").paginate(TableName=name, PaginationConfig={"PageSize": 3})
    replies += list(pages)
    aws.dynamodb.update_item(
        TableName=name,
        Key={"pk": {"S": "task#0"}},
        UpdateExpression="SET m.deep.s = :s, l[0] = :s",
        ExpressionAttributeValues={":s": {"S": "changed"}},
    )
    replies.append(aws.dynamodb.scan(TableName=name, **filtered))
    for reply in replies:
        reply.pop("ResponseMetadata", None)
    return replies


def test_scans_copy_only_what_they_keep_and_reply_as_moto_does(aws: Any) -> None:
    fast, slow = with_and_without(scans, aws)
    assert fast == slow
    assert (fast[0]["Count"], fast[1]["Count"], fast[1]["ScannedCount"]) == (7, 3, 7)
    assert [len(page["Items"]) for page in fast[4:7]] == [3, 3, 1]
    [changed] = [item for item in fast[-1]["Items"] if item["pk"] == {"S": "task#0"}]
    assert changed["m"]["M"]["deep"]["M"]["s"] == changed["l"]["L"][0] == {"S": "changed"}
    [before] = [item for item in fast[1]["Items"] if item["pk"] == {"S": "task#0"}]
    assert before["m"]["M"]["deep"] == ITEM["m"]["M"]["deep"]


def index_queries(aws: Any, name: str, seed: int) -> list[Any]:
    """Queries of a table's indexes (an INCLUDE, a KEYS_ONLY and an ALL one, tenant and time),
    read page by page to the end, both ways, with a status filter, a projection, a count, start
    keys of the pages and of no item; among 300 random items of four tenants, some with the same
    time, some without one (not in the index), some large (a page ends at 1 MB); then an item
    changed after a query, and the query's reply left as it was read."""
    rng = random.Random(seed)
    dynamodb = aws.dynamodb
    indexes = [
        {"IndexName": f"by-tenant-{kind.lower()}", "Projection": {"ProjectionType": kind}}
        for kind in ("INCLUDE", "KEYS_ONLY", "ALL")
    ]
    indexes[0]["Projection"]["NonKeyAttributes"] = ["status"]
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "tenant_id", "AttributeType": "S"},
            {"AttributeName": "created_at", "AttributeType": "N"},
        ],
        GlobalSecondaryIndexes=[
            {
                **index,
                "KeySchema": [
                    {"AttributeName": "tenant_id", "KeyType": "HASH"},
                    {"AttributeName": "created_at", "KeyType": "RANGE"},
                ],
            }
            for index in indexes
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    for i in range(300):
        item = {
            "pk": {"S": f"task#{rng.randrange(10**6):06d}-{i}"},
            "tenant_id": {"S": f"t{rng.randrange(4)}"},
            "status": {"S": rng.choice(["pending", "completed", "failed"])},
            "body": {"S": "x" * (rng.choice([10, 10, 10, 90_000]))},
        }
        if rng.random() < 0.9:  # else not in the indexes
            item["created_at"] = {"N": str(rng.choice([rng.randrange(1000), 7, 7.5, 1e3]))}
        dynamodb.put_item(TableName=name, Item=item)
    replies: list[Any] = []
    for index in indexes:
        for forward in (True, False):
            asks = [
                {"Limit": rng.choice([1, 7, 50])},
                {
                    "Limit": 40,
                    "FilterExpression": "#status IN (:a, :b)",
                    "ExpressionAttributeNames": {"#status": "status"},
                    ":values": {":a": {"S": "pending"}, ":b": {"S": "failed"}},
                },
                {"ProjectionExpression": "pk, created_at"},
                {"Select": "COUNT"},
                {
                    "Limit": 5,
                    "ExclusiveStartKey": {
                        "pk": {"S": "task#5"},
                        "tenant_id": {"S": "t1"},
                        "created_at": {"N": "7"},
                    },
                },
            ]
            for ask in asks:
                values = {":t": {"S": "t1"}, **ask.pop(":values", {})}
                query = {
                    "TableName": name,
                    "IndexName": index["IndexName"],
                    "KeyConditionExpression": "tenant_id = :t",
                    "ExpressionAttributeValues": values,
                    "ScanIndexForward": forward,
                    **ask,
                }
                while True:
                    reply = dynamodb.query(**query)
                    reply.pop("ResponseMetadata", None)
                    replies.append(reply)
                    if "LastEvaluatedKey" not in reply or len(replies) > 2000:
                        break
                    query["ExclusiveStartKey"] = reply["LastEvaluatedKey"]
    first = dynamodb.query(
        TableName=name,
        IndexName="by-tenant-all",
        KeyConditionExpression="tenant_id = :t",
        ExpressionAttributeValues={":t": {"S": "t2"}},
        Limit=1,
    )["Items"][0]
    dynamodb.update_item(
        TableName=name,
        Key={"pk": first["pk"]},
        UpdateExpression="SET #status = :s",
        ExpressionAttributeNames={"#status": "status"},
        ExpressionAttributeValues={":s": {"S": "changed"}},
    )
    replies.append(first)
    return replies


def test_a_query_on_an_index_reads_its_key_s_items_and_answers_as_moto_does(aws: Any) -> None:
    for seed in range(3):
        fast, slow = with_and_without(
            lambda aws, name, seed=seed: index_queries(aws, f"{name}-{seed}", seed), aws
        )
        assert fast == slow, seed
        assert fast[-1]["status"] != {"S": "changed"}  # the reply kept what it read
        pages = [reply for reply in fast[:-1] if "LastEvaluatedKey" in reply]
        assert any(reply["Count"] < 50 and reply.get("ScannedCount", 0) < 50 for reply in pages)
        assert any(len(reply["Items"]) < reply["ScannedCount"] for reply in fast[:-1] if "Items" in reply)


def test_a_query_on_an_index_sorts_only_the_items_of_its_key(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.dynamodb.models.table import Table

    index_queries(aws, "sorted-once", 0)
    sorted_all = []
    monkeypatch.setattr(Table, "all_items", lambda table: sorted_all.append(table) or [])
    reply = aws.dynamodb.query(
        TableName="sorted-once",
        IndexName="by-tenant-include",
        KeyConditionExpression="tenant_id = :t",
        ExpressionAttributeValues={":t": {"S": "t3"}},
    )
    assert reply["Count"] > 0
    assert sorted_all == []  # moto's own lists and sorts every item of the table


def fair_receives(aws: Any, name: str, seed: int) -> list[list[str]]:
    """What each receive of ten returns from a fair queue of a random shape: tenants with
    backlogs and messages in flight (some noisy by their share of them), delayed messages, and
    messages with no group, received until nothing is left, some deleted between receives."""
    rng = random.Random(seed)
    sqs = aws.sqs
    url = sqs.create_queue(QueueName=f"{name}-{seed}")["QueueUrl"]
    entries = []
    for i in range(rng.randrange(150, 260)):
        # A backlog first: once its first sixty are in flight, its tenant is noisy.
        group = "big" if i < 60 else rng.choice(["big", "big", "big", "mid", "mid", "small", "tiny", None])
        entry: dict[str, Any] = {"Id": str(i % 10), "MessageBody": f"{group}-{i}"}
        if group is not None:
            entry["MessageGroupId"] = group
        if rng.random() < 0.05:
            entry["DelaySeconds"] = 900
        entries.append(entry)
    for start in range(0, len(entries), 10):
        sqs.send_message_batch(QueueUrl=url, Entries=entries[start : start + 10])
    rounds, handles = [], []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=900).get(
            "Messages", []
        )
        if not got:
            return rounds
        rounds.append([m["Body"] for m in got])
        handles += [m["ReceiptHandle"] for m in got]
        rng.shuffle(handles)
        while len(handles) > 90 and rng.random() < 0.5:  # calls end, their places free
            sqs.delete_message(QueueUrl=url, ReceiptHandle=handles.pop())


def test_a_fair_queue_s_receives_read_lazily_hand_out_fair_order_s_order(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The shares by count of messages in flight decide, not the few milliseconds each was in flight
    # (which differ between the two runs): the fair queue's clock stands still.
    monkeypatch.setattr(fair_queues, "time", type("Still", (), {"time": staticmethod(lambda: 1.9e9)}))
    for seed in range(4):
        fast, slow = with_and_without(lambda aws, name, seed=seed: fair_receives(aws, name, seed), aws)
        assert fast == slow, seed
        # In each run a noisy tenant's backlog waited behind quiet tenants' later messages.
        sent_order = [int(body.rsplit("-", 1)[1]) for batch in fast for body in batch]
        assert sent_order != sorted(sent_order), seed


class CountingList(list[Any]):
    """A queue's list of messages that counts the ones iterated over."""

    iterated = 0

    def __iter__(self) -> Any:
        for message in super().__iter__():
            CountingList.iterated += 1
            yield message


def test_a_receive_looks_no_further_than_it_takes_and_a_delete_asks_no_message(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.sqs.models import Message, sqs_backends

    sqs = aws.sqs
    url = sqs.create_queue(QueueName="deep")["QueueUrl"]
    for start in range(0, 2000, 10):
        entries = [{"Id": str(i), "MessageBody": f"m{start + i}", "MessageGroupId": "one"} for i in range(10)]
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
    queue = sqs_backends["123456789012"]["us-east-1"].queues["deep"]
    queue._messages = CountingList(queue._messages)
    queue_index.index_of(queue)  # the list is another one now: its index is made again, once
    asked = []
    had = Message.had_receipt_handle
    monkeypatch.setattr(Message, "had_receipt_handle", lambda m, h: asked.append(h) or had(m, h))
    for _ in range(3):
        CountingList.iterated = 0
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=900)["Messages"]
        assert CountingList.iterated <= 11  # the ten it hands out (and none of the 1,990 behind)
        sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
        )
    assert asked == []  # each delete found its message through the index
    assert (
        int(
            sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])[
                "Attributes"
            ]["ApproximateNumberOfMessages"]
        )
        == 1970
    )
    # moto's own receive looks at every message for the same ten.
    queue_index.uninstall()
    try:
        CountingList.iterated = 0
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=900)
        assert CountingList.iterated >= 1970
    finally:
        queue_index.install()


def moved_and_purged(aws: Any, name: str) -> dict[str, Any]:
    """What a queue answers after its list changed behind the index: a message moved to its
    dead-letter queue by a receive (then deleted by an old handle: invalid), a redrive back, a
    purge; each followed by receives and deletes, and the counts."""
    sqs = aws.sqs
    dlq = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(
        QueueName=name,
        Attributes={"RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"})},
    )["QueueUrl"]
    seen: dict[str, Any] = {}
    for body in ("poison", "fine"):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="t")
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=0)["Messages"]
    # The poison message was received once: the next receive moves it to the DLQ.
    seen["second"] = [
        m["Body"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    ]
    refused = sqs.delete_message_batch(
        QueueUrl=url, Entries=[{"Id": "old", "ReceiptHandle": first[0]["ReceiptHandle"]}]
    )
    seen["old handle"] = [entry["Code"] for entry in refused.get("Failed", [])]
    seen["in dlq"] = [
        m["Body"]
        for m in sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10, VisibilityTimeout=0)["Messages"]
    ]
    sqs.start_message_move_task(SourceArn=dlq_arn)  # the local endpoint moves them at once
    back = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0).get("Messages", [])
    seen["moved back"] = sorted(m["Body"] for m in back)
    sqs.purge_queue(QueueUrl=url)
    sqs.send_message(QueueUrl=url, MessageBody="after the purge", MessageGroupId="t")
    after = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    deleted = sqs.delete_message_batch(
        QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": after[0]["ReceiptHandle"]}]
    )
    seen["after purge"] = ([m["Body"] for m in after], [e["Id"] for e in deleted.get("Successful", [])])
    seen["counts"] = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return seen


def test_a_queue_changed_behind_its_index_answers_as_moto_s_own_does(aws: Any) -> None:
    fast, slow = with_and_without(moved_and_purged, aws)
    assert fast == slow
    assert fast["in dlq"] == ["poison"]
    assert fast["old handle"] == ["ReceiptHandleIsInvalid"]
    assert fast["after purge"] == (["after the purge"], ["a"])


PROJECTIONS = [
    "pk, n, m.k, m.deep.s, ss",  # plain paths: one conversion of the item
    "pk, l[1], m.deep",  # a list element: moto's own
    "pk, nothing, m.missing, n",  # paths the item lacks
    "m.nul, m.deep, pk",
]


def projections(aws: Any, name: str) -> list[Any]:
    """Each of PROJECTIONS through GetItem, BatchGetItem and Scan, on ITEM with a NULL in a map."""
    dynamodb = aws.dynamodb
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    item = {**ITEM, "m": {"M": {**ITEM["m"]["M"], "nul": {"NULL": True}}}}
    dynamodb.put_item(TableName=name, Item=item)
    replies: list[Any] = []
    for projection in PROJECTIONS:
        ask = {"ProjectionExpression": projection}
        replies.append(dynamodb.get_item(TableName=name, Key={"pk": item["pk"]}, **ask)["Item"])
        batch = dynamodb.batch_get_item(RequestItems={name: {"Keys": [{"pk": item["pk"]}], **ask}})
        replies.append(batch["Responses"][name])
        replies.append(dynamodb.scan(TableName=name, **ask)["Items"])
    return replies


def test_a_projection_converts_the_item_once_and_answers_as_moto_does(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.dynamodb.models.dynamo_type import Item

    fast, slow = with_and_without(projections, aws)
    assert fast == slow
    assert fast[0]["m"] == {"M": {"k": {"BOOL": False}, "deep": {"M": {"s": {"S": "é"}}}}}
    assert (fast[0]["pk"], fast[0]["n"], sorted(fast[0]["ss"]["SS"])) == (ITEM["pk"], ITEM["n"], ["p", "q"])
    # Five plain paths: the item made plain JSON once (moto's own: once a path)
    conversions: list[int] = []
    to_regular_json = Item.to_regular_json

    def counted(item: Item) -> dict[str, Any]:
        conversions.append(1)
        return to_regular_json(item)

    monkeypatch.setattr(Item, "to_regular_json", counted)
    aws.dynamodb.get_item(
        TableName="fast",
        Key={"pk": ITEM["pk"]},
        ProjectionExpression=PROJECTIONS[0],
    )
    assert len(conversions) == 1


def test_a_query_s_pass_over_the_table_survives_a_put_beside_it(aws: Any) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodb.responses import DynamoHandler

    from llmtasks_local.moto_patches import index_queries as patched

    aws.dynamodb.create_table(
        TableName="grows",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for i in range(3):
        aws.dynamodb.put_item(TableName="grows", Item={"pk": {"S": f"task#{i}"}})
    table = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_table("grows")
    # A put lands between two steps of the pass (the moto server serves each request on a
    # thread of its own): the pass goes on over the items it began with
    passing = patched._items(table)
    first = next(passing)
    aws.dynamodb.put_item(TableName="grows", Item={"pk": {"S": "task#new"}})
    assert len([first, *passing]) == 3
    # And queries and scans wait for the writes' lock, as item reads do
    assert all(getattr(DynamoHandler, name).__llmtasks_atomic__ for name in ("query", "scan"))
