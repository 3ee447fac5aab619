"""OpenAI's Batch API served by llmtasks' batches: a JSON Lines file uploaded (`/v1/files`), a
batch made of it (`/v1/batches`), polled, and its output and error files downloaded, in OpenAI's
formats, so that code written with the `openai` SDK runs unchanged.

An OpenAI batch is a native batch (`batch_<id>`): its valid lines are the batch's items, with
their custom_id; a line that cannot be served is reported in the error file and does not fail
the batch. Once every request has ended the batch is `finalizing` while BatchFunction writes
its output and error files (OpenAIBatchFiles); it ends, `completed` or `cancelled`, in the write
that records them, so whoever learns it ended (a read, its webhook) finds them.
"""

from __future__ import annotations

import email.parser
import email.policy
import functools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, get_args

from pydantic import ValidationError

from llmtasks.api.openai_requests import (
    CompleteUpload,
    CreateBatch,
    CreateResponse,
    CreateUpload,
    Endpoint,
    InputMessage,
)
from llmtasks.domain.batch_input import LineParser, first_error
from llmtasks.domain.batches import (
    Batch,
    BatchFiles,
    BatchItem,
    BatchResult,
    BatchStatus,
    FileUpload,
    StoredFile,
    SubmitBatchRequest,
)
from llmtasks.domain.caller import Caller
from llmtasks.domain.errors import ApiError, InvalidInput
from llmtasks.domain.errors import FileNotFound as NoSuchFile
from llmtasks.domain.events import BATCH_ID_PREFIX, response_id
from llmtasks.domain.models import TaskStatus
from llmtasks.services.batch_outcomes import BatchOutcomes
from llmtasks.services.batches import BatchService

ENDPOINTS: tuple[str, ...] = get_args(Endpoint)
MAX_FILE_BYTES = 5 * 1024 * 1024  # a Lambda request body holds 6 MB
RESULTS_PAGE = 1000
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


