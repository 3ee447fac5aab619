"""A task at every edge: its request, the stored item, its views; the HTTP bodies they share (batches.py
has the batch's, messages.py what crosses the queues and reaches receivers).

The OpenAPI document is generated from these, so a field added here shows up in `/openapi.json`.

Long because a task's models are one vocabulary: the request, the stored item and its views
are checked against each other and make the OpenAPI document, so they change together.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    model_validator,
)

from llmtasks.domain.budgets import Budget
from llmtasks.domain.fields import JsonObject, Retries, Strict, Text, TimeoutSeconds, WebhookUrl
from llmtasks.domain.json_schema import Ways, alternatives, each, excludes, needs
from llmtasks.domain.llm_request import FIELD_RULES, ONE_INPUT, AudioPart, LLMRequest, ToolCall
from llmtasks.domain.mcp_servers import SEPARATOR, McpServer
from llmtasks.domain.runs import DEFAULT_MAX_STEPS, EndpointTool, MaxSteps, RequiredAction


class TaskStatus(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    # A run waits for its client's tool outputs (POST /tasks/{id}/tool_outputs); no worker holds it.
    REQUIRES_ACTION = "requires_action"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})
# error_code of a task whose message went to TaskDLQ.
DEAD_LETTERED = "dead_lettered"
# error_code of a task whose every answer failed its response_format: the last one's text is kept.
INVALID_OUTPUT = "invalid_output"


class WebhookStatus(StrEnum):
    PENDING = "pending"  # the task is not terminal yet, or the event is queued
    RETRYING = "retrying"  # at least one attempt failed, more are scheduled
    DELIVERED = "delivered"
    FAILED = "failed"  # attempts exhausted (or 410): the event is in the webhook DLQ
    SKIPPED = "skipped"  # the task ended with an event it did not ask for (webhook_events)
    # Its endpoint failed for WebhookEndpointDisableAfterSeconds and was disabled: not attempted
    # (the tenant enables it again, then replays the event).
    ENDPOINT_DISABLED = "endpoint_disabled"


TaskEventType = Literal["task.completed", "task.failed", "task.cancelled", "task.requires_action"]
BatchEventType = Literal["batch.completed"]
EventType = Literal[
    "task.completed", "task.failed", "task.cancelled", "task.requires_action", "batch.completed"
]
# A run waits for its client's tool outputs: sent each time it stops so (not a terminal event).
TASK_REQUIRES_ACTION: TaskEventType = "task.requires_action"
BATCH_COMPLETED: BatchEventType = "batch.completed"
EVENT_OF_STATUS: dict[TaskStatus, TaskEventType] = {  # the terminal events
    TaskStatus.COMPLETED: "task.completed",
    TaskStatus.FAILED: "task.failed",
    TaskStatus.CANCELLED: "task.cancelled",
}


# high: a lane of its own (HighTaskQueue), ahead of every normal task; low: background work, run
# in the batch items' lane so it never takes a normal task's slot (domain.rules.lane_of).
Priority = Literal["low", "normal", "high"]
# How a task's webhook speaks: llmtasks' own event (type task.*, the status object in `data`), or
# OpenAI's (type response.*, `data.id` the response id), for tasks made through /v1/responses.
WebhookFormat = Literal["llmtasks", "openai"]


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


def _utc(epoch: float | None) -> datetime | None:
    return None if epoch is None else _at(epoch)


# The rules between fields (the validators below enforce them; json_schema.py writes them into the
# document): exactly one of prompt and messages (llm_request.ONE_INPUT), ...
# What a webhook URL must be, beyond its length: a property of the network, said in words.
WEBHOOK_URL_RULE = (
    "https, and its host must resolve to public addresses only (a host of the deployment's"
    " WEBHOOK_ALLOWED_HOSTS may be anything, over http too); refused with 422 otherwise."
)
# ... max_steps only beside tools ...
TASK_NEEDS = needs({**FIELD_RULES, "max_steps": {"tools": {"type": "array"}}})
# ... the parameters the Responses API has no place for never beside provider_background ...
BACKGROUND_REFUSES = ("stop", "seed", "presence_penalty", "frequency_penalty", "logprobs")
# ... and the webhook's fields only beside its URL.
WEBHOOK_URL: Ways = [
    {"webhook_url": False, "webhook_events": False, "webhook_format": False},
    {"webhook_url": True},
]


class TaskOptions(LLMRequest):
    """What a task is asked to do and how: the LLM request plus its retries, deadline and metadata.
    A task body (`POST /tasks`) and a batch item share these."""

    max_retries: Retries = Field(default=3, description="Retries of transient LLM errors.")
    timeout_s: TimeoutSeconds | None = Field(
        default=None, description="Deadline for the whole task, from submission."
    )
    priority: Priority = "normal"
    metadata: JsonObject | None = Field(default=None, description="Up to 2 KiB of JSON, echoed back.")

    def llm_request(self) -> LLMRequest:
        return LLMRequest.model_validate(self.model_dump(include=set(LLMRequest.model_fields)))


# A task body's tool: a function (with a url or not), or an MCP server.
TaskTool = Annotated[EndpointTool | McpServer, Field(discriminator="type")]


class SubmitTaskRequest(TaskOptions):
    """`POST /tasks`."""

    model_config = ConfigDict(
        json_schema_extra=each(
            alternatives(ONE_INPUT, WEBHOOK_URL),
            TASK_NEEDS,
            excludes("provider_background", BACKGROUND_REFUSES),
        )
    )

    tools: Annotated[list[TaskTool], Field(min_length=1, max_length=128)] | None = Field(  # type: ignore[assignment]
        default=None,
        description="Function tools the model may call, and MCP servers whose tools it may call:"
        " the task is then a run (docs: agent runs), a loop of model calls and the tool calls they"
        " ask for until the model answers with none.",
    )
    max_steps: MaxSteps | None = Field(
        default=None,
        description=f"The run's most model calls (default {DEFAULT_MAX_STEPS}): the worker calls the"
        " url tools, waits in requires_action for the others' outputs, and fails"
        " max_steps_exceeded past it.",
    )
    provider_background: StrictBool = Field(
        default=False,
        description="Each model call runs in the provider's background mode (OpenAI's Responses"
        " API, `background: true`): the worker starts it and is released, then checks back, or is"
        " woken by the provider's webhook, so a long call holds no worker. An OpenAI provider's;"
        f" refused with {', '.join(BACKGROUND_REFUSES)} or audio, which that API has no place for.",
    )
    webhook_url: WebhookUrl | None = Field(
        default=None, description="URL that receives the terminal event, signed. " + WEBHOOK_URL_RULE
    )
    webhook_events: list[TaskEventType] | None = Field(
        default=None,
        min_length=1,
        description="The events to send to webhook_url (default: every terminal event).",
    )
    webhook_format: WebhookFormat | None = Field(
        default=None,
        description="'openai': OpenAI's webhook events (response.completed, ... with data.id the"
        " response id) instead of llmtasks' own (the default).",
    )

    @model_validator(mode="after")
    def _events_need_a_url(self) -> SubmitTaskRequest:
        if self.webhook_events is not None and self.webhook_url is None:
            raise ValueError("'webhook_events' needs a 'webhook_url'")
        if self.webhook_format is not None and self.webhook_url is None:
            raise ValueError("'webhook_format' needs a 'webhook_url'")
        if self.max_steps is not None and self.tools is None:
            raise ValueError("'max_steps' needs 'tools'")
        self._servers_apart()
        if self.provider_background:
            for name in BACKGROUND_REFUSES:
                if getattr(self, name) is not None:
                    raise ValueError(f"'{name}' has no place in the provider's background mode")
            if any(isinstance(part, AudioPart) for part in self.parts()):
                raise ValueError("audio has no place in the provider's background mode")
        return self

    def _servers_apart(self) -> None:
        """Each MCP server its own label, and no function of the task named as a server's tool."""
        labels = [server.server_label for server in self.mcp_servers or []]
        if len(set(labels)) != len(labels):
            raise ValueError("each MCP server's 'server_label' once")
        functions = [tool for tool in self.tools or [] if isinstance(tool, EndpointTool)]
        if (
            labels
            and not functions
            and (self.tool_choice is not None or self.parallel_tool_calls is not None)
        ):
            raise ValueError(
                "'tool_choice' and 'parallel_tool_calls' need a function tool beside MCP servers"
            )
        for tool in self.tools or []:
            if isinstance(tool, EndpointTool) and tool.function.name.split(SEPARATOR)[0] in labels:
                raise ValueError(
                    f"function '{tool.function.name}' is named as an MCP server's tool"
                    f" ('<server_label>{SEPARATOR}<tool>'): rename it"
                )

    def llm_request(self) -> LLMRequest:
        """The request the provider is asked: its functions without their URLs (the worker's
        alone), and no MCP server (the worker offers their tools as functions)."""
        given = self.model_dump(include=set(LLMRequest.model_fields), exclude_none=True, by_alias=True)
        functions = [tool for tool in given.get("tools") or [] if tool.get("type") == "function"]
        for tool in functions:
            tool.pop("url", None)
        if "tools" in given:
            given["tools"] = functions or None
        return LLMRequest.model_validate(given)

    @property
    def tool_urls(self) -> dict[str, str] | None:
        """The tools the worker calls, their URLs by name; None when there are none."""
        urls = {
            tool.function.name: tool.url
            for tool in self.tools or []
            if isinstance(tool, EndpointTool) and tool.url
        }
        return urls or None

    @property
    def mcp_servers(self) -> list[McpServer] | None:
        """The run's MCP servers; None when there are none."""
        servers = [tool for tool in self.tools or [] if isinstance(tool, McpServer)]
        return servers or None

    @property
    def run_steps(self) -> int | None:
        """The run's max_steps, None when the task is a single call: it gives no tools, and its
        call is not in the provider's background mode (whose started call the journal keeps)."""
        if self.tools:
            return self.max_steps or DEFAULT_MAX_STEPS
        return 1 if self.provider_background else None


