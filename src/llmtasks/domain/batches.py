"""A batch: its request, the stored item with its counts, its views and results.

Long because a batch's models are one vocabulary, as a task's are in models.py: its request,
item, views, results and events change together and make the OpenAPI document.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from llmtasks.domain.budgets import Budget
from llmtasks.domain.fields import JsonObject, Strict, Text, WebhookUrl
from llmtasks.domain.json_schema import Ways, alternatives, each, exactly_one_of
from llmtasks.domain.llm_request import FIELD_NEEDS
from llmtasks.domain.models import (
    BATCH_COMPLETED,
    WEBHOOK_URL,
    WEBHOOK_URL_RULE,
    BatchEventType,
    EventType,
    OutputMessage,
    Priority,
    Task,
    TaskOptions,
    TaskStatus,
    Usage,
    WebhookAttempt,
    WebhookFormat,
    WebhookStatus,
    WebhookView,
    _at,
    _utc,
    parsed_output,
)
from llmtasks.domain.provider_batches import BatchMode, shown_counts
from llmtasks.domain.usage import BatchSpend

MAX_BATCH_ITEMS = 100_000
# A batch's input file (POST /batches/uploads, then {"input_file_id": ...}): read in one
# streaming pass by the fan-out, never whole; a line is one item's JSON.
MAX_INPUT_FILE_BYTES = 256 * 1024 * 1024
MAX_INPUT_LINE_BYTES = 1024 * 1024
# Refused lines a batch keeps on its item (all of them are in its refused-lines file).
REFUSED_SAMPLE = 20
FILE_ID_PATTERN = r"^file-[0-9a-f]{32}$"


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


ITEMS_OR_FILE: Ways = [{"items": True, "input_file_id": False}, {"items": False, "input_file_id": True}]


class BatchStatus(StrEnum):
    VALIDATING = "validating"  # its input file is being read (items not counted yet)
    FAILED = "failed"  # its input file was refused whole (no line to serve, too many): see errors
    PENDING = "pending"  # no item has started yet
    PROCESSING = "processing"
    COMPLETED = "completed"  # every item completed
    COMPLETED_WITH_ERRORS = "completed_with_errors"  # every item terminal, some failed or cancelled
    CANCELLING = "cancelling"  # cancel asked; items still running finish or are discarded
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in (
            BatchStatus.COMPLETED,
            BatchStatus.COMPLETED_WITH_ERRORS,
            BatchStatus.CANCELLED,
            BatchStatus.FAILED,
        )


class BatchItem(TaskOptions):
    """One item of `POST /batches`: a task body, without webhook fields (the batch has one)."""

    model_config = ConfigDict(json_schema_extra=each(exactly_one_of("prompt", "messages"), FIELD_NEEDS))

    custom_id: Text | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Your id for the item, unique in the batch; results carry it.",
    )


class SubmitBatchRequest(Strict):
    """`POST /batches`."""

    model_config = ConfigDict(json_schema_extra=alternatives(ITEMS_OR_FILE, WEBHOOK_URL))

    items: list[BatchItem] | None = Field(default=None, min_length=1, max_length=MAX_BATCH_ITEMS)
    input_file_id: str | None = Field(
        default=None,
        pattern=FILE_ID_PATTERN,
        description="Instead of `items`: a JSON Lines file of items uploaded through"
        " POST /batches/uploads (up to 256 MiB and 100,000 lines), read in the background; the"
        " batch is `validating` until then, and its refused lines are reported by line number.",
    )
    webhook_url: WebhookUrl | None = Field(
        default=None, description="URL that receives `batch.completed`, signed. " + WEBHOOK_URL_RULE
    )
    webhook_events: list[BatchEventType] | None = Field(default=None, min_length=1)
    webhook_format: WebhookFormat | None = Field(
        default=None,
        description="'openai': OpenAI's webhook events (batch.completed, batch.cancelled, with data.id"
        " the OpenAI batch id) instead of llmtasks' own (the default).",
    )
    metadata: JsonObject | None = Field(default=None, description="Up to 2 KiB of JSON, echoed back.")
    priority: Priority | None = Field(
        default=None, description="The items' priority, for those that do not give their own."
    )
    mode: BatchMode = Field(
        default="tasks",
        description="'tasks': each item runs as an on-demand call (the default). 'provider': the"
        " items are sent as the provider's own batch jobs (OpenAI's Batch API), answered within"
        " 24 hours at its batch price; counts, results, cancel, retry and the webhook as for"
        " 'tasks'. Refused (422) on a provider without a batch API.",
    )

    @field_validator("items")
    @classmethod
    def _unique_custom_ids(cls, items: list[BatchItem] | None) -> list[BatchItem] | None:
        if items is None:
            return items
        seen: set[str] = set()
        for index, item in enumerate(items):
            if item.custom_id is not None:
                if item.custom_id in seen:
                    raise ValueError(f"items[{index}].custom_id '{item.custom_id}' is used twice")
                seen.add(item.custom_id)
        return items

    @model_validator(mode="after")
    def _items_or_a_file(self) -> SubmitBatchRequest:
        if (self.items is None) == (self.input_file_id is None):
            raise ValueError("give either 'items' or 'input_file_id'")
        return self

    @model_validator(mode="after")
    def _items_take_the_batch_s_priority(self) -> SubmitBatchRequest:
        if self.priority is not None:
            for item in self.items or []:
                if "priority" not in item.model_fields_set:
                    item.priority = self.priority
        return self

    @model_validator(mode="after")
    def _events_need_a_url(self) -> SubmitBatchRequest:
        if self.webhook_events is not None and self.webhook_url is None:
            raise ValueError("'webhook_events' needs a 'webhook_url'")
        if self.webhook_format is not None and self.webhook_url is None:
            raise ValueError("'webhook_format' needs a 'webhook_url'")
        return self


ITEM_COUNTS = ("pending", "processing", "completed", "failed", "cancelled")
RetriedStatus = Literal["failed", "cancelled"]


class RetryBatchRequest(Strict):
    """`POST /batches/{id}/retry`: which ended items to run again."""

    statuses: list[RetriedStatus] = Field(
        default_factory=lambda: list[RetriedStatus](["failed"]),
        min_length=1,
        max_length=2,
        description="The item statuses to run again: failed (the default), cancelled, or both.",
    )


class RefusedLine(BaseModel):
    """A line of a batch's input file that is not an item: why, by its line number (from 1)."""

    line: int = Field(ge=1)
    custom_id: str | None = None
    error: str


