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

A run (a task with tools) writes no output chunks: its events are numbered from its waits
instead (run_events). Each wait its client answered is the response that completed with the
calls to answer (their function_call items' events, response.completed), then went on
(response.in_progress); then the wait it is in, or its end (its items' events, then
response.completed, .incomplete or .failed). A completed run's MCP steps are items of its end,
before its answer: each server's list (output_item.added, mcp_list_tools.in_progress and
.completed, output_item.done) and each call of its tools (output_item.added,
mcp_call.in_progress, mcp_call_arguments.delta and .done, mcp_call.completed or .failed,
output_item.done). Read from its journal's steps, they are the same for
every reader at any time; a continuation's stream starts after the wait it answered.
"""

from __future__ import annotations

import json
import time
from typing import Any

from llmtasks.api.openai_objects import (
    function_call_item,
    incomplete_reason,
    message_item,
    output_items,
    reasoning_item,
    refusal_part,
    response_object,
    text_part,
    waiting_items,
)
from llmtasks.domain.llm_request import ToolCall
from llmtasks.domain.mcp_servers import McpApprovalRequest, McpListedTool, McpServer
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.domain.runs import RequiredAction
from llmtasks.domain.steps import RunStep, usage_of
from llmtasks.services.tasks import TaskService

__all__ = ["SEGMENT_S", "response_object", "resumed_after", "run_events", "segment"]
SEGMENT_S = 25.0
_HEADER = 3  # the last of the events before the first delta


class _Segment:
    def __init__(self, task_id: str, starting_after: int) -> None:
        self.task_id = task_id
        self.starting_after = starting_after
        self.lines: list[str] = []

    def emit(self, sequence: int, kind: str, **fields: Any) -> None:
        """The event, unless it is at or before the last one given (read again, it is the same)."""
        if sequence > self.starting_after:
            event = {"type": kind, "sequence_number": sequence, **fields}
            self.lines.append(f"event: {kind}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n")
            self.starting_after = sequence

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
        return item_events(reasoning_item(self.task_id, task.reasoning), 1)

    def _function_calls(self, task: Task) -> list[tuple[str, dict[str, Any]]]:
        """Each tool call as a function_call item, its arguments in one delta."""
        first = 2 if task.reasoning else 1
        events: list[tuple[str, dict[str, Any]]] = []
        for index, call in enumerate(task.tool_calls or []):
            events += item_events(function_call_item(self.task_id, index, call), first + index)
        return events


def item_events(item: dict[str, Any], index: int) -> list[tuple[str, dict[str, Any]]]:
    """An output item's events, from its announcement (in progress, empty) to its end: a
    function call's arguments, a reasoning summary, or a message's text in one delta each."""
    at = {"output_index": index}
    where = {**at, "item_id": item["id"]}
    if item["type"] == "mcp_approval_request":
        return [
            ("response.output_item.added", {**at, "item": item}),
            ("response.output_item.done", {**at, "item": item}),
        ]
    if item["type"] == "mcp_list_tools":
        return [
            ("response.output_item.added", {**at, "item": {**item, "tools": []}}),
            ("response.mcp_list_tools.in_progress", where),
            ("response.mcp_list_tools.completed", where),
            ("response.output_item.done", {**at, "item": item}),
        ]
    if item["type"] == "mcp_call":
        arguments = item["arguments"]
        announced = {**item, "arguments": "", "output": None, "error": None, "status": "in_progress"}
        ended = "response.mcp_call.failed" if item["status"] == "failed" else "response.mcp_call.completed"
        return [
            ("response.output_item.added", {**at, "item": announced}),
            ("response.mcp_call.in_progress", where),
            ("response.mcp_call_arguments.delta", {**where, "delta": arguments}),
            ("response.mcp_call_arguments.done", {**where, "arguments": arguments}),
            (ended, where),
            ("response.output_item.done", {**at, "item": item}),
        ]
    if item["type"] == "function_call":
        arguments = item["arguments"]
        announced = {**item, "arguments": "", "status": "in_progress"}
        return [
            ("response.output_item.added", {**at, "item": announced}),
            ("response.function_call_arguments.delta", {**where, "delta": arguments}),
            ("response.function_call_arguments.done", {**where, "arguments": arguments}),
            ("response.output_item.done", {**at, "item": item}),
        ]
    if item["type"] == "reasoning":
        [summary] = item["summary"]
        where = {**where, "summary_index": 0}
        return [
            ("response.output_item.added", {**at, "item": {**item, "summary": [], "status": "in_progress"}}),
            ("response.reasoning_summary_part.added", {**where, "part": {**summary, "text": ""}}),
            ("response.reasoning_summary_text.delta", {**where, "delta": summary["text"]}),
            ("response.reasoning_summary_text.done", {**where, "text": summary["text"]}),
            ("response.reasoning_summary_part.done", {**where, "part": summary}),
            ("response.output_item.done", {**at, "item": item}),
        ]
    announced = {**item, "status": "in_progress", "content": []}
    events = [("response.output_item.added", {**at, "item": announced})]
    for content_index, part in enumerate(item["content"]):
        place = {**where, "content_index": content_index}
        if part["type"] == "refusal":
            events += [
                ("response.content_part.added", {**place, "part": refusal_part("")}),
                ("response.refusal.done", {**place, "refusal": part["refusal"]}),
            ]
        else:
            events.append(("response.content_part.added", {**place, "part": text_part("")}))
            text = part["text"]
            if text:
                events.append(("response.output_text.delta", {**place, "delta": text, "logprobs": []}))
            events.append(("response.output_text.done", {**place, "text": text, "logprobs": []}))
        events.append(("response.content_part.done", {**place, "part": part}))
    return [*events, ("response.output_item.done", {**at, "item": item})]


# --- a run's events ----------------------------------------------------------------------------


def approval_requests(task: Task, steps: list[RunStep]) -> dict[str, McpApprovalRequest]:
    """Each call of an MCP tool the run's model asked for that waits, or waited, for the client's
    approval (by its server's require_approval), by the call's id."""
    servers = {server.server_label: server for server in task.mcp_servers or []}
    tools: dict[str, tuple[McpServer, McpListedTool]] = {}
    for step in steps:
        server = servers.get(step.server_label or "")
        if step.type == "mcp_list_tools" and server is not None:
            for tool in step.tools or []:
                tools.setdefault(tool.function_name, (server, tool))
    requests: dict[str, McpApprovalRequest] = {}
    for step in steps:
        for call in _calls(step):
            found = tools.get(call.function.name)
            if found is not None and found[0].needs_approval(found[1]):
                requests[call.id] = McpApprovalRequest(
                    id=call.id,
                    server_label=found[0].server_label,
                    name=found[1].name,
                    arguments=call.function.arguments,
                )
    return requests


def _calls(step: RunStep) -> list[ToolCall]:
    """The calls a model step asked for (none for another step)."""
    return (step.completion.tool_calls or []) if step.completion is not None else []


def answered_waits(task: Task, steps: list[RunStep]) -> list[tuple[int, list[ToolCall]]]:
    """Each model step whose wait the client answered, with the calls it waited for (its client
    functions' and the MCP calls to approve), in order: answered once one of them has its step
    (an output, a denial, an approved call made) or is an approved call not made yet."""
    approvals = approval_requests(task, steps)
    approved = set(task.approved_calls or [])
    done = {step.tool_call.id: step for step in steps if step.tool_call is not None}
    waits: list[tuple[int, list[ToolCall]]] = []
    for step in steps:
        waited = [
            call
            for call in _calls(step)
            if call.id in approvals or (call.id in done and done[call.id].source == "client")
        ]
        if any(call.id in done or call.id in approved for call in waited):
            waits.append((step.step, waited))
    return waits


Event = tuple[int, str, dict[str, Any]]


def run_events(task: Task, steps: list[RunStep]) -> list[Event]:
    """A run's events so far, numbered the same for every reader: response.created, then
    response.in_progress once it started; each wait its client answered, as the response that
    completed with the calls to answer (their function_call items, response.completed) and went
    on (response.in_progress); then the wait it is in, or its end."""
    task_id = task.task_id
    events: list[Event] = [(0, "response.created", {"response": _as_of(task, TaskStatus.PENDING)})]

    def add(kind: str, **fields: Any) -> None:
        events.append((events[-1][0] + 1, kind, fields))

    def add_items(items: list[dict[str, Any]]) -> None:
        for index, item in enumerate(items):
            for kind, fields in item_events(item, index):
                add(kind, **fields)

    if task.status is TaskStatus.PENDING and not steps:
        return events
    add("response.in_progress", response=_as_of(task, TaskStatus.PROCESSING))
    waiting = task.action_step if task.status is TaskStatus.REQUIRES_ACTION else None
    approvals = approval_requests(task, steps)
    for model_step, waited in answered_waits(task, steps):
        if model_step == waiting:
            continue  # its outputs are being taken: the run still waits
        calls = [call for call in waited if call.id not in approvals]
        asked = [approvals[call.id] for call in waited if call.id in approvals]
        add_items(waiting_items(task_id, model_step, calls, asked))
        before = [step for step in steps if step.step <= model_step]
        then = task.model_copy(
            update={
                "status": TaskStatus.REQUIRES_ACTION,
                "required_action": RequiredAction(tool_calls=calls, mcp_approval_requests=asked or None),
                "action_step": model_step,
                "usage": usage_of(before),
            }
        )
        add("response.completed", response=response_object(then))
        add("response.in_progress", response=_as_of(task, TaskStatus.PROCESSING))
    if waiting is not None:
        add_items(output_items(task))
        add("response.completed", response=response_object(task))
    elif task.status is TaskStatus.COMPLETED:
        add_items(output_items(task, steps))
        kind = "response.incomplete" if incomplete_reason(task) else "response.completed"
        add(kind, response=response_object(task, steps))
    elif task.status.is_terminal:
        kind = "response.failed" if task.status is TaskStatus.FAILED else "response.incomplete"
        add(kind, response=response_object(task))
    return events


def resumed_after(task: Task, steps: list[RunStep], model_step: int | None = None) -> int:
    """Where a run's events go on after its client's outputs for the calls of `model_step` (its
    latest answered wait's when None): the number of the response.completed that wait ended with."""
    waiting = task.action_step if task.status is TaskStatus.REQUIRES_ACTION else None
    waits = [step for step, _ in answered_waits(task, steps) if step != waiting]
    # The first response.in_progress is the run's start; each one after it follows a wait.
    resumed = [number for number, kind, _ in run_events(task, steps) if kind == "response.in_progress"][1:]
    return resumed[waits.index(model_step) if model_step is not None else -1] - 1


def _as_of(task: Task, status: TaskStatus) -> dict[str, Any]:
    """The response queued or in progress, as OpenAI's snapshots then are: no output, no usage
    (so that each reader reads the same event, whenever it reads it)."""
    return response_object(task.model_copy(update={"status": status, "usage": None}))


def _run_segment(service: TaskService, task: Task, starting_after: int, give_up: float) -> str:
    """A run's events after `starting_after`: those there are now, then, until `give_up`, those of
    its next wait or its end."""
    tenant_id, task_id = task.tenant_id, task.task_id
    out = _Segment(task_id, starting_after)
    while True:
        for number, kind, fields in run_events(task, service.runs.recorded(task)):
            out.emit(number, kind, **fields)
        left = give_up - time.monotonic()
        if task.status.is_terminal or task.status is TaskStatus.REQUIRES_ACTION or left <= 0:
            return "".join(out.lines)
        task = service.get(tenant_id, task_id, wait_s=left)


def segment(
    service: TaskService, tenant_id: str, task_id: str, starting_after: int, segment_s: float = SEGMENT_S
) -> str:
    """The events after `starting_after` that exist now or come within `segment_s`, as SSE."""
    give_up = time.monotonic() + segment_s
    task = service.get(tenant_id, task_id)
    if task.is_run:
        return _run_segment(service, task, starting_after, give_up)
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
