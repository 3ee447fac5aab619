"""Webhooks: the SSRF guard, Standard Webhooks signing, and delivery of one event.

The flow: the worker's terminal write appears on the table's stream; the webhook function relays
it to WebhookQueue (`WebhookRelay`), and delivers from there (`WebhookDelivery`) with retries
as visibility delays, so one slow receiver never holds up a stream shard and no completion is
lost between two writes.

Long because an event's delivery is one path (relay, guard, sign, send, schedule the retry),
kept in the order it runs.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from llmtasks.aws.batch_store import BatchStore
from llmtasks.aws.limits import Take
from llmtasks.aws.results import ResultBlobs
from llmtasks.domain.batches import Batch, BatchView
from llmtasks.domain.errors import RetryLater
from llmtasks.domain.events import WebhookEvent, openai_event
from llmtasks.domain.messages import WebhookMessage, new_webhook_secret
from llmtasks.domain.models import (
    BATCH_COMPLETED,
    EVENT_OF_STATUS,
    TASK_REQUIRES_ACTION,
    Task,
    TaskStatus,
    TaskView,
    WebhookAttempt,
    WebhookOutcome,
    WebhookStatus,
    WebhookTrigger,
    _at,
)
from llmtasks.domain.retry_after import parse_retry_after
from llmtasks.observability import Metric, emit, logger, task_keys
from llmtasks.services.signing import signed_headers
from llmtasks.services.webhook_places import PLACE_MARGIN_S, EndpointPlaces
from llmtasks.services.webhook_urls import (
    Resolver,
    UnsafeWebhookUrl,
    check_webhook_url,
    endpoint_of,
    system_resolver,
)

if TYPE_CHECKING:
    import httpx

    from llmtasks.aws.limits import RunningCalls
    from llmtasks.aws.queues import Queue
    from llmtasks.aws.store import TaskStore
    from llmtasks.aws.webhook_records import EndpointHealth
    from llmtasks.settings import WebhookSettings

# An event whose endpoint has every place taken comes back after this, doubled each time it is
# put off again, but never later than the timeout of the endpoint's oldest open delivery (a place
# is free by then): a hung endpoint's events wait no longer than its deliveries can. (SQS delays
# are whole seconds: the first comes back at once, the next after about 1, 1, 2, 5, 10 s.) A busy
# endpoint's events wait in their invocation first (webhook_places.PLACE_WAIT_S).
DEFER_BASE_S = 0.3


@dataclass(frozen=True)
class DeliveryResult:
    delivered: bool
    status_code: int | None = None
    gone: bool = False  # 410: the receiver asks never to be called again for this
    retry_after: float | None = None
    error: str = ""


class WebhookSender:
    """Signs and POSTs one event. Redirects are not followed (a 3xx is a failed attempt)."""

    def __init__(
        self,
        *,
        timeout_s: float,
        allowed_hosts: frozenset[str],
        resolve: Resolver = system_resolver,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._allowed_hosts = allowed_hosts
        self._resolve = resolve
        self._transport = transport

    @staticmethod
    def sign(secrets: list[str], *, message_id: str, timestamp: datetime, body: str) -> dict[str, str]:
        """Standard Webhooks headers; several secrets give several space-separated signatures."""
        return signed_headers(secrets, message_id=message_id, timestamp=timestamp, body=body)

    async def send(self, url: str, *, message_id: str, body: str, secrets: list[str]) -> DeliveryResult:
        try:
            # Again at send time: DNS may have changed since the task was submitted.
            check_webhook_url(url, allowed_hosts=self._allowed_hosts, resolve=self._resolve)
        except UnsafeWebhookUrl as exc:
            return DeliveryResult(delivered=False, gone=True, error=exc.detail)
        headers = {
            "content-type": "application/json",
            "user-agent": "llmtasks-webhooks/1",
            **self.sign(secrets, message_id=message_id, timestamp=datetime.now(tz=UTC), body=body),
        }
        import httpx  # here, not at the top: the submit and status functions never send

        try:
            async with httpx.AsyncClient(transport=self._transport, follow_redirects=False) as client:
                response = await client.post(
                    url, content=body.encode(), headers=headers, timeout=self._timeout_s
                )
        except httpx.TimeoutException:
            return DeliveryResult(delivered=False, error=f"no answer within {self._timeout_s:g} s")
        except httpx.TransportError as exc:
            return DeliveryResult(delivered=False, error=f"connection failed ({type(exc).__name__})")
        status = response.status_code
        return DeliveryResult(
            delivered=200 <= status < 300,
            status_code=status,
            gone=status == 410,
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            error="" if 200 <= status < 300 else f"receiver answered {status}",
        )


class WebhookRelay:
    """Stream side: a task or batch that just ended and has a webhook_url gets one queued event,
    grouped by its endpoint (WebhookQueue's fair queue: an endpoint with many events in flight
    waits behind the others)."""

    def __init__(self, webhook_queue: Queue) -> None:
        self._queue = webhook_queue

    def relay_change(self, old: Task | Batch | None, new: Task | Batch) -> bool:
        """A task's or a batch's change, as one stream record shows it."""
        if isinstance(new, Batch):
            return self.relay_batch(old if isinstance(old, Batch) else None, new)
        return self.relay(old if isinstance(old, Task) else None, new)

    def relay(self, old: Task | None, new: Task) -> bool:
        if new.status is TaskStatus.REQUIRES_ACTION:
            return self._relay_wait(old, new)
        if not new.webhook_url or not new.status.is_terminal or (old is not None and old.status.is_terminal):
            return False  # the stream filter should not have let it through; changes nothing
        event_type = EVENT_OF_STATUS[new.status]
        if not new.wants_webhook(event_type):
            logger.info("webhook not wanted for this event", event_type=event_type, **task_keys(new))
            return False
        endpoint = endpoint_of(new.webhook_url)
        self._queue.send(
            WebhookMessage.of_task(new.task_id, event_type, endpoint=endpoint),
            trace_header=new.trace_header,
            group=endpoint,
        )
        logger.info("webhook queued", event_type=event_type, **task_keys(new))
        return True

    def _relay_wait(self, old: Task | None, new: Task) -> bool:
        """A run that just stopped for its client's tool outputs: task.requires_action, an
        event of its own each wait (OpenAI's webhook events have none such: not sent in theirs)."""
        waited = old is not None and old.status is TaskStatus.REQUIRES_ACTION
        if not new.webhook_url or waited or new.webhook_format == "openai":
            return False
        if not new.wants_webhook(TASK_REQUIRES_ACTION):
            return False
        endpoint = endpoint_of(new.webhook_url)
        occurrence = f"step-{new.action_step}"
        message = WebhookMessage.of_task(
            new.task_id, TASK_REQUIRES_ACTION, endpoint=endpoint, occurrence=occurrence
        )
        self._queue.send(message, trace_header=new.trace_header, group=endpoint)
        logger.info("webhook queued", event_type=TASK_REQUIRES_ACTION, **task_keys(new))
        return True

    def relay_batch(self, old: Batch | None, new: Batch) -> bool:
        ended = new.status.is_terminal and (old is None or not old.status.is_terminal)
        if not ended or not new.wants_webhook():
            return False
        endpoint = endpoint_of(new.webhook_url or "")
        message = WebhookMessage.of_batch(new.batch_id, endpoint=endpoint, retries=new.retries)
        self._queue.send(message, group=endpoint)
        logger.info("webhook queued", batch_id=new.batch_id, event_type=BATCH_COMPLETED)
        return True


class WebhookDelivery:
    """Queue side: one attempt at one event; raises RetryLater while attempts remain."""

    def __init__(
        self,
        settings: WebhookSettings,
        store: TaskStore,
        dead_letters: Queue,
        sender: WebhookSender,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        results: ResultBlobs,
        batches: BatchStore | None = None,
        places: RunningCalls | None = None,
        requeue: Queue | None = None,
    ) -> None:
        """`places` counts each endpoint's open deliveries (under webhook_endpoint_concurrency);
        `requeue` (WebhookQueue) takes the events put off meanwhile."""
        if settings.webhook_endpoint_concurrency and (places is None or requeue is None):
            raise ValueError("a cap on each endpoint's deliveries needs its places and WebhookQueue")
        self._places = (
            EndpointPlaces(
                places,
                cap=settings.webhook_endpoint_concurrency,
                timeout_s=settings.webhook_timeout_s,
                clock=clock,
                rng=rng,
            )
            if places is not None and settings.webhook_endpoint_concurrency
            else None
        )
        self._requeue = requeue
        self._settings = settings
        self._store = store
        self._batches = batches
        self._dead_letters = dead_letters
        self._sender = sender
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._results = results

    def _subject(self, message: WebhookMessage) -> _Subject | None:
        """What the event is about, as it is now: its task or its batch (None once it is gone)."""
        now = self._clock()
        if message.batch_id is not None:
            batches = self._batches
            batch = batches.get(message.batch_id, now=now) if batches else None
            if batches is None or batch is None or not batch.webhook_url:
                return None
            batch_id = batch.batch_id
            return _Subject(
                url=batch.webhook_url,
                tenant_id=batch.tenant_id,
                data=BatchView.of(batch, batches.spend(batch_id)),
                record=lambda status, attempt: batches.record_webhook_outcome(
                    batch_id, status=status, attempt=attempt, log=batch.webhook_log
                ),
                log={"batch_id": batch_id},
                openai=batch.webhook_format == "openai",
            )
        task = self._store.get(message.task_id or "", now=now)
        if task is None or not task.webhook_url:
            return None
        task_id = task.task_id
        # A wait's event logs its attempts, and leaves the status to the terminal event's.
        kept = task.webhook_status or WebhookStatus.PENDING
        waits = message.event_type == TASK_REQUIRES_ACTION
        return _Subject(
            url=task.webhook_url,
            tenant_id=task.tenant_id,
            data=TaskView.of(self._results.hydrate(task)),
            record=lambda status, attempt: self._store.record_webhook_outcome(
                task_id,
                status=kept if waits and status is not WebhookStatus.ENDPOINT_DISABLED else status,
                attempt=attempt,
                log=task.webhook_log,
            ),
            log=task_keys(task),
            openai=task.webhook_format == "openai",
        )

    async def deliver(self, message: WebhookMessage, *, receive_count: int) -> None:
        """`receive_count` is SQS's count of this message's deliveries; with the attempts made
        before the message was sent (a deferred event's), it is this attempt's number. A
        redriven event starts again at 1 and gets the full schedule; a replay has one attempt."""
        attempt = message.attempts_before + receive_count
        # The reads and writes around the request run in threads: an invocation's deliveries
        # share one event loop, and a blocking call would hold up every other one's.
        subject: _Subject | None = None
        endpoint = message.endpoint
        if endpoint is None:  # a message sent before events carried their endpoint
            subject = await asyncio.to_thread(self._subject, message)
            if subject is None:
                return _dropped(message)
            endpoint = endpoint_of(subject.url)
        place = await self._places.take(endpoint, message.webhook_id) if self._places else Take(taken=True)
        if not place:
            # Put off before anything is read: an endpoint that hangs costs its events a write
            # and a send each round, no more.
            await asyncio.to_thread(self._defer, message, attempt, endpoint, place.held)
            return
        try:
            if subject is None:
                subject = await asyncio.to_thread(self._subject, message)
            if subject is None:
                return _dropped(message)
            await self._attempt(message, attempt, subject)
        finally:
            if self._places is not None:
                await self._places.give_back(endpoint, message.webhook_id)

    async def _attempt(self, message: WebhookMessage, attempt: int, subject: _Subject) -> None:
        """One HTTP attempt at the event (its endpoint's place held), and what it leads to."""
        health = await asyncio.to_thread(self._health, subject)
        if health is not None and health.disabled:
            await asyncio.to_thread(subject.record, WebhookStatus.ENDPOINT_DISABLED, None)
            logger.warning("webhook not attempted: its endpoint is disabled", url=subject.url, **subject.log)
            return
        secrets = await asyncio.to_thread(
            self._store.tenants.secrets, subject.tenant_id, new_secret=new_webhook_secret()
        )
        sent_at, started = self._clock(), time.monotonic()
        result = await self._sender.send(
            subject.url,
            message_id=message.webhook_id,
            body=subject.body(message),
            secrets=secrets.signing(sent_at),
        )
        latency_ms = round((time.monotonic() - started) * 1000)
        logged = _Attempt(sent_at, "replay" if message.replay else "scheduled", result, latency_ms)
        # pragma: no mutate start, the keys of its log lines
        log: dict[str, Any] = {**subject.log, "attempt": attempt, "status_code": result.status_code}
        # pragma: no mutate end
        emit(Metric.WEBHOOK_ATTEMPTS)
        if result.delivered:
            if health is not None and health.failing_since is not None:
                await asyncio.to_thread(self._store.endpoints.recovered, subject.tenant_id, subject.url)
            await asyncio.to_thread(subject.record, WebhookStatus.DELIVERED, logged.entry("delivered"))
            logger.info("webhook delivered", **log)
            return
        emit(Metric.WEBHOOK_FAILURES)
        if await asyncio.to_thread(self._endpoint_failed, subject, result, sent_at):
            await asyncio.to_thread(
                subject.record, WebhookStatus.ENDPOINT_DISABLED, logged.entry("endpoint_disabled")
            )
            return
        if message.replay or result.gone or attempt >= self._settings.webhook_attempts:
            if not message.replay:
                # Parked where `llmtasks dlq redrive --queue webhooks` can replay it, same webhook-id.
                await asyncio.to_thread(self._dead_letters.send, message)
            await asyncio.to_thread(subject.record, WebhookStatus.FAILED, logged.entry("failed"))
            logger.warning("webhook failed", error=result.error, replay=message.replay, **log)
            return
        delay = self._settings.webhook_retry_schedule[attempt - 1]
        delay = delay * self._rng.uniform(0.8, 1.2)  # jitter, so retries of many events spread out
        if result.retry_after is not None:
            delay = max(delay, result.retry_after)
        await asyncio.to_thread(
            subject.record, WebhookStatus.RETRYING, logged.entry("retrying", next_at=self._clock() + delay)
        )
        logger.info("webhook retry scheduled", error=result.error, delay_s=round(delay, 1), **log)
        raise RetryLater(delay, result.error)

    def _health(self, subject: _Subject) -> EndpointHealth | None:
        """The URL's health where failing URLs are disabled (None where they never are)."""
        if not self._settings.webhook_endpoint_disable_after_s:
            return None
        return self._store.endpoints.health(subject.tenant_id, subject.url)

    def _endpoint_failed(self, subject: _Subject, result: DeliveryResult, now: float) -> bool:
        """Counts the failure against the URL; True when that disabled it (said once, here)."""
        disable_after = self._settings.webhook_endpoint_disable_after_s
        if not disable_after:
            return False
        endpoints = self._store.endpoints
        if not endpoints.failed(
            subject.tenant_id, subject.url, error=result.error, now=now, disable_after_s=disable_after
        ):
            return False
        emit(Metric.WEBHOOK_ENDPOINTS_DISABLED)
        # pragma: no mutate start, a log line's words and keys, for operators
        logger.warning(
            "webhook endpoint disabled: it failed for the whole disable period with no success;"
            " its tenant enables it again (POST /webhooks/endpoints/enable) and replays what it missed",
            url=subject.url,
            tenant_id=subject.tenant_id,
            disable_after_s=disable_after,
            error=result.error,
        )
        # pragma: no mutate end
        return True

    def _defer_s(self, held: dict[str, float], deferrals: int) -> float:
        """How long to put an event off that was put off `deferrals` times before, from the
        endpoint's open deliveries (each with until when its place holds: its start, plus the
        timeout and PLACE_MARGIN_S)."""
        wanted: float = min(self._settings.webhook_timeout_s, DEFER_BASE_S * 2.0**deferrals)
        if not held:
            return DEFER_BASE_S  # freed since the take was refused
        frees_in = min(held.values()) - PLACE_MARGIN_S - self._clock()
        return max(DEFER_BASE_S, min(wanted, frees_in))

    def _defer(self, message: WebhookMessage, attempt: int, endpoint: str, held: dict[str, float]) -> None:
        """The event again, later, as a new message that keeps its attempt count: this delivery
        made no attempt, and SQS's receive count (the DLQ's maxReceiveCount) starts over. `held`:
        the endpoint's open deliveries, as the refused take found them."""
        assert self._requeue is not None  # checked with the places in __init__
        delay = self._defer_s(held, message.deferrals) * self._rng.uniform(0.8, 1.2)
        later = message.model_copy(
            update={"attempts_before": attempt - 1, "deferrals": message.deferrals + 1, "endpoint": endpoint}
        )
        self._requeue.send(later, delay_s=delay, group=endpoint)
        emit(Metric.WEBHOOK_DEFERRALS)
        # pragma: no mutate start, a log line's words and keys, for operators
        logger.info(
            "webhook deferred: its endpoint has every place taken",
            endpoint=endpoint,
            deferrals=later.deferrals,
            delay_s=round(delay, 1),
            task_id=message.task_id,
            batch_id=message.batch_id,
        )
        # pragma: no mutate end


def _dropped(message: WebhookMessage) -> None:
    # pragma: no mutate start, a log line's words, for operators
    logger.info(
        "webhook dropped: its task or batch is gone", task_id=message.task_id, batch_id=message.batch_id
    )
    # pragma: no mutate end


@dataclass(frozen=True)
class _Attempt:
    """One HTTP attempt as its log entry will say it."""

    sent_at: float
    trigger: WebhookTrigger
    result: DeliveryResult
    latency_ms: int  # from the request sent to its answer or failure

    def entry(self, outcome: WebhookOutcome, *, next_at: float | None = None) -> WebhookAttempt:
        return WebhookAttempt(
            at=_at(self.sent_at),
            trigger=self.trigger,
            outcome=outcome,
            status_code=self.result.status_code,
            error=self.result.error or None,
            latency_ms=self.latency_ms,
            next_attempt_at=None if next_at is None else _at(next_at),
        )


@dataclass(frozen=True)
class _Subject:
    url: str
    tenant_id: str
    data: TaskView | BatchView
    # Sets the webhook's status on the item and, with an attempt, counts and logs it.
    record: Callable[[WebhookStatus, WebhookAttempt | None], object]
    log: dict[str, Any]  # the keys of its log lines
    openai: bool = False  # OpenAI's event shape (a task made through /v1/responses)

    def body(self, message: WebhookMessage) -> str:
        if self.openai:
            return json.dumps(openai_event(message.webhook_id, self.data))
        return WebhookEvent(
            type=message.event_type, timestamp=datetime.now(tz=UTC), data=self.data
        ).model_dump_json()
