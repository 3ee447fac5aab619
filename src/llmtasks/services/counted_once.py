"""Counters moved exactly once per task change, from the table's stream (a batch's counts in
batch_items.BatchProgress, the tasks' counts in task_tally.TaskTally): each task's changes
collapse into one net change past the revision its mark says the counters hold, the changes are
applied a group a transaction, and a group's refusal says which marks hold more already (those
tasks collapse again past them) and whether another transaction got in the way (a back-off,
then the group again)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

Step = TypeVar("Step")
Change = TypeVar("Change", bound="OfTask")


class OfTask(Protocol):
    @property
    def task_id(self) -> str: ...


class Refusal(Protocol):
    """What a refused transaction says: per task whose mark refused it, the revision the counters
    hold (None: not told, read it); and whether it met another transaction."""

    counted: dict[str, int | None]
    conflict: bool


def count_once(
    by_task: dict[str, list[Step]],
    collapse: Callable[[str, list[Step], int | None], Change | None],
    apply: Callable[[list[Change]], None],
    counted_revision: Callable[[str], int | None],
    *,
    refused: type[Exception],
    group: int,
    attempts: int,
    sleep: Callable[[float], None],
) -> list[str]:
    """Applies each task's net change once; the tasks whose change did not apply within
    `attempts` rounds (none: every one did). `apply` raises `refused` (a Refusal) when its
    transaction did not apply."""
    counted: dict[str, int | None] = {}
    todo = dict(by_task)
    for attempt in range(attempts):
        collapsed = (collapse(task_id, steps, counted.get(task_id)) for task_id, steps in todo.items())
        pending = [change for change in collapsed if change is not None]
        todo = {change.task_id: todo[change.task_id] for change in pending}
        if not pending:
            return []
        for start in range(0, len(pending), group):
            changes = pending[start : start + group]
            try:
                apply(changes)
            except refused as refusal:
                said: Refusal = refusal  # type: ignore[assignment]
                for task_id, revision in said.counted.items():
                    counted[task_id] = revision if revision is not None else counted_revision(task_id)
                if said.conflict:
                    sleep(0.05 * 2**attempt)
                continue
            for change in changes:
                del todo[change.task_id]
    return list(todo)
