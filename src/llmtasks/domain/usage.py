"""A tenant's spend: the totals `GET /usage` reports, by day, model or API key, and the batch's.

The worker counts each call the provider billed as it gets the answer (aws/usage.py keeps the
sums per tenant and UTC day, and per batch), so a report reads a few counters, never the tasks.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from llmtasks.domain.models import Usage

GroupBy = Literal["day", "model", "key"]
_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_day(value: Any) -> Any:
    """A day as the document writes one, YYYY-MM-DD (pydantic's lax dates would take `0`, a
    Unix time, and `20261201`)."""
    if not isinstance(value, str | date) or (isinstance(value, str) and not _ISO_DAY.fullmatch(value)):
        raise ValueError("must be a date, YYYY-MM-DD")
    return value


Day = Annotated[date, BeforeValidator(_iso_day)]
# How long a tenant's daily counters are kept (a year's reports, and this month's budget): a
# report reads these days of its span at most, four BatchGetItem calls, whatever span it asks.
KEPT_DAYS = 400
DEFAULT_REPORT_DAYS = 30


def days_read(first: date, last: date, today: date) -> tuple[date, date] | None:
    """Of a report's span, the days that can have counters (none after today, none kept longer
    than KEPT_DAYS), or None: a span of days before or after those, or one that ends before it
    starts, has no calls to report."""
    read_first = max(first, today - timedelta(days=KEPT_DAYS - 1))
    read_last = min(last, today)
    return (read_first, read_last) if read_first <= read_last else None


def default_first(last: date) -> date:
    """A report's first day when it names none: DEFAULT_REPORT_DAYS ending with `last`."""
    return last - timedelta(days=min(DEFAULT_REPORT_DAYS - 1, (last - date.min).days))


class UsageTotals(BaseModel):
    calls: int = Field(default=0, description="LLM calls the provider billed (a task's retries each count).")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    cost_unknown_calls: int = Field(
        default=0, description="Calls of a model the price table lacks: in the tokens, priced at 0."
    )

    def __add__(self, other: UsageTotals) -> UsageTotals:
        summed = {
            name: getattr(self, name) + getattr(other, name)
            for name in UsageTotals.model_fields
            if name != "cost_usd"
        }
        cost = Decimal(repr(self.cost_usd)) + Decimal(repr(other.cost_usd))
        return UsageTotals(**summed, cost_usd=float(cost))

    @classmethod
    def of_call(cls, usage: Usage) -> UsageTotals:
        """One billed call."""
        return cls(
            calls=1,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            total_tokens=usage.total_tokens,
            cost_usd=usage.cost_usd or 0.0,
            cost_unknown_calls=int(usage.cost_unknown),
        )

    def as_usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            total_tokens=self.total_tokens,
            cost_usd=self.cost_usd,
            cost_unknown=self.cost_unknown_calls > 0,
        )


class BatchSpend(BaseModel):
    """A batch's counter: its items' billed calls, and the items its key's budget refused."""

    usage: Usage | None = None
    budget_exhausted: int = 0


# What one tenant-day's counters hold: the day's totals under each model and key that spent.
DayTotals = dict[tuple[Literal["model", "key"], str], UsageTotals]
NO_KEY = "-"  # the group of calls no API key made (the local gateway's --no-auth)


class UsageRow(UsageTotals):
    group: str | None = Field(
        description="The UTC day (YYYY-MM-DD), the model, or the API key's id (null: no key, as"
        " the local stack's --no-auth submits)."
    )


class UsageReport(BaseModel):
    """`GET /usage`: the tenant's billed calls from `from` to `to` (UTC days, both included)."""

    model_config = ConfigDict(populate_by_name=True)

    object: Literal["usage"] = "usage"
    from_: date = Field(alias="from")
    to: date
    group_by: GroupBy
    data: list[UsageRow] = Field(
        description="One row a group that spent, in order (days ascending, else by cost)."
    )
    total: UsageTotals

    @classmethod
    def of(cls, days: dict[date, DayTotals], *, first: date, last: date, group_by: GroupBy) -> UsageReport:
        groups: dict[str | None, UsageTotals] = {}
        total = UsageTotals()
        for day, totals in sorted(days.items()):
            for (kind, name), sums in totals.items():
                if kind == "model":  # each call is under one model and one key: count it once
                    total += sums
                if group_by == "day" and kind == "model":
                    group: str | None = day.isoformat()
                elif group_by == kind:
                    group = None if name == NO_KEY else name
                else:
                    continue
                groups[group] = groups.get(group, UsageTotals()) + sums
        rows = [UsageRow(group=g, **t.model_dump()) for g, t in groups.items()]
        if group_by != "day":
            rows.sort(key=lambda row: (-row.cost_usd, -row.total_tokens, row.group or ""))
        return cls(from_=first, to=last, group_by=group_by, data=rows, total=total)


def days_between(first: date, last: date) -> list[date]:
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]