# Where OpenAI's usage keeps the counts that are part of its totals.
_DETAILS = (("cached_tokens", "prompt_tokens_details"), ("reasoning_tokens", "completion_tokens_details"))


class Usage(BaseModel):
    """Tokens a call (or a task's calls, summed) used, and what they cost."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = Field(
        default=0, description="Prompt tokens the provider served from its cache (part of prompt_tokens)."
    )
    reasoning_tokens: int = Field(
        default=0,
        description="Tokens a reasoning model thought with before it answered (part of completion_tokens,"
        " priced as output).",
    )
    cost_usd: float | None = Field(
        default=None,
        description="What the provider billed, priced from the deploy's price table (every billed"
        " attempt of a task, retries included).",
    )
    cost_unknown: bool = Field(
        default=False, description="A model the price table lacks was billed: priced at 0, never guessed."
    )
    service_tier: str | None = Field(
        default=None,
        description="The tier that served the call, as the provider said (OpenAI's `service_tier`:"
        " default, flex, priority, scale; `batch` for a provider's batch job); the price is that"
        " tier's. Null when the provider says none, or a task's calls were served at several.",
    )
    tier_unpriced: bool = Field(
        default=False,
        description="The price table has no price for the model at the tier that served the call:"
        " priced at its standard price.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_details(cls, data: Any) -> Any:
        """OpenAI reports cached prompt tokens in prompt_tokens_details, and reasoning tokens in
        completion_tokens_details."""
        if not isinstance(data, dict):
            return data
        found = {}
        for total, details in _DETAILS:
            given = data.get(details)
            if total not in data and isinstance(given, dict) and isinstance(given.get(total), int):
                found[total] = given[total]
        return {**data, **found} if found else data

    def __add__(self, other: Usage) -> Usage:
        costs = [u.cost_usd for u in (self, other) if u.cost_usd is not None]
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            # Summed as decimals: 0.1 + 0.2 is 0.3 here, as in DynamoDB's counters
            cost_usd=float(sum(Decimal(repr(c)) for c in costs)) if costs else None,
            cost_unknown=self.cost_unknown or other.cost_unknown,
            service_tier=_one_tier(self, other),
            tier_unpriced=self.tier_unpriced or other.tier_unpriced,
        )


def _one_tier(*usages: Usage) -> str | None:
    """The tier that served every call summed, or None: none said, or several (an empty usage,
    the start of a sum, names none)."""
    said = {usage.service_tier for usage in usages if usage.total_tokens or usage.service_tier}
    return said.pop() if len(said) == 1 else None


class AttemptRecord(BaseModel):
    """One ended attempt at a task's LLM call. `discarded`: the provider answered (and billed)
    but the task had moved on meanwhile (cancelled, or taken over), so the answer was dropped."""

    attempt: int
    started_at: float
    ended_at: float
    outcome: Literal["completed", "failed", "retry", "discarded"]
    error_code: str | None = None
    usage: Usage | None = None  # the attempt the provider billed: what it used and cost


WebhookTrigger = Literal["scheduled", "replay"]
WebhookOutcome = Literal["delivered", "retrying", "failed", "endpoint_disabled"]


class WebhookAttempt(BaseModel):
    """One HTTP attempt at a webhook event, as the task's or batch's delivery log keeps it."""

    at: datetime = Field(description="When the request was sent.")
    trigger: WebhookTrigger = Field(description="'scheduled': the event's own schedule; 'replay': asked for.")
    outcome: WebhookOutcome = Field(
        description="What the attempt led to: delivered; retrying (next_attempt_at says when); failed"
        " (no attempt follows; a scheduled event is in WebhookDLQ); endpoint_disabled (this failure"
        " disabled the endpoint)."
    )
    status_code: int | None = Field(
        default=None, description="The receiver's HTTP status; absent when none came."
    )
    error: str | None = Field(default=None, description="Why the attempt failed, in a sentence.")
    latency_ms: int = Field(ge=0, description="From sending the request to its answer or failure.")
    next_attempt_at: datetime | None = Field(default=None, description="When the next attempt is due.")


class WebhookAttemptList(BaseModel):
    """`GET /tasks/{id}/webhook/attempts` and the batch's: a page of the log, newest first."""

    data: list[WebhookAttempt]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; absent on the last page."
    )

    @classmethod
    def page(cls, log: list[WebhookAttempt], *, limit: int, cursor: str | None) -> WebhookAttemptList:
        """A page of a log kept oldest first, newest first; the cursor is where the next starts."""
        start = int(cursor) if cursor is not None else 0
        newest_first = log[::-1]
        end = start + limit
        return cls(data=newest_first[start:end], next_cursor=str(end) if end < len(log) else None)