# A batch input file whose lines are batch items (POST /batches); any other format names the
# OpenAI endpoint whose request lines the file holds.
LLMTASKS_FORMAT = "llmtasks"


class BatchInput(BaseModel):
    """Where a batch made from a file (POST /batches with input_file_id) took its items from, and
    what reading it found."""

    file_id: str
    # llmtasks: each line is a batch item; else OpenAI's request lines for this endpoint.
    format: str = LLMTASKS_FORMAT
    priority: Priority | None = None  # for the lines that give none
    refused: int = 0  # lines that are not items (every one is in the refused-lines file)
    refused_sample: list[RefusedLine] = Field(default_factory=list)
    errors: list[str] | None = None  # why the whole file was refused (the batch is failed)


class BatchFiles(BaseModel):
    """The files an ended batch's outcomes were written to (the OpenAI surface's output and error
    files); None: no such file (nothing went there)."""

    output_file_id: str | None = None
    error_file_id: str | None = None


class Batch(BaseModel):
    """The stored batch: one TasksTable item (`batch#<id>`). Its items are tasks whose ids follow
    from the batch id and their index; the counters move as the items' statuses do."""

    batch_id: str
    tenant_id: str
    # As stored: pending until it ends (processing is derived from the counters), or cancelling.
    status: BatchStatus
    total: int
    pending: int = 0
    processing: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    # Where each fan-out chunk's items start in the manifest (ResultsBucket), and where it ends.
    manifest_ref: str
    chunk_size: int
    chunk_offsets: list[int]
    metadata: dict[str, Any] | None = None
    webhook_url: str | None = None
    webhook_events: list[EventType] | None = None
    webhook_format: WebhookFormat | None = None  # None: llmtasks' own
    webhook_status: WebhookStatus | None = None
    webhook_attempts: int = 0
    webhook_log: list[WebhookAttempt] = Field(default_factory=list)
    created_at: float
    expires_at: int
    cancel_requested_at: float | None = None
    completed_at: float | None = None
    # The submit request's X-Ray trace header, passed on to the items and their messages.
    trace_header: str | None = None
    # Its API key's max_running at submit, passed on to the items.
    max_running: int | None = None
    tpm: int | None = None  # its API key's tokens a minute, passed on to the items
    key_id: str | None = None  # the API key that submitted it, passed on to the items
    budget: Budget | None = None  # that key's budget: its items reserve under it as they fan out
    # The last event's sequence number (GET /batches/{id}/events): 0 before the first.
    events: int = 0
    # Times it was retried (POST /batches/{id}/retry), and the item statuses the last one ran again.
    retries: int = 0
    retry_statuses: list[TaskStatus] | None = None
    retry_requested_at: float | None = None
    # Items the retry has yet to move back to pending: the batch cannot end before it has.
    retrying: int = 0
    input: BatchInput | None = None  # a batch made from an uploaded file
    # Its API key's max_in_flight at submit: a file's items are weighed against it once read.
    max_in_flight: int | None = None
    # Where its outcomes were written as it ended (see ends_in_files): its last end's.
    files: BatchFiles | None = None
    mode: BatchMode = "tasks"  # provider: its chunks run as the provider's batch jobs
    # A provider batch's jobs' request counts at their last look: "<chunk>-<part>" ->
    # [completed, failed] (GET /batches/{id} shows them while the items are still processing).
    provider_counts: dict[str, list[int]] | None = None

    def is_expired(self, now: float) -> bool:
        return self.expires_at <= now

    @property
    def finished(self) -> int:
        """Items that have ended: the counters are exact, so at `total` every item has."""
        return self.completed + self.failed + self.cancelled

    @property
    def all_ended(self) -> bool:
        """Every item has ended, and no retry has items still to run again (a file still being
        read has items to come)."""
        return (
            self.status is not BatchStatus.VALIDATING and self.finished >= self.total and self.retrying <= 0
        )

    @property
    def ends_in_files(self) -> bool:
        """Its outcomes go to files as it ends (a batch made through the OpenAI surface, whose
        input file's lines are OpenAI's requests): it ends once BatchFunction has written them,
        so a client told it ended (a read, a webhook) finds them."""
        return self.input is not None and self.input.format != LLMTASKS_FORMAT

    @property
    def chunks(self) -> int:
        return len(self.chunk_offsets) - 1

    def chunk_of(self, index: int) -> int:
        return index // self.chunk_size

    def indexes(self, chunk: int) -> range:
        return range(chunk * self.chunk_size, min(self.total, (chunk + 1) * self.chunk_size))

    def final_status(self) -> BatchStatus:
        """What the batch ends as once every item is terminal."""
        if self.status is BatchStatus.CANCELLING:
            return BatchStatus.CANCELLED
        if self.completed == self.total:
            return BatchStatus.COMPLETED
        return BatchStatus.COMPLETED_WITH_ERRORS

    @property
    def read_status(self) -> BatchStatus:
        started = self.pending < self.total
        if self.status is BatchStatus.PENDING and started:
            return BatchStatus.PROCESSING
        return self.status

    def wants_webhook(self) -> bool:
        return self.webhook_url is not None and (
            self.webhook_events is None or BATCH_COMPLETED in self.webhook_events
        )


