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
               (a refusal: its content_part.added, refusal.done, content_part.done,)
               response.output_item.done of the message; then, where the answer has them, the
               reasoning item (output_item.added, reasoning_summary_part.added,
               reasoning_summary_text.delta and .done, reasoning_summary_part.done,
               output_item.done) and each function_call item (output_item.added,
               function_call_arguments.delta and .done, output_item.done); last
               response.completed, or response.incomplete for an answer cut short
    failed:    K+4 response.failed
    cancelled: K+4 response.incomplete (the response's status is `cancelled`: OpenAI's stream
               has no event of its own for it)

The events number the items in the order they announce them (the message first: it is announced
before the model answers); the Response object orders them as OpenAI does (openai_objects.py).

A retried task's deltas write its text again from its start (its chunks do; OpenAI has no
retries to say so): the `.done` events and the response hold the result alone.
"""

from __future__ import annotations

import json
import time
from typing import Any

from llmtasks.api.openai_objects import (
    function_call_item,
    incomplete_reason,
    message_item,
    reasoning_item,
    refusal_part,
    response_object,
    text_part,
)
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.services.tasks import TaskService

__all__ = ["SEGMENT_S", "response_object", "segment"]
SEGMENT_S = 25.0
_HEADER = 3  # the last of the events before the first delta


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
        self.emit(2, "response.output_item.added", output_index=0, item=message_item(self.task_id, None))
        self.part(3, "response.content_part.added", part=text_part(""))

    def ended(self, task: Task, chunks: int) -> None:
        sequence = _HEADER + chunks
        if task.status is not TaskStatus.COMPLETED:
            kind = "response.failed" if task.status is TaskStatus.FAILED else "response.incomplete"
            self.emit(sequence + 1, kind, response=response_object(task))
            return
        events = self._message_done(task) + self._reasoning(task) + self._function_calls(task)
        final = "response.incomplete" if incomplete_reason(task) else "response.completed"
        for kind, fields in [*events, (final, {"response": response_object(task)})]:
            sequence += 1
            self.emit(sequence, kind, **fields)

    def _message_done(self, task: Task) -> list[tuple[str, dict[str, Any]]]:
        """The streamed message's end: its text part (announced before the model answered, so
        there even when it only refused or called tools), then a refusal part if it refused."""
        text = task.result or ""
        where = {"item_id": f"msg_{self.task_id}", "output_index": 0}
        parts = [text_part(text)]
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []}),
            ("response.content_part.done", {**where, "content_index": 0, "part": text_part(text)}),
        ]
        if task.refusal is not None:
            parts.append(refusal_part(task.refusal))
            events += [
                ("response.content_part.added", {**where, "content_index": 1, "part": refusal_part("")}),
                ("response.refusal.done", {**where, "content_index": 1, "refusal": task.refusal}),
                ("response.content_part.done", {**where, "content_index": 1, "part": parts[-1]}),
            ]
        status = "incomplete" if incomplete_reason(task) else "completed"
        item = message_item(self.task_id, parts, status)
        return [*events, ("response.output_item.done", {"output_index": 0, "item": item})]

    def _reasoning(self, task: Task) -> list[tuple[str, dict[str, Any]]]:
        """The reasoning summary, once the answer gives it: an item of its own after the message."""
        if not task.reasoning:
            return []
        where = {"item_id": f"rs_{self.task_id}", "output_index": 1, "summary_index": 0}
        summary = {"type": "summary_text", "text": task.reasoning}
        return [
            ("response.output_item.added", {"output_index": 1, "item": reasoning_item(self.task_id, None)}),
            ("response.reasoning_summary_part.added", {**where, "part": {**summary, "text": ""}}),
            ("response.reasoning_summary_text.delta", {**where, "delta": task.reasoning}),
            ("response.reasoning_summary_text.done", {**where, "text": task.reasoning}),
            ("response.reasoning_summary_part.done", {**where, "part": summary}),
            (
                "response.output_item.done",
                {"output_index": 1, "item": reasoning_item(self.task_id, task.reasoning)},
            ),
        ]

    def _function_calls(self, task: Task) -> list[tuple[str, dict[str, Any]]]:
        """Each tool call as a function_call item, its arguments in one delta."""
        events: list[tuple[str, dict[str, Any]]] = []
        first = 2 if task.reasoning else 1
        for index, call in enumerate(task.tool_calls or []):
            at = {"output_index": first + index}
            where = {**at, "item_id": f"fc_{self.task_id}_{index}"}
            arguments = call.function.arguments
            events += [
                (
                    "response.output_item.added",
                    {**at, "item": function_call_item(self.task_id, index, call, "")},
                ),
                ("response.function_call_arguments.delta", {**where, "delta": arguments}),
                ("response.function_call_arguments.done", {**where, "arguments": arguments}),
                ("response.output_item.done", {**at, "item": function_call_item(self.task_id, index, call)}),
            ]
        return events


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
