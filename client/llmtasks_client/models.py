"""What a caller reads from the API: tasks, batches, their results and webhook events.

These are the caller's side of the wire, written for it, not imported from the service: they
keep every field the server adds later (`extra="allow"`) and check no input rule, so an
application built on one release keeps reading the replies of the next. The service's own
models (which validate what it accepts) are the source of the OpenAPI document.
"""

from __future__ import annotations

from datetime import date, datetime
from enum import StrEnum
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

Parsed = TypeVar("Parsed", bound=BaseModel)


class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class TaskStatus(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    REQUIRES_ACTION = "requires_action"  # a run waits for the client's tool outputs
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self not in (TaskStatus.PENDING, TaskStatus.PROCESSING, TaskStatus.REQUIRES_ACTION)


class BatchStatus(StrEnum):
    VALIDATING = "validating"  # its input file is being read
    FAILED = "failed"  # its input file was refused whole (errors say why)
    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    COMPLETED_WITH_ERRORS = "completed_with_errors"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (
            BatchStatus.COMPLETED,
            BatchStatus.COMPLETED_WITH_ERRORS,
            BatchStatus.CANCELLED,
            BatchStatus.FAILED,
        )


class Usage(_Reply):
    """Tokens a task's billed calls used (retries included), and what they cost in USD."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the provider served from its cache
    reasoning_tokens: int = 0  # tokens a reasoning model thought with (part of completion_tokens)
    cost_usd: float | None = None
    cost_unknown: bool = False  # a model the deploy's price table lacks (priced at 0)
    service_tier: str | None = None  # the tier that served the calls (default, flex, ...), priced at it
    tier_unpriced: bool = False  # a tier the price table lacks for the model: priced at standard


class UsageTotals(_Reply):
    calls: int = 0  # LLM calls the provider billed
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    cost_unknown_calls: int = 0


class UsageRow(UsageTotals):
    group: str | None  # the day (YYYY-MM-DD), model or key id (None: no key)


class UsageReport(_Reply):
    """`GET /usage`: the tenant's billed calls by day, model or key, from `first` to `last`."""

    first: date = Field(alias="from")
    last: date = Field(alias="to")
    group_by: Literal["day", "model", "key"]
    data: list[UsageRow]
    total: UsageTotals


class WebhookState(_Reply):
    """How the subject's webhook stands: pending, retrying, delivered, failed, skipped or
    endpoint_disabled."""

    status: str
    attempts: int


class Progress(_Reply):
    tokens: int
    updated_at: datetime


class FunctionCall(_Reply):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(_Reply):
    """A function call the model asked for, as the provider returned it."""

    id: str
    type: str = "function"
    function: FunctionCall


class OutputMessage(_Reply):
    """The model's whole message, in Chat Completions' shape."""

    role: str = "assistant"
    content: str | None = None  # its text (the task's `result`)
    refusal: str | None = None  # why the model declined, when it did
    tool_calls: list[ToolCall] | None = None
    reasoning: str | None = None  # a summary of its reasoning, where the provider gives one


class McpApprovalRequest(_Reply):
    """A call of an MCP server's tool that waits for the client's approval."""

    id: str  # answer it by this id (`approvals` of `Client.submit_tool_outputs`)
    type: str = "mcp_approval_request"
    server_label: str
    name: str  # the server's tool
    arguments: str  # JSON text, as the model wrote it


class RequiredAction(_Reply):
    """What a run in requires_action waits for: an output of each of these calls, and an
    approval of each MCP call (`Client.submit_tool_outputs`)."""

    type: str = "submit_tool_outputs"
    tool_calls: list[ToolCall]
    mcp_approval_requests: list[McpApprovalRequest] | None = None


class Step(_Reply):
    """One step of a run: a model call (its `output` message and `usage`), a tool call (its
    `tool_call`, who answered it and its `tool_output`) or an MCP server's list of tools."""

    step: int
    type: str  # mcp_list_tools | model_call | tool_call
    started_at: datetime
    ended_at: datetime
    output: OutputMessage | None = None
    model: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_call: ToolCall | None = None
    tool_source: str | None = None  # endpoint | client | mcp | unknown
    tool_output: str | None = None
    server_label: str | None = None  # the MCP server listed or called
    tools: list[dict[str, Any]] | None = None  # an mcp_list_tools step's: the tools offered


class StepList(_Reply):
    """A page of `GET /tasks/{id}/steps`, in order; `next_cursor` is None on the last page."""

    steps: list[Step]
    next_cursor: str | None = None


class TaskView(_Reply):
    """A task as `GET /tasks/{id}` answers it (and a task event's `data`).

    `parsed` is the answer of a task asked for JSON (response_format json_object or json_schema):
    an instance of the pydantic model given as `response_format` when this client submitted the
    task, else the JSON as it came (`parse(Model)` makes it one)."""

    task_id: str
    status: TaskStatus
    result: str | None = None
    output: OutputMessage | None = None
    finish_reason: str | None = None  # stop, length, tool_calls, content_filter
    parsed: Any = None
    partial_result: str | None = None
    progress: Progress | None = None
    error: str | None = None
    error_code: str | None = None
    attempts: int = 0
    model: str | None = None
    usage: Usage | None = None
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    expires_at: datetime
    next_attempt_at: datetime | None = None
    metadata: dict[str, Any] | None = None
    batch_id: str | None = None
    webhook: WebhookState | None = None
    required_action: RequiredAction | None = None  # while requires_action

    def parse(self, model: type[Parsed]) -> Parsed | None:
        """The JSON answer as `model` (None while there is none); pydantic's ValidationError
        when it does not fit."""
        if self.parsed is None or isinstance(self.parsed, model):
            return self.parsed
        return model.model_validate(self.parsed)


class TaskList(_Reply):
    """A page of `GET /tasks`, newest first; `next_cursor` is None on the last page."""

    data: list[TaskView]
    next_cursor: str | None = None


# A batch's items by where they stand; together they make `total`.
ITEM_COUNTS = ("pending", "processing", "completed", "failed", "cancelled")


class BatchView(_Reply):
    """A batch as `GET /batches/{id}` answers it (and `batch.completed`'s `data`)."""

    batch_id: str
    status: BatchStatus
    total: int
    pending: int = 0
    processing: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    created_at: datetime
    completed_at: datetime | None = None
    expires_at: datetime
    metadata: dict[str, Any] | None = None
    webhook: WebhookState | None = None
    retries: int = 0  # times its failed or cancelled items were run again (retry_batch)
    mode: str = "tasks"  # provider: its items run as the provider's batch jobs
    events: int = 0  # its last event's number: follow_batch(after=events) reads on from this read
    usage: Usage | None = None  # its items' billed calls, summed
    input_file_id: str | None = None  # a batch made from an uploaded file
    refused_lines: int = 0  # that file's lines that are not items (GET /batches/{id}/refused)
    errors: list[str] | None = None  # why the whole file was refused (status failed)

    def after(self, event: BatchEvent) -> BatchView:
        """The batch as `event` left it (its counts; processing once an item has started)."""
        counts = event.counts.model_dump(include=set(ITEM_COUNTS))
        started = self.status is BatchStatus.PENDING and counts["pending"] < self.total
        status = BatchStatus.PROCESSING if started else self.status
        return self.model_copy(update={**counts, "status": status, "events": event.sequence})

    @property
    def finished(self) -> int:
        """Items that have ended (completed, failed or cancelled)."""
        return self.completed + self.failed + self.cancelled


class BatchResult(_Reply):
    """One item of `GET /batches/{id}/results`, in submission order."""

    index: int
    custom_id: str | None = None
    task_id: str
    status: TaskStatus
    result: str | None = None
    error: str | None = None
    error_code: str | None = None
    attempts: int = 0
    usage: Usage | None = None


class BatchResults(_Reply):
    data: list[BatchResult]
    next_cursor: str | None = None


class WebhookEvent(_Reply):
    """A delivery's body: `type` task.completed, task.failed, task.cancelled or batch.completed."""

    type: str
    timestamp: datetime
    data: TaskView | BatchView


class WebhookAttempt(_Reply):
    """One HTTP attempt at a webhook event: `trigger` scheduled or replay; `outcome` delivered,
    retrying, failed or endpoint_disabled."""

    at: datetime
    trigger: str
    outcome: str
    status_code: int | None = None
    error: str | None = None
    latency_ms: int
    next_attempt_at: datetime | None = None


class WebhookAttemptList(_Reply):
    data: list[WebhookAttempt]
    next_cursor: str | None = None


class WebhookReplay(_Reply):
    """A replay's `202`: the event, queued for one attempt with its own webhook-id."""

    webhook_id: str
    event_type: str
    status: str


class StepEvent(_Reply):
    """A run's step as its output stream shows it, in step order among the text: `model_call`
    (its `model`, `usage` and the `tool_calls` it asked for), `tool_call` (its `tool_call`,
    `tool_source`, `tool_output` and whether it failed, `tool_error`), `mcp_list_tools` (an MCP
    server's `server_label` and the `tools` it listed), or `requires_action` (the
    run stops for the `tool_calls` to answer; `step` is the model call that asked). Arguments
    and outputs are trimmed; `Client.steps` has them whole."""

    type: str  # mcp_list_tools | model_call | tool_call | requires_action
    step: int
    server_label: str | None = None  # an MCP server's list, or its tool's call
    tools: list[str] | None = None  # mcp_list_tools: the tools the server listed
    model: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call: ToolCall | None = None
    tool_source: str | None = None  # endpoint | client | mcp | unknown
    tool_output: str | None = None
    tool_error: bool | None = None

    def line(self) -> str:
        """The event on one line, as `llmtasks wait` prints it."""
        if self.type == "mcp_list_tools":
            return f"step {self.step} mcp_list_tools {self.server_label}: {', '.join(self.tools or [])}"
        if self.type == "requires_action":
            calls = ", ".join(f"{call.id} {_call_text(call)}" for call in self.tool_calls or [])
            return f"requires_action after step {self.step}: {calls}"
        if self.type == "tool_call" and self.tool_call is not None:
            failed = " (failed)" if self.tool_error else ""
            output = _one_line(self.tool_output or "", 80)
            called = f"{_call_text(self.tool_call)} [{self.tool_source}]{failed}"
            return f"step {self.step} tool_call {called} -> {output}"
        spent = ""
        if self.usage is not None:
            cost = f" ${self.usage.cost_usd:.6f}" if self.usage.cost_usd is not None else ""
            spent = f" {self.usage.total_tokens} tokens{cost}"
        asked = ", ".join(call.function.name for call in self.tool_calls or []) or self.finish_reason
        return f"step {self.step} model_call {self.model or ''}{spent} -> {asked or 'answer'}"


def _one_line(text: str, most: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= most else flat[: most - 3] + "..."


def _call_text(call: ToolCall) -> str:
    return f"{call.function.name}({_one_line(call.function.arguments, 60)})"


class OutputChunk(_Reply):
    """A piece of a task's output, in order: `sequence` from 1 (pass it as `after` to read on),
    the `text` the model added, the `tokens` it added, and the `attempt` that wrote it (when it
    changes, a retry is writing the text again from its start). A run's chunks also carry its
    steps: a chunk with an `event` (and no text) is one."""

    sequence: int
    text: str
    tokens: int = 0
    attempt: int = 1
    written_at: datetime | None = None
    event: StepEvent | None = None


class TaskOutputPage(_Reply):
    """`GET /tasks/{id}/output`: the chunks after `after`; `final` once the task ended and no
    chunk follows (then `status`, and `error` if it failed)."""

    task_id: str
    chunks: list[OutputChunk]
    after: int
    final: bool
    status: TaskStatus | None = None
    error: str | None = None
    error_code: str | None = None


class BatchCounts(_Reply):
    pending: int = 0
    processing: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0


class BatchEventItem(_Reply):
    """An item whose status moved: its place in the batch, its ids, its status after."""

    index: int
    custom_id: str | None = None
    task_id: str
    status: TaskStatus


class BatchEvent(_Reply):
    """Items of a batch whose status moved together, and the batch's counts after them;
    `sequence` from 1 (pass it as `after` to read on)."""

    sequence: int
    items: list[BatchEventItem]
    counts: BatchCounts
    at: datetime


class BatchEventPage(_Reply):
    """`GET /batches/{id}/events`: the events after `after`; `final` once the batch ended and no
    event follows."""

    batch_id: str
    events: list[BatchEvent]
    after: int
    final: bool
    status: BatchStatus


class FileObject(_Reply):
    """A file uploaded to llmtasks (`POST /v1/files`, OpenAI's file object): `id` is what a
    content part names as its `file_id`."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
