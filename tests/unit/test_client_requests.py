"""The SDK's side of a whole request: pydantic models made strict json_schema formats (as the
openai SDK makes them), content parts built from paths, bytes and URLs, and large parts uploaded
through the Files API before the task names them by id."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import pytest
from openai.lib._parsing._completions import type_to_response_format_param
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import llmtasks_client
from llmtasks.api.openai_batches import multipart_fields
from llmtasks.domain.batches import SubmitBatchRequest
from llmtasks.domain.models import SubmitTaskRequest
from llmtasks_client import LocalFile, file_part, image_part, json_schema_format, strict_json_schema
from llmtasks_client.client import FILE_PART_BYTES
from tests.helpers import serve

pytestmark = pytest.mark.unit

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 40
PDF = b"%PDF-1.7\n1 0 obj\n<< >>\nendobj\n%%EOF\n"


class Kind(Enum):
    INVOICE = "invoice"
    CONTRACT = "contract"


class Address(BaseModel):
    street: str
    city: str | None = None


class Document(BaseModel):
    """A classified document."""

    kind: Kind = Field(description="What it is")
    title: str
    pages: int | None = None
    tags: list[str] = []
    sender: Address = Field(description="Who sent it")  # a $ref beside a description: inlined
    copies: list[Address] = []
    language: Literal["en", "de"] = "en"
    parent: Document | None = None  # recursive


class Label(BaseModel):
    label: Literal["spam", "ham"]
    score: float


@pytest.mark.parametrize("model", [Label, Address, Document])
def test_a_model_s_schema_is_made_strict_exactly_as_the_openai_sdk_makes_it(model: type[BaseModel]) -> None:
    assert strict_json_schema(model) == to_strict_json_schema(model)
    assert json_schema_format(model) == type_to_response_format_param(model)


def test_a_strict_schema_closes_every_object_and_requires_every_property() -> None:
    schema = strict_json_schema(Document)
    assert schema["additionalProperties"] is False
    assert schema["required"] == list(Document.model_fields)
    assert schema["properties"]["sender"]["additionalProperties"] is False  # inlined, then closed
    assert "$ref" not in schema["properties"]["sender"]
    assert schema["$defs"]["Address"]["required"] == ["street", "city"]
    assert "default" not in schema["properties"]["pages"]  # a None default says nothing
    adapter = TypeAdapter(list[Label])
    assert strict_json_schema(adapter) == to_strict_json_schema(adapter)


def test_submit_sends_a_model_as_its_json_schema_format_and_the_service_accepts_it() -> None:
    # Given the body the SDK makes for a model class and a content list with a bare string
    body = llmtasks_client.client._Policy.task_body(
        None,
        [{"role": "user", "content": ["Classify this", image_part("https://example.com/a.png")]}],
        Document,
        {"max_completion_tokens": 500, "reasoning_effort": "high", "seed": None},
    )
    # Then the service's own model of a task body takes it, as sent
    request = SubmitTaskRequest.model_validate(json.loads(json.dumps(body)))
    assert request.json_schema == to_strict_json_schema(Document)
    assert body["response_format"]["json_schema"]["name"] == "Document"
    assert body["messages"][0]["content"][0] == {"type": "text", "text": "Classify this"}
    assert "seed" not in body  # None leaves a field out
    # A response_format given as a mapping goes as it is
    given = {"type": "json_object"}
    assert llmtasks_client.client._Policy.task_body("x", None, given, {})["response_format"] == given
    with pytest.raises(TypeError):
        llmtasks_client.client._Policy.task_body("x", None, Label(label="ham", score=1), {})  # type: ignore[arg-type]


def test_a_batch_s_items_take_model_classes_and_parts_as_a_task_does() -> None:
    items = [
        {"custom_id": "a", "prompt": "spam?", "response_format": Label},
        {"custom_id": "b", "messages": [{"role": "user", "content": ["ham?", image_part(PNG)]}]},
    ]
    body = llmtasks_client.client._Policy.batch_body(items, {"priority": "low", "webhook_url": None})
    assert body["items"][0]["response_format"] == type_to_response_format_param(Label)
    assert body["items"][1]["messages"][0]["content"][0] == {"type": "text", "text": "ham?"}
    assert items[0]["response_format"] is Label  # the caller's items are left as they were
    assert "webhook_url" not in body
    SubmitBatchRequest.model_validate(json.loads(json.dumps(body)))  # what the service takes


def test_image_part_passes_urls_and_inlines_small_images_as_data_urls(tmp_path: Path) -> None:
    url = "https://example.com/cat.jpg"
    assert image_part(url, detail="low") == {"type": "image_url", "image_url": {"url": url, "detail": "low"}}
    inline = image_part(PNG)
    assert inline == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
    }
    jpeg = tmp_path / "photo.jpg"
    jpeg.write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 20)
    part = image_part(jpeg, detail="high")
    assert isinstance(part, dict)
    assert part["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert part["image_url"]["detail"] == "high"
    # Bytes of no known image type need their media type said
    with pytest.raises(ValueError, match="media_type"):
        image_part(b"not an image")
    assert isinstance(image_part(b"raw", media_type="image/webp"), dict)
    with pytest.raises(FileNotFoundError):
        image_part(tmp_path / "missing.png")


def test_file_part_inlines_a_small_document_with_its_filename(tmp_path: Path) -> None:
    assert file_part(PDF, filename="deal.pdf") == {
        "type": "file",
        "file": {
            "file_data": "data:application/pdf;base64," + base64.b64encode(PDF).decode(),
            "filename": "deal.pdf",
        },
    }
    notes = tmp_path / "notes.txt"
    notes.write_text("a contract")
    part = file_part(notes)
    assert isinstance(part, dict)
    assert part["file"]["filename"] == "notes.txt"
    assert part["file"]["file_data"] == "data:text/plain;base64," + base64.b64encode(b"a contract").decode()


def test_a_part_over_the_inline_limit_is_a_local_file_named_by_id_once_uploaded(tmp_path: Path) -> None:
    big = tmp_path / "scan.pdf"
    big.write_bytes(PDF + b"x" * llmtasks_client.INLINE_BYTES)
    document = file_part(big)
    assert isinstance(document, LocalFile)
    assert (document.path, document.filename, document.media_type) == (big, "scan.pdf", "application/pdf")
    assert document.part("file-abc") == {
        "type": "file",
        "file": {"file_id": "file-abc", "filename": "scan.pdf"},
    }
    image = image_part(PNG, detail="low", inline_limit=10)
    assert isinstance(image, LocalFile)
    assert image.data == PNG
    assert image.part("file-img") == {
        "type": "image_url",
        "image_url": {"file_id": "file-img", "detail": "low"},
    }


def test_parse_makes_the_parsed_json_the_model_and_refuses_a_misfit() -> None:
    view = {"task_id": "t", "status": "completed", "created_at": 0, "expires_at": 0}
    task = llmtasks_client.TaskView.model_validate({**view, "parsed": {"label": "spam", "score": 0.5}})
    assert task.parse(Label) == Label(label="spam", score=0.5)
    assert llmtasks_client.TaskView.model_validate(view).parse(Label) is None
    with pytest.raises(ValidationError):
        llmtasks_client.TaskView.model_validate({**view, "parsed": {"label": "eggs"}}).parse(Label)


class FilesServer:
    """Plays the API's Files, Uploads and task routes, recording what the SDK sent; it reads the
    multipart bodies with the service's own parser."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str | None, str, bytes]] = {}  # id -> filename, purpose, bytes
        self.parts: dict[str, bytes] = {}
        self.uploads: dict[str, dict[str, Any]] = {}
        self.tasks: list[dict[str, Any]] = []
        self.seen: list[str] = []
        self.md5 = ""  # what the last completed upload said its bytes' MD5 is

    def _file(self, file_id: str, filename: str | None, purpose: str, data: bytes) -> dict[str, Any]:
        self.files[file_id] = (filename, purpose, data)
        return {
            "id": file_id,
            "object": "file",
            "bytes": len(data),
            "created_at": 1,
            "filename": filename,
            "purpose": purpose,
        }

    async def route(self, request: Request) -> JSONResponse:
        path, body = request.url.path, await request.body()
        self.seen.append(f"{request.method} {path}")
        content_type = request.headers.get("content-type", "")
        if path == "/v1/files":
            fields = multipart_fields(content_type, body)
            filename, data = fields["file"]
            return JSONResponse(
                self._file(f"file-{len(self.files)}", filename, fields["purpose"][1].decode(), data)
            )
        if path == "/v1/uploads":
            upload = json.loads(body)
            self.uploads[f"upload_{len(self.uploads)}"] = upload
            return JSONResponse({"id": f"upload_{len(self.uploads) - 1}", **upload})
        if path.endswith("/parts"):
            part_id = f"part_{len(self.parts)}"
            self.parts[part_id] = multipart_fields(content_type, body)["data"][1]
            return JSONResponse({"id": part_id})
        if path.endswith("/complete"):
            upload = self.uploads[path.split("/")[3]]
            done = json.loads(body)
            data = b"".join(self.parts[part_id] for part_id in done["part_ids"])
            self.md5 = done["md5"]
            return JSONResponse({"file": self._file("file-big", upload["filename"], upload["purpose"], data)})
        if path == "/tasks":
            self.tasks.append(json.loads(body))
            return JSONResponse({"task_id": "t1"}, 202)
        parsed = {"label": "ham", "score": 0.25}
        view = {"task_id": "t1", "status": "completed", "created_at": 0, "expires_at": 0, "parsed": parsed}
        return JSONResponse(view)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self.route, methods=["GET", "POST"])])


