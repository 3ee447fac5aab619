"""The embedded endpoint with a state dir, killed with SIGKILL and started again: what it
acknowledged is all there (tables, stream records, objects, messages, dead letters), what was
in flight is visible at once, a disk that refuses writes gets 503 and nothing half-written, and
state it cannot read stops the start naming the file."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from llmtasks_local.emulator import journal
from llmtasks_local.emulator.moto_server import BACKEND_PATH, CALLS_PATH, CPU_PATH, STATE_PATH
from llmtasks_local.emulator.processes import listen_on, spawn_moto_server, stop
from llmtasks_local.tool_errors import ToolError
from tests.helpers import local_client

pytestmark = pytest.mark.integration
NO_RETRIES = Config(retries={"max_attempts": 1, "mode": "standard"})


class Endpoint:
    """A moto server on a state dir, as `llmtasks up` starts it; crashed and started again."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        # A free port bound at once (a restart binds the same one again).
        self.listener = listen_on("127.0.0.1", 0, "--moto-port", "the test's moto server")
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.notes: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Endpoint:
        self.notes.clear()
        if self.listener.fileno() == -1:  # handed to the last server, closed here since
            self.listener = listen_on("127.0.0.1", self.port, "--moto-port", "the test's moto server")
        self.process = spawn_moto_server(self.listener, state_dir=self.state_dir, say=self.notes.append)
        return self

    def crash(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def client(self, service: str) -> Any:
        client = local_client(service, self.url)
        client.meta.config.retries = NO_RETRIES.retries
        return client

    def state(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}{STATE_PATH}").json()  # type: ignore[no-any-return]


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[Endpoint]:
    running = Endpoint(tmp_path / "state").start()
    yield running
    if running.process is not None and running.process.poll() is None:
        stop(running.process)


def _resources(endpoint: Endpoint) -> dict[str, str]:
    dynamodb, sqs = endpoint.client("dynamodb"), endpoint.client("sqs")
    dynamodb.create_table(
        TableName="tasks",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    queue = sqs.create_queue(QueueName="work")["QueueUrl"]
    dlq = sqs.create_queue(QueueName="dead")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    poison = sqs.create_queue(QueueName="poison", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    endpoint.client("s3").create_bucket(Bucket="results")
    return {"queue": queue, "dlq": dlq, "poison": poison}


def _stored(endpoint: Endpoint) -> dict[str, Any]:
    """What a client can read back without changing it: items, stream records, objects."""
    dynamodb, s3 = endpoint.client("dynamodb"), endpoint.client("s3")
    streams = endpoint.client("dynamodbstreams")
    stream = streams.list_streams(TableName="tasks")["Streams"][0]["StreamArn"]
    shard = streams.describe_stream(StreamArn=stream)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON")
    records = streams.get_records(ShardIterator=iterator["ShardIterator"], Limit=1000)["Records"]
    objects = s3.list_objects_v2(Bucket="results").get("Contents", [])
    return {
        "items": sorted(
            json.dumps(item, sort_keys=True) for item in dynamodb.scan(TableName="tasks")["Items"]
        ),
        "stream": [(r["dynamodb"]["SequenceNumber"], r["eventName"], r["dynamodb"]["Keys"]) for r in records],
        "objects": {o["Key"]: s3.get_object(Bucket="results", Key=o["Key"])["Body"].read() for o in objects},
    }


def _messages(sqs: Any, url: str) -> list[tuple[str, str]]:
    """Every visible message with its receive count (this receive included)."""
    found = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0, MessageSystemAttributeNames=["All"]
    ).get("Messages", [])
    return sorted((m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in found)


def _changes(endpoint: Endpoint, urls: dict[str, str]) -> None:
    """One of each change the stack makes, some of them refused."""
    dynamodb, s3, sqs = endpoint.client("dynamodb"), endpoint.client("s3"), endpoint.client("sqs")
    for i in range(5):
        dynamodb.put_item(TableName="tasks", Item={"pk": {"S": f"t{i}"}, "n": {"N": "0"}})
    dynamodb.update_item(
        TableName="tasks",
        Key={"pk": {"S": "t1"}},
        UpdateExpression="SET n = n + :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )
    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        dynamodb.put_item(
            TableName="tasks",
            Item={"pk": {"S": "t2"}, "n": {"N": "9"}},
            ConditionExpression="attribute_not_exists(pk)",
        )
    dynamodb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": "tasks", "Item": {"pk": {"S": "t9"}}}},
            {"Delete": {"TableName": "tasks", "Key": {"pk": {"S": "t0"}}}},
        ]
    )
    s3.put_object(Bucket="results", Key="kept", Body=b"a result")
    s3.put_object(Bucket="results", Key="gone", Body=b"deleted")
    s3.delete_object(Bucket="results", Key="gone")
    for i in range(3):
        sqs.send_message(QueueUrl=urls["queue"], MessageBody=f"single {i}")
    sqs.send_message_batch(
        QueueUrl=urls["queue"], Entries=[{"Id": str(i), "MessageBody": f"batched {i}"} for i in range(3)]
    )
    received = sqs.receive_message(QueueUrl=urls["queue"], MaxNumberOfMessages=3, VisibilityTimeout=600)[
        "Messages"
    ]
    sqs.delete_message(QueueUrl=urls["queue"], ReceiptHandle=received[0]["ReceiptHandle"])
    # Received once and back at once; the next receive finds it past maxReceiveCount: to the DLQ.
    sqs.send_message(QueueUrl=urls["poison"], MessageBody="poison")
    sqs.receive_message(QueueUrl=urls["poison"], VisibilityTimeout=0)
    assert "Messages" not in sqs.receive_message(QueueUrl=urls["poison"])
    endpoint.notes.append(json.dumps([m["Body"] for m in received]))


def test_a_crash_loses_nothing_the_endpoint_acknowledged(endpoint: Endpoint) -> None:
    urls = _resources(endpoint)
    _changes(endpoint, urls)
    deleted, *held = json.loads(endpoint.notes[-1])
    before = _stored(endpoint)

    endpoint.crash()
    endpoint.start()

    assert _stored(endpoint) == before  # the same items, stream records (by number) and objects
    assert len(before["items"]) == 5
    assert before["objects"] == {"kept": b"a result"}
    sent = {f"{kind} {i}" for kind in ("single", "batched") for i in range(3)}
    # Every message but the deleted one, visible at once; each receive was counted.
    work = _messages(endpoint.client("sqs"), urls["queue"])
    assert [body for body, _ in work] == sorted(sent - {deleted})
    assert {body: int(count) for body, count in work} == {
        body: 2 if body in held else 1 for body in sent - {deleted}
    }
    assert _messages(endpoint.client("sqs"), urls["dlq"]) == [
        ("poison", "2")
    ]  # its one receive, and this one
    assert any("replayed" in note for note in endpoint.notes)


def test_messages_received_before_a_crash_are_visible_at_once_after_it(endpoint: Endpoint) -> None:
    urls = _resources(endpoint)
    sqs = endpoint.client("sqs")
    sqs.send_message_batch(
        QueueUrl=urls["queue"], Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(4)]
    )
    held = sqs.receive_message(QueueUrl=urls["queue"], MaxNumberOfMessages=10, VisibilityTimeout=3600)[
        "Messages"
    ]
    assert sqs.receive_message(QueueUrl=urls["queue"]).get("Messages") is None  # all in flight

    endpoint.crash()
    endpoint.start()

    again = sqs.receive_message(QueueUrl=urls["queue"], MaxNumberOfMessages=10).get("Messages", [])
    assert sorted(m["Body"] for m in again) == sorted(m["Body"] for m in held)
    assert any(f"{len(held)} message(s) received before the stop" in note for note in endpoint.notes)


def test_a_clean_save_keeps_messages_in_flight_as_they_were(endpoint: Endpoint) -> None:
    urls = _resources(endpoint)
    sqs = endpoint.client("sqs")
    sqs.send_message(QueueUrl=urls["queue"], MessageBody="held")
    sqs.send_message(QueueUrl=urls["queue"], MessageBody="waiting")
    sqs.receive_message(QueueUrl=urls["queue"], MaxNumberOfMessages=1, VisibilityTimeout=3600)
    assert httpx.post(f"{endpoint.url}{STATE_PATH}").json()["bytes"] > 0
    assert journal.read(endpoint.state_dir).records == []  # folded into the snapshot

    endpoint.crash()  # nothing changed after the save: a clean stop
    endpoint.start()

    assert [
        m["Body"] for m in sqs.receive_message(QueueUrl=urls["queue"], MaxNumberOfMessages=10)["Messages"]
    ] == ["waiting"]
    assert endpoint.notes == []


def test_a_disk_that_refuses_writes_gets_503_and_nothing_half_written(endpoint: Endpoint) -> None:
    urls = _resources(endpoint)
    dynamodb, sqs, s3 = endpoint.client("dynamodb"), endpoint.client("sqs"), endpoint.client("s3")
    dynamodb.put_item(TableName="tasks", Item={"pk": {"S": "before"}})
    assert endpoint.process is not None
    segment = journal.segments(endpoint.state_dir)[-1]
    # The journal may not grow: write(2) fails, as on a full disk.
    resource.prlimit(
        endpoint.process.pid, resource.RLIMIT_FSIZE, (segment.stat().st_size, resource.RLIM_INFINITY)
    )

    refused = [
        lambda: dynamodb.put_item(TableName="tasks", Item={"pk": {"S": "refused"}}),
        lambda: sqs.send_message(QueueUrl=urls["queue"], MessageBody="refused"),
        lambda: s3.put_object(Bucket="results", Key="refused", Body=b"x"),
    ]
    for write in refused:
        with pytest.raises(ClientError) as error:
            write()
        assert error.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    state = endpoint.state()
    assert state["ok"] is False
    assert str(segment) in state["problem"]

    assert [i["pk"]["S"] for i in dynamodb.scan(TableName="tasks")["Items"]] == ["before"]
    assert sqs.receive_message(QueueUrl=urls["queue"]).get("Messages") is None
    assert s3.list_objects_v2(Bucket="results").get("Contents") is None

    resource.prlimit(
        endpoint.process.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    )
    dynamodb.put_item(TableName="tasks", Item={"pk": {"S": "after"}})
    assert endpoint.state()["ok"] is True
    endpoint.crash()
    endpoint.start()
    assert sorted(i["pk"]["S"] for i in dynamodb.scan(TableName="tasks")["Items"]) == ["after", "before"]


def test_a_torn_last_record_is_dropped_with_a_warning_naming_it(endpoint: Endpoint) -> None:
    _resources(endpoint)
    dynamodb = endpoint.client("dynamodb")
    dynamodb.put_item(TableName="tasks", Item={"pk": {"S": "whole"}})
    dynamodb.put_item(TableName="tasks", Item={"pk": {"S": "torn"}})
    endpoint.crash()
    segment = journal.segments(endpoint.state_dir)[-1]
    segment.write_bytes(segment.read_bytes()[:-5])  # the last write, cut short

    endpoint.start()

    assert [i["pk"]["S"] for i in dynamodb.scan(TableName="tasks")["Items"]] == ["whole"]
    [warning] = [note for note in endpoint.notes if note.startswith("Warning:")]
    assert str(segment) in warning
    assert "cut short" in warning


@pytest.mark.parametrize("damaged", ["snapshot", "journal"])
def test_state_that_cannot_be_read_stops_the_start_naming_the_file_and_the_way_out(
    endpoint: Endpoint, damaged: str
) -> None:
    _resources(endpoint)
    for i in range(3):
        endpoint.client("dynamodb").put_item(TableName="tasks", Item={"pk": {"S": f"t{i}"}})
    endpoint.crash()
    path = (
        endpoint.state_dir / journal.SNAPSHOT
        if damaged == "snapshot"
        else journal.segments(endpoint.state_dir)[-1]
    )
    data = bytearray(path.read_bytes())
    data[30] ^= 0xFF
    path.write_bytes(bytes(data))

    with pytest.raises(ToolError) as refused:
        endpoint.start()

    assert refused.value.where == str(path)
    assert refused.value.fix is not None
    assert "--reset" in refused.value.fix
    assert path.read_bytes() == bytes(data)  # never reset silently
    assert os.path.exists(endpoint.state_dir / journal.SNAPSHOT)


def test_a_redrive_survives_a_crash(endpoint: Endpoint) -> None:
    urls = _resources(endpoint)
    sqs = endpoint.client("sqs")
    sqs.send_message(QueueUrl=urls["poison"], MessageBody="replayed")
    sqs.receive_message(QueueUrl=urls["poison"], VisibilityTimeout=0)
    assert "Messages" not in sqs.receive_message(QueueUrl=urls["poison"])  # moved to the DLQ
    dlq_arn = sqs.get_queue_attributes(QueueUrl=urls["dlq"], AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sqs.start_message_move_task(SourceArn=dlq_arn)

    endpoint.crash()
    endpoint.start()

    assert _messages(sqs, urls["dlq"]) == []
    assert [body for body, _ in _messages(sqs, urls["poison"])] == ["replayed"]


def test_the_endpoint_says_how_much_of_each_operation_was_its_backend_s_work_and_the_journal_s(
    endpoint: Endpoint,
) -> None:
    """The floor the bench sets beside what serving costs: moto's backend timed inside the server,
    charged to the operation served, and the journal's appends within it with their bytes."""
    _resources(endpoint)
    dynamodb = endpoint.client("dynamodb")
    httpx.delete(endpoint.url + CALLS_PATH).raise_for_status()
    for number in range(20):
        dynamodb.put_item(TableName="tasks", Item={"pk": {"S": f"t{number}"}, "body": {"S": "x" * 1000}})
    written = httpx.get(endpoint.url + BACKEND_PATH).json()
    dynamodb.get_item(TableName="tasks", Key={"pk": {"S": "t1"}})
    served, account = httpx.get(endpoint.url + CPU_PATH).json(), httpx.get(endpoint.url + BACKEND_PATH).json()
    for operation in ("dynamodb.PutItem", "dynamodb.GetItem"):
        assert 0 < account["backend_us"][operation] <= served[operation]
    # Each put journaled once, its item's bytes in it; the read wrote nothing.
    assert written["journal"]["records"] == account["journal"]["records"] == 20
    assert account["journal"]["bytes"] >= 20 * 1000
    assert 0 < account["journal"]["us"] <= account["backend_us"]["dynamodb.PutItem"]
    httpx.delete(endpoint.url + BACKEND_PATH).raise_for_status()  # zeroes it with the counts
    assert httpx.get(endpoint.url + BACKEND_PATH).json() == {"backend_us": {}, "journal": {}}
    assert httpx.get(endpoint.url + CALLS_PATH).json() == {}
