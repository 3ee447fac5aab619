"""OpenAI's Batch API served by llmtasks' batches: a JSON Lines file uploaded (`/v1/files`), a
batch made of it (`/v1/batches`), polled, and its output and error files downloaded, in OpenAI's
formats, so that code written with the `openai` SDK runs unchanged.

An OpenAI batch is a native batch (`batch_<id>`): its valid lines are the batch's items, with
their custom_id; a line that cannot be served is reported in the error file and does not fail
the batch. Once every request has ended the batch is `finalizing` while BatchFunction writes
its output and error files (OpenAIBatchFiles, openai_batch_files.py); it ends, `completed` or
`cancelled`, in the write that records them, so whoever learns it ended (a read, its webhook)
finds them.
"""

from __future__ import annotations

import email.parser
import email.policy
import time
import uuid
from typing import Any

from pydantic import ValidationError

from llmtasks.api.openai_batch_files import file_ids
from llmtasks.api.openai_requests import CompleteUpload, CreateBatch, CreateUpload
from llmtasks.domain.batch_input import first_error
from llmtasks.domain.batches import (
    Batch,
    BatchFiles,
    BatchStatus,
    BatchView,
    FileUpload,
    StoredFile,
    SubmitBatchRequest,
)
from llmtasks.domain.caller import Caller
from llmtasks.domain.errors import ApiError, InvalidInput
from llmtasks.domain.errors import FileNotFound as NoSuchFile
from llmtasks.domain.events import BATCH_ID_PREFIX
from llmtasks.services.batches import BatchService
from llmtasks.services.file_uploads import check_purpose

MAX_FILE_BYTES = 5 * 1024 * 1024  # a Lambda request body holds 6 MB
_STATUSES = {
    BatchStatus.VALIDATING: "validating",
    BatchStatus.FAILED: "failed",
    BatchStatus.PENDING: "in_progress",
    BatchStatus.PROCESSING: "in_progress",
    BatchStatus.COMPLETED: "completed",
    BatchStatus.COMPLETED_WITH_ERRORS: "completed",
    BatchStatus.CANCELLING: "cancelling",
    BatchStatus.CANCELLED: "cancelled",
}


class FileNotFound(ApiError):
    status, title, slug = 404, "File not found", "not-found"


class BatchNotFound(ApiError):
    status, title, slug = 404, "Batch not found", "not-found"


