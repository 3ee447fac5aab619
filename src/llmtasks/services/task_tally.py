"""What BatchFunction does with every task's stream records besides its batch's: the counters of
tasks per status, tenant and priority (aws/task_counts.py) move exactly once per change, so the
views of a deployment (`llmtasks stats`, the local console) read one item, not the table."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from llmtasks.aws.task_counts import MARK_GRACE_S, Tally, TallyRefused, TaskCounts
from llmtasks.domain.errors import BackendError
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.domain.rules import Clock
from llmtasks.services.counted_once import count_once

# Tasks in one transaction: DynamoDB allows 100 actions, one is the counters'.
TALLY_GROUP = 99
TALLY_ATTEMPTS = 8


@dataclass(frozen=True)
class _Step:
    old: TaskStatus | None
    new: TaskStatus | None
    revision: int
    tenant_id: str
    priority: str
    mark_expires_at: int


def _collapse(task_id: str, steps: list[_Step], counted: int | None) -> Tally | None:
    """The net change of a task's steps the counters do not include yet (None: they include all)."""
    fresh = [step for step in steps if counted is None or step.revision > counted]
    if not fresh:
        return None
    return Tally(
        task_id=task_id,
        tenant_id=fresh[-1].tenant_id,
        priority=fresh[-1].priority,
        since=fresh[0].revision,
        revision=fresh[-1].revision,
        old=fresh[0].old,
        new=fresh[-1].new,
        mark_expires_at=fresh[-1].mark_expires_at,
    )


class TaskTally:
    def __init__(
        self,
        counts: TaskCounts,
        *,
        clock: Clock = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._counts = counts
        self._clock = clock
        self._sleep = sleep  # the back-off after a transaction conflict

    def apply(self, changes: list[tuple[Task | None, Task | None]]) -> None:
        """`changes`: (old, new) images in stream order; old None for an insert, new None for a
        deletion. Writes that kept the status count too: their revisions place the others in order."""
        steps: dict[str, list[_Step]] = defaultdict(list)
        for old, new in changes:
            if new is not None:
                steps[new.task_id].append(
                    _Step(
                        old.status if old is not None else None,
                        new.status,
                        new.revision,
                        new.tenant_id,
                        new.priority,
                        new.expires_at + MARK_GRACE_S,
                    )
                )
            elif old is not None:  # deleted: a step past every revision it had
                steps[old.task_id].append(
                    _Step(
                        old.status,
                        None,
                        old.revision + 1,
                        old.tenant_id,
                        old.priority,
                        int(self._clock()) + MARK_GRACE_S,
                    )
                )
        self._count(steps)

    def _count(self, by_task: dict[str, list[_Step]]) -> None:
        left = count_once(
            by_task,
            _collapse,
            self._counts.apply,
            self._counts.tallied_revision,
            refused=TallyRefused,
            group=TALLY_GROUP,
            attempts=TALLY_ATTEMPTS,
            sleep=self._sleep,
        )
        if left:
            raise BackendError(f"task counts not applied after {TALLY_ATTEMPTS} attempts")
