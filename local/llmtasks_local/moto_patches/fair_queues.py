"""SQS fair queues in moto, as AWS documents them (Amazon SQS fair queues, 2025).

A standard queue whose messages carry a MessageGroupId is a fair queue: the group id names the
tenant (a message without one is a tenant of its own). SQS watches how the in-flight messages and
the consumers' recent processing time are shared between tenants. A tenant is *noisy* while

- it holds more than about 10% of the queue's in-flight messages and at least 30 of its own, or
- it took more than about 10% of the consumers' recent processing time.

While some tenant is noisy, a receive returns the quiet tenants' messages first; when several are
noisy, the one with the fewest messages in flight comes first. Nothing is dropped or throttled:
with no quiet message waiting, a receive returns the noisy tenants' messages as before.

Here a receive orders the visible messages so, reading them lazily (queue_index.Ranked): it looks
no further into the queue than the messages it hands out. The shares are measured at each receive,
so a tenant stops being noisy as soon as its shares fall (AWS's own detection lags and is approximate:
"the thresholds are approximate values"). "Recent" processing time is the last RECENT_S seconds of
messages deleted (from their last receive to their delete) plus what the in-flight messages have
run so far; AWS does not say how recent. FIFO queues keep their own order.

`LLMTASKS_FAIR_QUEUES=off` in the local endpoint's environment turns the ordering off (a standard
queue as it was before fair queues), for comparing the two in bench/.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

from moto.sqs.models import Message, Queue

from llmtasks_local import moto_patches
from llmtasks_local.moto_patches import queue_index

CONCURRENCY_SHARE = 0.10
MIN_IN_FLIGHT = 30
PROCESSING_TIME_SHARE = 0.10
RECENT_S = 60.0


def tenant_of(message: Message) -> str:
    """The tenant a message belongs to: its group, or itself when it has none."""
    return f"group:{message.group_id}" if message.group_id is not None else f"message:{message.id}"


class Processing:
    """One queue's recent processing time per tenant: (ended at, tenant, seconds) of each delete."""

    def __init__(self) -> None:
        self.ended: deque[tuple[float, str, float]] = deque()

    def add(self, tenant: str, seconds: float, now: float) -> None:
        self.ended.append((now, tenant, seconds))
        self._forget(now)

    def recent(self, now: float) -> dict[str, float]:
        self._forget(now)
        seconds: dict[str, float] = {}
        for _, tenant, taken in self.ended:
            seconds[tenant] = seconds.get(tenant, 0.0) + taken
        return seconds

    def _forget(self, now: float) -> None:
        while self.ended and self.ended[0][0] < now - RECENT_S:
            self.ended.popleft()


def noisy_tenants(in_flight: Counter[str], processing_s: dict[str, float]) -> set[str]:
    """The tenants over either share (the two rules of the module's docstring)."""
    held = sum(in_flight.values())
    took = sum(processing_s.values())
    noisy = {t for t, n in in_flight.items() if n >= MIN_IN_FLIGHT and n > CONCURRENCY_SHARE * held}
    if took > 0:
        noisy |= {t for t, s in processing_s.items() if s > PROCESSING_TIME_SHARE * took}
    return noisy


def shares(
    in_flight: Iterable[Message], processing: Processing, now: float
) -> tuple[Counter[str], dict[str, float]]:
    """Each tenant's messages in flight, and its recent processing time with what they have run."""
    held: Counter[str] = Counter()
    processing_s = processing.recent(now)
    for message in in_flight:
        tenant = tenant_of(message)
        held[tenant] += 1
        running_s = max(0.0, now - getattr(message, "_llmtasks_received_at", now))
        processing_s[tenant] = processing_s.get(tenant, 0.0) + running_s
    return held, processing_s


