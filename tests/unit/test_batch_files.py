"""Batches from an uploaded file (issue 45): the upload URL, the streaming read of the file by
BatchFunction, refused lines by number, exact counts, bad files refused whole, cancels while
the file is read; and the pieces the read is made of (lines across chunks, the part writer)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from typing import Any
from urllib.parse import unquote, urlsplit

import boto3
import httpx
import pytest

from llmtasks.aws.limits import KeyLimits, work_ended
from llmtasks.aws.results import PART_BYTES, ObjectWriter
from llmtasks.domain.batch_input import numbered_lines
from llmtasks.domain.batches import UPLOAD_TTL_S, BatchStatus, SubmitBatchRequest
from llmtasks.domain.caller import Caller
from llmtasks.domain.errors import ApiError, InvalidInput
from llmtasks.services import batch_inputs
from llmtasks.services.batch_inputs import BatchInputReader
from llmtasks.services.batch_outcomes import batch_task_id
from llmtasks.services.batches import BatchService
from llmtasks.services.file_uploads import FileUploads
from llmtasks.settings import Settings
from llmtasks_client import AsyncClient, Client, ProblemError
from tests.conftest import Aws, RunningMock
from tests.helpers import blobs
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


def test_an_upload_s_parts_are_joined_in_the_order_complete_names_them(rig: Rig) -> None:
    uploads = rig.service.uploads
    pieces = [b'{"prompt": "a"}\n', b'{"prompt": "b"}\n' * 3, b'{"prompt": "c"}\n']
    upload = uploads.create("default", size=sum(map(len, pieces)), filename="in.jsonl", purpose="batch")
    ids = [uploads.add_part("default", upload.upload_id, piece)[0] for piece in reversed(pieces)]
    completed = uploads.complete("default", upload.upload_id, list(reversed(ids)), None)
    assert completed.status == "completed"
    assert rig.service.outcomes.file_content("default", upload.file_id) == b"".join(pieces)
    stored = rig.service.file("default", upload.file_id)
    assert stored is not None
    assert (stored.filename, stored.size) == ("in.jsonl", sum(map(len, pieces)))


def test_an_upload_refused_at_complete_makes_no_file(rig: Rig) -> None:
    uploads = rig.service.uploads
    upload = uploads.create("default", size=4, filename="x.jsonl", purpose="batch")
    part, _ = uploads.add_part("default", upload.upload_id, b"{}\n\n\n")
    with pytest.raises(InvalidInput, match="5 bytes"):  # the parts add up to more than announced
        uploads.complete("default", upload.upload_id, [part], None)
    exact = uploads.create("default", size=3, filename="x.jsonl", purpose="batch")
    part, _ = uploads.add_part("default", exact.upload_id, b"{}\n")
    with pytest.raises(InvalidInput, match="md5"):
        uploads.complete("default", exact.upload_id, [part], "0" * 32)
    assert rig.service.file("default", exact.file_id) is None
    with pytest.raises(ApiError) as elsewhere:
        uploads.complete("other", exact.upload_id, [part], None)
    assert elsewhere.value.status == 404
    right = hashlib.md5(b"{}\n", usedforsecurity=False).hexdigest()
    assert uploads.complete("default", exact.upload_id, [part], right).status == "completed"


def test_an_expired_upload_takes_no_part(rig: Rig) -> None:
    now = [1000.0]
    uploads = FileUploads(blobs(rig.settings), clock=lambda: now[0])
    upload = uploads.create("default", size=3, filename="x.jsonl", purpose="batch")
    now[0] += UPLOAD_TTL_S
    with pytest.raises(InvalidInput, match="expired"):
        uploads.add_part("default", upload.upload_id, b"{}\n")


@pytest.mark.parametrize("given", ["path", "bytes"])
def test_the_sdk_puts_a_batch_file_to_its_url_without_the_api_key(tmp_path: Any, given: str) -> None:
    data = lines({"prompt": "a"}, {"prompt": "b"})
    seen: list[httpx.Request] = []

    def serve(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/batches/uploads":
            upload_url = "http://127.0.0.1:9/bucket/files/t/file-1?X-Amz-Signature=abc"
            return httpx.Response(201, json={"file_id": "file-1", "upload_url": upload_url})
        if request.method == "PUT":
            assert request.read() == data
            return httpx.Response(200)
        if request.method == "GET":  # the batch, read after the submit: not served by this fake
            return httpx.Response(404, json={"title": "Batch not found", "status": 404, "detail": "fake"})
        assert json.loads(request.content) == {"input_file_id": "file-1", "priority": "low"}
        return httpx.Response(202, json={"batch_id": "b" * 32})

    source: Any = data if given == "bytes" else tmp_path / "items.jsonl"
    if given == "path":
        source.write_bytes(data)
    client = Client("http://api.test", "key-1", transport=httpx.MockTransport(serve))
    file_id = client.upload_batch_file(source)
    assert file_id == "file-1"
    with pytest.raises(ProblemError):
        client.submit_batch(file_id, priority="low")
    put = seen[1]
    assert put.method == "PUT"
    assert "authorization" not in put.headers  # the URL is signed: S3 refuses a second signature
    assert put.headers["content-length"] == str(len(data))
    assert seen[0].headers["authorization"] == "Bearer key-1"


def test_the_async_sdk_streams_a_batch_file_from_its_path(tmp_path: Any) -> None:
    data = lines(*[{"prompt": str(i)} for i in range(50_000)])  # a few megabytes, read in chunks
    path = tmp_path / "items.jsonl"
    path.write_bytes(data)
    put: list[tuple[bytes, httpx.Headers]] = []

    async def serve(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            put.append((await request.aread(), request.headers))
            return httpx.Response(200)
        return httpx.Response(
            201, json={"file_id": "file-2", "upload_url": "http://127.0.0.1:9/b/k?X-Amz-Signature=s"}
        )

    async def run() -> str:
        async with AsyncClient("http://api.test", "key-2", transport=httpx.MockTransport(serve)) as client:
            return await client.upload_batch_file(path)

    assert asyncio.run(run()) == "file-2"
    [(body, headers)] = put
    assert body == data
    assert headers["content-length"] == str(len(data))
    assert "authorization" not in headers


def test_a_file_whose_items_do_not_fit_its_key_s_in_flight_fails_its_batch(rig: Rig) -> None:
    assert rig.settings.limits_table_name is not None
    ended = work_ended(rig.store, rig.batches)
    counters = KeyLimits(rig.settings.limits_table_name, rig.aws.dynamodb, ended=ended)
    service = BatchService(
        rig.settings, rig.store, rig.batches, rig.fanout_queue, results=blobs(rig.settings), limits=counters
    )
    reader = BatchInputReader(
        rig.settings, rig.batches, blobs(rig.settings), rig.fanout_queue, limits=counters
    )
    caller = Caller("default", "k1", max_in_flight=4)
    fits = upload(rig, lines(*[{"prompt": str(i)} for i in range(4)]))
    too_many = upload(rig, lines(*[{"prompt": str(i)} for i in range(5)]))
    first = service.submit("default", SubmitBatchRequest(input_file_id=too_many), caller=caller).batch
    reader.read(first)
    failed = rig.batch(first.batch_id)
    assert failed.status is BatchStatus.FAILED
    assert failed.input is not None
    assert failed.input.errors == ["its 5 items are more than its API key may have in flight (4)"]
    second = service.submit("default", SubmitBatchRequest(input_file_id=fits), caller=caller).batch
    reader.read(second)  # the failed batch's hold is released (it ended), so 4 fit
    assert rig.batch(second.batch_id).status is BatchStatus.PENDING


def test_a_batch_whose_file_is_refused_whole_still_sends_its_webhook(rig: Rig) -> None:
    file_id = upload(rig, lines({"nope": 1}))
    reply = rig.api.call(
        "POST", "/batches", {"input_file_id": file_id, "webhook_url": "http://127.0.0.1:9/hook"}
    )
    batch_id = reply["json"]["batch_id"]
    rig.fan_out()
    assert rig.batch(batch_id).status is BatchStatus.FAILED
    [event] = rig.relay(rig.stream())  # through WebhookFunction's stream filter, as the template has it
    assert (event.batch_id, event.event_type) == (batch_id, "batch.completed")


def test_an_openai_batch_ends_once_its_files_are_written_so_its_webhook_finds_them(rig: Rig) -> None:
    request = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    data = lines(
        *(
            {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": request}
            for i in range(5)
        ),
        b"not json",
    )
    rig.service.put_file("default", "file-" + "a" * 32, data, filename="in.jsonl", purpose="batch")
    created = rig.api.call(
        "POST",
        "/v1/batches",
        {
            "input_file_id": "file-" + "a" * 32,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "webhook_url": "http://127.0.0.1:9/hook",
        },
    )
    assert created["statusCode"] == 200, created
    openai_id = created["json"]["id"]
    batch_id = openai_id.removeprefix("batch_")
    rig.fan_out()  # the read
    rig.fan_out()  # the chunks
    assert rig.run_items() == 5
    rig.count(rig.stream())

    # Every request has ended: the batch is finalizing, and has not ended (no webhook yet)
    seen = rig.api.call("GET", f"/v1/batches/{openai_id}")["json"]
    assert (seen["status"], seen["output_file_id"], seen["error_file_id"]) == ("finalizing", None, None)
    assert rig.batch(batch_id).status is BatchStatus.PENDING
    assert rig.relay(rig.stream()) == []
    # BatchFunction writes its files, and ends it in the same write that records them
    [written] = rig.fan_out()
    assert json.loads(written["Body"])["action"] == "files"
    ended = rig.api.call("GET", f"/v1/batches/{openai_id}")["json"]
    assert ended["status"] == "completed"
    assert ended["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    output = rig.api.call("GET", f"/v1/files/{ended['output_file_id']}/content")
    body = base64.b64decode(output["body"]) if output.get("isBase64Encoded") else output["body"].encode()
    assert sorted(json.loads(line)["custom_id"] for line in body.splitlines()) == [f"r{i}" for i in range(5)]
    assert ended["error_file_id"] is not None
    [event] = rig.relay(rig.stream())
    assert (event.batch_id, event.event_type) == (batch_id, "batch.completed")

    # A copy of the files message (SQS is at-least-once) finds it ended: nothing moves
    batch = rig.batch(batch_id)
    rig.batch_fn(rig._sqs_event("BatchFanoutQueue", [written]), rig.batch_ctx)
    assert rig.batch(batch_id) == batch
    assert rig.relay(rig.stream()) == []


def test_a_copy_of_an_end_s_files_message_met_after_a_retry_writes_nothing(rig: Rig) -> None:
    # Given an OpenAI batch cancelled before its requests ran, ended with its files
    file_id = "file-" + "b" * 32
    body = {"messages": [{"role": "user", "content": "q"}]}
    line = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": body}
    rig.service.put_file(
        "default", file_id, lines(line, line | {"custom_id": "y"}), filename="i", purpose="batch"
    )
    create = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    openai_id = rig.api.call("POST", "/v1/batches", create)["json"]["id"]
    batch_id = openai_id.removeprefix("batch_")
    rig.fan_out()
    rig.fan_out()
    assert rig.api.call("POST", f"/v1/batches/{openai_id}/cancel")["json"]["status"] == "cancelling"
    rig.fan_out()  # the cancel: both items cancelled, and the batch's end asks for its files
    rig.count(rig.stream())
    assert rig.api.call("GET", f"/v1/batches/{openai_id}")["json"]["status"] == "cancelling"
    ends = rig.fan_out()
    assert {json.loads(m["Body"])["action"] for m in ends} == {"files"}
    first = rig.api.call("GET", f"/v1/batches/{openai_id}")["json"]
    assert first["status"] == "cancelled"
    assert first["error_file_id"] == f"file-{batch_id}-errors"
    # When it is retried, and a copy of that end's message comes again
    assert (
        rig.api.call("POST", f"/batches/{batch_id}/retry", {"statuses": ["cancelled"]})["statusCode"] == 202
    )
    rig.batch_fn(rig._sqs_event("BatchFanoutQueue", ends[:1]), rig.batch_ctx)
    # Then it writes nothing and ends nothing: the retry's own end writes its files
    assert not rig.batch(batch_id).status.is_terminal
    rig.fan_out()  # the retry's chunk
    rig.run_items(allow_retries=True)  # (the cancelled items' first messages are there too)
    rig.count(rig.stream())
    assert rig.api.call("GET", f"/v1/batches/{openai_id}")["json"]["status"] == "finalizing"
    rig.fan_out()
    again = rig.api.call("GET", f"/v1/batches/{openai_id}")["json"]
    assert (again["status"], again["error_file_id"]) == ("completed", None)
    assert again["output_file_id"] == f"file-{batch_id}-output-retry1"


def test_an_openai_batch_whose_every_line_is_refused_fails_with_each_line_in_its_errors(rig: Rig) -> None:
    file_id = "file-" + "c" * 32
    rig.service.put_file("default", file_id, lines({"custom_id": "a"}, b"[1]"), filename="i", purpose="batch")
    create = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    openai_id = rig.api.call("POST", "/v1/batches", create)["json"]["id"]
    rig.fan_out()
    failed = rig.api.call("GET", f"/v1/batches/{openai_id}")["json"]
    assert (failed["status"], failed["output_file_id"], failed["error_file_id"]) == ("failed", None, None)
    assert [(e["code"], e["line"]) for e in failed["errors"]["data"]] == [
        ("invalid_file", None),
        ("invalid_request", 1),
        ("invalid_request", 2),
    ]
    assert rig.aws.messages("BatchFanoutQueue") == []  # a failed batch has no files to write