def _line_item(line: Any, endpoint: str) -> BatchItem:
    """One input line as a batch item; ValueError says why it cannot be served."""
    if not isinstance(line, dict):
        raise ValueError("a line must be a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise ValueError("custom_id is missing")
    if line.get("method", "POST") != "POST":
        raise ValueError("method must be POST")
    if line.get("url") != endpoint:
        raise ValueError(f"url must be the batch's endpoint, {endpoint}")
    body = line.get("body")
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    try:
        if endpoint == "/v1/responses":
            if "webhook_url" in body:  # a batch has one webhook, not one a line
                raise ValueError("unsupported parameter 'webhook_url'")
            asked = CreateResponse.model_validate({**body, "background": True}).task_request()
            return BatchItem(custom_id=custom_id, **asked.model_dump(exclude_none=True))
        return _chat_item(custom_id, body)
    except (ValidationError, InvalidInput) as invalid:
        raise ValueError(
            str(invalid).splitlines()[0] if isinstance(invalid, InvalidInput) else first_error(invalid)
        ) from invalid


def line_parser(endpoint: str) -> LineParser:
    """How a batch's input file of OpenAI request lines for `endpoint` is read (BatchFunction)."""
    return functools.partial(_line_item, endpoint=endpoint)


def _chat_item(custom_id: str, body: dict[str, Any]) -> BatchItem:
    served = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature"}
    unsupported = sorted(set(body) - served)
    if unsupported:
        raise ValueError(f"unsupported parameter '{unsupported[0]}'")
    messages = [InputMessage.model_validate(m).chat() for m in body.get("messages") or []]
    return BatchItem(
        custom_id=custom_id,
        messages=messages or None,
        model=body.get("model"),
        max_tokens=body.get("max_completion_tokens", body.get("max_tokens")),
        temperature=body.get("temperature"),
    )


class OpenAIBatches:
    """The Batch API for one request: files in the results bucket, batches as native batches."""

    def __init__(self, batches: BatchService, *, clock: Any = time.time) -> None:
        self._batches = batches
        self._clock = clock

    # --- files ---

    def upload(self, tenant_id: str, content_type: str, body: bytes) -> dict[str, Any]:
        fields = multipart_fields(content_type, body)
        purpose = fields.get("purpose", (None, b""))[1].decode(errors="replace")
        if purpose != "batch":
            raise InvalidInput(
                "llmtasks keeps files for batches only: purpose must be 'batch'", field="purpose"
            )
        filename, data = fields.get("file", (None, b""))
        if not data:
            raise InvalidInput("the 'file' field is missing or empty", field="file")
        if len(data) > MAX_FILE_BYTES:
            raise InvalidInput(f"a file holds at most {MAX_FILE_BYTES} bytes here", field="file")
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
            tenant_id, size=body.bytes, filename=body.filename, purpose=body.purpose
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
                "completed": batch.completed,
                "failed": batch.failed + invalid,
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
        output_id, error_id = _file_ids(batch)
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


class OpenAIBatchFiles:
    """An ended batch's outcomes in OpenAI's output and error files, written by BatchFunction
    before the batch ends (BatchEnds), a page of results at a time (neither file is ever whole
    in memory): its ids derive from the batch's, and a retried batch's end has files of its own
    (its items' latest outcomes)."""

    def __init__(self, outcomes: BatchOutcomes, *, clock: Any = time.time) -> None:
        self._outcomes = outcomes
        self._clock = clock

    def write(self, batch: Batch) -> BatchFiles:
        tenant = batch.tenant_id
        output_id, error_id = _file_ids(batch)
        endpoint = (batch.metadata or {})["openai"]["endpoint"]
        ended_at = int(self._clock())
        outputs = self._outcomes.open_file(tenant, output_id, filename="output.jsonl", purpose="batch_output")
        errors = self._outcomes.open_file(tenant, error_id, filename="errors.jsonl", purpose="batch_output")
        try:
            for line in self._refused_lines(batch):
                errors.write(line)
            for row in self._outcomes.every(batch, page_size=RESULTS_PAGE):
                if row.status is TaskStatus.COMPLETED:
                    outputs.write(_json_line(_output_line(row, endpoint, ended_at)))
                    continue
                code = (
                    "batch_cancelled"
                    if row.status is TaskStatus.CANCELLED
                    else (row.error_code or "server_error")
                )
                errors.write(
                    _json_line(_error_line(row.custom_id, code, row.error or "The request was not run."))
                )
            has_errors = errors.size > 0
            if has_errors:
                errors.close()
            else:
                errors.abort()
            outputs.close()
        except BaseException:
            outputs.abort()
            errors.abort()
            raise
        return BatchFiles(output_file_id=output_id, error_file_id=error_id if has_errors else None)

    def _refused_lines(self, batch: Batch) -> Iterator[bytes]:
        """The input's lines that were not served, as error lines: read from the batch's refused
        lines (by line number)."""
        if batch.input is None or not batch.input.refused:
            return
        for refused in self._outcomes.refused(batch):
            yield _json_line(
                _error_line(refused.custom_id, "invalid_request", f"line {refused.line}: {refused.error}")
            )


def _file_ids(batch: Batch) -> tuple[str, str]:
    """The ids of the batch's output and error files, derived from its id: a retried batch's end
    has files of its own."""
    ending = f"-retry{batch.retries}" if batch.retries else ""
    return f"file-{batch.batch_id}-output{ending}", f"file-{batch.batch_id}-errors{ending}"


def _json_line(line: dict[str, Any]) -> bytes:
    return json.dumps(line).encode() + b"\n"


def _error_line(custom_id: Any, code: str, message: str) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def _output_line(row: BatchResult, endpoint: str, ended_at: int) -> dict[str, Any]:
    usage = row.usage
    if endpoint == "/v1/responses":
        body: dict[str, Any] = {
            "id": response_id(row.task_id),
            "object": "response",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": f"msg_{row.task_id}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": row.result or "", "annotations": []}],
                }
            ],
            "usage": usage
            and {
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            },
        }
    else:
        body = {
            "id": f"chatcmpl-{row.task_id}",
            "object": "chat.completion",
            "created": ended_at,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": row.result or ""},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage and usage.model_dump(),
        }
    return {
        "id": f"batch_req_{row.task_id}",
        "custom_id": row.custom_id,
        "response": {"status_code": 200, "request_id": row.task_id, "body": body},
        "error": None,
    }
