"""The mock's Batch API, as OpenAI serves it: `POST /v1/batches`, `GET /v1/batches/{id}`,
`GET /v1/batches` (newest first, `after` and `limit`), `POST /v1/batches/{id}/cancel`.

A batch runs on the mock's clock, `batch_delay_s` from create to end: `validating` (its input file
checked as OpenAI checks it, batch_input.py; a bad file fails the batch with OpenAI's error codes
and line numbers), `in_progress` (its lines answered as the chat or Responses endpoint answers
them, spread over the time, `request_counts` moving), `finalizing`, then `completed` with its
output file (answered lines) and error file (failed ones). `rate_batch_fail` or `[mock:batch-fail]`
fails a line with a 500. Past `batch_expire_s` it `expired`: the lines not run go to the error file
as `batch_expired`, as OpenAI writes them. A cancel is `cancelling`, then `cancelled` with the
lines run so far; those not run are in neither file, as with OpenAI. The state is advanced by a
ticker task and by every read. When a batch ends and `webhook_url` is set, OpenAI's
`batch.<status>` event is sent, signed as background.py signs the Responses events.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmtasks_local.mock_llm.background import send_event
from llmtasks_local.mock_llm.batch_input import read_input
from llmtasks_local.mock_llm.files_api import FilesAPI, StoredFile
from llmtasks_local.mock_llm.request import ChatCall, OpenAIError, error, read_call
from llmtasks_local.mock_llm.responses import read_response_call, response_object
from llmtasks_local.mock_llm.responses_api import Mock

ENDPOINTS = ("/v1/chat/completions", "/v1/responses")
PHASE_MAX_S = 0.5  # the longest validating, finalizing and cancelling take (a tenth of the delay)
TICK_S = 0.05
BATCH_ENTRIES = 10_000
EXPIRED = "This request could not be executed before the completion window expired."
ENDED = ("completed", "failed", "expired", "cancelled")


@dataclass
class Job:
    """One batch: its request, its lines once validated, and what has run."""

    id: str
    endpoint: str
    input_file_id: str
    data: bytes  # the input file's bytes as the create found them (until validated)
    metadata: dict[str, str] | None
    created_at: int
    started: float = field(default_factory=time.monotonic)
    status: str = "validating"
    at: dict[str, int] = field(default_factory=dict)  # in_progress_at, finalizing_at, ... when reached
    lines: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (custom_id, body)
    model: str | None = None
    total: int = 0  # lines, once validated
    run: int = 0  # lines run so far (answered or failed)
    completed: int = 0
    failed: int = 0
    output: list[bytes] = field(default_factory=list)
    errors_out: list[bytes] = field(default_factory=list)
    errors: list[dict[str, Any]] | None = None  # why validation failed
    output_file_id: str | None = None
    error_file_id: str | None = None
    cancel_at: float | None = None
    usage: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("input", "cached", "output", "reasoning"), 0)
    )


class BatchesAPI:
    """The batches by id, their clock and routes."""

    def __init__(self, mock: Mock, files: FilesAPI) -> None:
        self.mock = mock
        self.files = files
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    def routes(self) -> list[Route]:
        return [
            Route("/v1/batches", self.create, methods=["POST"]),
            Route("/v1/batches", self.list, methods=["GET"]),
            Route("/v1/batches/{batch_id}", self.retrieve, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
        ]

    # --- routes ---

    async def create(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        try:
            stored = self._input_file(body)
        except OpenAIError as refused:
            return JSONResponse(refused.body, 400)
        job = Job(
            id=f"batch_mock{uuid.uuid4().hex}",
            endpoint=body["endpoint"],
            input_file_id=stored.id,
            data=stored.data,
            metadata=body.get("metadata"),
            created_at=int(time.time()),
        )
        self._jobs[job.id] = job
        while len(self._jobs) > BATCH_ENTRIES:
            self._jobs.popitem(last=False)
        with self.mock.lock:
            self.mock.stats.batches_created += 1
        self._spawn(self._tick(job))
        return JSONResponse(self._object(job))

    def _input_file(self, body: Any) -> StoredFile:
        """The input file of a create's body, checked as OpenAI checks the create."""
        if not isinstance(body, dict):
            raise OpenAIError("We could not parse the JSON body of your request.")
        for name in ("input_file_id", "endpoint", "completion_window"):
            if not isinstance(body.get(name), str):
                raise OpenAIError(f"Missing required parameter: '{name}'.", param=name)
        if body["completion_window"] != "24h":
            raise OpenAIError(
                "Invalid value for 'completion_window': only '24h' is supported.", param="completion_window"
            )
        if body["endpoint"] not in ENDPOINTS:
            raise OpenAIError(
                f"The mock serves batches of {' and '.join(ENDPOINTS)}, not {body['endpoint']}.",
                param="endpoint",
            )
        if body.get("metadata") is not None and not _valid_metadata(body["metadata"]):
            raise OpenAIError(
                "Invalid 'metadata': at most 16 string pairs, keys of 64 and values of 512 characters.",
                param="metadata",
            )
        stored = self.files.get(body["input_file_id"])
        if stored is None:
            raise OpenAIError(f"No such File object: {body['input_file_id']}", param="input_file_id")
        if stored.purpose != "batch":
            raise OpenAIError("The input file must be uploaded with purpose 'batch'.", param="input_file_id")
        return stored

    async def retrieve(self, request: Request) -> Response:
        job = self._jobs.get(request.path_params["batch_id"])
        if job is None:
            return _no_batch(request.path_params["batch_id"])
        with self.mock.lock:
            self.mock.stats.batch_polls += 1
        self._advance(job)
        return JSONResponse(self._object(job))

    async def list(self, request: Request) -> Response:
        try:
            limit = int(request.query_params.get("limit", "20"))
        except ValueError:
            return error(400, "Invalid 'limit': an integer is expected.", param="limit")
        if not 1 <= limit <= 100:
            return error(400, "Invalid 'limit': it must be between 1 and 100.", param="limit")
        ids = list(reversed(self._jobs))
        after = request.query_params.get("after")
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        page = [self._jobs[job_id] for job_id in ids[:limit]]
        for job in page:
            self._advance(job)
        data = [self._object(job) for job in page]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(ids) > limit,
            }
        )

    async def cancel(self, request: Request) -> Response:
        job = self._jobs.get(request.path_params["batch_id"])
        if job is None:
            return _no_batch(request.path_params["batch_id"])
        self._advance(job)
        if job.status in ("cancelling", "cancelled"):
            return JSONResponse(self._object(job))
        if job.status in ENDED:
            return error(409, f"Cannot cancel a batch with status '{job.status}'.", param="batch_id")
        job.status, job.cancel_at = "cancelling", time.monotonic()
        job.at["cancelling_at"] = int(time.time())
        return JSONResponse(self._object(job))

    # --- the clock ---

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tick(self, job: Job) -> None:
        while job.status not in ENDED:
            await asyncio.sleep(TICK_S)
            self._advance(job)

    def _advance(self, job: Job) -> None:
        """Brings the batch up to now: validation, the lines due, its end."""
        config = self.mock.config
        now = time.monotonic()
        delay = config.batch_delay_s
        phase = min(PHASE_MAX_S, delay / 10)
        if job.status in ENDED:
            return
        if job.status == "cancelling":
            assert job.cancel_at is not None
            if now - job.cancel_at >= phase:
                self._end(job, "cancelled")
            return
        expire_at = config.batch_expire_s
        if job.status == "validating" and now - job.started >= min(phase, expire_at or phase):
            self._validate(job)
            if job.status == "failed":
                return
        if job.status == "in_progress":
            elapsed = now - job.started if expire_at is None else min(now - job.started, expire_at)
            running = max(delay - 2 * phase, 0.0)
            share = 1.0 if running == 0 else (elapsed - phase) / running
            due = min(len(job.lines), max(0, int(share * len(job.lines))))
            while job.run < due:
                self._run(job, *job.lines[job.run])
            if job.run == len(job.lines):
                job.status = "finalizing"
                job.at["finalizing_at"] = int(time.time())
        if job.status == "finalizing" and now - job.started >= delay:
            self._end(job, "completed")
        elif expire_at is not None and now - job.started >= expire_at and job.status == "in_progress":
            for custom_id, _ in job.lines[job.run :]:
                job.errors_out.append(_line(custom_id, None, {"code": "batch_expired", "message": EXPIRED}))
                job.failed += 1
            self._end(job, "expired")

    def _validate(self, job: Job) -> None:
        """The input file read as OpenAI reads it: its lines, or the batch failed with why."""
        read = read_input(job.data, job.endpoint, max_requests=self.mock.config.batch_max_requests)
        job.model, job.data = read.model, b""
        if read.errors:
            job.errors = read.errors
            self._end(job, "failed")
            return
        job.lines, job.total = read.lines, len(read.lines)
        job.status = "in_progress"
        job.at["in_progress_at"] = int(time.time())

    def _run(self, job: Job, custom_id: str, body: dict[str, Any]) -> None:
        """One line answered as its endpoint answers it, or failed."""
        job.run += 1
        try:
            call: ChatCall = (
                read_response_call(body)[0] if job.endpoint == "/v1/responses" else read_call(body)
            )
        except OpenAIError as refused:
            self._failed(job, custom_id, 400, refused.body)
            return
        self.mock.take(call)
        if call.marked("[mock:batch-fail]") or self.mock.draw() < self.mock.config.rate_batch_fail:
            said = {
                "message": "The server had an error processing your request (mock).",
                "type": "server_error",
            }
            self._failed(job, custom_id, 500, {"error": {**said, "param": None, "code": None}})
            return
        answer = self.mock.completion(call)
        usage = answer["usage"]
        job.usage["input"] += usage["prompt_tokens"]
        job.usage["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
        job.usage["output"] += usage["completion_tokens"]
        job.usage["reasoning"] += usage["completion_tokens_details"]["reasoning_tokens"]
        if job.endpoint == "/v1/responses":
            answer = response_object(
                call,
                answer,
                response_id=f"resp_mock{uuid.uuid4().hex}",
                status="completed",
                created_at=int(time.time()),
            )
        job.output.append(
            _line(custom_id, {"status_code": 200, "request_id": uuid.uuid4().hex, "body": answer}, None)
        )
        job.completed += 1
        with self.mock.lock:
            self.mock.stats.batch_lines_run += 1

    def _failed(self, job: Job, custom_id: str, status: int, body: dict[str, Any]) -> None:
        job.errors_out.append(
            _line(custom_id, {"status_code": status, "request_id": uuid.uuid4().hex, "body": body}, None)
        )
        job.failed += 1
        with self.mock.lock:
            self.mock.stats.batch_lines_run += 1
            self.mock.stats.batch_lines_failed += 1

    def _end(self, job: Job, status: str) -> None:
        """The batch's end: its files written, counted, announced."""
        job.status = status
        job.at[f"{status}_at"] = int(time.time())
        if job.output:
            job.output_file_id = self.files.add(
                f"{job.id}_output.jsonl", "batch_output", b"".join(job.output)
            ).id
        if job.errors_out:
            job.error_file_id = self.files.add(
                f"{job.id}_error.jsonl", "batch_output", b"".join(job.errors_out)
            ).id
        job.output, job.errors_out, job.lines = [], [], []  # kept in its files now
        with self.mock.lock:
            ended = self.mock.stats.batches_ended
            ended[status] = ended.get(status, 0) + 1

        def counted(delivered: bool) -> None:
            with self.mock.lock:
                if delivered:
                    self.mock.stats.webhooks_sent += 1
                else:
                    self.mock.stats.webhook_failures += 1

        self._spawn(send_event(self.mock.config, f"batch.{status}", job.id, counted))

    def _object(self, job: Job) -> dict[str, Any]:
        """The Batch object as it stands."""
        usage = job.usage
        return {
            "id": job.id,
            "object": "batch",
            "endpoint": job.endpoint,
            "model": job.model,
            "errors": None if job.errors is None else {"object": "list", "data": job.errors},
            "input_file_id": job.input_file_id,
            "completion_window": "24h",
            "status": job.status,
            "output_file_id": job.output_file_id,
            "error_file_id": job.error_file_id,
            "created_at": job.created_at,
            "expires_at": job.created_at + 24 * 3600,
            **{
                name: job.at.get(name)
                for name in (
                    *("in_progress_at", "finalizing_at", "completed_at", "failed_at"),
                    *("expired_at", "cancelling_at", "cancelled_at"),
                )
            },
            "request_counts": {
                "total": job.total,
                "completed": job.completed,
                "failed": job.failed,
            },
            "usage": {
                "input_tokens": usage["input"],
                "input_tokens_details": {"cached_tokens": usage["cached"]},
                "output_tokens": usage["output"],
                "output_tokens_details": {"reasoning_tokens": usage["reasoning"]},
                "total_tokens": usage["input"] + usage["output"],
            },
            "metadata": job.metadata,
        }


def _line(custom_id: str, response: dict[str, Any] | None, failure: dict[str, Any] | None) -> bytes:
    """A line of an output or error file, as OpenAI writes them."""
    line = {
        "id": f"batch_req_mock{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": response,
        "error": failure,
    }
    return json.dumps(line).encode() + b"\n"


def _valid_metadata(metadata: Any) -> bool:
    return (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(
            isinstance(key, str) and len(key) <= 64 and isinstance(value, str) and len(value) <= 512
            for key, value in metadata.items()
        )
    )


def _no_batch(batch_id: str) -> JSONResponse:
    return error(404, f"No batch found with id '{batch_id}'.", param="batch_id")