class BatchView(BaseModel):
    """`GET /batches/{id}`, and the `batch.completed` webhook's `data`."""

    batch_id: str
    status: BatchStatus
    total: int
    pending: int
    processing: int
    completed: int
    failed: int
    cancelled: int
    created_at: datetime
    completed_at: datetime | None = None
    expires_at: datetime
    metadata: dict[str, Any] | None = None
    webhook: WebhookView | None = None
    retries: int = Field(default=0, description="Times its failed or cancelled items were run again.")
    mode: BatchMode = Field(
        default="tasks", description="How its items run: on-demand calls, or the provider's batch jobs."
    )
    events: int = Field(
        default=0,
        description="Its last event's sequence number: pass it as `after` to GET /batches/{id}/events"
        " to follow the batch from this read on.",
    )
    usage: Usage | None = Field(
        default=None,
        description="Its items' billed calls, summed (retries included); absent before the first.",
    )
    budget_exhausted: int = Field(
        default=0,
        description="Items created failed (budget_exhausted): its key's budget had no room for them.",
    )
    input_file_id: str | None = Field(default=None, description="The file its items were read from.")
    refused_lines: int = Field(
        default=0,
        description="Lines of its input file that are not items; each one, with why, is in"
        " GET /batches/{id}/refused (the first 20 are here).",
    )
    refused: list[RefusedLine] | None = Field(default=None, description="The first refused lines.")
    errors: list[str] | None = Field(
        default=None, description="Why the whole input file was refused (the batch is failed)."
    )

    @property
    def finished(self) -> int:
        """Items that have ended (completed, failed or cancelled)."""
        return self.completed + self.failed + self.cancelled

    @classmethod
    def of(cls, batch: Batch, spend: BatchSpend | None = None) -> BatchView:
        counts = {name: getattr(batch, name) for name in ITEM_COUNTS}
        if batch.mode == "provider" and not batch.status.is_terminal and not batch.retries:
            counts = shown_counts(counts, batch.total, batch.provider_counts)
        return cls(
            batch_id=batch.batch_id,
            status=batch.read_status,
            total=batch.total,
            mode=batch.mode,
            **counts,
            created_at=_at(batch.created_at),
            completed_at=_utc(batch.completed_at),
            expires_at=_at(batch.expires_at),
            metadata=batch.metadata,
            webhook=WebhookView.of(batch.webhook_status, batch.webhook_attempts),
            retries=batch.retries,
            events=batch.events,
            usage=spend.usage if spend else None,
            budget_exhausted=spend.budget_exhausted if spend else 0,
            **_input_fields(batch.input),
        )


