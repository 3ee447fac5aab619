"""OpenAI's Batch API as `BatchJobs` (llm/batch_jobs.py): a job is a JSONL file of Chat
Completions requests (`POST /files`, purpose batch) and a batch over it (`POST /batches`, 24 h);
its results are the output file (answers) and the error file (requests that failed or expired).

Each line's body is built as OpenAIChat builds a call's (`chat_body`) and each answer read as it
reads one (`read_chat_reply`), so a request means the same sent either way. A job's files and
batch live in one account: the pool's first key makes and reads every job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.llm import http_error_code, is_transient_status
from llmtasks.llm.batch_jobs import OPENAI_BATCH_LIMITS, BatchLimits, JobResult, JobState, JobStatus
from llmtasks.llm.keys import LlmEndpoint, endpoints_from_settings
from llmtasks.llm.openai import chat_body, http_error, read_chat_reply, transport_errors

if TYPE_CHECKING:
    from llmtasks.settings import LlmSettings

Shape = TypeVar("Shape", bound=BaseModel)
ENDPOINT = "/v1/chat/completions"
TAG_KEY = "llmtasks_job"  # the metadata key a job's tag is sent under
FIND_PAGES = 10  # pages of 100 batches `find` looks through, newest first
STATES = {
    "validating": JobState.PENDING,
    "in_progress": JobState.PROCESSING,
    "finalizing": JobState.PROCESSING,
    "completed": JobState.COMPLETED,
    "failed": JobState.FAILED,
    "expired": JobState.EXPIRED,
    "cancelling": JobState.CANCELLING,
    "cancelled": JobState.CANCELLED,
}
# A request's error that says the batch, not the request, stopped it: retrying it may succeed.
ENDED_BY_BATCH = frozenset({"batch_expired", "batch_cancelled"})


class _Counts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class _BatchError(BaseModel):
    code: str | None = None
    message: str | None = None
    line: int | None = None


class _Errors(BaseModel):
    data: list[_BatchError] = []


class _Batch(BaseModel):
    """What is read of a Batch object (leniently: OpenAI adds fields)."""

    id: str
    status: str
    request_counts: _Counts | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: _Errors | None = None
    metadata: dict[str, str] | None = None


class _BatchPage(BaseModel):
    data: list[_Batch]
    has_more: bool = False
    last_id: str | None = None


class _File(BaseModel):
    id: str


class _LineResponse(BaseModel):
    status_code: int
    body: Any = None


class _LineError(BaseModel):
    code: str | None = None
    message: str | None = None


class _ResultLine(BaseModel):
    """A line of an output or error file."""

    custom_id: str
    response: _LineResponse | None = None
    error: _LineError | None = None


class OpenAIBatchJobs:
    """OpenAI's Batch API over one endpoint (base URL and key), synchronously."""

    def __init__(
        self,
        endpoint: LlmEndpoint,
        *,
        timeout_s: float = 60.0,
        client: httpx.Client | None = None,
        limits: BatchLimits = OPENAI_BATCH_LIMITS,
    ) -> None:
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self._client = client or httpx.Client(follow_redirects=False)
        self.limits = limits

    @classmethod
    def from_settings(cls, settings: LlmSettings) -> OpenAIBatchJobs:
        return cls(endpoints_from_settings(settings)[0], timeout_s=settings.llm_timeout_s)

    def encode(self, model: str, custom_id: str, request: LLMRequest) -> bytes:
        line = {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": chat_body(request, model)}
        return json.dumps(line, separators=(",", ":")).encode() + b"\n"

    def submit(self, model: str, lines: Sequence[tuple[str, LLMRequest]], *, tag: str) -> str:
        data = self._input_file(model, lines)
        upload = self._send(
            "POST",
            "/files",
            files={"file": ("batch.jsonl", data, "application/jsonl")},
            data={"purpose": "batch"},
        )
        file = _read(_File, upload)
        created = self._send(
            "POST",
            "/batches",
            json={
                "input_file_id": file.id,
                "endpoint": ENDPOINT,
                "completion_window": "24h",
                "metadata": {TAG_KEY: tag},
            },
        )
        return _read(_Batch, created).id

    def _input_file(self, model: str, lines: Sequence[tuple[str, LLMRequest]]) -> bytes:
        """The job's JSONL; ValueError when it breaks OpenAI's rules or `limits`."""
        if not lines or len(lines) < self.limits.min_records:
            raise ValueError(f"a job needs at least {max(1, self.limits.min_records)} requests")
        if len(lines) > self.limits.max_requests:
            raise ValueError(f"a job holds at most {self.limits.max_requests} requests, not {len(lines)}")
        if len({custom_id for custom_id, _ in lines}) < len(lines):
            raise ValueError("the custom_ids of a job must be unique")
        data = b"".join(self.encode(model, custom_id, request) for custom_id, request in lines)
        if len(data) > self.limits.max_bytes:
            raise ValueError(
                f"a job's input file holds at most {self.limits.max_bytes} bytes, not {len(data)}"
            )
        return data

    def find(self, tag: str) -> str | None:
        after: str | None = None
        for _ in range(FIND_PAGES):
            params: dict[str, str | int] = {"limit": 100} | ({"after": after} if after else {})
            page = _read(_BatchPage, self._send("GET", "/batches", params=params))
            for batch in page.data:
                if (batch.metadata or {}).get(TAG_KEY) == tag:
                    return batch.id
            if not page.has_more or not page.data:
                return None
            after = page.last_id or page.data[-1].id
        return None

    def look(self, job_id: str) -> JobStatus:
        batch = _read(_Batch, self._send("GET", f"/batches/{job_id}"))
        counts = batch.request_counts or _Counts()
        state = STATES.get(batch.status)
        if state is None:
            raise LLMError(
                f"OpenAI's batch has an unknown status: {batch.status[:40]}",
                code="llm_invalid_reply",
                transient=False,
            )
        return JobStatus(
            job_id=batch.id,
            state=state,
            provider_status=batch.status,
            total=counts.total,
            completed=counts.completed,
            failed=counts.failed,
            output_ref=batch.output_file_id,
            error_ref=batch.error_file_id,
            error=_why_failed(batch) if state is JobState.FAILED else None,
        )

    def results(self, job: JobStatus) -> Iterator[JobResult]:
        for file_id in (job.output_ref, job.error_ref):
            if file_id is not None:
                yield from self._file_results(file_id)

    def _file_results(self, file_id: str) -> Iterator[JobResult]:
        url = self._url(f"/files/{file_id}/content")
        with (
            transport_errors(self._timeout_s),
            self._client.stream("GET", url, headers=self._headers(), timeout=self._timeout_s) as response,
        ):
            if response.status_code >= 400:
                response.read()
                raise http_error(response)
            for text in response.iter_lines():
                if text.strip():
                    yield _result(text)

    def cancel(self, job_id: str) -> None:
        try:
            self._send("POST", f"/batches/{job_id}/cancel")
        except LLMError as refused:
            # A job that ended first cannot be cancelled: what was asked holds already.
            if refused.code not in ("llm_http_400", "llm_http_409") or not self.look(job_id).state.is_ended:
                raise

    def _url(self, path: str) -> str:
        return self._endpoint.base_url.rstrip("/") + path

    def _headers(self) -> dict[str, str]:
        key = self._endpoint.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with transport_errors(self._timeout_s):
            response = self._client.request(
                method, self._url(path), headers=self._headers(), timeout=self._timeout_s, **kwargs
            )
        if response.status_code >= 400:
            raise http_error(response)
        return response


def _read(shape: type[Shape], response: httpx.Response) -> Shape:
    try:
        return shape.model_validate_json(response.content)
    except ValidationError as exc:
        raise LLMError(
            f"OpenAI's answer is not a {shape.__name__.strip('_')} object.",
            code="llm_invalid_reply",
            transient=False,
        ) from exc


def _why_failed(batch: _Batch) -> str:
    errors = (batch.errors or _Errors()).data
    said = [
        (f"line {error.line}: " if error.line is not None else "") + f"{error.code}: {error.message}"
        for error in errors[:5]
    ]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return ("; ".join(said) + more) if said else "OpenAI failed the batch without saying why."


def _result(text: str) -> JobResult:
    """One line of an output or error file as the request's outcome."""
    try:
        line = _ResultLine.model_validate_json(text)
    except ValidationError as exc:
        raise LLMError(
            "A line of OpenAI's batch results is not a result.", code="llm_invalid_reply", transient=False
        ) from exc
    if line.error is not None or line.response is None:
        failure = line.error or _LineError()
        code = failure.code or "error"
        return JobResult(
            line.custom_id,
            LLMError(
                f"OpenAI's batch did not run the request: {failure.message or code}",
                code=f"llm_{code}" if code.startswith("batch_") else f"llm_batch_{code}",
                transient=code in ENDED_BY_BATCH,
            ),
        )
    status = line.response.status_code
    body = line.response.body
    if status != 200:
        said = body.get("error", {}).get("message") if isinstance(body, dict) else None
        return JobResult(
            line.custom_id,
            LLMError(
                f"The LLM answered {status}: {str(said or 'error')[:500]}",
                code=http_error_code(status),
                transient=is_transient_status(status),
            ),
        )
    try:
        model = body.get("model", "") if isinstance(body, dict) else ""
        return JobResult(line.custom_id, read_chat_reply(body if isinstance(body, dict) else {}, model))
    except LLMError as unreadable:
        return JobResult(line.custom_id, unreadable)
