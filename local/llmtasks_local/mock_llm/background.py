"""The mock's stored responses (background mode's clock) and OpenAI's webhook events.

A background response is `queued` for the first quarter of its think time (at most a second),
`in_progress` until its think time ends, then completed (or failed, incomplete); an asyncio task
of the mock's event loop ends it on time, and a read past its end ends it too. When a background
response ends, and `webhook_url` is set, the mock POSTs OpenAI's event for it (`{"id": "evt_...",
"object": "event", "type": "response.completed", "data": {"id": "resp_..."}}`), signed with the
Standard Webhooks headers as OpenAI signs them, retrying with back-off on a non-2xx or no answer.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
from standardwebhooks import Webhook

from llmtasks_local.mock_llm.config import MockConfig, MockStats
from llmtasks_local.mock_llm.request import ChatCall

# The responses kept for retrieval (the oldest forgotten past this many).
RESPONSE_ENTRIES = 10_000
QUEUED_MAX_S = 1.0
USER_AGENT = "OpenAI/1.0 (+https://platform.openai.com/docs/webhooks)"
WEBHOOK_TIMEOUT_S = 10.0
FINAL = ("completed", "failed", "incomplete", "cancelled")


@dataclass
class Stored:
    """One response the mock keeps: the call it answers, and its end once it has one."""

    id: str
    call: ChatCall
    items: list[Any]  # its input items, history included (for a next previous_response_id)
    key: str
    background: bool
    created_at: int
    think_s: float = 0.0
    fail: bool = False  # a background response drawn to fail (rate_500, [mock:background-fail])
    started: float = field(default_factory=time.monotonic)
    response: dict[str, Any] | None = None  # the final Response object, once it ended
    task: asyncio.Task[None] | None = None

    def status(self, now: float) -> str:
        if self.response is not None:
            return str(self.response["status"])
        elapsed = now - self.started
        return "queued" if elapsed < min(QUEUED_MAX_S, self.think_s / 4) else "in_progress"

    def due(self, now: float) -> bool:
        return self.response is None and now - self.started >= self.think_s


class ResponseStore:
    """The stored responses by id, the oldest forgotten past `RESPONSE_ENTRIES`."""

    def __init__(self, entries: int = RESPONSE_ENTRIES) -> None:
        self._entries = entries
        self._responses: OrderedDict[str, Stored] = OrderedDict()

    def add(self, stored: Stored) -> None:
        self._responses[stored.id] = stored
        while len(self._responses) > self._entries:
            _, old = self._responses.popitem(last=False)
            if old.task is not None:
                old.task.cancel()

    def get(self, response_id: str) -> Stored | None:
        return self._responses.get(response_id)


def event_type(status: str) -> str:
    return f"response.{status}"


class _Counts(Protocol):
    lock: threading.Lock
    stats: MockStats


def delivery_counter(mock: _Counts) -> Callable[[bool], None]:
    """`send_event`'s `counted` that counts each attempt in the mock's stats (read at the
    attempt: a reset in between starts them again)."""

    def counted(delivered: bool) -> None:
        with mock.lock:
            if delivered:
                mock.stats.webhooks_sent += 1
            else:
                mock.stats.webhook_failures += 1

    return counted


async def send_event(
    config: MockConfig, kind: str, response_id: str, counted: Callable[[bool], None]
) -> None:
    """POSTs OpenAI's webhook event `kind` about `response_id` to `config.webhook_url`, signed,
    until a 2xx or `webhook_attempts`; `counted(delivered)` after each attempt."""
    if config.webhook_url is None or config.webhook_secret is None:
        return
    signer = Webhook(config.webhook_secret)
    event = {
        "id": f"evt_mock{uuid.uuid4().hex}",
        "object": "event",
        "created_at": int(time.time()),
        "type": kind,
        "data": {"id": response_id},
    }
    payload = json.dumps(event)
    message_id = f"wh_mock{uuid.uuid4().hex}"  # the same on every attempt: receivers dedupe on it
    pause = config.webhook_retry_s
    async with httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S) as client:
        for attempt in range(config.webhook_attempts):
            now = datetime.now(tz=UTC)
            headers = {
                "content-type": "application/json",
                "user-agent": USER_AGENT,
                "webhook-id": message_id,
                "webhook-timestamp": str(int(now.timestamp())),
                "webhook-signature": signer.sign(message_id, now, payload),
            }
            try:
                answer = await client.post(config.webhook_url, content=payload, headers=headers)
                delivered = answer.is_success
            except httpx.HTTPError:
                delivered = False
            counted(delivered)
            if delivered:
                return
            if attempt + 1 < config.webhook_attempts:
                await asyncio.sleep(pause)
                pause *= 2