def _input_fields(read: BatchInput | None) -> dict[str, Any]:
    if read is None:
        return {}
    return {
        "input_file_id": read.file_id,
        "refused_lines": read.refused,
        "refused": read.refused_sample or None,
        "errors": read.errors,
    }


class BatchUpload(BaseModel):
    """`POST /batches/uploads`: where to PUT a batch's input file, then name it in POST /batches."""

    file_id: str = Field(description="Give it as `input_file_id` to POST /batches once the PUT is done.")
    upload_url: str = Field(
        description="PUT the file's bytes here (one request, no other header needed): they go straight"
        " to storage, never through the API."
    )
    method: Literal["PUT"] = "PUT"
    expires_at: datetime = Field(description="The URL works until then; an upload never made costs nothing.")
    max_bytes: int = Field(description="The largest file a batch reads.")
    max_items: int = Field(description="The most items (lines) a batch holds.")


class BatchAccepted(BaseModel):
    """The `202` reply to `POST /batches`."""

    batch_id: str
    total: int
    status: BatchStatus
    created_at: datetime
    expires_at: datetime

    @classmethod
    def of(cls, batch: Batch) -> BatchAccepted:
        return cls(
            batch_id=batch.batch_id,
            total=batch.total,
            status=batch.read_status,
            created_at=_at(batch.created_at),
            expires_at=_at(batch.expires_at),
        )