def test_submit_uploads_a_large_part_with_purpose_user_data_and_names_it_by_id(tmp_path: Path) -> None:
    # Given a large PDF on disk, a small image and a model class
    scan = tmp_path / "scan.pdf"
    scan.write_bytes(PDF + b"y" * (llmtasks_client.INLINE_BYTES + 1))
    server = FilesServer()
    with serve(server.app()) as url, llmtasks_client.Client(url, "k") as client:
        # When it is submitted
        task = client.submit(
            messages=[{"role": "user", "content": ["Label it", file_part(scan), image_part(PNG)]}],
            response_format=Label,
        )
        # Then the file went up once, as OpenAI's files.create sends it, before the task
        assert server.seen[:2] == ["POST /v1/files", "POST /tasks"]
        assert server.files["file-0"] == ("scan.pdf", "user_data", scan.read_bytes())
        [part_text, document, image] = server.tasks[0]["messages"][0]["content"]
        assert document == {"type": "file", "file": {"file_id": "file-0", "filename": "scan.pdf"}}
        assert image["image_url"]["url"].startswith("data:image/png;base64,")  # small: inline
        assert part_text == {"type": "text", "text": "Label it"}
        SubmitTaskRequest.model_validate(server.tasks[0])  # what the service takes
        # and the task read back carries the model's instance
        assert task.parsed == Label(label="ham", score=0.25)
        assert client.wait("t1").parsed == Label(label="ham", score=0.25)
    # A client that did not submit it gives the JSON as it came
    with serve(server.app()) as url, llmtasks_client.Client(url, "k") as other:
        assert other.get("t1").parsed == {"label": "ham", "score": 0.25}


def test_a_file_over_a_request_s_size_goes_up_in_parts_through_the_uploads_api() -> None:
    data = bytes(range(256)) * (FILE_PART_BYTES // 256) + b"tail"
    server = FilesServer()

    async def upload(url: str) -> llmtasks_client.FileObject:
        async with llmtasks_client.AsyncClient(url, "k") as client:
            return await client.upload_file(data, filename="big.pdf")

    with serve(server.app()) as url:
        made = asyncio.run(upload(url))
    assert (made.id, made.bytes, made.purpose) == ("file-big", len(data), "user_data")
    assert server.uploads["upload_0"] == {
        "bytes": len(data),
        "filename": "big.pdf",
        "mime_type": "application/pdf",
        "purpose": "user_data",
    }
    assert [len(part) for part in server.parts.values()] == [FILE_PART_BYTES, 4]
    assert server.files["file-big"][2] == data
    assert server.md5 == hashlib.md5(data).hexdigest()  # the whole file's, for the server to check
