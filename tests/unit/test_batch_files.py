"""Batches from an uploaded file (issue 45): the upload URL, the streaming read of the file by
BatchFunction, refused lines by number, exact counts, bad files refused whole, cancels while
the file is read; and the pieces the read is made of (lines across chunks, the part writer)."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import pytest

from llmtasks.aws.results import PART_BYTES, ObjectWriter
from llmtasks.domain.batch_input import numbered_lines
from llmtasks.domain.batches import BatchStatus
from llmtasks.services import batch_inputs
from llmtasks.services.batches import batch_task_id
from llmtasks.settings import Settings
from tests.conftest import Aws, RunningMock
from tests.unit.test_api import assert_problem
from tests.unit.test_batches import CHUNK, Rig


@pytest.fixture
def rig(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> Rig:
    return Rig(aws, handler, settings.model_copy(update={"batch_chunk_size": CHUNK}), mock_llm)


def upload(rig: Rig, data: bytes, *, tenant: str = "default") -> str:
    """What a client does: asks for an upload, PUTs the bytes to its URL (here through boto3 to
    the key the URL names: moto in-process serves no HTTP); returns the file id."""
    reply = rig.api.call("POST", "/batches/uploads", tenant=tenant)
    assert reply["statusCode"] == 201, reply
    upload_url = urlsplit(reply["json"]["upload_url"])
    assert "X-Amz-Signature=" in upload_url.query or "Signature=" in upload_url.query
    bucket = rig.settings.results_bucket
    # Path-style (the bucket first in the path) or virtual-hosted (the bucket in the host name).
    key = unquote(upload_url.path).lstrip("/").removeprefix(f"{bucket}/")
    assert key == f"files/{tenant}/{reply['json']['file_id']}"
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=data)
    assert reply["json"]["max_items"] == 100_000
    return str(reply["json"]["file_id"])


def lines(*values: Any) -> bytes:
    return b"".join((v if isinstance(v, bytes) else json.dumps(v).encode()) + b"\n" for v in values)


def refused_lines(rig: Rig, batch_id: str) -> list[dict[str, Any]]:
    reply = rig.api.call("GET", f"/batches/{batch_id}/refused")
    assert reply["statusCode"] == 200, reply
    text = base64.b64decode(reply["body"]).decode() if reply.get("isBase64Encoded") else reply["body"]
    return [json.loads(line) for line in text.splitlines()]


def test_a_file_s_items_are_read_in_the_background_with_its_refused_lines_named_by_number(rig: Rig) -> None:
    good = [{"prompt": f"item {i}", "custom_id": f"c{i}"} for i in range(25)]
    data = lines(
        *good[:10],
        b"not json",
        {"prompt": "again", "custom_id": "c3"},  # a custom_id an earlier line has
        *good[10:20],
        {"messages": []},
        b"",  # blank lines are skipped, and counted in the numbering
        {"prompt": "x" * 300_000},  # over MAX_PROMPT_BYTES
        *good[20:],
        {"prompt": "no newline at the end", "custom_id": "last"},
    )[:-1]
    file_id = upload(rig, data)

    accepted = rig.api.call("POST", "/batches", {"input_file_id": file_id, "priority": "low"})
    assert accepted["statusCode"] == 202, accepted
    batch_id = accepted["json"]["batch_id"]
    assert (accepted["json"]["status"], accepted["json"]["total"]) == ("validating", 0)
    assert rig.api.call("GET", f"/batches/{batch_id}/refused")["statusCode"] == 404  # not read yet

    [read] = rig.fan_out()  # the one read message: the file, line by line
    assert json.loads(read["Body"])["action"] == "read"
    view = rig.api.call("GET", f"/batches/{batch_id}")["json"]
    assert (view["status"], view["total"], view["pending"]) == ("pending", 26, 26)
    assert view["input_file_id"] == file_id
    assert view["refused_lines"] == 4
    assert [(r["line"], r.get("custom_id")) for r in view["refused"]] == [
        (11, None),
        (12, "c3"),
        (23, None),
        (25, None),
    ]
    assert "not JSON" in view["refused"][0]["error"]
    assert "earlier line" in view["refused"][1]["error"]
    assert "300000 bytes" in view["refused"][3]["error"]
    assert refused_lines(rig, batch_id) == view["refused"]

    chunks = rig.fan_out()  # 26 items in chunks of 4 (the rig's batch_chunk_size)
    assert len(chunks) == 7
    last = rig.store.get(batch_task_id(batch_id, 25), now=0)
    assert last is not None
    assert (last.custom_id, last.request.prompt, last.priority) == ("last", "no newline at the end", "low")
    assert rig.run_items() == 26
    rig.count(rig.stream())
    ended = rig.api.call("GET", f"/batches/{batch_id}")["json"]
    assert (ended["status"], ended["completed"]) == ("completed", 26)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (lines({"nope": 1}, b"[1]"), "no line of the file is an item (2 refused"),
        (b"\n\n", "the file has no line"),
    ],
)
def test_a_file_with_no_item_fails_its_batch_with_the_reason(rig: Rig, data: bytes, reason: str) -> None:
    file_id = upload(rig, data)
    if not data.strip():
        # An empty file is refused at once, as not JSON Lines; the read's own check is for a file
        # whose head passes: shown with one that does, below.
        assert_problem(rig.api.call("POST", "/batches", {"input_file_id": file_id}), 422)
        return
    batch_id = rig.api.call("POST", "/batches", {"input_file_id": file_id})["json"]["batch_id"]
    rig.fan_out()
    view = rig.api.call("GET", f"/batches/{batch_id}")["json"]
    assert view["status"] == "failed"
    assert view["total"] == 0
    assert view["errors"][0].startswith(reason)
    assert rig.aws.messages("BatchFanoutQueue") == []
    assert rig.aws.messages("BatchTaskQueue") == []


def test_a_file_over_the_batch_s_item_limit_fails_it_and_makes_no_task(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_inputs, "MAX_BATCH_ITEMS", 3)
    file_id = upload(rig, lines(*[{"prompt": str(i)} for i in range(5)]))
    batch_id = rig.api.call("POST", "/batches", {"input_file_id": file_id})["json"]["batch_id"]
    rig.fan_out()
    view = rig.api.call("GET", f"/batches/{batch_id}")["json"]
    assert (view["status"], view["errors"]) == ("failed", ["the file has 5 items; a batch holds at most 3"])
    assert rig.aws.messages("BatchFanoutQueue") == []


def test_files_refused_at_once_change_nothing(rig: Rig) -> None:
    mine = upload(rig, lines({"prompt": "a"}))
    theirs = upload(rig, lines({"prompt": "b"}), tenant="other")
    not_jsonl = upload(rig, b"hello, world\n")
    bad_first_line = upload(rig, b'{"prompt": \n{"prompt": "b"}\n')
    assert_problem(rig.api.call("POST", "/batches", {"input_file_id": theirs}), 404)
    assert_problem(rig.api.call("POST", "/batches", {"input_file_id": not_jsonl}), 422)
    assert_problem(rig.api.call("POST", "/batches", {"input_file_id": bad_first_line}), 422)
    assert rig.aws.messages("BatchFanoutQueue") == []
    # The tenant's own file is not another's either way round.
    assert_problem(rig.api.call("POST", "/batches", {"input_file_id": mine}, tenant="other"), 404)
    assert rig.aws.messages("BatchFanoutQueue") == []


def test_a_batch_cancelled_while_its_file_is_read_ends_cancelled_and_the_read_makes_nothing(rig: Rig) -> None:
    file_id = upload(rig, lines(*[{"prompt": str(i)} for i in range(10)]))
    batch_id = rig.api.call("POST", "/batches", {"input_file_id": file_id})["json"]["batch_id"]
    cancelled = rig.api.call("POST", f"/batches/{batch_id}/cancel")
    assert cancelled["statusCode"] == 200, cancelled
    rig.fan_out()  # the read (which finds it cancelling) and the cancel's one message
    view = rig.api.call("GET", f"/batches/{batch_id}")["json"]
    assert (view["status"], view["total"]) == ("cancelled", 0)
    assert rig.aws.messages("BatchTaskQueue") == []


def test_a_read_that_meets_a_cancel_after_its_messages_drops_them(rig: Rig) -> None:
    file_id = upload(rig, lines(*[{"prompt": str(i)} for i in range(10)]))
    batch_id = rig.api.call("POST", "/batches", {"input_file_id": file_id})["json"]["batch_id"]
    batch = rig.batches.get(batch_id, now=0)
    assert batch is not None
    assert batch.status is BatchStatus.VALIDATING
    rig.batches.request_cancel(batch_id, tenant_id="default", now=1)
    rig.fanout._inputs.read(batch)  # type: ignore[union-attr]  # read as it was before the cancel
    stored = rig.batches.get(batch_id, now=0)
    assert stored is not None
    assert stored.status is BatchStatus.CANCELLING
    rig.fan_out()  # the read's chunk message: dropped (the batch has no chunk)
    assert rig.aws.messages("BatchTaskQueue") == []


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_lines_are_numbered_the_same_however_the_stream_is_cut(size: int) -> None:
    data = b'{"a": 1}\r\n\n' + b"x" * 30 + b'\n{"b": 2}'
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    assert list(numbered_lines(chunks, 20)) == [(1, b'{"a": 1}'), (2, b""), (3, None), (4, b'{"b": 2}')]


def test_an_object_written_in_parts_reads_back_whole_and_an_aborted_one_leaves_nothing(rig: Rig) -> None:
    s3 = boto3.client("s3")
    bucket = rig.settings.results_bucket
    writer = ObjectWriter(s3, bucket, "files/t/parts")
    piece = bytes(range(256)) * 4096  # 1 MiB
    for _ in range(PART_BYTES // len(piece) * 2 + 3):
        writer.write(piece)
    writer.close()
    body = s3.get_object(Bucket=bucket, Key="files/t/parts")["Body"].read()
    assert body == piece * (PART_BYTES // len(piece) * 2 + 3)

    aborted = ObjectWriter(s3, bucket, "files/t/aborted")
    aborted.write(piece * (PART_BYTES // len(piece) + 1))  # one part sent
    aborted.abort()
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="files/t/aborted")