class BatchResult(BaseModel):
    """One item of `GET /batches/{id}/results`, in submission order."""

    index: int
    custom_id: str | None = None
    task_id: str
    status: TaskStatus
    result: str | None = None
    output: OutputMessage | None = Field(
        default=None, description="The model's whole message: text, refusal, tool calls."
    )
    finish_reason: str | None = None
    parsed: Any = Field(
        default=None, description="With a JSON response_format: the answer, validated against its schema."
    )
    error: str | None = None
    error_code: str | None = None
    attempts: int = 0
    usage: Usage | None = None

    @classmethod
    def of(cls, task: Task) -> BatchResult:
        return cls(
            index=task.batch_index or 0,
            custom_id=task.custom_id,
            task_id=task.task_id,
            status=task.status,
            result=task.result,
            output=OutputMessage.of(task),
            finish_reason=task.finish_reason,
            parsed=parsed_output(task),
            error=task.error,
            error_code=task.error_code,
            attempts=task.attempts,
            usage=task.billed_usage,
        )


class BatchResults(BaseModel):
    data: list[BatchResult]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; absent on the last page."
    )


# A page of batch events at most: one BatchGetItem's worth.
MAX_PAGE_EVENTS = 100


class BatchCounts(BaseModel):
    """The batch's items by status."""

    pending: int
    processing: int
    completed: int
    failed: int
    cancelled: int


class BatchEventItem(BaseModel):
    index: int = Field(ge=0, description="The item's place in the batch, from 0.")
    custom_id: str | None = None
    task_id: str
    status: TaskStatus = Field(description="Its status after the event.")


class BatchEvent(BaseModel):
    """Items of the batch whose status changed together (one count of the batch's stream), and
    the batch's counts after them."""

    sequence: int = Field(ge=1, description="Its place in the batch's events, from 1; pass as `after`.")
    items: list[BatchEventItem] = Field(description="The items whose status changed, in index order.")
    counts: BatchCounts
    at: datetime


class BatchEventPage(BaseModel):
    """`GET /batches/{id}/events`: the events after `after`, in order."""

    batch_id: str
    events: list[BatchEvent]
    after: int = Field(
        ge=0, description="The last event's sequence number so far: pass it as `after` to read on."
    )
    final: bool = Field(description="No event follows: the batch has ended and this page has its last event.")
    status: BatchStatus = Field(description="The batch's status when the page was read.")


@dataclass(frozen=True)
class StoredFile:
    """A file a tenant uploaded for the OpenAI Batch API (or one a batch wrote: its output, its
    errors), as the results bucket keeps it."""

    file_id: str
    filename: str
    purpose: str
    size: int
    created_at: float
    # An input file's (purpose user_data or vision): its media type as uploaded, and a PDF's
    # pages as counted when it was stored (None: not counted).
    mime_type: str | None = None
    pages: int | None = None


# OpenAI's Uploads API: a file sent in parts, each within a request's 6 MB (base64-encoded in
# the invocation's event: about 4.5 MB of bytes), then made whole.
UPLOAD_TTL_S = 3600  # a pending upload expires an hour after it began (OpenAI's default)
UploadStatus = Literal["pending", "completed", "cancelled", "expired"]


class FileUpload(BaseModel):
    """One upload of OpenAI's Uploads API, as the results bucket keeps it (beside its parts)."""

    upload_id: str
    tenant_id: str
    file_id: str  # the file it makes once completed
    bytes: int
    filename: str
    purpose: str
    created_at: float
    expires_at: float
    status: UploadStatus = "pending"
    mime_type: str | None = None

    def status_at(self, now: float) -> UploadStatus:
        return "expired" if self.status == "pending" and now >= self.expires_at else self.status