# The attempts' cursor: a place in the log (it holds MAX_WEBHOOK_LOG entries at most).
WEBHOOK_ATTEMPTS_CURSOR_PATTERN = r"^[1-9][0-9]{0,3}$"


class WebhookReplay(BaseModel):
    """The `202` reply to a webhook replay: the event is queued for one attempt now."""

    webhook_id: str = Field(description="The event's id, the same as its first delivery's (webhook-id).")
    event_type: EventType
    status: Literal["queued"] = "queued"


class EnableWebhookEndpoint(Strict):
    """`POST /webhooks/endpoints/enable`: a webhook URL of the caller's to attempt again."""

    url: Text = Field(
        min_length=1, max_length=2048, description="The webhook URL, as tasks or batches give it."
    )


class WebhookEndpoint(BaseModel):
    """A webhook URL of the caller's, as deliveries to it now stand."""

    url: str
    status: Literal["enabled"] = "enabled"


def stored_as(read: TaskStatus) -> frozenset[TaskStatus]:
    """The statuses a task may be stored with when it reads as `read`: a dead-lettered task is
    stored processing and reads as failed (`Task.as_read`)."""
    if read is TaskStatus.FAILED:
        return frozenset({TaskStatus.FAILED, TaskStatus.PROCESSING})
    return frozenset({read})


