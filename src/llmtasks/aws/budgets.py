"""Each API key's budget, counted in LimitsTable: one item a key, `budget#<key id>`.

- `day`, `month`: the UTC day and month the counters are of; `dn`, `mn`: what is reserved or
  spent in them (USD, exact decimals). The first reservation of a new day (or month) starts its
  counter over, in a write conditioned on the old one.
- `t_<task id>` (`t_<task id>_r<attempt>` for a retry's): one reservation, as one string
  `<amount>|<what the task had been billed before it>|<its day>|<its month>|<when>` (one value:
  the item is read and written whole, and it holds one a task in flight).

A reservation is one conditional write: the entry is added, and both counters move, only while
each leaves room for it; so concurrent submits from any number of sandboxes never overshoot.
Nothing settles a reservation when its task ends (no write on the worker's path): when a
reservation finds no room, the entries whose tasks have ended are settled first, to what each
task was billed while it held them, and the reservation tries again. A reservation is refused
only when, with every ended task settled, what is reserved and spent leaves no room for it.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from llmtasks.aws.dynamo import deserialize
from llmtasks.aws.limits import CounterRefused, counter_update
from llmtasks.domain.budgets import BUDGET_EXHAUSTED, Budget, Periods
from llmtasks.domain.errors import TooManyRequests

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from llmtasks.aws.store import TaskStore

# A reservation that finds no room settles ended tasks and tries again, at most this often.
RESERVE_ATTEMPTS = 8
# An entry whose task is not stored yet may be a submit still under way.
UNSTORED_GRACE_S = 120


class BudgetExhausted(TooManyRequests):
    """A reservation the key's budget has no room for: 429, until the period starts over."""

    title, slug = "Budget exhausted", BUDGET_EXHAUSTED


@dataclass(frozen=True)
class Entry:
    name: str
    task_id: str
    amount: Decimal
    billed_before: Decimal
    day: str
    month: str
    at: float


def _entries(fields: dict[str, Any]) -> list[Entry]:
    found = []
    for name, value in fields.items():
        if name.startswith("t_"):
            amount, before, day, month, at = str(value).split("|")
            task_id = name[2:].split("_r", 1)[0]
            found.append(Entry(name, task_id, Decimal(amount), Decimal(before), day, month, float(at)))
    return found


