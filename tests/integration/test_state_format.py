"""The state dir's snapshot is AWS-level JSON (state_format): saved by an endpoint with the moto
patches, loaded by one on stock moto, it gives the same tables, items, stream records, queues,
messages (attributes, receive counts, timers) and objects; a state dir of the release before
(pickled moto backends, a pickled journal) is migrated at its first start."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from moto import mock_aws
from moto.sqs.models import Message

from llmtasks_local import moto_backends, moto_patches
from llmtasks_local.emulator import journal, state_format
from llmtasks_local.emulator.moto_server import STATE_PATH
from llmtasks_local.emulator.processes import listen_on, spawn_moto_server, stop
from tests.helpers import local_client

pytestmark = pytest.mark.integration


class Endpoint:
    """A moto server on a state dir, started and stopped cleanly, patched or on stock moto."""

    def __init__(self, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state_dir = state_dir
        self.monkeypatch = monkeypatch
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, *, patched: bool) -> Endpoint:
        if patched:
            self.monkeypatch.delenv(moto_patches.SWITCH, raising=False)
        else:
            self.monkeypatch.setenv(moto_patches.SWITCH, "off")
        listener = listen_on("127.0.0.1", 0, "--moto-port", "the test's moto server")
        self.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        self.process = spawn_moto_server(listener, state_dir=self.state_dir, say=lambda _: None)
        return self

    def stop_cleanly(self) -> None:
        assert self.process is not None
        assert httpx.post(f"{self.url}{STATE_PATH}", timeout=60).status_code == 200
        stop(self.process)
        self.process = None

    def client(self, service: str) -> Any:
        return local_client(service, self.url)


@pytest.fixture
def in_process_moto(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto in-process answers every call: an endpoint the environment names (LocalStack's SQS in
    scripts/localstack-tests) would take the calls meant for it."""
    for name in [name for name in os.environ if name.startswith("AWS_ENDPOINT_URL")]:
        monkeypatch.delenv(name)


@pytest.fixture
def endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_process_moto: None) -> Iterator[Endpoint]:
    running = Endpoint(tmp_path / "state", monkeypatch)
    yield running
    if running.process is not None:
        stop(running.process)


