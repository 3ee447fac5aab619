"""OpenAI's Response object over a task (`resp_<task id>`), and its streaming events.

Streaming a background response: `POST /v1/responses` with
`"stream": true` and `GET /v1/responses/{id}?stream=true&starting_after=N` answer
`text/event-stream`, one segment at a time: the events after N that exist now and those that come
within SEGMENT_S, then the reply ends cleanly (API Gateway holds a reply 30 s, and buffers it: the
events of a segment arrive together when it ends, locally as in AWS). A client reads on with
`starting_after` = the last event's `sequence_number`, for as long as the task lives.

Each event has the same sequence number for every reader at any time, from the task's output
chunks (domain/output.py), chunk k being its k-th:

    0       response.created
    1, 2, 3 response.in_progress, response.output_item.added, response.content_part.added,
            once the task has left `queued`
    3 + k   response.output_text.delta (chunk k's text)
    then, with K chunks in all, once the task ended:
    completed: K+4 response.output_text.done, K+5 response.content_part.done,
               K+6 response.output_item.done, K+7 response.completed
    failed:    K+4 response.failed
    cancelled: K+4 response.incomplete (the response's status is `cancelled`: OpenAI's stream
               has no event of its own for it)

A retried task's deltas write its text again from its start (its chunks do; OpenAI has no
retries to say so): the `.done` events and the response hold the result alone.
"""

from __future__ import annotations

import json
import time
from typing import Any

from llmtasks.domain.errors import RATE_LIMITED
from llmtasks.domain.events import response_id
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.services.tasks import TaskService

_STATUSES = {
    TaskStatus.PENDING: "queued",
    TaskStatus.PROCESSING: "in_progress",
    TaskStatus.COMPLETED: "completed",
    TaskStatus.FAILED: "failed",
    TaskStatus.CANCELLED: "cancelled",
}
SEGMENT_S = 25.0
_HEADER = 3  # the last of the events before the first delta


def response_object(task: Task) -> dict[str, Any]:
    """A task as OpenAI's Response object (background mode)."""
    request = task.request
    completed = task.status is TaskStatus.COMPLETED
    output = [_message(task.task_id, task.result or "")] if completed else []
    error = None
    if task.status is TaskStatus.FAILED:
        code = "rate_limit_exceeded" if task.error_code == RATE_LIMITED else "server_error"
        error = {"code": code, "message": task.error or "The task failed."}
    usage = None
    if task.usage is not None:
        usage = {
            "input_tokens": task.usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": task.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": task.usage.total_tokens,
        }
    return {
        "id": response_id(task.task_id),
        "object": "response",
        "created_at": int(task.created_at),
        "completed_at": int(task.completed_at) if completed and task.completed_at else None,
        "status": _STATUSES[task.status],
        "background": True,
        "error": error,
        "incomplete_details": None,
        "instructions": request.system,
        "max_output_tokens": request.max_tokens,
        "metadata": task.metadata if isinstance(task.metadata, dict) else {},
        "model": task.model or request.model or "",
        "output": output,
        "parallel_tool_calls": False,
        "temperature": request.temperature,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


class _Segment:
    def __init__(self, task_id: str, starting_after: int) -> None:
        self.task_id = task_id
        self.starting_after = starting_after
        self.lines: list[str] = []

    def emit(self, sequence: int, kind: str, **fields: Any) -> None:
        if sequence > self.starting_after:
            event = {"type": kind, "sequence_number": sequence, **fields}
            self.lines.append(f"event: {kind}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n")

    def part(self, sequence: int, kind: str, **fields: Any) -> None:
        """An event about the one output item's one text part."""
        self.emit(sequence, kind, item_id=f"msg_{self.task_id}", output_index=0, content_index=0, **fields)

    def started(self, task: Task) -> None:
        in_progress = task.model_copy(update={"status": TaskStatus.PROCESSING})
        self.emit(1, "response.in_progress", response=response_object(in_progress))
        self.emit(2, "response.output_item.added", output_index=0, item=_message(self.task_id, None))
        self.part(3, "response.content_part.added", part=_text_part(""))

    def ended(self, task: Task, chunks: int) -> None:
        end = _HEADER + chunks
        response = response_object(task)
        if task.status is TaskStatus.COMPLETED:
            text = task.result or ""
            self.part(end + 1, "response.output_text.done", text=text, logprobs=[])
            self.part(end + 2, "response.content_part.done", part=_text_part(text))
            self.emit(end + 3, "response.output_item.done", output_index=0, item=_message(self.task_id, text))
            self.emit(end + 4, "response.completed", response=response)
        elif task.status is TaskStatus.FAILED:
            self.emit(end + 1, "response.failed", response=response)
        else:
            self.emit(end + 1, "response.incomplete", response=response)


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _message(task_id: str, text: str | None) -> dict[str, Any]:
    """The response's one output item: in progress and empty (None), or completed with `text`."""
    return {
        "type": "message",
        "id": f"msg_{task_id}",
        "status": "in_progress" if text is None else "completed",
        "role": "assistant",
        "content": [] if text is None else [_text_part(text)],
    }


def segment(
    service: TaskService, tenant_id: str, task_id: str, starting_after: int, segment_s: float = SEGMENT_S
) -> str:
    """The events after `starting_after` that exist now or come within `segment_s`, as SSE."""
    give_up = time.monotonic() + segment_s
    task = service.get(tenant_id, task_id)
    out = _Segment(task_id, starting_after)
    out.emit(0, "response.created", response=response_object(task))
    started = task.status is not TaskStatus.PENDING
    if started:
        out.started(task)
    after = max(0, starting_after - _HEADER)
    while True:
        wait_s = max(0.0, give_up - time.monotonic())
        page = service.output(tenant_id, task_id, after=after, wait_s=wait_s, past_end_ok=True)
        if (page.chunks or page.final) and not started:
            started = True
            out.started(task)
        for chunk in page.chunks:
            out.part(_HEADER + chunk.sequence, "response.output_text.delta", delta=chunk.text, logprobs=[])
        after = page.after
        if page.final:
            # The task as it ended: read again unless it had ended when the segment began.
            ended = task if task.status.is_terminal else service.get(tenant_id, task_id)
            out.ended(ended, page.after)
            return "".join(out.lines)
        if time.monotonic() >= give_up:
            return "".join(out.lines)
