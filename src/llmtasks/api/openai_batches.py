"""OpenAI's Batch API served by llmtasks' batches: a JSON Lines file uploaded (`/v1/files`), a
batch made of it (`/v1/batches`), polled, and its output and error files downloaded, in OpenAI's
formats, so that code written with the `openai` SDK runs unchanged.

An OpenAI batch is a native batch (`batch_<id>`): its valid lines are the batch's items, with
their custom_id; a line that cannot be served is reported in the error file and does not fail
the batch. The output and error files are written once the batch has ended, on the first read
that sees it ended, with ids derived from the batch's, so every later read finds the same ones.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import time
import uuid
from typing import Any, get_args

from pydantic import ValidationError

from llmtasks.api.openai_requests import CreateBatch, CreateResponse, Endpoint, InputMessage
from llmtasks.domain.batches import Batch, BatchItem, BatchResult, BatchStatus, StoredFile, SubmitBatchRequest
from llmtasks.domain.caller import Caller
from llmtasks.domain.errors import ApiError, InvalidInput
from llmtasks.domain.events import BATCH_ID_PREFIX, response_id
from llmtasks.domain.models import TaskStatus
from llmtasks.services.batches import BatchService

ENDPOINTS: tuple[str, ...] = get_args(Endpoint)
MAX_FILE_BYTES = 5 * 1024 * 1024  # a Lambda request body holds 6 MB
RESULTS_PAGE = 1000
_STATUSES = {
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


def _line_item(line: dict[str, Any], endpoint: str) -> BatchItem:
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
            str(invalid).splitlines()[0] if isinstance(invalid, InvalidInput) else _first_error(invalid)
        ) from invalid


def _first_error(invalid: ValidationError) -> str:
    first = invalid.errors()[0]
    field = ".".join(str(part) for part in first.get("loc", ()))
    if first.get("type") == "extra_forbidden":
        return f"unsupported parameter '{field}'"
    return f"invalid '{field}': {first.get('msg')}"


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

    def content(self, tenant_id: str, file_id: str) -> bytes:
        self._file(tenant_id, file_id)
        return self._batches.file_content(tenant_id, file_id)

    # --- batches ---

    def create(self, caller: Caller, body: CreateBatch, *, idempotency_key: str | None) -> dict[str, Any]:
        tenant_id = caller.tenant_id
        endpoint, input_file_id = body.endpoint, body.input_file_id
        if self._batches.file(tenant_id, input_file_id) is None:
            raise InvalidInput(f"No file found with id '{input_file_id[:80]}'.", field="input_file_id")
        items, invalid = self._read_lines(self._batches.file_content(tenant_id, input_file_id), endpoint)
        if not items:
            raise InvalidInput(
                "no line of the input file can be served; see each line's format", field="input_file_id"
            )
        described = {
            "openai": {
                "endpoint": endpoint,
                "input_file_id": input_file_id,
                "metadata": body.metadata,
                "invalid": len(invalid),
            }
        }
        webhook_url = body.webhook_url
        try:
            request = SubmitBatchRequest(
                items=items,
                metadata=described,
                webhook_url=webhook_url,
                webhook_format="openai" if webhook_url else None,
            )
        except ValidationError as refused:
            raise InvalidInput(_first_error(refused), field=str(refused.errors()[0]["loc"][0])) from None
        submission = self._batches.submit(tenant_id, request, idempotency_key=idempotency_key, caller=caller)
        batch = submission.batch
        if invalid and not submission.replayed:
            lines = b"".join(json.dumps(line).encode() + b"\n" for line in invalid)
            self._batches.put_file(
                tenant_id,
                _file_id(batch.batch_id, "invalid"),
                lines,
                filename="invalid.jsonl",
                purpose="batch_output",
            )
        return self._batch_object(batch)

    @staticmethod
    def _read_lines(data: bytes, endpoint: str) -> tuple[list[BatchItem], list[dict[str, Any]]]:
        items: list[BatchItem] = []
        invalid: list[dict[str, Any]] = []
        seen: set[str] = set()
        for number, raw in enumerate(data.splitlines(), start=1):
            if not raw.strip():
                continue
            line: Any = None
            try:
                try:
                    line = json.loads(raw)
                except ValueError:
                    raise ValueError("not a JSON object") from None
                item = _line_item(line, endpoint)
                if item.custom_id in seen:
                    raise ValueError(f"custom_id '{item.custom_id}' is used twice")
                seen.add(str(item.custom_id))
                items.append(item)
            except ValueError as why:
                custom_id = line.get("custom_id") if isinstance(line, dict) else None
                invalid.append(_error_line(custom_id, "invalid_request", f"line {number}: {why}"))
        return items, invalid

    def retrieve(self, tenant_id: str, openai_id: str) -> dict[str, Any]:
        return self._batch_object(self._batch(tenant_id, openai_id), finalize=True)

    def cancel(self, tenant_id: str, openai_id: str) -> dict[str, Any]:
        batch = self._batch(tenant_id, openai_id)
        if not batch.status.is_terminal:
            batch = self._batches.cancel(tenant_id, batch.batch_id)
        return self._batch_object(batch, finalize=True)

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

    def _batch_object(self, batch: Batch, *, finalize: bool = False) -> dict[str, Any]:
        described = (batch.metadata or {})["openai"]
        invalid = int(described.get("invalid", 0))
        output_file_id = error_file_id = None
        if finalize and batch.status.is_terminal:
            output_file_id, error_file_id = self._files_of(batch, invalid)
        created = int(batch.created_at)
        ended = int(batch.completed_at) if batch.completed_at else None
        status = _STATUSES[batch.status]
        return {
            "id": BATCH_ID_PREFIX + batch.batch_id,
            "object": "batch",
            "endpoint": described["endpoint"],
            "errors": None,
            "input_file_id": described["input_file_id"],
            "completion_window": "24h",
            "status": status,
            "output_file_id": output_file_id,
            "error_file_id": error_file_id,
            "created_at": created,
            "in_progress_at": created,
            "expires_at": created + 24 * 3600,
            "finalizing_at": ended if status == "completed" else None,
            "completed_at": ended if status == "completed" else None,
            "failed_at": None,
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

    def _files_of(self, batch: Batch, invalid: int) -> tuple[str | None, str | None]:
        """The ended batch's output and error files, written on the first read that needs them;
        a retried batch's end has files of its own (its items' latest outcomes)."""
        tenant = batch.tenant_id
        ending = f"-retry{batch.retries}" if batch.retries else ""
        output_id = _file_id(batch.batch_id, "output" + ending)
        error_id = _file_id(batch.batch_id, "errors" + ending)
        if self._batches.file(tenant, output_id) is None:
            endpoint = (batch.metadata or {})["openai"]["endpoint"]
            outputs: list[bytes] = []
            errors: list[bytes] = []
            if invalid:
                errors.append(self._batches.file_content(tenant, _file_id(batch.batch_id, "invalid")))
            for row in self._rows(batch):
                if row.status is TaskStatus.COMPLETED:
                    outputs.append(_json_line(_output_line(row, endpoint, batch)))
                else:
                    code = (
                        "batch_cancelled"
                        if row.status is TaskStatus.CANCELLED
                        else (row.error_code or "server_error")
                    )
                    errors.append(
                        _json_line(_error_line(row.custom_id, code, row.error or "The request was not run."))
                    )
            if errors:
                self._batches.put_file(
                    tenant, error_id, b"".join(errors), filename="errors.jsonl", purpose="batch_output"
                )
            # The output file last: its presence says both were written.
            self._batches.put_file(
                tenant, output_id, b"".join(outputs), filename="output.jsonl", purpose="batch_output"
            )
        has_errors = self._batches.file(tenant, error_id) is not None
        return output_id, error_id if has_errors else None

    def _rows(self, batch: Batch) -> list[BatchResult]:
        rows: list[BatchResult] = []
        cursor = None
        while True:
            page, cursor = self._batches.results(
                batch.tenant_id, batch.batch_id, limit=RESULTS_PAGE, cursor=cursor
            )
            rows += page
            if cursor is None:
                return rows


def _file_id(batch_id: str, kind: str) -> str:
    return f"file-{batch_id}-{kind}"


def _json_line(line: dict[str, Any]) -> bytes:
    return json.dumps(line).encode() + b"\n"


def _error_line(custom_id: Any, code: str, message: str) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def _output_line(row: BatchResult, endpoint: str, batch: Batch) -> dict[str, Any]:
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
            "created": int(batch.completed_at or batch.created_at),
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