def _fill(endpoint: Endpoint) -> dict[str, str]:
    dynamodb, sqs, s3 = endpoint.client("dynamodb"), endpoint.client("sqs"), endpoint.client("s3")
    dynamodb.create_table(
        TableName="tasks",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "N"},
            {"AttributeName": "tenant", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-tenant",
                "KeySchema": [{"AttributeName": "tenant", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    dynamodb.update_time_to_live(
        TableName="tasks", TimeToLiveSpecification={"AttributeName": "expires", "Enabled": True}
    )
    for n in range(5):
        dynamodb.put_item(
            TableName="tasks",
            Item={
                "pk": {"S": f"task-{n}"},
                "sk": {"N": str(n)},
                "tenant": {"S": "acme" if n % 2 else "zeta"},
                "blob": {"B": bytes([n, 255])},
                "tags": {"SS": ["a", "b"]},
                "doc": {"M": {"nested": {"L": [{"N": "1.5"}, {"NULL": True}, {"BOOL": False}]}}},
            },
        )
    dynamodb.delete_item(TableName="tasks", Key={"pk": {"S": "task-4"}, "sk": {"N": "4"}})

    dlq = sqs.create_queue(QueueName="work-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    work = sqs.create_queue(
        QueueName="work",
        Attributes={
            "VisibilityTimeout": "45",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"}),
        },
    )["QueueUrl"]
    sqs.send_message(
        QueueUrl=work,
        MessageBody="first",
        MessageGroupId="tenant-a",
        MessageAttributes={
            "kind": {"DataType": "String", "StringValue": "task"},
            "raw": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
        },
        MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-abc"}},
    )
    sqs.send_message(QueueUrl=work, MessageBody="later", DelaySeconds=900)
    sqs.send_message(QueueUrl=work, MessageBody="held")
    # "first" and "held" received once; "held" stays in flight (its visibility timer runs on)
    for message in sqs.receive_message(QueueUrl=work, MaxNumberOfMessages=10, VisibilityTimeout=0)[
        "Messages"
    ]:
        if message["Body"] == "held":
            sqs.change_message_visibility(
                QueueUrl=work, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=900
            )

    s3.create_bucket(Bucket="results")
    s3.put_object(Bucket="results", Key="a/one.json", Body=b'{"n": 1}', ContentType="application/json")
    s3.put_object(Bucket="results", Key="b/two.bin", Body=bytes(range(256)), Metadata={"task": "t2"})
    return {"work": work, "dlq": dlq}


def _tables(endpoint: Endpoint) -> dict[str, Any]:
    dynamodb = endpoint.client("dynamodb")
    table = dynamodb.describe_table(TableName="tasks")["Table"]
    items = sorted(dynamodb.scan(TableName="tasks")["Items"], key=lambda item: item["pk"]["S"])
    by_tenant = dynamodb.query(
        TableName="tasks",
        IndexName="by-tenant",
        KeyConditionExpression="tenant = :t",
        ExpressionAttributeValues={":t": {"S": "acme"}},
    )["Items"]
    streams = endpoint.client("dynamodbstreams")
    [shard] = streams.describe_stream(StreamArn=table["LatestStreamArn"])["StreamDescription"]["Shards"]
    iterator = streams.get_shard_iterator(
        StreamArn=table["LatestStreamArn"], ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records = streams.get_records(ShardIterator=iterator)["Records"]
    return {
        "keys": table["KeySchema"],
        "attributes": sorted(table["AttributeDefinitions"], key=lambda a: a["AttributeName"]),
        "indexes": [(i["IndexName"], i["KeySchema"]) for i in table["GlobalSecondaryIndexes"]],
        "stream": (table["StreamSpecification"], table["LatestStreamArn"], shard["ShardId"]),
        "ttl": dynamodb.describe_time_to_live(TableName="tasks")["TimeToLiveDescription"],
        "items": items,
        "by_tenant": sorted(item["pk"]["S"] for item in by_tenant),
        "stream_records": [
            (r["eventID"], r["eventName"], r["dynamodb"]["SequenceNumber"], r["dynamodb"]["Keys"])
            for r in records
        ],
    }


def _objects(endpoint: Endpoint) -> dict[str, Any]:
    s3 = endpoint.client("s3")
    found = {}
    for listed in s3.list_objects_v2(Bucket="results")["Contents"]:
        got = s3.get_object(Bucket="results", Key=listed["Key"])
        found[listed["Key"]] = (got["Body"].read(), got["ContentType"], got["Metadata"], got["ETag"])
    return found


def test_a_state_saved_with_the_patches_loads_the_same_on_stock_moto(endpoint: Endpoint) -> None:
    # Given a state written by an endpoint with the patches, stopped cleanly
    endpoint.start(patched=True)
    urls = _fill(endpoint)
    tables, objects = _tables(endpoint), _objects(endpoint)
    attributes = endpoint.client("sqs").get_queue_attributes(QueueUrl=urls["work"], AttributeNames=["All"])
    endpoint.stop_cleanly()
    saved = json.loads((endpoint.state_dir / journal.SNAPSHOT).read_bytes())
    assert (saved["format"], saved["version"]) == (state_format.FORMAT, state_format.VERSION)

    # When an endpoint on stock moto starts on it
    endpoint.start(patched=False)

    # Then its tables, objects and queues are the same
    assert _tables(endpoint) == tables
    assert _objects(endpoint) == objects
    sqs = endpoint.client("sqs")
    again = sqs.get_queue_attributes(QueueUrl=urls["work"], AttributeNames=["All"])["Attributes"]
    for name in ("VisibilityTimeout", "RedrivePolicy", "QueueArn"):
        assert again[name] == attributes["Attributes"][name]
    assert again["ApproximateNumberOfMessages"] == "1"  # "first"; "held" in flight, "later" delayed
    assert again["ApproximateNumberOfMessagesNotVisible"] == "1"
    assert again["ApproximateNumberOfMessagesDelayed"] == "1"
    [first] = sqs.receive_message(
        QueueUrl=urls["work"],
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
        MaxNumberOfMessages=10,
    )["Messages"]
    assert first["Body"] == "first"
    assert first["MessageAttributes"] == {
        "kind": {"DataType": "String", "StringValue": "task"},
        "raw": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
    }
    assert first["Attributes"]["MessageGroupId"] == "tenant-a"
    assert first["Attributes"]["AWSTraceHeader"] == "Root=1-abc"
    assert first["Attributes"]["ApproximateReceiveCount"] == "2"  # once before the stop, once now
    assert [m["MessageId"] for m in saved["sqs"][0]["queues"][1]["Messages"] if m["Body"] == "first"] == [
        first["MessageId"]
    ]


def test_a_state_dir_of_the_release_before_is_migrated_at_its_first_start(endpoint: Endpoint) -> None:
    # Given a state dir as the release before wrote it: pickled moto backends (format 2) and a
    # journal of pickled records after them
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        sqs = boto3.client("sqs", region_name="us-east-1")
        dynamodb.create_table(
            TableName="tasks",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        dynamodb.put_item(TableName="tasks", Item={"pk": {"S": "old"}, "state": {"S": "done"}})
        sqs.create_queue(QueueName="work")
        backends = pickle.dumps({"format": 2, "seq": 2, "clean": False, "backends": moto_backends.state()})
        message = Message("m-journaled", "sent after the snapshot")
        message.sent_timestamp = int(time.time() * 1000)  # within the queue's retention period
    state_dir = endpoint.state_dir
    state_dir.mkdir(parents=True)
    (state_dir / journal.LEGACY_SNAPSHOT).write_bytes(backends)
    records = [
        ("call", "dynamodb", "123456789012", "us-east-1", "put_item", ("tasks", {"pk": {"S": "new"}}), {}),
        ("put", "123456789012", "us-east-1", "work", message),
    ]
    with (state_dir / journal.segment_name(3)).open("wb") as segment:
        for seq, record in enumerate(records, start=3):
            segment.write(journal._frame(seq, pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)))

    # When the endpoint starts on it
    endpoint.start(patched=True)

    # Then what both held is there, and the state dir holds the new format alone
    keys = {item["pk"]["S"] for item in endpoint.client("dynamodb").scan(TableName="tasks")["Items"]}
    assert keys == {"old", "new"}
    url = endpoint.client("sqs").get_queue_url(QueueName="work")["QueueUrl"]
    [received] = endpoint.client("sqs").receive_message(QueueUrl=url)["Messages"]
    assert (received["MessageId"], received["Body"]) == ("m-journaled", "sent after the snapshot")
    assert not (state_dir / journal.LEGACY_SNAPSHOT).exists()
    snapshot = json.loads((state_dir / journal.SNAPSHOT).read_bytes())
    assert snapshot["version"] == state_format.VERSION
    for segment_path in journal.segments(state_dir):
        assert not segment_path.read_bytes()[16:17].startswith(b"\x80")

    # And a second start reads the new format
    endpoint.stop_cleanly()
    endpoint.start(patched=True)
    keys = {item["pk"]["S"] for item in endpoint.client("dynamodb").scan(TableName="tasks")["Items"]}
    assert keys == {"old", "new"}


@pytest.mark.usefixtures("in_process_moto")
def test_a_queue_keeps_its_policy_and_a_fifo_group_in_flight_stays_held() -> None:
    policy = json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": "*", "Action": "sqs:SendMessage", "Resource": "*"}
            ],
        }
    )
    # Given a FIFO queue with a policy and a redrive policy, one of its group's messages in flight
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        dlq = sqs.create_queue(QueueName="dead.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3})
        url = sqs.create_queue(
            QueueName="work.fifo",
            Attributes={
                "FifoQueue": "true",
                "ContentBasedDeduplication": "true",
                "Policy": policy,
                "RedrivePolicy": redrive,
            },
        )["QueueUrl"]
        for body in ("first", "second"):
            sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g")
        taken = sqs.receive_message(QueueUrl=url, VisibilityTimeout=300)["Messages"]
        assert [message["Body"] for message in taken] == ["first"]
        saved = state_format.decode(state_format.dump(1, clean=True))

    # When it is loaded into an empty moto
    with mock_aws():
        state_format.load(saved)
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.get_queue_url(QueueName="work.fifo")["QueueUrl"]
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]

        # Then both policies are there, and the group stays held while its first message is in flight
        assert json.loads(attributes["Policy"]) == json.loads(policy)
        assert json.loads(attributes["RedrivePolicy"])["maxReceiveCount"] == 3
        assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0).get("Messages", []) == []