def is_dead_lettered(status: TaskStatus, dead_letter_at: float | None, now: float) -> bool:
    """See `Task.is_dead_lettered` (also for readers that load a few fields of a task)."""
    return status is TaskStatus.PROCESSING and dead_letter_at is not None and dead_letter_at < now


@dataclass(frozen=True)
class Lease:
    """A claim's hold on a task: this id holds it until `until`, through this delivery (message
    and receive count) of its message; if that delivery dies, the task reads as dead-lettered
    from `dead_letter_at` on (its message's last delivery is then due)."""

    lease_id: str
    until: float
    message_id: str
    receive_count: int
    dead_letter_at: float


class ProviderCall(BaseModel):
    """A run's model step running in the provider's background mode: the response there, the
    key it runs on, and how often the worker has looked at it."""

    step: int
    response_id: str
    key_index: int
    model: str
    started_at: float
    polls: int = 0


class Task(BaseModel):
    """The stored task: one TasksTable item. Times are epoch seconds (expires_at is the TTL attribute)."""

    task_id: str
    tenant_id: str
    status: TaskStatus
    request: LLMRequest
    webhook_url: str | None = None
    webhook_events: list[EventType] | None = None  # None: all of them
    webhook_format: WebhookFormat | None = None  # None: llmtasks' own
    max_retries: int = 3
    timeout_s: float | None = None
    priority: Priority = "normal"
    metadata: dict[str, Any] | None = None
    batch_id: str | None = None
    batch_index: int | None = None  # the item's place in its batch, from 0
    custom_id: str | None = None  # the batch item's own id, if it gave one
    created_at: float
    expires_at: int
    # The submit request's X-Ray trace header: every message about the task carries it on.
    trace_header: str | None = None
    # Its API key's max_running at submit: the worker keeps the tenant's running calls under it.
    max_running: int | None = None
    # Its API key's tokens a minute at submit: the tenant's calls share them (worker/runner.py).
    tpm: int | None = None
    # The API key that submitted it (its id, never the key): what /usage groups its cost by.
    key_id: str | None = None
    # That key's budget at submit: a retry after a billed attempt reserves under it again.
    budget: Budget | None = None
    # Counts the task's status changes (each conditional write adds one), so the batch counters
    # apply each change once however often its stream record is processed.
    revision: int = 0
    started_at: float | None = None
    completed_at: float | None = None
    attempts: int = 0
    # A batch retry of the item (POST /batches/{id}/retry): when, and the attempts it had then,
    # so that its retries count from there (its attempt count and log keep the earlier run).
    retried_at: float | None = None
    attempts_before_retry: int = 0
    lease_id: str | None = None
    lease_until: float | None = None
    # The TaskQueue message whose delivery holds the lease, and its ApproximateReceiveCount then.
    lease_message_id: str | None = None
    lease_receive_count: int = 0
    # When the task counts as dead-lettered if no later delivery has claimed it: every delivery
    # the message had left was due by then (set at the claim; see TaskRunner.run).
    dead_letter_at: float | None = None
    next_attempt_at: float | None = None
    # When the running attempt was claimed, and each ended attempt: the console's timeline.
    attempt_started_at: float | None = None
    attempt_log: list[AttemptRecord] = Field(default_factory=list)
    result: str | None = None
    # The rest of the model's message beside its text: why it stopped, a refusal, the tool calls
    # it asked for, a reasoning summary where the provider gives one.
    finish_reason: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning: str | None = None
    # Where a result too large for the item lives (ResultsBucket key); `result` is then None.
    result_ref: str | None = None
    # While a call streams: its text so far (at most max_inline_result_bytes), its chunks, when.
    partial_result: str | None = None
    progress_tokens: int | None = None
    progress_at: float | None = None
    error: str | None = None
    error_code: str | None = None
    # The error of the latest failed attempt while retries remain (`error` is set only on failure).
    last_error: str | None = None
    last_error_code: str | None = None
    usage: Usage | None = None
    model: str | None = None
    # Which key of the LLM key pool served the completion (an index, never the key).
    llm_key_index: int | None = None
    webhook_status: WebhookStatus | None = None
    webhook_attempts: int = 0
    # Every HTTP attempt at its webhook, oldest first (the newest MAX_WEBHOOK_LOG kept).
    webhook_log: list[WebhookAttempt] = Field(default_factory=list)
    # A run (steps.py): its step cap, the tools the worker calls (URLs by name) and, while it
    # waits in requires_action, the calls it waits for and the model step that asked for them.
    max_steps: int | None = None
    tool_urls: dict[str, str] | None = None
    # Its MCP servers (their headers too: never shown back), and the calls of their tools the
    # client approved (POST /tasks/{id}/tool_outputs).
    mcp_servers: list[McpServer] | None = None
    approved_calls: list[str] | None = None
    required_action: RequiredAction | None = None
    action_step: int | None = None
    # A run whose model calls go in the provider's background mode, and the call running there
    # while no worker waits on it (the worker checks back: TaskRunner._background_step).
    provider_background: bool = False
    provider_call: ProviderCall | None = None

    @classmethod
    def submitted(
        cls,
        options: TaskOptions,
        *,
        task_id: str,
        tenant_id: str,
        created_at: float,
        expires_at: int,
        trace_header: str | None = None,
        max_running: int | None = None,
        tpm: int | None = None,
        key_id: str | None = None,
        budget: Budget | None = None,
        batch_id: str | None = None,
        batch_index: int | None = None,
        custom_id: str | None = None,
        cancelled_at: float | None = None,
    ) -> Task:
        """The one place a task's options become a Task, a submit's body or a batch item alike:
        what it asks of the LLM and how (retries, deadline, priority, metadata), and for a body
        with a webhook where its events go. A new option is a field of TaskOptions, one of Task
        and a line here. An item of a batch cancelled before it existed is created cancelled."""
        webhook = options if isinstance(options, SubmitTaskRequest) and options.webhook_url else None
        body = options if isinstance(options, SubmitTaskRequest) else None
        return cls(
            task_id=task_id,
            tenant_id=tenant_id,
            status=TaskStatus.PENDING if cancelled_at is None else TaskStatus.CANCELLED,
            request=options.llm_request(),
            webhook_url=webhook.webhook_url if webhook else None,
            webhook_events=sorted(set(webhook.webhook_events))
            if webhook and webhook.webhook_events
            else None,
            webhook_format=webhook.webhook_format if webhook else None,
            webhook_status=WebhookStatus.PENDING if webhook else None,
            max_retries=options.max_retries,
            timeout_s=options.timeout_s,
            priority=options.priority,
            metadata=options.metadata,
            batch_id=batch_id,
            batch_index=batch_index,
            custom_id=custom_id,
            created_at=created_at,
            expires_at=expires_at,
            completed_at=cancelled_at,
            trace_header=trace_header,
            max_running=max_running,
            tpm=tpm,
            key_id=key_id,
            budget=budget,
            max_steps=body.run_steps if body else None,
            tool_urls=body.tool_urls if body else None,
            mcp_servers=body.mcp_servers if body else None,
            provider_background=body.provider_background if body else False,
        )

    @property
    def is_run(self) -> bool:
        return self.max_steps is not None

    @property
    def billed_cost(self) -> Decimal:
        """What the provider billed for this task so far (exactly, as the counters add it)."""
        usage = self.billed_usage
        return Decimal(repr(usage.cost_usd)) if usage and usage.cost_usd else Decimal(0)

    @property
    def billed_usage(self) -> Usage | None:
        """What every attempt the provider billed used and cost, summed (retries included); for
        an item stored before attempts kept their usage, its completion's."""
        billed = [a.usage for a in self.attempt_log if a.usage is not None]
        if not billed:
            return self.usage
        total = billed[0]
        for usage in billed[1:]:
            total += usage
        return total

    @property
    def deadline(self) -> float | None:
        return None if self.timeout_s is None else self.created_at + self.timeout_s

    def is_expired(self, now: float) -> bool:
        return self.expires_at <= now

    def wants_webhook(self, event_type: EventType) -> bool:
        return self.webhook_url is not None and (
            self.webhook_events is None or event_type in self.webhook_events
        )

    @property
    def webhook_state(self) -> WebhookStatus | None:
        """The webhook's status as clients see it: a terminal event the task did not ask for
        is `skipped` (the relay sends nothing and writes nothing)."""
        unwanted = self.status.is_terminal and not self.wants_webhook(EVENT_OF_STATUS[self.status])
        if self.webhook_status is WebhookStatus.PENDING and unwanted:
            return WebhookStatus.SKIPPED
        return self.webhook_status

    def is_dead_lettered(self, now: float) -> bool:
        """Its message's last delivery has died (crash, timeout) or is past due: nothing runs the
        task again until TaskDLQ is redriven.

        Derived on read rather than written by a sweeper: no writer races a live worker, nothing
        runs while nothing fails, and a redriven message claims the task as it stands.
        """
        return is_dead_lettered(self.status, self.dead_letter_at, now)

    def as_read(self, now: float) -> Task:
        """The task as clients see it: a dead-lettered one reads as failed."""
        if not self.is_dead_lettered(now):
            return self
        return self.model_copy(
            update={
                "status": TaskStatus.FAILED,
                "error_code": DEAD_LETTERED,
                "error": (
                    f"The task's message was delivered {self.lease_receive_count} times; the last"
                    " delivery the worker saw stopped without finishing (a crash or a timeout) and no"
                    " later one can come, so the message is in TaskDLQ. `llmtasks dlq redrive` runs"
                    " the task again."
                ),
                "completed_at": self.lease_until,
            }
        )


