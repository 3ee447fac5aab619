"""Images and documents a task names by file id: uploaded with purpose user_data or vision (50 MB
each), checked at submit (the caller's, of such a purpose, 50 MB a task in all), read into the
provider's request by the worker for the call only (the task keeps the ids), a file gone at run
time a failed task; and a budget's bound for images and documents never below what is billed."""

from __future__ import annotations

import asyncio
import base64
import json
from decimal import Decimal
from typing import Any

import boto3
import pytest

from llmtasks.domain.input_files import (
    MAX_TASK_FILE_BYTES,
    FileFacts,
    InputFile,
    InputFileMissing,
    PageCounter,
    pdf_pages,
    sniff_mime,
    with_file_data,
)
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.models import SubmitTaskRequest, TaskStatus
from llmtasks.domain.pricing import ModelPrice, PriceTable
from llmtasks.llm.openai import OpenAIChat
from llmtasks.records import sqs_record
from llmtasks.worker.runner import TaskRunner
from tests.conftest import Aws, RunningMock
from tests.documents import pdf_document
from tests.helpers import blobs
from tests.unit.test_api import assert_problem
from tests.unit.test_batches import Rig
from tests.unit.test_openapi import document, multipart, validator
from tests.unit.test_worker import Worker


@pytest.fixture
def rig(aws: Aws, handler: Any, settings: Any, mock_llm: RunningMock) -> Rig:
    return Rig(aws, handler, settings, mock_llm)


pytestmark = pytest.mark.unit

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
PRICES = PriceTable(
    models={
        "mock-model": ModelPrice(input=Decimal(1), output=Decimal(4), max_output_tokens=200),
        "o4-mini": ModelPrice(input=Decimal(1), output=Decimal(4), max_output_tokens=200),
    }
)


def file_part(file_id: str) -> dict[str, Any]:
    return {"type": "file", "file": {"file_id": file_id}}


def image_part(file_id: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"file_id": file_id}}


def asking(*parts: dict[str, Any], **options: Any) -> dict[str, Any]:
    """A task body: one user message of a question and `parts`."""
    content = [{"type": "text", "text": "Which kind of document is this?"}, *parts]
    return {"messages": [{"role": "user", "content": content}], **options}


# --- what a file is ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "mime"),
    [
        (PNG, "image/png"),
        (b"\xff\xd8\xff\xe0JFIF", "image/jpeg"),
        (b"GIF89a...", "image/gif"),
        (b"RIFF\x10\0\0\0WEBPVP8 ", "image/webp"),
        (b"%PDF-1.7\n", "application/pdf"),
        (b"\xef\xbb\xbf junk %PDF-1.4\n", "application/pdf"),
        (b"plain text", None),
    ],
)
def test_a_file_s_type_is_what_its_first_bytes_say(head: bytes, mime: str | None) -> None:
    assert sniff_mime(head) == mime


def test_a_pdf_s_pages_are_counted_whole_wherever_its_chunks_are_cut() -> None:
    data = pdf_document("an invoice", pages=3)
    assert pdf_pages(data) == 3  # its /Type /Pages tree is no page
    for cut in range(1, len(data)):
        counter = PageCounter()
        counter.feed(data[:cut])
        counter.feed(data[cut:])
        assert counter.pages == 3, cut
    # Pages that may hide in compressed object streams, or none seen: not counted
    assert pdf_pages(data.replace(b"/Type /Catalog", b"/Type /ObjStm")) is None
    assert pdf_pages(b"%PDF-1.4\n%%EOF\n") is None


# --- the worker's request ------------------------------------------------------------------------


def test_the_provider_s_request_carries_the_files_and_the_task_s_keeps_their_ids() -> None:
    pdf = pdf_document("a contract")
    request = LLMRequest.model_validate(asking(image_part("file-img"), file_part("file-pdf")))
    files = {
        "file-img": InputFile(PNG, "scan.png", mime_type=None),
        "file-pdf": InputFile(pdf, "deal.pdf", mime_type="text/plain"),
    }
    sent = with_file_data(request, files.get)
    _, image, document = sent.chat_messages()[0]["content"]
    assert image == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
    }
    # A document is sent as what its bytes are, whatever its upload said
    assert document["file"] == {
        "file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode(),
        "filename": "deal.pdf",
    }
    assert request.file_ids() == ["file-img", "file-pdf"]  # the task's own request is unchanged
    assert with_file_data(LLMRequest(prompt="hi"), files.get) == LLMRequest(prompt="hi")
    with pytest.raises(InputFileMissing, match="file-img"):
        with_file_data(request, {"file-pdf": files["file-pdf"]}.get)


