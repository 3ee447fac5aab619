"""The bodies a webhook receiver gets, both shapes side by side: llmtasks' own event (the status
object in `data`) and OpenAI's (for tasks and batches made through /v1, which OpenAI's SDK
unwraps), with the OpenAI ids they share with the /v1 routes. Both are signed alike (Standard
Webhooks) by the delivery (services/webhooks.py)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from pydantic import BaseModel, field_serializer

from llmtasks.domain.batches import BatchStatus, BatchView
from llmtasks.domain.models import EventType, TaskStatus, TaskView

# OpenAI's objects are llmtasks' own under a prefix: a response is a task, a batch a batch.
RESPONSE_ID_PREFIX = "resp_"
BATCH_ID_PREFIX = "batch_"
# The finish reasons that make a completed task an incomplete response, as OpenAI names the reason.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_id(task_id: str) -> str:
    return RESPONSE_ID_PREFIX + task_id


def task_id_of(response_id: str) -> str:
    return response_id.removeprefix(RESPONSE_ID_PREFIX)


class WebhookEvent(BaseModel):
    """The body POSTed to a webhook receiver."""

    type: EventType
    timestamp: datetime
    data: TaskView | BatchView

    @field_serializer("timestamp")
    def _iso(self, value: datetime) -> str:
        return value.isoformat().replace("+00:00", "Z")


def openai_event(webhook_id: str, subject: TaskView | BatchView) -> dict[str, Any]:
    """OpenAI's webhook event for a response or a batch that ended (response.completed,
    .incomplete for an answer cut short, .failed, .cancelled; batch.completed, .cancelled, .failed:
    its file refused whole), signed like llmtasks' own (Standard Webhooks), as OpenAI signs its."""
    if isinstance(subject, TaskView):
        ended = subject.status.value
        if subject.status is TaskStatus.COMPLETED and subject.finish_reason in INCOMPLETE_REASONS:
            ended = "incomplete"
        kind, object_id = "response." + ended, response_id(subject.task_id)
    else:
        ended = {BatchStatus.CANCELLED: "cancelled", BatchStatus.FAILED: "failed"}.get(
            subject.status, "completed"
        )
        kind, object_id = "batch." + ended, BATCH_ID_PREFIX + subject.batch_id
    return {
        "object": "event",
        "id": "evt_" + webhook_id.removeprefix("msg_"),
        "type": kind,
        "created_at": int(time.time()),
        "data": {"id": object_id},
    }