class WebhookView(BaseModel):
    status: WebhookStatus
    attempts: int

    @classmethod
    def of(cls, status: WebhookStatus | None, attempts: int) -> WebhookView | None:
        return None if status is None else cls(status=status, attempts=attempts)


class Progress(BaseModel):
    tokens: int = Field(description="Chunks of the reply streamed so far (about one token each).")
    updated_at: datetime


class OutputMessage(BaseModel):
    """The model's message, in Chat Completions' shape."""

    role: Literal["assistant"] = "assistant"
    content: str | None = Field(default=None, description="Its text (the task's `result`).")
    refusal: str | None = Field(default=None, description="Why the model declined, when it did.")
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="The function calls it asked for, as the provider returned them."
    )
    reasoning: str | None = Field(
        default=None, description="A summary of its reasoning, where the provider gives one."
    )

    @classmethod
    def of(cls, task: Task) -> OutputMessage | None:
        if task.status is not TaskStatus.COMPLETED and task.error_code != INVALID_OUTPUT:
            return None
        return cls(
            content=task.result if task.result or not (task.refusal or task.tool_calls) else None,
            refusal=task.refusal,
            tool_calls=task.tool_calls,
            reasoning=task.reasoning,
        )


def parsed_output(task: Task) -> Any:
    """A completed task's JSON answer (response_format json_object or json_schema; the worker
    validated it against the schema), as an object; None otherwise."""
    if task.status is not TaskStatus.COMPLETED or not task.request.wants_json or not task.result:
        return None
    try:
        return json.loads(task.result)
    except ValueError:
        return None