# --- the budget's bound --------------------------------------------------------------------------


def billed(mock_llm: RunningMock, request: LLMRequest, prices: PriceTable = PRICES) -> Decimal:
    """What the mock LLM bills for `request`, priced."""
    chat = OpenAIChat(base_url=mock_llm.url, api_key=None, default_model="mock-model")
    completion = asyncio.run(chat.complete(request, timeout_s=30))
    return Decimal(repr(prices.price(completion.usage, request.model or "mock-model").cost_usd))


def test_the_most_cost_is_never_below_what_images_and_documents_are_billed(mock_llm: RunningMock) -> None:
    # Input tokens alone (the reply's bound would hide a prompt's shortfall)
    prompts = PriceTable(
        models={"mock-model": ModelPrice(input=Decimal(1), output=Decimal(0), max_output_tokens=1)}
    )
    pdf = pdf_document("an invoice", pages=2, size=60_000)
    pdf_url = "data:application/pdf;base64," + base64.b64encode(pdf).decode()
    png_url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    requests = [
        asking(*[{"type": "image_url", "image_url": {"url": png_url, "detail": "high"}}] * 3),
        asking({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
        asking({"type": "file", "file": {"file_data": pdf_url, "filename": "a.pdf"}}),
    ]
    for body in requests:
        request = LLMRequest.model_validate(body)
        assert billed(mock_llm, request, prompts) <= prompts.most_cost(request, "mock-model"), body
    # A file named by id is bound by its facts; sent as its data, the bound still holds
    by_id = LLMRequest.model_validate(asking(file_part("file-pdf")))
    sent = with_file_data(by_id, {"file-pdf": InputFile(pdf, "a.pdf")}.get)
    facts = {"file-pdf": FileFacts(size=len(pdf), pdf=True, pages=2)}
    assert billed(mock_llm, sent, prompts) <= prompts.most_cost(by_id, "mock-model", facts)
    # One with no facts is bound as the largest a task may name
    assert prompts.most_cost(by_id, "mock-model") * 1_000_000 > MAX_TASK_FILE_BYTES


def test_the_most_cost_is_never_below_what_a_reasoning_model_s_reply_is_billed(mock_llm: RunningMock) -> None:
    for effort in ("low", "high"):
        request = LLMRequest.model_validate(
            asking(max_completion_tokens=60, model="o4-mini", reasoning_effort=effort)
        )
        assert billed(mock_llm, request) <= PRICES.most_cost(request, "o4-mini")


def test_the_reply_is_bound_by_max_completion_tokens_reasoning_included() -> None:
    short, long = (
        LLMRequest(prompt="q", model="o4-mini", max_completion_tokens=n, max_tokens=1) for n in (10, 110)
    )
    # 100 more tokens of reply at 4 USD a million: max_completion_tokens wins over max_tokens
    assert PRICES.most_cost(long, "o4-mini") - PRICES.most_cost(short, "o4-mini") == Decimal("0.0004")


# --- the API -------------------------------------------------------------------------------------


def upload_file(rig: Rig, data: bytes, purpose: str, *, tenant: str = "default") -> dict[str, Any]:
    content_type, body = multipart({"file": ("doc.pdf", data), "purpose": (None, purpose.encode())})
    return rig.api.call(
        "POST",
        "/v1/files",
        raw=base64.b64encode(body).decode(),
        headers={"content-type": content_type},
        base64_body=True,
        tenant=tenant,
    )


def test_files_take_purpose_user_data_and_vision_and_a_pdf_s_pages_are_kept(rig: Rig) -> None:
    pdf = pdf_document("an invoice", pages=2)
    for purpose in ("user_data", "vision"):
        reply = upload_file(rig, pdf, purpose)
        assert reply["statusCode"] == 200, reply["body"]
        assert reply["json"]["purpose"] == purpose
        stored = rig.service.file("default", reply["json"]["id"])
        assert stored is not None
        assert (stored.mime_type, stored.pages) == ("application/pdf", 2)
    assert upload_file(rig, pdf, "fine-tune")["statusCode"] == 400


def test_an_upload_of_an_input_file_holds_50_mb_and_its_pdf_pages_are_counted(rig: Rig) -> None:
    refused = rig.api.call(
        "POST",
        "/v1/uploads",
        {
            "bytes": MAX_TASK_FILE_BYTES + 1,
            "filename": "a.pdf",
            "mime_type": "application/pdf",
            "purpose": "user_data",
        },
    )
    assert refused["statusCode"] == 400
    assert "bytes" in json.dumps(refused["json"])
    pdf = pdf_document("an invoice", pages=4, size=20_000)
    body = {"bytes": len(pdf), "filename": "a.pdf", "mime_type": "application/pdf", "purpose": "user_data"}
    made = rig.api.call("POST", "/v1/uploads", body)
    assert made["statusCode"] == 200, made["body"]
    uploads = rig.service.uploads
    upload_id = made["json"]["id"]
    parts = [uploads.add_part("default", upload_id, pdf[i : i + 7_000])[0] for i in range(0, len(pdf), 7_000)]
    completed = uploads.complete("default", upload_id, parts, None)
    stored = rig.service.file("default", completed.file_id)
    assert stored is not None
    assert (stored.purpose, stored.mime_type, stored.pages, stored.size) == (
        "user_data",
        "application/pdf",
        4,
        len(pdf),
    )
    assert rig.service.outcomes.file_content("default", completed.file_id) == pdf


def test_a_submit_names_only_the_caller_s_input_files_50_mb_in_all(rig: Rig, aws: Aws) -> None:
    mine = upload_file(rig, pdf_document("an invoice"), "user_data")["json"]["id"]
    theirs = upload_file(rig, pdf_document("an invoice"), "user_data", tenant="other")["json"]["id"]
    batch_input = upload_file(rig, b'{"prompt": "a"}\n', "batch")["json"]["id"]
    assert rig.api.call("POST", "/tasks", asking(file_part(mine)))["statusCode"] == 202

    for named, status in ((theirs, 404), ("file-nothere", 404), (batch_input, 422)):
        problem = assert_problem(rig.api.call("POST", "/tasks", asking(image_part(named))), status)
        assert problem["errors"][0]["field"] == "messages[0].content[1].image_url.file_id", problem
    problem = assert_problem(
        rig.api.call("POST", "/batches", {"items": [{"prompt": "a"}, asking(file_part("file-nothere"))]}), 404
    )
    assert problem["errors"][0]["field"] == "items[1].messages[0].content[1].file.file_id"

    # Two files of just over half the cap each: the second is one too many
    s3, bucket = boto3.client("s3"), rig.settings.results_bucket
    halves = []
    for n in range(2):
        key = f"files/default/file-half{n}"
        s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=b"\0" * (MAX_TASK_FILE_BYTES // 2 + 1),
            Metadata={"purpose": "user_data"},
        )
        halves.append(f"file-half{n}")
    problem = assert_problem(rig.api.call("POST", "/tasks", asking(*map(file_part, halves))), 422)
    assert "at most" in problem["detail"]
    assert problem["errors"][0]["field"] == "messages[0].content[2].file.file_id"
    assert len(aws.messages("TaskQueue")) == 1  # only the first submit's


def test_an_inline_image_over_the_request_cap_is_413_pointing_to_uploads(rig: Rig) -> None:
    big = "data:image/png;base64," + base64.b64encode(PNG + b"\0" * 200_000).decode()
    reply = rig.api.call("POST", "/tasks", asking({"type": "image_url", "image_url": {"url": big}}))
    problem = assert_problem(reply, 413)
    assert "POST /v1/files" in problem["detail"]
    assert "file_id" in problem["detail"]


# --- the worker ----------------------------------------------------------------------------------


def test_the_worker_sends_the_named_files_and_the_task_item_keeps_only_their_ids(
    worker: Worker, mock_llm: RunningMock, aws: Aws
) -> None:
    pdf = pdf_document("an invoice", pages=2, size=300_000)
    results = blobs(worker.settings)
    results.put_file("default", "file-doc", pdf, filename="doc.pdf", purpose="user_data")
    results.put_file("default", "file-png", PNG, filename="a.png", purpose="vision", mime_type="image/png")
    body = asking(file_part("file-doc"), image_part("file-png"))
    task_id = worker.service.submit("default", _request(body)).task.task_id
    assert worker.run_queued() == {"batchItemFailures": []}
    task = worker.task(task_id)
    assert task.status is TaskStatus.COMPLETED, task.error
    assert (mock_llm.stats.files, mock_llm.stats.file_bytes, mock_llm.stats.images) == (1, len(pdf), 1)
    # The item holds the ids, never the bytes
    item = aws.dynamodb.get_item(
        TableName=worker.settings.tasks_table_name, Key={"pk": {"S": f"task#{task_id}"}}
    )
    raw = json.dumps(item["Item"])
    assert "file-doc" in raw
    assert "file-png" in raw
    assert len(raw) < 20_000


def test_a_file_gone_when_the_task_runs_fails_it_with_input_file_missing_and_no_call(
    worker: Worker, mock_llm: RunningMock
) -> None:
    results = blobs(worker.settings)
    results.put_file("default", "file-gone", PNG, filename="a.png", purpose="vision")
    task_id = worker.service.submit("default", _request(asking(image_part("file-gone")))).task.task_id
    boto3.client("s3").delete_object(Bucket=worker.settings.results_bucket, Key="files/default/file-gone")
    assert worker.run_queued() == {"batchItemFailures": []}
    task = worker.task(task_id)
    assert (task.status, task.error_code) == (TaskStatus.FAILED, "input_file_missing")
    assert "file-gone" in task.error
    assert mock_llm.stats.calls == 0


def _request(body: dict[str, Any]) -> SubmitTaskRequest:
    return SubmitTaskRequest.model_validate(body)


def test_the_document_says_an_input_file_s_upload_holds_50_mb_as_the_api_does(rig: Rig) -> None:
    check = validator(document(rig), "/v1/uploads")
    for purpose, size in (
        ("user_data", MAX_TASK_FILE_BYTES),
        ("vision", MAX_TASK_FILE_BYTES + 1),
        ("batch", 10**8),
    ):
        body = {"bytes": size, "filename": "a.pdf", "mime_type": "application/pdf", "purpose": purpose}
        accepted = rig.api.call("POST", "/v1/uploads", body)["statusCode"] == 200
        assert check.is_valid(body) == accepted == (purpose == "batch" or size <= MAX_TASK_FILE_BYTES), body


def test_an_invocation_holds_one_call_s_files_past_its_limit_and_the_others_wait_queued(
    worker: Worker, mock_llm: RunningMock, aws: Aws
) -> None:
    # Three tasks naming a document each reach one invocation, whose limit holds one document:
    # one call runs with it, and the first of the others is sent back to its queue, costing no
    # retry, while a task naming no file runs beside them
    mock_llm.configure(latency_s=1.0)
    results = blobs(worker.settings)
    named = []
    for n in range(2):
        results.put_file(
            "default", f"file-doc{n}", pdf_document(f"doc {n}"), filename="a.pdf", purpose="user_data"
        )
        named.append(
            worker.service.submit("default", _request(asking(file_part(f"file-doc{n}")))).task.task_id
        )
    plain = worker.submit("no file")
    runner = TaskRunner(
        worker.settings.model_copy(update={"worker_call_slots": 0}),
        worker.store,
        worker.lanes,
        OpenAIChat(base_url=mock_llm.url, api_key=None, default_model="mock-model"),
        results=results,
        held_file_limit=len(pdf_document("doc 0")),
    )
    arn = aws.resources.attributes[("TaskQueue", "Arn")]
    event = {"Records": [sqs_record(m, arn) for m in worker.queued()]}  # type: ignore[arg-type]
    assert worker.fn(event, worker.context, runner=runner, queue=worker.queue, call_slots=0) == {
        "batchItemFailures": []
    }
    ran, waiting = sorted((worker.task(t) for t in named), key=lambda t: t.status is TaskStatus.PENDING)
    assert ran.status is TaskStatus.COMPLETED
    assert (waiting.status, waiting.last_error_code, waiting.attempts) == (
        TaskStatus.PENDING,
        "files_held",
        0,
    )
    assert worker.task(plain).status is TaskStatus.COMPLETED
    assert mock_llm.stats.files == 1
