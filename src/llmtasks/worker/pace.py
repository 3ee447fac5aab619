"""A call's slot in the shared pace of LLM calls (LlmRequestsPerSecond, aws/pacing.py): the wait
for it, within what the call's time budget allows."""

from __future__ import annotations

import asyncio

from llmtasks.aws.pacing import CallPacer
from llmtasks.domain.rules import Clock

# A paced call starts only if at least this much of its timeout is left after the wait.
MIN_CALL_TIME_S = 60.0
# How often a call that woke late for its pace slot takes a fresh one before it goes anyway.
PACE_LATE_TRIES = 3


class PaceFull(Exception):
    def __init__(self, backlog_s: float) -> None:
        super().__init__(f"the next free pace slot is {backlog_s:.0f} s away")
        self.backlog_s = backlog_s


async def wait_for_pace(pacer: CallPacer, call_budget_s: float, clock: Clock) -> float:
    """Waits for this call's slot in the shared pace; returns the seconds waited. Raises
    PaceFull when the slot lies beyond what the call's time budget leaves. A call that wakes well
    past its slot (a busy sandbox) takes a fresh one rather than leave in a burst with the
    next, which a provider counting requests per second would refuse."""
    began = clock()
    for _ in range(PACE_LATE_TRIES):
        start_at = await asyncio.to_thread(pacer.reserve, clock())
        if start_at - began > call_budget_s - MIN_CALL_TIME_S:
            raise PaceFull(start_at - began)
        await asyncio.sleep(max(0.0, start_at - clock()))
        if clock() - start_at <= pacer.interval_s / 2:
            break
    return clock() - began