class KeyBudgets:
    def __init__(
        self,
        table_name: str,
        client: DynamoDBClient,
        *,
        tasks: TaskStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.table_name = table_name
        self._client = client
        self._tasks = tasks
        self._clock = clock

    def reserve(
        self, key_id: str, budget: Budget, task_id: str, amount: Decimal, *, attempt: int = 0
    ) -> None:
        """Reserves `amount` for the task (`attempt` > 0: again, for that attempt of it) under
        the key's budget; BudgetExhausted when it does not fit. Reserving what is reserved
        already (a repeated fan-out, a redelivery) changes nothing."""
        name = f"t_{task_id}" if attempt == 0 else f"t_{task_id}_r{attempt}"
        billed_before = self._billed_before(task_id, attempt)
        for _ in range(RESERVE_ATTEMPTS):
            now = self._clock()
            periods = Periods.at(now)
            try:
                self._add(key_id, budget, name, amount, now, billed_before=billed_before)
                return
            except CounterRefused as refused:
                fields = deserialize(refused.item) if refused.item else {}
                if name in fields:
                    return
                if fields.get("day") != periods.day or fields.get("month") != periods.month:
                    self._start_over(key_id, fields, periods)
                    continue
                if not self._settle_ended(key_id, fields, now):
                    raise self._exhausted(budget, fields, amount, periods, now) from None
        raise self._exhausted(budget, fields, amount, periods, self._clock())

    def _billed_before(self, task_id: str, attempt: int) -> Decimal:
        if attempt == 0:
            return Decimal(0)
        task = self._tasks.get_many([task_id]).get(task_id)
        return task.billed_cost if task else Decimal(0)

    def _add(
        self,
        key_id: str,
        budget: Budget,
        name: str,
        amount: Decimal,
        now: float,
        *,
        billed_before: Decimal,
    ) -> None:
        periods = Periods.at(now)
        condition = ["attribute_not_exists(#entry)", "#day = :day", "#month = :month"]
        values: dict[str, Any] = {
            ":entry": f"{amount}|{billed_before}|{periods.day}|{periods.month}|{now:.3f}",
            ":amount": amount,
            ":day": periods.day,
            ":month": periods.month,
        }
        if budget.day_usd is not None:
            condition.append("dn <= :day_room")
            values[":day_room"] = budget.day_usd - amount
        if budget.month_usd is not None:
            condition.append("mn <= :month_room")
            values[":month_room"] = budget.month_usd - amount
        counter_update(
            self._client,
            self.table_name,
            f"budget#{key_id}",
            "SET #entry = :entry, dn = dn + :amount, mn = mn + :amount",
            " AND ".join(condition),
            values,
            names={"#entry": name, "#day": "day", "#month": "month"},
        )

    def _start_over(self, key_id: str, fields: dict[str, Any], periods: Periods) -> None:
        """The counters of a new day (and month) from zero; a write conditioned on the old ones,
        so only one sandbox starts each over."""
        sets, conditions, values = [], [], {":zero": Decimal(0)}
        for period, counter in (("day", "dn"), ("month", "mn")):
            now_is = getattr(periods, period)
            if fields.get(period) == now_is:
                continue
            sets.append(f"#{period} = :{period}, {counter} = :zero")
            values[f":{period}"] = now_is
            if period in fields:
                conditions.append(f"#{period} = :old_{period}")
                values[f":old_{period}"] = fields[period]
            else:
                conditions.append(f"attribute_not_exists(#{period})")
        with contextlib.suppress(CounterRefused):  # another reservation started it over first
            counter_update(
                self._client,
                self.table_name,
                f"budget#{key_id}",
                "SET " + ", ".join(sets),
                " AND ".join(conditions),
                values,
                names={f"#{period}": period for period in ("day", "month") if f"#{period}" in " ".join(sets)},
            )

    def _settle_ended(self, key_id: str, fields: dict[str, Any], now: float) -> bool:
        """Settles the entries of tasks that have ended (or never got stored) to what each was
        billed while it held them; whether any was settled."""
        by_task: dict[str, list[Entry]] = defaultdict(list)
        for entry in _entries(fields):
            by_task[entry.task_id].append(entry)
        if not by_task:
            return False
        tasks = self._tasks.get_many(list(by_task))
        settled = False
        for task_id, entries in by_task.items():
            task = tasks.get(task_id)
            if task is None:
                if now - min(entry.at for entry in entries) < UNSTORED_GRACE_S:
                    continue
                billed = Decimal(0)
            elif task.status.is_terminal or task.is_dead_lettered(now):
                billed = task.billed_cost
            else:
                continue
            settled |= self._settle(key_id, fields, sorted(entries, key=lambda e: e.billed_before), billed)
        return settled

    def _settle(self, key_id: str, fields: dict[str, Any], entries: list[Entry], billed: Decimal) -> bool:
        """One task's entries, removed, each counter moved from what they reserved to what the
        task was billed while each held it (from its billed_before to the next one's)."""
        day_delta = month_delta = Decimal(0)
        for place, entry in enumerate(entries):
            until = entries[place + 1].billed_before if place + 1 < len(entries) else billed
            spent = max(Decimal(0), until - entry.billed_before)
            if entry.day == fields.get("day"):
                day_delta += spent - entry.amount
            if entry.month == fields.get("month"):
                month_delta += spent - entry.amount
        names = {f"#e{n}": entry.name for n, entry in enumerate(entries)}
        try:
            counter_update(
                self._client,
                self.table_name,
                f"budget#{key_id}",
                "REMOVE " + ", ".join(names) + " SET dn = dn + :day_delta, mn = mn + :month_delta",
                " AND ".join(f"attribute_exists({n})" for n in names)
                + " AND #day = :day AND #month = :month",
                {
                    ":day_delta": day_delta,
                    ":month_delta": month_delta,
                    ":day": fields.get("day"),
                    ":month": fields.get("month"),
                },
                names={**names, "#day": "day", "#month": "month"},
            )
        except CounterRefused:
            return True  # settled by another reservation meanwhile (or the period moved on): look again
        return True

    @staticmethod
    def _exhausted(
        budget: Budget, fields: dict[str, Any], amount: Decimal, periods: Periods, now: float
    ) -> BudgetExhausted:
        day_full = budget.day_usd is not None and Decimal(str(fields.get("dn", 0))) + amount > budget.day_usd
        which = f"{budget.day_usd} USD a day" if day_full else f"{budget.month_usd} USD a month"
        return BudgetExhausted(
            f"This API key's budget ({which}) has no room for this task, which could cost up to"
            f" {amount} USD; it starts over at the end of the UTC {'day' if day_full else 'month'}.",
            retry_after_s=periods.retry_after_s(now, day=day_full),
        )
