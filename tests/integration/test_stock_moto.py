"""The embedded endpoint on stock moto: with the patches refused (another moto version, or
LLMTASKS_MOTO_PATCHES=off), it says so in one line and serves tables, queues and buckets,
conditional writes still atomic."""

from __future__ import annotations

import http.client
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from llmtasks_local import moto_patches
from llmtasks_local.emulator.moto_server import STREAM_RECORDS_PATH
from llmtasks_local.emulator.processes import listen_on, spawn_moto_server, stop
from llmtasks_local.emulator.ttl import TtlSweeper, TtlTable, expired_on
from llmtasks_local.moto_patches import serving
from tests.helpers import HANG_S, local_client

pytestmark = pytest.mark.integration
STOCK_LINE = "running on stock moto: slower, never wrong"


def test_another_moto_version_refuses_every_patch_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import moto

    monkeypatch.setattr(moto, "__version__", "5.9.0")
    monkeypatch.setattr(moto_patches, "_said", [])
    monkeypatch.delenv(moto_patches.SWITCH, raising=False)

    assert moto_patches.install() is False
    assert moto_patches.enabled() is False  # asked again: refused again, not said again

    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert "moto 5.9.0 found" in lines[0]
    assert f"checked with moto {moto_patches.CHECKED_WITH}" in lines[0]
    assert STOCK_LINE in lines[0]


def test_the_pinned_version_is_the_checked_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import moto

    monkeypatch.delenv(moto_patches.SWITCH, raising=False)
    pin = next(
        line.strip().strip('",')
        for line in (Path(__file__).parents[2] / "local" / "pyproject.toml").read_text().splitlines()
        if line.strip().startswith('"moto[server]')
    )
    assert pin == f"moto[server]=={moto_patches.CHECKED_WITH}"
    assert moto.__version__ == moto_patches.CHECKED_WITH
    assert moto_patches.refusal() is None


def _start_stock(state_dir: Path, port: int = 0) -> tuple[subprocess.Popen[bytes], str, list[str]]:
    listener = listen_on("127.0.0.1", port, "--moto-port", "the test's moto server")
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    said: list[str] = []
    process = spawn_moto_server(listener, quiet=False, state_dir=state_dir, say=said.append)
    return process, url, said


@pytest.fixture
def stock_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> Iterator[str]:
    monkeypatch.setenv(moto_patches.SWITCH, "off")
    process, url, said = _start_stock(tmp_path / "state")
    try:
        # what the stack says to its user, once
        assert said == [f"moto patches off ({moto_patches.SWITCH}=off): {STOCK_LINE}"]
        yield url
    finally:
        stop(process)


def test_stock_moto_journals_what_it_acknowledged_through_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an endpoint on stock moto that acknowledged writes, then was killed
    monkeypatch.setenv(moto_patches.SWITCH, "off")
    process, url, _ = _start_stock(tmp_path / "state")
    try:
        dynamodb, sqs = local_client("dynamodb", url), local_client("sqs", url)
        dynamodb.create_table(
            TableName="tasks",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        dynamodb.put_item(TableName="tasks", Item={"pk": {"S": "kept"}})
        queue_url = sqs.create_queue(QueueName="work")["QueueUrl"]
        sqs.send_message(QueueUrl=queue_url, MessageBody="deleted")
        sqs.send_message(QueueUrl=queue_url, MessageBody="kept")
        for message in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]:
            if message["Body"] == "deleted":
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()

    # When it starts again on the same state dir
    process, url, said = _start_stock(tmp_path / "state")
    try:
        # Then the journal gave back every acknowledged change; what was in flight is visible
        assert any("journaled change(s) replayed" in note for note in said)
        dynamodb, sqs = local_client("dynamodb", url), local_client("sqs", url)
        assert dynamodb.scan(TableName="tasks")["Items"] == [{"pk": {"S": "kept"}}]
        queue_url = sqs.get_queue_url(QueueName="work")["QueueUrl"]
        messages = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )["Messages"]
        assert [(m["Body"], m["Attributes"]["ApproximateReceiveCount"]) for m in messages] == [("kept", "2")]
    finally:
        stop(process)


def test_stock_moto_serves_tables_queues_and_buckets(
    stock_endpoint: str, capfd: pytest.CaptureFixture[str]
) -> None:
    dynamodb, sqs, s3 = (local_client(name, stock_endpoint) for name in ("dynamodb", "sqs", "s3"))

    dynamodb.create_table(
        TableName="tasks",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.put_item(TableName="tasks", Item={"pk": {"S": "t1"}, "state": {"S": "queued"}})
    assert dynamodb.get_item(TableName="tasks", Key={"pk": {"S": "t1"}})["Item"]["state"] == {"S": "queued"}

    queue_url = sqs.create_queue(QueueName="work")["QueueUrl"]
    sqs.send_message(QueueUrl=queue_url, MessageBody="hello", MessageGroupId="tenant-a")
    [message] = sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=1)["Messages"]
    assert message["Body"] == "hello"
    sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])

    s3.create_bucket(Bucket="results")
    s3.put_object(Bucket="results", Key="a/b.json", Body=b'{"ok": true}')
    assert s3.get_object(Bucket="results", Key="a/b.json")["Body"].read() == b'{"ok": true}'

    # Patched moto only: the stream activity endpoint is not there, the pollers read as Lambda does.
    assert httpx.get(f"{stock_endpoint}{STREAM_RECORDS_PATH}").status_code == 404
    said = [line for line in capfd.readouterr().err.splitlines() if STOCK_LINE in line]
    assert said == [f"moto patches off ({moto_patches.SWITCH}=off): {STOCK_LINE}"]


