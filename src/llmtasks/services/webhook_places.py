"""The places of each webhook endpoint (its open deliveries, under WebhookEndpointConcurrency),
as one sandbox's deliveries take, wait for and free them.

Each place is an entry in LimitsTable (`RunningCalls`), and every ask for one is a conditional
write: a write unit in AWS, refused or not. So a sandbox's deliveries of one endpoint form a
line: while one of them holds a place or waits for one, the others wait behind it without
asking, and a delivery that ends hands its place to the next in line in one write (the entry
renamed) where a give-back and a take would be two. Only the line's first asks again, every
PLACE_POLL_S, for a place another sandbox frees: far fewer writes than when each waiting
delivery asked.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmtasks.aws.limits import Take

if TYPE_CHECKING:
    from llmtasks.aws.limits import RunningCalls

# An endpoint whose open deliveries all began under this long ago is busy, not hung: a place
# frees within tens of milliseconds, and a delivery waits in its invocation until its line has
# not moved for this long before it is put off (a healthy endpoint's burst goes out as fast as
# its places turn over, however slow the machine, not a round of SQS delays a place).
PLACE_WAIT_S = 1.0
# The line's first asks again this often (jittered by half). Not backed off: a place another
# sandbox frees is found this late at most, and a healthy endpoint's burst goes out as fast as
# when every waiting delivery asked this often (a doubling back-off made bursts slower).
PLACE_POLL_S = 0.1
# A place outlives its delivery's timeout by this much: a sandbox that dies mid-delivery holds
# it no longer (the next take that finds the endpoint full clears it).
PLACE_MARGIN_S = 5.0


@dataclass(eq=False)
class _Waiter:
    webhook_id: str
    wake: asyncio.Future[None]  # set when something changed for it: look again
    picked: bool = False  # a hand-over to it is being written: it waits for the answer
    handed: bool | None = None  # that hand-over's answer
    asking: bool = False  # its own ask is being written: no hand-over to it meanwhile

    def nudge(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)


@dataclass
class _Line:
    """One endpoint's deliveries in this sandbox: those holding a place (webhook-id: until when
    it holds), those waiting in order, and the places as the last refused ask found them."""

    holding: dict[str, float] = field(default_factory=dict)
    waiting: deque[_Waiter] = field(default_factory=deque)
    refused: dict[str, float] = field(default_factory=dict)
    asking: int = 0  # asks being written: places this sandbox may hold once they are answered
    users: int = 0  # deliveries taking, waiting or holding: the line goes with the last
    moved: float = 0.0  # (monotonic) when a place of this line was last taken, handed or freed

    def may_ask(self, cap: int) -> bool:
        """Whether a place could be free that this sandbox neither holds nor is asking for."""
        return len(self.holding) + self.asking < cap

    def first(self) -> _Waiter | None:
        return self.waiting[0] if self.waiting else None


class EndpointPlaces:
    """Takes, hands over and gives back each endpoint's places for one sandbox's deliveries.
    Its lines live on the invocation's event loop (only the writes run in threads); an
    invocation's deliveries all end before it returns, and the lines empty with them."""

    def __init__(
        self,
        places: RunningCalls,
        *,
        cap: int,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._places = places
        self._cap = cap
        self._timeout_s = timeout_s
        self._clock = clock
        self._monotonic = monotonic
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._lines: dict[str, _Line] = {}

    async def take(self, endpoint: str, webhook_id: str) -> Take:
        """A place for this delivery, or a refusal saying who holds the endpoint's places (each
        until when) when they are hung or the line has not moved for PLACE_WAIT_S. A place taken
        is given back (or handed on) by `give_back`."""
        line = self._lines.setdefault(endpoint, _Line(moved=self._monotonic()))
        line.users += 1
        place = Take(taken=False)
        try:
            place = await self._take(line, endpoint, webhook_id)
        finally:
            if not place:
                self._leave(endpoint, line)
        return place

    async def give_back(self, endpoint: str, webhook_id: str) -> None:
        """The delivery's place to the next in line (one write), or back to the endpoint."""
        line = self._lines[endpoint]
        try:
            line.holding.pop(webhook_id, None)
            waiter = next((w for w in line.waiting if not (w.picked or w.asking)), None)
            if waiter is not None:
                waiter.picked = True
                until, handed = self._until(), False
                try:
                    handed = await asyncio.to_thread(
                        self._places.hand_over, endpoint, webhook_id, waiter.webhook_id, until=until
                    )
                finally:  # the waiter waits for this answer, a failed write's included
                    if handed:
                        line.holding[waiter.webhook_id] = until
                        line.moved = self._monotonic()
                    waiter.handed = handed
                    waiter.nudge()
                if handed:
                    return
            await asyncio.to_thread(self._places.give_back, endpoint, webhook_id)
            line.moved = self._monotonic()
        finally:
            self._leave(endpoint, line)

    async def _take(self, line: _Line, endpoint: str, webhook_id: str) -> Take:
        give_up = self._monotonic() + PLACE_WAIT_S
        if line.waiting or not line.may_ask(self._cap):
            if not self.busy_not_hung(line.holding):
                # Those here hang: one ask says whether any place is free (or lapsed).
                return await self._ask(line, endpoint, webhook_id)
        else:
            place = await self._ask(line, endpoint, webhook_id)
            if place or not self.busy_not_hung(place.held):
                return place
        return await self._wait(line, endpoint, webhook_id, give_up)

    def busy_not_hung(self, held: dict[str, float]) -> bool:
        """Every open delivery of the endpoint began under PLACE_WAIT_S ago (a place holds until
        its start, plus the timeout and PLACE_MARGIN_S), or none is open any more."""
        began = [until - self._timeout_s - PLACE_MARGIN_S for until in held.values()]
        return not began or self._clock() - min(began) < PLACE_WAIT_S

    async def _ask(self, line: _Line, endpoint: str, webhook_id: str) -> Take:
        """One conditional write: a place, or who holds them."""
        until = self._until()
        line.asking += 1
        try:
            place = await asyncio.to_thread(
                self._places.take, endpoint, webhook_id, cap=self._cap, until=until
            )
        finally:
            line.asking -= 1
        if place:
            line.holding[webhook_id] = until
            line.moved = self._monotonic()
        else:
            line.refused = place.held
        return place

    async def _wait(self, line: _Line, endpoint: str, webhook_id: str, give_up: float) -> Take:
        """In line for a place: handed over by a delivery of this sandbox as it ends, or asked
        for by the line's first every PLACE_POLL_S (while this sandbox holds fewer than the cap:
        else a hand-over comes first); the last refusal once neither this delivery's wait nor the
        line's last move is within PLACE_WAIT_S, or the places read as hung."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(webhook_id, loop.create_future())
        line.waiting.append(waiter)
        next_ask: float | None = None  # set when it becomes the line's first
        try:
            while True:
                if waiter.handed is not None:  # a hand-over was written
                    if waiter.handed:
                        return Take(taken=True)
                    waiter.picked, waiter.handed = False, None
                now = self._monotonic()
                # Patience lasts while the line moves: a slow machine's burst turns its places
                # over slowly, and is no more hung for it.
                give_up = max(give_up, line.moved + PLACE_WAIT_S)
                # No place will free soon once this sandbox's holders are hung, or (holding none)
                # the holders the last refusal named.
                hung = not self.busy_not_hung(line.holding or line.refused)
                if not waiter.picked and (now >= give_up or hung):
                    return Take(taken=False, held=line.refused or dict(line.holding))
                first = line.first() is waiter
                if first and next_ask is None:
                    next_ask = now + PLACE_POLL_S * self._rng.uniform(0.5, 1.5)
                if first and not waiter.picked and next_ask is not None and now >= next_ask:
                    if line.may_ask(self._cap):
                        waiter.asking = True
                        try:
                            place = await self._ask(line, endpoint, webhook_id)
                        finally:
                            waiter.asking = False
                        if place:
                            return place
                    next_ask = self._monotonic() + PLACE_POLL_S * self._rng.uniform(0.5, 1.5)
                    continue
                wake_at = give_up if not first or next_ask is None else min(give_up, next_ask)
                waiter.wake = loop.create_future()
                await asyncio.wait({waiter.wake}, timeout=None if waiter.picked else max(0.0, wake_at - now))
        finally:
            was_first = line.first() is waiter
            line.waiting.remove(waiter)
            following = line.first()
            if was_first and following is not None:
                following.nudge()

    def _until(self) -> float:
        return self._clock() + self._timeout_s + PLACE_MARGIN_S

    def _leave(self, endpoint: str, line: _Line) -> None:
        """A delivery is done with the line: the line goes with its last."""
        line.users -= 1
        if not line.users and self._lines.get(endpoint) is line:
            del self._lines[endpoint]
