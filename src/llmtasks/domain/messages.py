"""What crosses the queues and reaches webhook receivers, the tenant's signing secrets, and the
LLM's reply."""

from __future__ import annotations

import base64
import os
import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from llmtasks.domain.llm_request import ToolCall
from llmtasks.domain.models import BATCH_COMPLETED, EventType, TaskEventType, Usage, _utc

_WEBHOOK_ID_NAMESPACE = uuid.UUID("5d3c8a52-9d35-4b0a-9d43-3b6c6a1f3b11")


def webhook_id(subject_id: str, event_type: EventType) -> str:
    """Stable across every retry, redrive and replay of one event (of a task or a batch), so
    receivers can deduplicate on it."""
    return "msg_" + uuid.uuid5(_WEBHOOK_ID_NAMESPACE, f"{subject_id}/{event_type}").hex


class WebhookSecrets(BaseModel):
    """A tenant's signing secrets, as stored (the tenant's item in TasksTable)."""

    model_config = ConfigDict(extra="ignore")

    webhook_secret: str
    previous_webhook_secret: str | None = None
    previous_secret_until: float | None = None

    def signing(self, now: float) -> list[str]:
        """The secrets that sign a delivery now: during a rotation's overlap the previous one too,
        so a receiver still holding it keeps verifying (Standard Webhooks allows several)."""
        previous = self.previous_webhook_secret
        if previous and self.previous_secret_until is not None and self.previous_secret_until > now:
            return [self.webhook_secret, previous]
        return [self.webhook_secret]


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


class WebhookSecret(BaseModel):
    """`GET /webhooks/secret` and `POST /webhooks/secret/rotate`."""

    key: Annotated[str, Field(description="The tenant's Standard Webhooks secret, whsec_...")]
    previous_key_expires_at: datetime | None = Field(
        default=None, description="Until when deliveries are also signed with the previous secret."
    )

    @classmethod
    def of(cls, secrets: WebhookSecrets, now: float) -> WebhookSecret:
        live = len(secrets.signing(now)) > 1
        return cls(
            key=secrets.webhook_secret,
            previous_key_expires_at=_utc(secrets.previous_secret_until) if live else None,
        )


# --- queue bodies ---------------------------------------------------------------------------


class TaskMessage(BaseModel):
    """TaskQueue body: the task lives in the table; the message only points at it."""

    task_id: str


class FanoutMessage(BaseModel):
    """BatchFanoutQueue body: one chunk of a batch's items to create as tasks, to cancel, or to
    run again (a retry); a batch's input file to read (`read`, chunk 0); or an ended batch's
    outcomes to write to its files before it ends (`files`, chunk 0); or a look at one of a
    provider batch's jobs (`look`, see domain/provider_batches.py)."""

    batch_id: str
    chunk: int
    action: Literal["create", "cancel", "retry", "read", "files", "look"] = "create"
    # Which retry of the batch a "retry" message runs (Batch.retries once asked), or whose end a
    # "files" message writes.
    retry: int = 0
    # A provider batch's "look" at one of its chunk's jobs: which part, the job's looks before
    # it (a look whose number the job has passed is a copy: dropped), and how many of the job's
    # results earlier looks have ended items with already.
    part: int = 0
    looks: int = 0
    offset: int = 0


class WebhookMessage(BaseModel):
    """WebhookQueue body: one event to deliver, of a task or of a batch. `webhook_id` stays the
    same across every retry."""

    webhook_id: str
    event_type: EventType
    task_id: str | None = None
    batch_id: str | None = None
    # Attempts made before this message was sent (a deferred event is sent again as a new
    # message, whose receive count starts over): its attempt is this plus its receive count.
    attempts_before: int = Field(default=0, ge=0)
    # Times it was put off because its endpoint had every place taken: each waits longer.
    deferrals: int = Field(default=0, ge=0)
    # Sent again because its tenant asked (POST .../webhook/replay): one attempt, no schedule.
    replay: bool = False
    # Its URL's scheme, host and port (its group on WebhookQueue): a delivery takes one of the
    # endpoint's places before it reads anything, so an event put off costs no read. None in a
    # message sent before events carried it: read from its task or batch then.
    endpoint: str | None = None

    @classmethod
    def of_task(
        cls,
        task_id: str,
        event_type: TaskEventType,
        *,
        endpoint: str,
        replay: bool = False,
        occurrence: str | None = None,
    ) -> WebhookMessage:
        """`occurrence` tells apart events of one type a task sends more than once (a run's
        requires_action, once per wait)."""
        the_id = webhook_id(f"{task_id}/{occurrence}" if occurrence else task_id, event_type)
        return cls(
            webhook_id=the_id, task_id=task_id, event_type=event_type, endpoint=endpoint, replay=replay
        )

    @classmethod
    def of_batch(
        cls, batch_id: str, *, endpoint: str, retries: int = 0, replay: bool = False
    ) -> WebhookMessage:
        """A retried batch's end is an event of its own (its receiver must not take it for the
        first end's copy): its id names the retry."""
        subject = batch_id if not retries else f"{batch_id}/retry/{retries}"
        return cls(
            webhook_id=webhook_id(subject, BATCH_COMPLETED),
            batch_id=batch_id,
            event_type=BATCH_COMPLETED,
            endpoint=endpoint,
            replay=replay,
        )


# --- the LLM ------------------------------------------------------------------------------


class Completion(BaseModel):
    """The provider's answer: its text (empty when it only called tools or refused), the rest of
    its message, and what it used."""

    text: str
    model: str
    usage: Usage
    key_index: int | None = None  # which key of the pool served it (never the key itself)
    finish_reason: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning: str | None = None