class TaskView(BaseModel):
    """The public status object: `GET /tasks/{id}` and the webhook's `data`."""

    task_id: str
    status: TaskStatus
    result: str | None = Field(
        default=None,
        description="The model's text, once completed (kept on an invalid_output failure too).",
    )
    output: OutputMessage | None = Field(
        default=None, description="The model's whole message: text, refusal, tool calls."
    )
    finish_reason: str | None = Field(
        default=None, description="Why the model stopped: stop, length, tool_calls, content_filter."
    )
    parsed: Any = Field(
        default=None,
        description="With response_format json_schema or json_object: the answer as JSON, validated"
        " against the schema.",
    )
    partial_result: str | None = Field(
        default=None, description="While processing: the text the model has streamed so far."
    )
    progress: Progress | None = None
    error: str | None = None
    error_code: str | None = None
    attempts: int
    model: str | None = None
    usage: Usage | None = None
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    expires_at: datetime
    next_attempt_at: datetime | None = Field(default=None, description="When a retry is due, while pending.")
    metadata: dict[str, Any] | None = None
    batch_id: str | None = None
    webhook: WebhookView | None = None
    required_action: RequiredAction | None = Field(
        default=None, description="While requires_action: the calls whose outputs the run waits for."
    )

    @classmethod
    def of(cls, task: Task) -> TaskView:
        return cls(
            task_id=task.task_id,
            status=task.status,
            result=task.result,
            output=OutputMessage.of(task),
            finish_reason=task.finish_reason,
            parsed=parsed_output(task),
            partial_result=task.partial_result if task.status is TaskStatus.PROCESSING else None,
            progress=(
                Progress(tokens=task.progress_tokens, updated_at=_at(task.progress_at))
                if task.status is TaskStatus.PROCESSING and task.progress_tokens and task.progress_at
                else None
            ),
            error=task.error,
            error_code=task.error_code,
            attempts=task.attempts,
            model=task.model,
            usage=task.billed_usage,
            created_at=_at(task.created_at),
            started_at=_utc(task.started_at),
            completed_at=_utc(task.completed_at),
            expires_at=_at(task.expires_at),
            next_attempt_at=_utc(task.next_attempt_at) if task.status is TaskStatus.PENDING else None,
            metadata=task.metadata,
            batch_id=task.batch_id,
            webhook=WebhookView.of(task.webhook_state, task.webhook_attempts),
            required_action=task.required_action if task.status is TaskStatus.REQUIRES_ACTION else None,
        )


class TaskList(BaseModel):
    """`GET /tasks`: a page of the tenant's tasks, newest first. Entries leave out the answer:
    `result`, `output` and `parsed` (read the task for it)."""

    data: list[TaskView]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; absent on the last page."
    )


class TaskAccepted(BaseModel):
    """The `202` reply to `POST /tasks`."""

    task_id: str
    status: TaskStatus
    created_at: datetime
    expires_at: datetime

    @classmethod
    def of(cls, task: Task) -> TaskAccepted:
        return cls(
            task_id=task.task_id,
            status=task.status,
            created_at=_at(task.created_at),
            expires_at=_at(task.expires_at),
        )


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    errors: list[dict[str, Any]] | None = Field(default=None, description="Per-field validation errors.")
