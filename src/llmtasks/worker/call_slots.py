"""An invocation's call slots, kept full from its own queue.

The SQS event source hands an invocation at most BatchSize records and gives that invocation's
slot no more until all of them are done. With long LLM calls that wastes most slots: an
invocation of ten runs its last, slowest call alone while nine slots idle, and while tasks trickle
in, every invocation holds two or three calls for a whole call time while the rest of the work
waits in the queue. So the worker does what a Celery thread does: as each call ends it takes the
next message from the queue itself (receiving at most its free slots), as long as the invocation's
remaining time can hold a whole call, and returns when its calls are done and the queue has
nothing more for it. One invocation waiting on ten calls bills once; ten invocations would bill
ten times. Calls shorter than a second never refill: the event source serves them as well.

Messages it received itself keep the event source's rules, applied here: deleted once handled,
made visible after RetryLater's delay, and left in flight when their handler fails, so that they
come back after the visibility timeout and count toward maxReceiveCount (then TaskDLQ). The
event's own records are reported in `batchItemFailures`, as before.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable, Callable, Coroutine, Sized
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from llmtasks.aws.queues import Queue
from llmtasks.domain.errors import RetryLater
from llmtasks.observability import logger
from llmtasks.records import UnreadableMessage, each_message_once, pushing_retries_out, sqs_record

# While calls run and slots are free, the queue is looked at this often (and at once whenever a
# call ends), from this long after the invocation began. Short receives, not long polls: a long
# poll still waiting when the last call ends would keep the invocation, and its bill, running
# until it returns; a short one never does.
RECHECK_S = 1.0

T = TypeVar("T")


class TakenRecord(SQSRecord):
    """A record this invocation received itself as a slot came free, on the promise of a whole
    call's time (its handler checks that the time is still there when the call starts)."""


@dataclass(frozen=True)
class CallSlots:
    """How an invocation refills: from `queue`, up to `slots` records at once, while at least
    `min_remaining_s` of its time is left (a whole call and the writing of its outcome)."""

    queue: Queue
    slots: int
    min_remaining_s: float


@dataclass
class QueueLooks:
    """When an invocation looks at its queue, on the event loop's clock (`now` is given, so the
    rules are checked at set times). The event source has just looked when the invocation
    begins: its first look is RECHECK_S away, so calls shorter than that never refill (the event
    source's batches serve them at no receive more). Then it looks at once when a call ends and
    every RECHECK_S while slots are free."""

    started: float
    received_at: float = -math.inf  # the last receive's start; none yet
    drained: bool = False  # the last receive found nothing
    call_ended: bool = False  # a slot came free since the last receive

    def warm(self, now: float) -> bool:
        return now - self.started >= RECHECK_S

    def due(self, now: float) -> bool:
        return self.warm(now) and (self.call_ended or now - self.received_at >= RECHECK_S)

    def finished(self, now: float, running: Sized) -> bool:
        """With no call running, the invocation is done, unless a call that ran past the first
        RECHECK_S just ended or the queue was never looked at: then it is looked at once more."""
        return not running and (not self.warm(now) or (self.drained and not self.call_ended))

    def may_look(self, now: float, *, free: int, running: Sized, receiving: bool) -> bool:
        """One receive at a time, into free slots, when due and not finished."""
        return not receiving and free > 0 and self.due(now) and not self.finished(now, running)

    def next_in(self, now: float, *, free: int, receiving: bool) -> float | None:
        """How long to wait for a call to end before looking again; None (until a call ends or
        the receive returns) when no slot is free or a receive is on its way."""
        if free <= 0 or receiving:
            return None
        return max(0.0, max(self.started, self.received_at) + RECHECK_S - now)

    def receiving(self, now: float) -> None:
        self.received_at, self.call_ended = now, False

    def received(self, count: int) -> None:
        self.drained = count == 0