def test_stock_moto_lets_one_of_many_conditional_writers_win(stock_endpoint: str) -> None:
    dynamodb = local_client("dynamodb", stock_endpoint)
    dynamodb.create_table(
        TableName="leases",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.put_item(TableName="leases", Item={"pk": {"S": "task"}, "owner": {"S": "none"}})
    won: list[str] = []
    refused: list[str] = []
    start = threading.Barrier(16)

    def claim(worker: str) -> None:
        client: Any = local_client("dynamodb", stock_endpoint)
        start.wait()
        try:
            client.update_item(
                TableName="leases",
                Key={"pk": {"S": "task"}},
                UpdateExpression="SET #o = :me",
                ConditionExpression="#o = :none",
                ExpressionAttributeNames={"#o": "owner"},
                ExpressionAttributeValues={":me": {"S": worker}, ":none": {"S": "none"}},
            )
            won.append(worker)
        except ClientError as error:
            refused.append(error.response["Error"]["Code"])

    workers = [threading.Thread(target=claim, args=(f"w{n}",)) for n in range(16)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert len(won) == 1
    assert refused == ["ConditionalCheckFailedException"] * 15
    item = dynamodb.get_item(TableName="leases", Key={"pk": {"S": "task"}})["Item"]
    assert item["owner"] == {"S": won[0]}


def test_stock_moto_hands_each_message_to_one_of_many_pollers(stock_endpoint: str) -> None:
    sqs: Any = local_client("sqs", stock_endpoint)
    url = sqs.create_queue(QueueName="work")["QueueUrl"]
    for start in range(0, 100, 10):
        sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{start + i}"} for i in range(10)]
        )
    received: list[str] = []

    def poll() -> None:
        client: Any = local_client("sqs", stock_endpoint)
        while batch := client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=120, WaitTimeSeconds=1
        ).get("Messages", []):
            received.extend(m["Body"] for m in batch)

    pollers = [threading.Thread(target=poll) for _ in range(6)]
    for poller in pollers:
        poller.start()
    for poller in pollers:
        poller.join(timeout=HANG_S)
    assert not [poller for poller in pollers if poller.is_alive()]

    assert sorted(received) == sorted(f"m{i}" for i in range(100))  # each once


def test_stock_moto_long_poll_waits_without_holding_up_sends(stock_endpoint: str) -> None:
    sqs: Any = local_client("sqs", stock_endpoint)
    url = sqs.create_queue(QueueName="work")["QueueUrl"]
    got: list[Any] = []
    waiting = threading.Thread(
        target=lambda: got.append(
            local_client("sqs", stock_endpoint).receive_message(QueueUrl=url, WaitTimeSeconds=10)
        )
    )
    waiting.start()
    time.sleep(0.5)  # the long poll is waiting on the empty queue

    started = time.monotonic()
    sqs.send_message(QueueUrl=url, MessageBody="wake")
    sent_in_s = time.monotonic() - started
    waiting.join(timeout=15)

    assert sent_in_s < 2  # not behind the poll's 10 s
    assert [m["Body"] for m in got[0]["Messages"]] == ["wake"]
    assert time.monotonic() - started < 5  # the poll answered once the message came


def test_stock_moto_s_ttl_sweep_scans_for_the_expired_items(stock_endpoint: str) -> None:
    # Given a TTL table on stock moto, one item expired
    dynamodb = local_client("dynamodb", stock_endpoint)
    dynamodb.create_table(
        TableName="tasks",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.update_time_to_live(
        TableName="tasks", TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"}
    )
    now = int(time.time())
    for pk, expires_at in (("old", now - 10), ("new", now + 3600)):
        dynamodb.put_item(TableName="tasks", Item={"pk": {"S": pk}, "expires_at": {"N": str(expires_at)}})
    scans: list[str] = []
    dynamodb.meta.events.register("before-call.dynamodb.Scan", lambda **_: scans.append("Scan"))
    expired = expired_on(stock_endpoint, dynamodb.meta.region_name)

    # When the stack's sweep asks which items expired, the endpoint cannot tell (no TTL index)
    assert expired(TtlTable("tasks", "expires_at"), now) is None
    sweeper = TtlSweeper(dynamodb, [TtlTable("tasks", "expires_at")], expired=expired)

    # Then it scans the table, and still deletes the expired item alone
    assert sweeper.sweep() == 1
    assert scans == ["Scan"]
    assert [item["pk"]["S"] for item in dynamodb.scan(TableName="tasks")["Items"]] == ["new"]


def test_another_werkzeug_keeps_moto_s_own_request_loop_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given the pinned moto, and a werkzeug other than the one the request loop's patches know
    monkeypatch.delenv(moto_patches.SWITCH, raising=False)
    monkeypatch.setitem(serving.CHECKED_WITH, "werkzeug", "0.0.1")
    parse_headers = http.client.parse_headers

    # When the request loop's patches are installed
    serving.install()

    # Then none is (http.client's is the standard library's) and one line says why
    assert http.client.parse_headers is parse_headers
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1
    assert "werkzeug" in said[0]
    assert "checked with 0.0.1" in said[0]
    assert said[0].endswith("slower, never wrong")
