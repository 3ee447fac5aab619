"""Budgets that hold: an API key's spend per UTC day and per UTC month, in USD, never overshot.

A submit reserves the most its task can cost (PriceTable.most_cost) in one conditional write,
and is refused (429 budget_exhausted) when that does not fit what is left; the reservation is
settled to what the task really cost once it has ended (aws/budgets.py says when). A retry
that follows a billed attempt, or a batch retry, reserves again before it calls.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

BUDGET_EXHAUSTED = "budget_exhausted"  # the problem's type and the failed task's error_code

UsdBudget = Annotated[Decimal, Field(ge=0, le=1_000_000_000, allow_inf_nan=False)]


class Budget(BaseModel):
    """What one API key may spend; None: no bound on that period."""

    model_config = ConfigDict(frozen=True)

    day_usd: UsdBudget | None = None
    month_usd: UsdBudget | None = None

    @property
    def bounded(self) -> bool:
        return self.day_usd is not None or self.month_usd is not None


class Periods(BaseModel):
    """The UTC day and month a moment falls in, and when each ends."""

    day: str
    month: str
    day_ends: float
    month_ends: float

    @classmethod
    def at(cls, now: float) -> Periods:
        moment = datetime.fromtimestamp(now, tz=UTC)
        day_start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        next_month = (day_start.replace(day=1) + timedelta(days=32)).replace(day=1)
        return cls(
            day=day_start.date().isoformat(),
            month=day_start.strftime("%Y-%m"),
            day_ends=day_start.timestamp() + 86_400,
            month_ends=next_month.timestamp(),
        )

    def retry_after_s(self, now: float, *, day: bool) -> int:
        """Seconds until the exhausted period (the day's, else the month's) starts over."""
        return max(1, math.ceil((self.day_ends if day else self.month_ends) - now))