@dataclass
class _Invocation:
    handle: Callable[[SQSRecord], Awaitable[None]]
    slots: CallSlots
    remaining_s: Callable[[], float]
    queue_arn: str
    running: dict[asyncio.Task[None], SQSRecord] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # the event's records to report
    handled: list[str] = field(default_factory=list)  # receipts of own records to delete
    taking: bool = True  # False once the queue could not be read: nothing more is taken

    def start(self, record: SQSRecord) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(self.handle(record))
        self.running[task] = record

    def ended(self, task: asyncio.Task[None]) -> None:
        record = self.running.pop(task)
        error = task.exception()
        # pragma: no mutate start, whether a log line is written
        if error is not None and not isinstance(error, RetryLater | UnreadableMessage):  # said already
            logger.warning("record failed", message_id=record.message_id, exc_info=error)
        # pragma: no mutate end
        if not isinstance(record, TakenRecord):  # the event's: reported, the event source deletes it
            if error is not None:
                self.failures.append(record.message_id)
        elif error is None:  # received by this invocation, which deletes it itself
            self.handled.append(record.receipt_handle)

    def free(self) -> int:
        """Slots a receive may fill now: none once the time left cannot hold a whole call."""
        if not self.taking or self.remaining_s() < self.slots.min_remaining_s:
            return 0
        return self.slots.slots - len(self.running)

    async def until_done(self) -> None:
        loop = asyncio.get_running_loop()
        receiving: asyncio.Task[list[Any]] | None = None
        deleting: list[str] = []  # the receipts the pending receive deletes first
        looks = QueueLooks(started=loop.time())
        while True:
            limit = self.free()
            now = loop.time()
            if looks.may_look(now, free=limit, running=self.running, receiving=receiving is not None):
                deleting, self.handled = self.handled, []
                receiving = loop.create_task(asyncio.to_thread(self._delete_and_receive, deleting, limit))
                looks.receiving(now)
            waiting: set[asyncio.Task[Any]] = set(self.running)
            if receiving is not None:
                waiting.add(receiving)
            if not waiting:
                break
            recheck_in = looks.next_in(loop.time(), free=limit, receiving=receiving is not None)
            done, _ = await asyncio.wait(waiting, timeout=recheck_in, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is receiving:
                    receiving = None
                    records = self._received(task, deleting)
                    looks.received(len(records))
                    for record in records:
                        self.start(record)
                else:
                    self.ended(task)
                    looks.call_ended = True
        if self.handled:
            await asyncio.to_thread(self.slots.queue.delete_many, self.handled)

    def _delete_and_receive(self, handled: list[str], limit: int) -> list[Any]:
        """In a thread: deletes what this invocation has handled, then receives up to `limit`
        (what is visible now: no wait)."""
        if handled:
            self.slots.queue.delete_many(handled)
        return self.slots.queue.receive(limit)

    def _received(self, task: asyncio.Task[list[Any]], deleting: list[str]) -> list[TakenRecord]:
        """The messages a receive took, but not a copy of one running here (at-least-once
        delivery): the copy is left to come back later and find its task done."""
        error = task.exception()
        if error is not None:
            # The queue cannot be used now: the calls running finish, nothing more is taken,
            # and the deletes are tried once more at the end.
            logger.warning("receive failed; this invocation takes no more messages", exc_info=error)
            self.taking = False
            self.handled = deleting + self.handled
            return []
        running = {record.message_id for record in self.running.values()}
        records = []
        for message in task.result():
            if message["MessageId"] in running:
                logger.info("a copy of a message running here is left", message_id=message["MessageId"])
                continue
            records.append(TakenRecord(sqs_record(message, self.queue_arn)))
        if records:
            logger.info("took messages from the queue", count=len(records))
        return records


def keep_slots_full(
    event: dict[str, Any],
    context: LambdaContext,
    handle: Callable[[SQSRecord], Awaitable[None]],
    slots: CallSlots,
) -> PartialItemFailureResponse:
    """Runs the event's records and what the queue holds, up to `slots.slots` at once; the
    event's records that failed are in the reply's batchItemFailures."""
    records = each_message_once(event).get("Records") or []
    queue_arn = str(records[0].get("eventSourceARN", "")) if records else ""
    invocation = _Invocation(
        pushing_retries_out(handle, slots.queue),
        slots,
        lambda: context.get_remaining_time_in_millis() / 1000,
        queue_arn,
    )

    async def run_all() -> None:
        for record in records:
            invocation.start(SQSRecord(record))
        await invocation.until_done()

    run_in_lambda_loop(run_all())
    return {"batchItemFailures": [{"itemIdentifier": i} for i in invocation.failures]}


def run_in_lambda_loop(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs `coroutine` on the sandbox's event loop, kept from one invocation to the next as
    Powertools' batch processor does (a loop closed by asyncio.run would break clients bound to it
    after a thaw); outside Lambda, on a fresh loop."""
    if not os.getenv("LAMBDA_TASK_ROOT"):
        return asyncio.run(coroutine)
    try:
        loop = asyncio.get_event_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
    return loop.run_until_complete(coroutine)