def fair_order(visible: list[Message], held: Counter[str], noisy: set[str]) -> list[Message]:
    """`visible` in the order a fair queue hands it out: quiet tenants' messages first (in their
    own order), then the noisy tenants', fewest in flight first. (What a receive reads lazily,
    queue_index.Ranked, gives the same order.)"""
    rank = [(1, held[t]) if t in noisy else (0, 0) for t in map(tenant_of, visible)]
    order = sorted(range(len(visible)), key=lambda i: rank[i])
    return [visible[i] for i in order]


def ranked(visible: queue_index.Receivable, held: Counter[str], noisy: set[str], now: float) -> Any:
    """fair_order's order, read lazily: how many messages of each rank can be visible follows from
    the queue's counts by group (less the delayed ones) and its messages in flight. A message with
    no group is a tenant of its own, never noisy while visible (its shares are those of its time
    in flight)."""

    def rank_of_tenant(tenant: str) -> tuple[int, int]:
        return (1, held[tenant]) if tenant in noisy else (0, 0)

    candidates: Counter[tuple[int, int]] = Counter()
    for group, count in visible.index.undelayed(now * 1000).items():
        if group is None:
            alone_in_flight = sum(n for tenant, n in held.items() if tenant.startswith("message:"))
            candidates[(0, 0)] += count - alone_in_flight
        else:
            tenant = f"group:{group}"
            candidates[rank_of_tenant(tenant)] += count - held[tenant]
    return visible.ranked(lambda message: rank_of_tenant(tenant_of(message)), dict(candidates))


def _processing(queue: Queue) -> Processing:
    found: Processing | None = queue.__dict__.get("_llmtasks_processing")
    if found is None:
        found = queue.__dict__["_llmtasks_processing"] = Processing()
    return found


def _fair_messages(messages: property) -> property:
    def ordered(queue: Queue) -> Any:
        visible = messages.fget(queue)  # type: ignore[misc]
        if not queue_index.receiving(queue) or queue.fifo_queue:
            return visible  # a count or a wait needs no order; FIFO queues keep their own
        now = time.time()
        held, processing_s = shares(
            (m for m in queue.pending_messages if not m.visible), _processing(queue), now
        )
        noisy = noisy_tenants(held, processing_s)
        if not noisy:
            return visible
        if isinstance(visible, queue_index.Receivable):
            return ranked(visible, held, noisy, now)
        return fair_order(visible, held, noisy)

    ordered.__llmtasks_fair__ = True  # type: ignore[attr-defined]
    return property(ordered)


def _timed_receipt(mark_received: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(mark_received)
    def marked(message: Message, *args: Any, **kwargs: Any) -> Any:
        message._llmtasks_received_at = time.time()  # type: ignore[attr-defined]
        return mark_received(message, *args, **kwargs)

    marked.__llmtasks_fair__ = True  # type: ignore[attr-defined]
    return marked


def _timed_delete(delete: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(delete)
    def deleted(queue: Queue, receipt_handle: str) -> Any:
        message = queue_index.find(queue, receipt_handle)
        result = delete(queue, receipt_handle)
        received_at = getattr(message, "_llmtasks_received_at", None)
        if message is not None and received_at is not None:
            now = time.time()
            _processing(queue).add(tenant_of(message), max(0.0, now - received_at), now)
        return result

    deleted.__llmtasks_fair__ = True  # type: ignore[attr-defined]
    return deleted


def enabled() -> bool:
    return os.environ.get("LLMTASKS_FAIR_QUEUES", "on").strip().lower() not in ("off", "0", "false", "no")


def install() -> None:
    """Idempotent; in whatever process runs moto, before it serves the first receive."""
    if not moto_patches.enabled() or not enabled():  # another moto version; or turned off
        return
    patches = (
        (Message, "mark_received", _timed_receipt),
        (Queue, "delete_message", _timed_delete),
    )
    for owner, name, patch in patches:
        method = getattr(owner, name)
        if not getattr(method, "__llmtasks_fair__", False):
            setattr(owner, name, patch(method))
    messages = Queue.__dict__["messages"]
    if not getattr(messages.fget, "__llmtasks_fair__", False):
        Queue.messages = _fair_messages(messages)  # type: ignore[method-assign,assignment]
