"""The mock's Files API, as OpenAI serves it for batches: `POST /v1/files` (multipart: `file`
and `purpose`), `GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`.

Files are kept in memory. A batch input file (`purpose=batch`) past `batch_max_bytes` is refused
as OpenAI refuses it; the batches write their output and error files here (`batch_output`).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmtasks_local.mock_llm.request import error
from llmtasks_local.mock_llm.responses_api import Mock

# What a caller may upload for (OpenAI's purposes); `batch_output` is written by batches only.
PURPOSES = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})
FILE_ENTRIES = 10_000  # the files kept (the oldest forgotten past this many)


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def object(self) -> dict[str, Any]:
        """The File object, as OpenAI answers it."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


class FilesAPI:
    """The files by id, and their routes."""

    def __init__(self, mock: Mock) -> None:
        self.mock = mock
        self._files: OrderedDict[str, StoredFile] = OrderedDict()

    def routes(self) -> list[Route]:
        return [
            Route("/v1/files", self.upload, methods=["POST"]),
            Route("/v1/files/{file_id}", self.retrieve, methods=["GET"]),
            Route("/v1/files/{file_id}", self.delete, methods=["DELETE"]),
            Route("/v1/files/{file_id}/content", self.content, methods=["GET"]),
        ]

    def add(self, filename: str, purpose: str, data: bytes) -> StoredFile:
        stored = StoredFile(f"file-mock{uuid.uuid4().hex}", filename, purpose, data, int(time.time()))
        self._files[stored.id] = stored
        while len(self._files) > FILE_ENTRIES:
            self._files.popitem(last=False)
        return stored

    def get(self, file_id: str) -> StoredFile | None:
        return self._files.get(file_id)

    async def upload(self, request: Request) -> Response:
        try:
            form = await request.form(max_files=1, max_fields=4)
        except (ValueError, AssertionError):  # not multipart, or past the form's limits
            return error(400, "The request must be multipart/form-data with 'file' and 'purpose'.")
        try:
            upload, purpose = form.get("file"), form.get("purpose")
            if not isinstance(upload, UploadFile):
                return error(400, "Missing required parameter: 'file'.", param="file")
            if purpose not in PURPOSES:
                return error(400, f"Invalid value for 'purpose': {purpose!r}.", param="purpose")
            data = await upload.read()
        finally:
            await form.close()
        if purpose == "batch":
            if not (upload.filename or "").endswith(".jsonl"):
                return error(400, "Invalid file format for Batch API. Must be .jsonl", param="file")
            if len(data) > self.mock.config.batch_max_bytes:
                limit_mb = self.mock.config.batch_max_bytes / 1024 / 1024
                return error(
                    400,
                    f"File is too large: a batch input file may be at most {limit_mb:g} MB.",
                    param="file",
                )
        with self.mock.lock:
            self.mock.stats.files_uploaded += 1
        return JSONResponse(self.add(upload.filename or "upload", purpose, data).object())

    async def retrieve(self, request: Request) -> Response:
        stored = self.get(request.path_params["file_id"])
        return JSONResponse(stored.object()) if stored else _no_file(request.path_params["file_id"])

    async def content(self, request: Request) -> Response:
        stored = self.get(request.path_params["file_id"])
        if stored is None:
            return _no_file(request.path_params["file_id"])
        return Response(stored.data, media_type="application/octet-stream")

    async def delete(self, request: Request) -> Response:
        file_id = request.path_params["file_id"]
        if self._files.pop(file_id, None) is None:
            return _no_file(file_id)
        return JSONResponse({"id": file_id, "object": "file", "deleted": True})


def _no_file(file_id: str) -> JSONResponse:
    return error(404, f"No such File object: {file_id}", param="id")