def file_object(stored: StoredFile) -> dict[str, Any]:
    return {
        "id": stored.file_id,
        "object": "file",
        "bytes": stored.size,
        "created_at": int(stored.created_at),
        "filename": stored.filename,
        "purpose": stored.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def multipart_fields(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A multipart/form-data body's fields: name -> (filename, bytes)."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    if not message.is_multipart():
        raise InvalidInput("the body must be multipart/form-data with a 'file' and a 'purpose'", field="file")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


class OpenAIBatches:
    """The Batch API for one request: files in the results bucket, batches as native batches."""

    def __init__(self, batches: BatchService, *, clock: Any = time.time) -> None:
        self._batches = batches
        self._clock = clock

    # --- files ---

    def upload(self, tenant_id: str, content_type: str, body: bytes) -> dict[str, Any]:
        fields = multipart_fields(content_type, body)
        purpose = fields.get("purpose", (None, b""))[1].decode(errors="replace")
        check_purpose(purpose)
        filename, data = fields.get("file", (None, b""))
        if not data:
            raise InvalidInput("the 'file' field is missing or empty", field="file")
        if len(data) > MAX_FILE_BYTES:
            raise InvalidInput(
                f"a file holds at most {MAX_FILE_BYTES} bytes here: send a larger one with POST /v1/uploads",
                field="file",
            )
        file_id = f"file-{uuid.uuid4().hex}"
        self._batches.put_file(tenant_id, file_id, data, filename=filename or "batch.jsonl", purpose=purpose)
        return file_object(self._file(tenant_id, file_id))

    def _file(self, tenant_id: str, file_id: str) -> StoredFile:
        stored = self._batches.file(tenant_id, file_id)
        if stored is None:
            raise FileNotFound(f"No file found with id '{file_id[:80]}'.")
        return stored

    def file(self, tenant_id: str, file_id: str) -> dict[str, Any]:
        return file_object(self._file(tenant_id, file_id))

    def content(self, tenant_id: str, file_id: str) -> tuple[bytes | None, str | None]:
        """The file's bytes, or a presigned URL to them when too large for a reply (one look at
        the file, which also says whether the tenant has it)."""
        try:
            return self._batches.file_or_link(tenant_id, file_id)
        except NoSuchFile:
            raise FileNotFound(f"No file found with id '{file_id[:80]}'.") from None

    # --- uploads (a file in parts: OpenAI's Uploads API) ---

    def create_upload(self, tenant_id: str, body: CreateUpload) -> dict[str, Any]:
        upload = self._batches.uploads.create(
            tenant_id, size=body.bytes, filename=body.filename, purpose=body.purpose, mime_type=body.mime_type
        )
        return self._upload_object(upload)

    def add_part(self, tenant_id: str, upload_id: str, content_type: str, body: bytes) -> dict[str, Any]:
        data = multipart_fields(content_type, body).get("data", (None, b""))[1]
        part_id, added_at = self._batches.uploads.add_part(tenant_id, upload_id, data)
        return {"id": part_id, "object": "upload.part", "created_at": int(added_at), "upload_id": upload_id}

    def complete_upload(self, tenant_id: str, upload_id: str, body: CompleteUpload) -> dict[str, Any]:
        upload = self._batches.uploads.complete(tenant_id, upload_id, body.part_ids, body.md5)
        return self._upload_object(upload)

    def cancel_upload(self, tenant_id: str, upload_id: str) -> dict[str, Any]:
        return self._upload_object(self._batches.uploads.cancel(tenant_id, upload_id))

    def _upload_object(self, upload: FileUpload) -> dict[str, Any]:
        made = self._batches.file(upload.tenant_id, upload.file_id) if upload.status == "completed" else None
        return {
            "id": upload.upload_id,
            "object": "upload",
            "bytes": upload.bytes,
            "created_at": int(upload.created_at),
            "filename": upload.filename,
            "purpose": upload.purpose,
            "status": upload.status_at(self._clock()),
            "expires_at": int(upload.expires_at),
            "file": made and file_object(made),
        }

    # --- batches ---

    def create(self, caller: Caller, body: CreateBatch, *, idempotency_key: str | None) -> dict[str, Any]:
        """A native batch made from the file: `validating` while BatchFunction reads its lines
        (in one streaming pass, whatever its size); the lines it cannot serve go to the error
        file with their line numbers."""
        tenant_id = caller.tenant_id
        if self._batches.file(tenant_id, body.input_file_id) is None:
            raise InvalidInput(f"No file found with id '{body.input_file_id[:80]}'.", field="input_file_id")
        described = {
            "openai": {
                "endpoint": body.endpoint,
                "input_file_id": body.input_file_id,
                "metadata": body.metadata,
            }
        }
        webhook_url = body.webhook_url
        try:
            request = SubmitBatchRequest(
                input_file_id=body.input_file_id,
                metadata=described,
                webhook_url=webhook_url,
                webhook_format="openai" if webhook_url else None,
                mode=body.mode,
            )
        except ValidationError as refused:
            raise InvalidInput(first_error(refused), field=str(refused.errors()[0]["loc"][0])) from None
        submission = self._batches.submit(
            tenant_id, request, idempotency_key=idempotency_key, caller=caller, input_format=body.endpoint
        )
        return self._batch_object(submission.batch)

    def retrieve(self, tenant_id: str, openai_id: str) -> dict[str, Any]:
        return self._batch_object(self._batch(tenant_id, openai_id))

    def cancel(self, tenant_id: str, openai_id: str) -> dict[str, Any]:
        batch = self._batch(tenant_id, openai_id)
        if not batch.status.is_terminal:
            batch = self._batches.cancel(tenant_id, batch.batch_id)
        return self._batch_object(batch)

    def _batch(self, tenant_id: str, openai_id: str) -> Batch:
        try:
            batch = self._batches.get(tenant_id, openai_id.removeprefix(BATCH_ID_PREFIX))
        except ApiError as missing:
            if missing.status == 404:
                raise BatchNotFound(f"No batch found with id '{openai_id[:80]}'.") from None
            raise
        if not isinstance((batch.metadata or {}).get("openai"), dict):
            raise BatchNotFound(f"No batch found with id '{openai_id[:80]}' (it was made by POST /batches).")
        return batch

    def _batch_object(self, batch: Batch) -> dict[str, Any]:
        described = (batch.metadata or {})["openai"]
        # Lines it could not serve: counted as the file was read (older batches: at create).
        invalid = batch.input.refused if batch.input is not None else int(described.get("invalid", 0))
        files = self._files_of(batch)
        created = int(batch.created_at)
        ended = int(batch.completed_at) if batch.completed_at else None
        status = _STATUSES[batch.status]
        counts = BatchView.of(batch)  # a provider batch's: its jobs' counts while they run
        if status == "in_progress" and batch.all_ended:
            status = "finalizing"  # every request has ended; BatchFunction writes its files
        return {
            "id": BATCH_ID_PREFIX + batch.batch_id,
            "object": "batch",
            "endpoint": described["endpoint"],
            "errors": _errors_of(batch),
            "input_file_id": described["input_file_id"],
            "completion_window": "24h",
            "status": status,
            "output_file_id": files.output_file_id,
            "error_file_id": files.error_file_id,
            "created_at": created,
            "in_progress_at": None if status in ("validating", "failed") else created,
            "expires_at": created + 24 * 3600,
            "finalizing_at": ended if status == "completed" else None,
            "completed_at": ended if status == "completed" else None,
            "failed_at": ended if status == "failed" else None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": ended if status == "cancelled" else None,
            "request_counts": {
                "total": batch.total + invalid,
                "completed": counts.completed,
                "failed": counts.failed + invalid,
            },
            "metadata": described.get("metadata"),
        }

    def _files_of(self, batch: Batch) -> BatchFiles:
        """The files the ended batch's outcomes were written to as it ended. A batch that ended
        before its files were written so (they were written on the first read that saw it
        ended) has those a read wrote, if one did."""
        if not batch.status.is_terminal or batch.status is BatchStatus.FAILED:
            return BatchFiles()
        if batch.files is not None:
            return batch.files
        output_id, error_id = file_ids(batch)
        return BatchFiles(
            output_file_id=output_id if self._batches.file(batch.tenant_id, output_id) else None,
            error_file_id=error_id if self._batches.file(batch.tenant_id, error_id) else None,
        )


def _errors_of(batch: Batch) -> dict[str, Any] | None:
    """Why a batch failed, in OpenAI's errors object: its file's errors, and the lines it refused
    (a sample, by line number; every one is in GET /batches/{id}/refused)."""
    if batch.input is None or batch.status is not BatchStatus.FAILED:
        return None
    data: list[dict[str, Any]] = [
        {"code": "invalid_file", "message": error, "param": "input_file_id", "line": None}
        for error in batch.input.errors or ()
    ]
    data += [
        {"code": "invalid_request", "message": refused.error, "param": None, "line": refused.line}
        for refused in batch.input.refused_sample
    ]
    return {"object": "list", "data": data}
