"""The client side of llmtasks: `Client` and `AsyncClient` for the HTTP API, and
`verify_webhook` for receivers. Runs anywhere: it needs httpx, pydantic and standardwebhooks,
and nothing of AWS or of the service.

Both clients have the same methods. Reads and submits survive connection errors and 5xx: reads
are retried with backoff, and `submit` sends an Idempotency-Key of its own, so a retried submit
never makes a second task. `wait` uses the server's long-poll and its Retry-After.

Long because both clients are here, method beside method, so that a change to one is made
beside the other; what they share (errors, retries, waiting, following) is above them.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import mimetypes
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from datetime import date
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, TypeVar, Unpack

import httpx
from pydantic import BaseModel
from standardwebhooks import Webhook, WebhookVerificationError

from llmtasks_client.models import (
    BatchEvent,
    BatchEventPage,
    BatchResult,
    BatchResults,
    BatchView,
    FileObject,
    OutputChunk,
    StepList,
    TaskList,
    TaskOutputPage,
    TaskStatus,
    TaskView,
    UsageReport,
    WebhookAttempt,
    WebhookAttemptList,
    WebhookEvent,
    WebhookReplay,
)
from llmtasks_client.parts import local_files, with_file_ids, with_text_parts
from llmtasks_client.structured import is_model_class, response_format_of
from llmtasks_client.task_options import TaskOptions

__all__ = [
    "AsyncClient",
    "BatchWaitTimeoutError",
    "Client",
    "ProblemError",
    "TaskFailedError",
    "WaitTimeoutError",
    "WebhookVerificationError",
    "verify_webhook",
]

DEFAULT_URL = "http://127.0.0.1:3000"
LONG_POLL_S = 20  # the server holds a status read up to 25 s
# Failed reads in a row (each after the request's own retries) that a stream reads on from.
STREAM_RECONNECTS = 8
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# A file up to this size is one POST /v1/files; a larger one goes in parts of it (/v1/uploads):
# a request through the gateway carries about 4.5 MB.
FILE_PART_BYTES = 4 * 1024 * 1024
# The tasks whose response_format was a model class that a client remembers, to parse their answers.
_REMEMBERED_FORMATS = 10_000
ResponseFormat = type[BaseModel] | Mapping[str, Any]


# API Gateway's own refusals come as {"message": ...}, not as problems: what each means here.
_GATEWAY_REFUSALS = {
    401: "no API key was sent (Authorization: Bearer lt_...)",
    403: "the API key is not valid, or was revoked",
}


class ProblemError(Exception):
    """The API answered with a problem (RFC 9457), or API Gateway refused the request itself
    (401: no key; 403: a key the authorizer denied); its fields are here."""

    def __init__(self, status: int, problem: Mapping[str, Any]) -> None:
        self.status = status
        self.type = str(problem.get("type", "about:blank"))
        self.title = str(problem.get("title", ""))
        self.detail = str(problem.get("detail", ""))
        if not self.title and "message" in problem:
            self.title = str(problem["message"])
            self.detail = _GATEWAY_REFUSALS.get(status, self.detail)
        self.errors = problem.get("errors")
        super().__init__(f"{status} {self.title}: {self.detail}")


class TaskFailedError(Exception):
    """`wait` saw the task end without a result (failed or cancelled)."""

    def __init__(self, task: TaskView) -> None:
        self.task = task
        self.error_code = task.error_code or task.status.value
        super().__init__(f"task {task.task_id} {task.status.value}: {task.error_code}: {task.error}")


class WaitTimeoutError(TimeoutError):
    def __init__(self, task: TaskView, timeout: float) -> None:
        self.task = task
        super().__init__(f"task {task.task_id} still {task.status.value} after {timeout:g} s")


class BatchWaitTimeoutError(TimeoutError):
    def __init__(self, batch: BatchView) -> None:
        self.batch = batch
        done = f"{batch.finished}/{batch.total} done"
        super().__init__(f"batch {batch.batch_id} still {batch.status.value} ({done})")


# A webhook's log keeps its newest 100 attempts: one page holds it whole.
_WHOLE_LOG = {"limit": 100}
# (Named here: inside the clients, `list` is their method.)
Attempts = list[WebhookAttempt]


def _usage_query(first: date | None, last: date | None, group_by: str) -> dict[str, str]:
    query = {"group_by": group_by}
    if first is not None:
        query["from"] = first.isoformat()
    if last is not None:
        query["to"] = last.isoformat()
    return query


def _attempts(page: Any) -> Attempts:
    return WebhookAttemptList.model_validate(page).data


def verify_webhook(body: bytes | str, headers: Mapping[str, str], secret: str) -> WebhookEvent:
    """The event of one delivery, once its Standard Webhooks signature checks out.

    `body` must be the exact bytes received (not re-serialised JSON); `headers` the request's
    headers, in any case; `secret` the `whsec_...` from `GET /webhooks/secret`. During a
    rotation's overlap a delivery carries a signature per secret, so the old and the new one
    both verify. Raises WebhookVerificationError for a bad signature, a missing header or a
    timestamp more than 5 minutes off (a replay).
    """
    Webhook(secret).verify(body, dict(headers))
    return WebhookEvent.model_validate_json(body)


def _retry_after_s(response: httpx.Response) -> float | None:
    """The reply's Retry-After in seconds (delta-seconds, as llmtasks sends it, or an HTTP date)."""
    value = response.headers.get("retry-after", "").strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class _Policy:
    """What both clients share: where, who, and when to try again."""

    def __init__(self, base_url: str | None, api_key: str | None, max_retries: int) -> None:
        self.base_url = (base_url or os.environ.get("LLMTASKS_API_URL") or DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get("LLMTASKS_API_KEY")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.max_retries = max_retries
        self._rng = random.Random()  # noqa: S311 - jitter, not crypto
        self._formats: dict[str, type[BaseModel]] = {}  # task id -> the model its answer fits

    def delay(self, attempt: int, response: httpx.Response | None = None, cap: float = 10.0) -> float:
        """Full jitter over 0.5 * 2**attempt (capped), never sooner than the server's Retry-After."""
        delay = self._rng.uniform(0, min(cap, 0.5 * 2**attempt))
        retry_after = _retry_after_s(response) if response is not None else None
        if retry_after is not None:
            delay = max(delay, min(cap * 6, retry_after))
        return delay

    def should_retry(self, attempt: int, response: httpx.Response | None) -> bool:
        """Connection errors (no response) and transient statuses, while attempts remain."""
        return attempt < self.max_retries and (response is None or response.status_code in _RETRY_STATUSES)

    @staticmethod
    def result(response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = {"title": response.reason_phrase, "detail": response.text[:500]}
            raise ProblemError(response.status_code, problem if isinstance(problem, dict) else {})
        return response.json()

    @staticmethod
    def task_body(
        prompt: str | None,
        messages: Sequence[Mapping[str, Any]] | None,
        response_format: ResponseFormat | None,
        options: Mapping[str, Any],
    ) -> dict[str, Any]:
        """A task's body: a model class as response_format made its json_schema format, the bare
        strings of a content list made text parts, None left out (LocalFiles still in it)."""
        given = {"prompt": prompt, "messages": messages, "response_format": response_format, **options}
        return _Policy.item({k: v for k, v in given.items() if v is not None})

    @staticmethod
    def item(body: Mapping[str, Any]) -> dict[str, Any]:
        """A task body or batch item with a model class as response_format made its json_schema
        format, and the bare strings of its messages' content lists made text parts."""
        made = dict(body)
        if made.get("response_format") is not None:
            made["response_format"] = response_format_of(made["response_format"])
        if isinstance(made.get("messages"), list):
            made["messages"] = with_text_parts(made["messages"])
        return made

    @staticmethod
    def batch_body(items: Sequence[Mapping[str, Any]] | str, options: Mapping[str, Any]) -> dict[str, Any]:
        """A batch's body: its items (made as `item` makes them), or the id of an uploaded file
        of them."""
        if isinstance(items, str):
            given: dict[str, Any] = {"input_file_id": items}
        else:
            given = {"items": [_Policy.item(item) for item in items]}
        return {**given, **{k: v for k, v in options.items() if v is not None}}

    @staticmethod
    def posted(body: dict[str, Any], idempotency_key: str | None) -> dict[str, Any]:
        """The keyword arguments of a submit's POST: its own Idempotency-Key unless one is given,
        so that every retry of it names the same task (or fans a batch out once)."""
        return {"json": body, "headers": {"Idempotency-Key": idempotency_key or str(uuid.uuid4())}}

    def remember(self, task_id: str, response_format: ResponseFormat | None) -> None:
        """Notes the model class a task's answer is parsed into (the newest tasks' only)."""
        if is_model_class(response_format):
            self._formats[task_id] = response_format
            if len(self._formats) > _REMEMBERED_FORMATS:
                del self._formats[next(iter(self._formats))]

    def typed(self, reply: Any) -> TaskView:
        """A task read, its `parsed` an instance of the model it was submitted with, if known."""
        task = TaskView.model_validate(reply)
        model = self._formats.get(task.task_id)
        if model is not None and task.parsed is not None:
            task.parsed = task.parse(model)
        return task

    @staticmethod
    def file_form(data: bytes, filename: str, media_type: str, purpose: str) -> dict[str, Any]:
        """POST /v1/files' multipart form, as OpenAI's files.create sends it."""
        return {"files": {"file": (filename, data, media_type)}, "data": {"purpose": purpose}}

    @staticmethod
    def upload_start(size: int, filename: str, media_type: str, purpose: str) -> dict[str, Any]:
        return {"json": {"bytes": size, "filename": filename, "mime_type": media_type, "purpose": purpose}}

    @staticmethod
    def part_form(chunk: bytes) -> dict[str, Any]:
        return {"files": {"data": ("part", chunk, "application/octet-stream")}}

    @staticmethod
    def upload_end(part_ids: Sequence[str], md5: str) -> dict[str, Any]:
        return {"json": {"part_ids": list(part_ids), "md5": md5}}

    @staticmethod
    def upload_request(
        http: httpx.Client | httpx.AsyncClient, url: str, content: Any, size: int
    ) -> httpx.Request:
        """The PUT of a batch's file to its presigned URL: the URL carries its own signature, so
        the request carries no Authorization header (S3 refuses two ways of signing)."""
        request = http.build_request("PUT", url, content=content, headers={"Content-Length": str(size)})
        del request.headers["Authorization"]
        return request

    @staticmethod
    def retry_request(statuses: Sequence[str], idempotency_key: str | None) -> dict[str, Any]:
        key = idempotency_key or str(uuid.uuid4())
        return {"json": {"statuses": list(statuses)}, "headers": {"Idempotency-Key": key}}

    @staticmethod
    def results_page(cursor: str | None, page_size: int) -> dict[str, Any]:
        return {"limit": page_size, **({"cursor": cursor} if cursor else {})}

    @staticmethod
    def listing(status: str | None, limit: int, cursor: str | None) -> dict[str, Any]:
        return {
            k: v for k, v in {"status": status, "limit": limit, "cursor": cursor}.items() if v is not None
        }


def tool_outputs_body(
    outputs: Mapping[str, str], approvals: Mapping[str, bool] | None = None
) -> dict[str, Any]:
    """`POST /tasks/{id}/tool_outputs`'s body: each call's id and its output, and each MCP
    approval request's id and whether it is approved."""
    body: dict[str, Any] = {
        "tool_outputs": [{"tool_call_id": call, "output": output} for call, output in outputs.items()]
    }
    if approvals:
        body["mcp_approvals"] = [
            {"approval_request_id": request, "approve": approve} for request, approve in approvals.items()
        ]
    return body


class _Waiting:
    """The decisions of one `wait`, so that each client only does the reads and the sleeps."""

    def __init__(self, policy: _Policy, timeout: float | None) -> None:
        self._policy = policy
        self._timeout = timeout
        self._give_up = None if timeout is None else time.monotonic() + timeout
        self._attempt = 0
        self._asked = 0.0

    def _left(self) -> float:
        return LONG_POLL_S if self._give_up is None else max(0.0, self._give_up - time.monotonic())

    def poll_s(self) -> float:
        """How long the next read may long-poll."""
        self._asked = time.monotonic()
        return min(LONG_POLL_S, self._left())

    def pause_s(self, task: TaskView) -> float | None:
        """None once `task` is completed; raises when it failed or time is up; else how long to
        pause before the next read (nothing when the server held the read, as a long-poll does)."""
        if task.status in (TaskStatus.COMPLETED, TaskStatus.REQUIRES_ACTION):
            return None
        if task.status.is_terminal:
            raise TaskFailedError(task)
        if self._give_up is not None and time.monotonic() >= self._give_up:
            raise WaitTimeoutError(task, self._timeout or 0)
        if time.monotonic() - self._asked >= 1:
            return 0.0
        self._attempt += 1
        return min(self._policy.delay(self._attempt - 1), self._left())


Page = TypeVar("Page", TaskOutputPage, BatchEventPage)


class _Following:
    """The decisions of one `stream`, so that each client only does the reads and the sleeps:
    where to read on from, and whether an error ends the stream or is read on from."""

    def __init__(self, policy: _Policy, after: int, timeout: float | None) -> None:
        self._policy = policy
        self.after = after
        self.timeout = timeout
        self._give_up = None if timeout is None else time.monotonic() + timeout
        self._failures = 0  # in a row: a page read resets it

    def params(self) -> dict[str, int]:
        left = LONG_POLL_S if self._give_up is None else self._give_up - time.monotonic()
        return {"after": self.after, "wait": max(0, min(LONG_POLL_S, math.ceil(left)))}

    def timed_out(self) -> bool:
        return self._give_up is not None and time.monotonic() >= self._give_up

    def page(self, reply: Any, model: type[Page]) -> Page:
        """The page read, where the next read goes on from."""
        page = model.model_validate(reply)
        self.after = page.after
        self._failures = 0
        return page

    def reconnect_s(self, error: Exception) -> float:
        """How long to wait before reading on after `error` (the request's own retries spent);
        raises it when it is no passing fault (a 4xx) or it came too often in a row."""
        if isinstance(error, ProblemError) and error.status < 500:
            raise error
        self._failures += 1
        if self._failures > STREAM_RECONNECTS:
            raise error
        return self._policy.delay(self._failures)

    @staticmethod
    def failed(page: TaskOutputPage) -> TaskFailedError:
        """The error a stream ends with when its task did not complete."""
        task = TaskView.model_validate(
            {
                "task_id": page.task_id,
                "status": page.status or TaskStatus.FAILED,
                "error": page.error,
                "error_code": page.error_code,
                "attempts": 0,
                "created_at": 0,
                "expires_at": 0,
            }
        )
        return TaskFailedError(task)


def _file_facts(
    file: str | os.PathLike[str] | bytes, filename: str | None, media_type: str | None
) -> tuple[str, str, int]:
    """An upload's filename, media type and size."""
    name = filename or ("file" if isinstance(file, bytes) else Path(file).name)
    media = media_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
    return name, media, len(file) if isinstance(file, bytes) else os.stat(file).st_size


def _parts_of(file: str | os.PathLike[str] | bytes) -> Iterator[bytes]:
    """A file's bytes in the Uploads API's parts (FILE_PART_BYTES each)."""
    if isinstance(file, bytes):
        yield from (file[at : at + FILE_PART_BYTES] for at in range(0, len(file), FILE_PART_BYTES))
        return
    with open(file, "rb") as data:
        while chunk := data.read(FILE_PART_BYTES):
            yield chunk


def _paused(page: TaskOutputPage) -> bool:
    """The page ends with a run's `requires_action` event: the run may be waiting for its client
    (or already resumed, its next chunks not written yet: the task says which)."""
    last = page.chunks[-1].event if page.chunks else None
    return last is not None and last.type == "requires_action"


async def _chunks_of(path: str | os.PathLike[str], size: int = 1024 * 1024) -> AsyncIterator[bytes]:
    """A file's bytes, read a megabyte at a time off the event loop."""
    data = await asyncio.to_thread(open, path, "rb")
    try:
        while chunk := await asyncio.to_thread(data.read, size):
            yield chunk
    finally:
        data.close()


class Client:
    """`Client(base_url, api_key)`; both default to LLMTASKS_API_URL and LLMTASKS_API_KEY."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._policy = _Policy(base_url, api_key, max_retries)
        self._http = httpx.Client(
            base_url=self._policy.base_url, headers=self._policy.headers, timeout=timeout, transport=transport
        )

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                response: httpx.Response | None = self._http.request(method, path, **kwargs)
            except httpx.TransportError:
                response = None
            if not self._policy.should_retry(attempt, response):
                if response is None:
                    raise httpx.ConnectError(f"{method} {path}: no answer after {attempt + 1} attempts")
                return self._policy.result(response)
            time.sleep(self._policy.delay(attempt, response))
            attempt += 1

    def submit(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        response_format: ResponseFormat | None = None,
        idempotency_key: str | None = None,
        **options: Unpack[TaskOptions],
    ) -> TaskView:
        """A new task (`202`) of `prompt` or `messages` (content parts: text, `image_part`,
        `file_part`; those too large to go inline are uploaded first) and the parameters of one
        Chat Completions call. `response_format` may be a pydantic model class: the task is asked
        for JSON that fits it, and `get`/`wait` give its `parsed` as an instance of it (pydantic's
        ValidationError if a constraint the schema cannot say refuses it). Retried under one
        Idempotency-Key, so never two; parts uploaded first are uploaded again by a second
        submit, so reuse a key only with parts that go inline or by `file_id`."""
        body = self._uploaded(self._policy.task_body(prompt, messages, response_format, options))
        accepted = self._request("POST", "/tasks", **self._policy.posted(body, idempotency_key))
        self._policy.remember(accepted["task_id"], response_format)
        return self.get(accepted["task_id"])

    def _uploaded(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body with its LocalFiles uploaded (purpose user_data) and named by their ids."""
        files = local_files(body)
        if not files:
            return body
        ids = {
            file: self.upload_file(file.source, filename=file.filename, media_type=file.media_type).id
            for file in files
        }
        return with_file_ids(body, ids)

    def upload_file(
        self,
        file: str | os.PathLike[str] | bytes,
        *,
        purpose: str = "user_data",
        filename: str | None = None,
        media_type: str | None = None,
    ) -> FileObject:
        """Uploads a file (a path, or its bytes), as OpenAI's `files.create` does: with purpose
        user_data, a content part names it by its id (`file_id`). One over FILE_PART_BYTES goes
        in parts (OpenAI's Uploads API)."""
        name, media, size = _file_facts(file, filename, media_type)
        if size <= FILE_PART_BYTES:
            data = file if isinstance(file, bytes) else Path(file).read_bytes()
            form = self._policy.file_form(data, name, media, purpose)
            return FileObject.model_validate(self._request("POST", "/v1/files", **form))
        upload = self._request("POST", "/v1/uploads", **self._policy.upload_start(size, name, media, purpose))
        digest = hashlib.md5(usedforsecurity=False)
        part_ids = []
        for chunk in _parts_of(file):
            digest.update(chunk)
            part = self._request("POST", f"/v1/uploads/{upload['id']}/parts", **self._policy.part_form(chunk))
            part_ids.append(str(part["id"]))
        end = self._policy.upload_end(part_ids, digest.hexdigest())
        return FileObject.model_validate(
            self._request("POST", f"/v1/uploads/{upload['id']}/complete", **end)["file"]
        )

    def get(self, task_id: str, *, wait: float = 0) -> TaskView:
        params = {"wait": int(wait)} if wait else None
        return self._policy.typed(self._request("GET", f"/tasks/{task_id}", params=params))

    def cancel(self, task_id: str) -> TaskView:
        return TaskView.model_validate(self._request("POST", f"/tasks/{task_id}/cancel"))

    def submit_tool_outputs(
        self, task_id: str, outputs: Mapping[str, str], *, approvals: Mapping[str, bool] | None = None
    ) -> TaskView:
        """Answers the calls a run in requires_action waits for (`outputs`: each call's id to
        its output; `approvals`: each MCP approval request's id to whether it is approved); the
        run goes on."""
        body = tool_outputs_body(outputs, approvals)
        return TaskView.model_validate(self._request("POST", f"/tasks/{task_id}/tool_outputs", json=body))

    def steps(self, task_id: str, *, limit: int = 50, cursor: str | None = None) -> StepList:
        """A page of a run's steps, in order."""
        params = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        return StepList.model_validate(self._request("GET", f"/tasks/{task_id}/steps", params=params))

    def list(self, *, status: str | None = None, limit: int = 20, cursor: str | None = None) -> TaskList:
        params = self._policy.listing(status, limit, cursor)
        return TaskList.model_validate(self._request("GET", "/tasks", params=params))

    def wait(self, task_id: str, *, timeout: float | None = None) -> TaskView:
        """The completed task, or a run that requires action (its `required_action` lists the
        calls to answer with `submit_tool_outputs`); raises TaskFailedError if it failed or was
        cancelled, WaitTimeoutError after `timeout` seconds."""
        waiting = _Waiting(self._policy, timeout)
        while True:
            task = self.get(task_id, wait=waiting.poll_s())
            pause = waiting.pause_s(task)
            if pause is None:
                return task
            time.sleep(pause)

    def output(self, task_id: str, *, after: int = 0, wait: float = 0) -> TaskOutputPage:
        """The chunks of the task's output after `after`; with `wait`, held up to that many
        seconds (25 at most) until there is one or the task ends."""
        params = {"after": after, "wait": int(wait)}
        return TaskOutputPage.model_validate(self._request("GET", f"/tasks/{task_id}/output", params=params))

    def _pages(self, path: str, model: type[Page], following: _Following) -> Iterator[Page]:
        """The pages of a followed read (a task's output, a batch's events), each read on from
        the last; after an error, read again from where it stood."""
        while True:
            try:
                reply = self._request("GET", path, params=following.params())
            except (httpx.HTTPError, ProblemError) as error:
                time.sleep(following.reconnect_s(error))
                continue
            yield following.page(reply, model)

    def stream(self, task_id: str, *, after: int = 0, timeout: float | None = None) -> Iterator[OutputChunk]:
        """Each chunk of the task's output after `after`, in order and once, as it is written,
        until the task ends; reads on from the last chunk after an error or a dropped
        connection. Returns when the task completed, or when a run stops for its client (after
        its `requires_action` event: answer with `submit_tool_outputs`, then stream on from that
        chunk); raises TaskFailedError if it failed or was cancelled, WaitTimeoutError after
        `timeout` seconds. A run's steps come as chunks with an `event` (StepEvent), in order
        among its text. A text chunk whose `attempt` differs from the text before starts it over."""
        following = _Following(self._policy, after, timeout)
        for page in self._pages(f"/tasks/{task_id}/output", TaskOutputPage, following):
            yield from page.chunks
            if page.final:
                if page.status is not TaskStatus.COMPLETED:
                    raise following.failed(page)
                return
            if _paused(page) and self.get(task_id).status is TaskStatus.REQUIRES_ACTION:
                return
            if following.timed_out():
                raise WaitTimeoutError(self.get(task_id), following.timeout or 0)

    def submit_batch(
        self, items: Sequence[Mapping[str, Any]] | str, *, idempotency_key: str | None = None, **options: Any
    ) -> BatchView:
        """A new batch (`202`) of task bodies, each with an optional `custom_id`, or of the
        lines of a file `upload_batch_file` sent (its file id); `options`: webhook_url,
        webhook_events, metadata, priority, mode ("provider": the provider's batch jobs). An
        item's response_format may be a model class and its parts LocalFiles, as `submit` takes
        them. Retried under one Idempotency-Key."""
        body = self._uploaded(self._policy.batch_body(items, options))
        accepted = self._request("POST", "/batches", **self._policy.posted(body, idempotency_key))
        return self.get_batch(accepted["batch_id"])

    def upload_batch_file(self, file: str | os.PathLike[str] | bytes) -> str:
        """Sends a JSON Lines file of batch items (a path, or its bytes; up to 256 MiB) straight
        to storage through a presigned URL, around the API's 6 MB request limit; its file id, for
        `submit_batch`. Its lines are checked once the batch is made (see BatchView.refused_lines)."""
        upload = self._request("POST", "/batches/uploads")
        if isinstance(file, bytes):
            sent = self._http.send(
                self._policy.upload_request(self._http, upload["upload_url"], file, len(file))
            )
        else:
            with open(file, "rb") as data:
                size = os.fstat(data.fileno()).st_size
                sent = self._http.send(
                    self._policy.upload_request(self._http, upload["upload_url"], data, size)
                )
        sent.raise_for_status()
        return str(upload["file_id"])

    def get_batch(self, batch_id: str) -> BatchView:
        return BatchView.model_validate(self._request("GET", f"/batches/{batch_id}"))

    def batch_events(self, batch_id: str, *, after: int = 0, wait: float = 0) -> BatchEventPage:
        """The batch's events after `after` (items whose status moved, the counts after them);
        with `wait`, held up to that many seconds (25 at most) until there is one or the batch
        ends."""
        params = {"after": after, "wait": int(wait)}
        return BatchEventPage.model_validate(
            self._request("GET", f"/batches/{batch_id}/events", params=params)
        )

    def follow_batch(
        self, batch_id: str, *, after: int = 0, timeout: float | None = None
    ) -> Iterator[BatchEvent]:
        """Each of the batch's events after `after`, in order and once, as it happens, until the
        batch ends; reads on from the last event after an error or a dropped connection. Raises
        BatchWaitTimeoutError after `timeout` seconds."""
        following = _Following(self._policy, after, timeout)
        for page in self._pages(f"/batches/{batch_id}/events", BatchEventPage, following):
            yield from page.events
            if page.final:
                return
            if following.timed_out():
                raise BatchWaitTimeoutError(self.get_batch(batch_id))

    def cancel_batch(self, batch_id: str) -> BatchView:
        return BatchView.model_validate(self._request("POST", f"/batches/{batch_id}/cancel"))

    def retry_batch(
        self, batch_id: str, *, statuses: Sequence[str] = ("failed",), idempotency_key: str | None = None
    ) -> BatchView:
        """Runs the ended batch's items of `statuses` (failed, cancelled) again, in the same batch:
        the same ids and custom_ids, each a new attempt. Retried under one Idempotency-Key, so a
        lost reply never retries twice. ProblemError 409 while it runs or when none match."""
        request = self._policy.retry_request(statuses, idempotency_key)
        return BatchView.model_validate(self._request("POST", f"/batches/{batch_id}/retry", **request))

    def usage(
        self, *, first: date | None = None, last: date | None = None, group_by: str = "day"
    ) -> UsageReport:
        """The tenant's billed LLM calls, tokens and cost from `first` to `last` (UTC days, both
        included; by default the 30 days to today), one row a day, model or API key."""
        return UsageReport.model_validate(
            self._request("GET", "/usage", params=_usage_query(first, last, group_by))
        )

    def webhook_attempts(self, task_id: str) -> Attempts:
        """Every HTTP attempt at the task's webhook, newest first."""
        return _attempts(self._request("GET", f"/tasks/{task_id}/webhook/attempts", params=_WHOLE_LOG))

    def batch_webhook_attempts(self, batch_id: str) -> Attempts:
        return _attempts(self._request("GET", f"/batches/{batch_id}/webhook/attempts", params=_WHOLE_LOG))

    def replay_webhook(self, task_id: str) -> WebhookReplay:
        """The ended task's event sent again now (same webhook-id, fresh signature)."""
        return WebhookReplay.model_validate(self._request("POST", f"/tasks/{task_id}/webhook/replay"))

    def replay_batch_webhook(self, batch_id: str) -> WebhookReplay:
        return WebhookReplay.model_validate(self._request("POST", f"/batches/{batch_id}/webhook/replay"))

    def enable_webhook_endpoint(self, url: str) -> None:
        """Deliveries to a URL of yours that was disabled for failing are attempted again."""
        self._request("POST", "/webhooks/endpoints/enable", json={"url": url})

    def batch_results(self, batch_id: str, *, page_size: int = 100) -> Iterator[BatchResult]:
        """Every item of the batch in submission order, a page at a time."""
        cursor: str | None = None
        while True:
            params = self._policy.results_page(cursor, page_size)
            page = BatchResults.model_validate(
                self._request("GET", f"/batches/{batch_id}/results", params=params)
            )
            yield from page.data
            cursor = page.next_cursor
            if cursor is None:
                return

    def wait_batch(
        self,
        batch_id: str,
        *,
        timeout: float | None = None,
        on_progress: Callable[[BatchView], object] | None = None,
    ) -> BatchView:
        """The batch once every item is terminal; `on_progress` sees it as read, then as each
        of its events leaves it (followed with `follow_batch`, not read whole again), then as
        it ended. Raises BatchWaitTimeoutError after `timeout` seconds."""
        view = self.get_batch(batch_id)
        progress = on_progress or (lambda _: None)
        progress(view)
        if not view.status.is_terminal:
            for event in self.follow_batch(batch_id, after=view.events, timeout=timeout):
                view = view.after(event)
                progress(view)
            view = self.get_batch(batch_id)
            progress(view)
        return view

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncClient:
    """The same as `Client`, for asyncio."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._policy = _Policy(base_url, api_key, max_retries)
        self._http = httpx.AsyncClient(
            base_url=self._policy.base_url, headers=self._policy.headers, timeout=timeout, transport=transport
        )

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        attempt = 0
        while True:
            try:
                response: httpx.Response | None = await self._http.request(method, path, **kwargs)
            except httpx.TransportError:
                response = None
            if not self._policy.should_retry(attempt, response):
                if response is None:
                    raise httpx.ConnectError(f"{method} {path}: no answer after {attempt + 1} attempts")
                return self._policy.result(response)
            await asyncio.sleep(self._policy.delay(attempt, response))
            attempt += 1

    async def submit(
        self,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        response_format: ResponseFormat | None = None,
        idempotency_key: str | None = None,
        **options: Unpack[TaskOptions],
    ) -> TaskView:
        body = await self._uploaded(self._policy.task_body(prompt, messages, response_format, options))
        accepted = await self._request("POST", "/tasks", **self._policy.posted(body, idempotency_key))
        self._policy.remember(accepted["task_id"], response_format)
        return await self.get(accepted["task_id"])

    async def _uploaded(self, body: dict[str, Any]) -> dict[str, Any]:
        files = local_files(body)
        if not files:
            return body
        ids = {}
        for file in files:
            uploaded = await self.upload_file(file.source, filename=file.filename, media_type=file.media_type)
            ids[file] = uploaded.id
        return with_file_ids(body, ids)

    async def upload_file(
        self,
        file: str | os.PathLike[str] | bytes,
        *,
        purpose: str = "user_data",
        filename: str | None = None,
        media_type: str | None = None,
    ) -> FileObject:
        name, media, size = _file_facts(file, filename, media_type)
        if size <= FILE_PART_BYTES:
            data = file if isinstance(file, bytes) else await asyncio.to_thread(Path(file).read_bytes)
            form = self._policy.file_form(data, name, media, purpose)
            return FileObject.model_validate(await self._request("POST", "/v1/files", **form))
        start = self._policy.upload_start(size, name, media, purpose)
        upload = await self._request("POST", "/v1/uploads", **start)
        digest = hashlib.md5(usedforsecurity=False)
        part_ids = []
        chunks = _parts_of(file)
        while chunk := await asyncio.to_thread(next, chunks, b""):
            digest.update(chunk)
            form = self._policy.part_form(chunk)
            part_ids.append(
                str((await self._request("POST", f"/v1/uploads/{upload['id']}/parts", **form))["id"])
            )
        end = self._policy.upload_end(part_ids, digest.hexdigest())
        done = await self._request("POST", f"/v1/uploads/{upload['id']}/complete", **end)
        return FileObject.model_validate(done["file"])

    async def get(self, task_id: str, *, wait: float = 0) -> TaskView:
        params = {"wait": int(wait)} if wait else None
        return self._policy.typed(await self._request("GET", f"/tasks/{task_id}", params=params))

    async def cancel(self, task_id: str) -> TaskView:
        return TaskView.model_validate(await self._request("POST", f"/tasks/{task_id}/cancel"))

    async def submit_tool_outputs(
        self, task_id: str, outputs: Mapping[str, str], *, approvals: Mapping[str, bool] | None = None
    ) -> TaskView:
        body = tool_outputs_body(outputs, approvals)
        return TaskView.model_validate(
            await self._request("POST", f"/tasks/{task_id}/tool_outputs", json=body)
        )

    async def steps(self, task_id: str, *, limit: int = 50, cursor: str | None = None) -> StepList:
        params = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        return StepList.model_validate(await self._request("GET", f"/tasks/{task_id}/steps", params=params))

    async def list(
        self, *, status: str | None = None, limit: int = 20, cursor: str | None = None
    ) -> TaskList:
        params = self._policy.listing(status, limit, cursor)
        return TaskList.model_validate(await self._request("GET", "/tasks", params=params))

    async def wait(self, task_id: str, *, timeout: float | None = None) -> TaskView:  # noqa: ASYNC109 - Client.wait's twin
        waiting = _Waiting(self._policy, timeout)
        while True:
            task = await self.get(task_id, wait=waiting.poll_s())
            pause = waiting.pause_s(task)
            if pause is None:
                return task
            await asyncio.sleep(pause)

    async def output(self, task_id: str, *, after: int = 0, wait: float = 0) -> TaskOutputPage:
        params = {"after": after, "wait": int(wait)}
        reply = await self._request("GET", f"/tasks/{task_id}/output", params=params)
        return TaskOutputPage.model_validate(reply)

    async def _pages(self, path: str, model: type[Page], following: _Following) -> AsyncIterator[Page]:
        """Client._pages' twin."""
        while True:
            try:
                reply = await self._request("GET", path, params=following.params())
            except (httpx.HTTPError, ProblemError) as error:
                await asyncio.sleep(following.reconnect_s(error))
                continue
            yield following.page(reply, model)

    async def stream(
        self,
        task_id: str,
        *,
        after: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109 - Client.stream's twin
    ) -> AsyncIterator[OutputChunk]:
        """Client.stream's twin."""
        following = _Following(self._policy, after, timeout)
        async for page in self._pages(f"/tasks/{task_id}/output", TaskOutputPage, following):
            for chunk in page.chunks:
                yield chunk
            if page.final:
                if page.status is not TaskStatus.COMPLETED:
                    raise following.failed(page)
                return
            if _paused(page) and (await self.get(task_id)).status is TaskStatus.REQUIRES_ACTION:
                return
            if following.timed_out():
                raise WaitTimeoutError(await self.get(task_id), following.timeout or 0)

    async def submit_batch(
        self, items: Sequence[Mapping[str, Any]] | str, *, idempotency_key: str | None = None, **options: Any
    ) -> BatchView:
        body = await self._uploaded(self._policy.batch_body(items, options))
        accepted = await self._request("POST", "/batches", **self._policy.posted(body, idempotency_key))
        return await self.get_batch(accepted["batch_id"])

    async def upload_batch_file(self, file: str | os.PathLike[str] | bytes) -> str:
        upload = await self._request("POST", "/batches/uploads")
        if isinstance(file, bytes):
            content: Any = file
            size = len(file)
        else:
            size = os.stat(file).st_size
            content = _chunks_of(file)
        sent = await self._http.send(
            self._policy.upload_request(self._http, upload["upload_url"], content, size)
        )
        sent.raise_for_status()
        return str(upload["file_id"])

    async def get_batch(self, batch_id: str) -> BatchView:
        return BatchView.model_validate(await self._request("GET", f"/batches/{batch_id}"))

    async def batch_events(self, batch_id: str, *, after: int = 0, wait: float = 0) -> BatchEventPage:
        params = {"after": after, "wait": int(wait)}
        reply = await self._request("GET", f"/batches/{batch_id}/events", params=params)
        return BatchEventPage.model_validate(reply)

    async def follow_batch(
        self,
        batch_id: str,
        *,
        after: int = 0,
        timeout: float | None = None,  # noqa: ASYNC109 - Client.follow_batch's twin
    ) -> AsyncIterator[BatchEvent]:
        """Client.follow_batch's twin."""
        following = _Following(self._policy, after, timeout)
        async for page in self._pages(f"/batches/{batch_id}/events", BatchEventPage, following):
            for event in page.events:
                yield event
            if page.final:
                return
            if following.timed_out():
                raise BatchWaitTimeoutError(await self.get_batch(batch_id))

    async def cancel_batch(self, batch_id: str) -> BatchView:
        return BatchView.model_validate(await self._request("POST", f"/batches/{batch_id}/cancel"))

    async def retry_batch(
        self, batch_id: str, *, statuses: Sequence[str] = ("failed",), idempotency_key: str | None = None
    ) -> BatchView:
        request = self._policy.retry_request(statuses, idempotency_key)
        return BatchView.model_validate(await self._request("POST", f"/batches/{batch_id}/retry", **request))

    async def usage(
        self, *, first: date | None = None, last: date | None = None, group_by: str = "day"
    ) -> UsageReport:
        reply = await self._request("GET", "/usage", params=_usage_query(first, last, group_by))
        return UsageReport.model_validate(reply)

    async def webhook_attempts(self, task_id: str) -> Attempts:
        return _attempts(await self._request("GET", f"/tasks/{task_id}/webhook/attempts", params=_WHOLE_LOG))

    async def batch_webhook_attempts(self, batch_id: str) -> Attempts:
        reply = await self._request("GET", f"/batches/{batch_id}/webhook/attempts", params=_WHOLE_LOG)
        return _attempts(reply)

    async def replay_webhook(self, task_id: str) -> WebhookReplay:
        return WebhookReplay.model_validate(await self._request("POST", f"/tasks/{task_id}/webhook/replay"))

    async def replay_batch_webhook(self, batch_id: str) -> WebhookReplay:
        reply = await self._request("POST", f"/batches/{batch_id}/webhook/replay")
        return WebhookReplay.model_validate(reply)

    async def enable_webhook_endpoint(self, url: str) -> None:
        await self._request("POST", "/webhooks/endpoints/enable", json={"url": url})

    async def batch_results(self, batch_id: str, *, page_size: int = 100) -> AsyncIterator[BatchResult]:
        cursor: str | None = None
        while True:
            params = self._policy.results_page(cursor, page_size)
            reply = await self._request("GET", f"/batches/{batch_id}/results", params=params)
            page = BatchResults.model_validate(reply)
            for row in page.data:
                yield row
            cursor = page.next_cursor
            if cursor is None:
                return

    async def wait_batch(
        self,
        batch_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - Client.wait_batch's twin
        on_progress: Callable[[BatchView], object] | None = None,
    ) -> BatchView:
        view = await self.get_batch(batch_id)
        progress = on_progress or (lambda _: None)
        progress(view)
        if not view.status.is_terminal:
            async for event in self.follow_batch(batch_id, after=view.events, timeout=timeout):
                view = view.after(event)
                progress(view)
            view = await self.get_batch(batch_id)
            progress(view)
        return view

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()
