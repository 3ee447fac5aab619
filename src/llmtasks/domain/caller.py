"""Who sent a request: what the authorizer writes into API Gateway's request context for a valid
key, and what the API reads back from it. Both sides of that context live here, so they cannot
drift apart."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmtasks.domain.budgets import Budget


@dataclass(frozen=True)
class Caller:
    """Who sent a request, as the authorizer decided: the key's tenant, id and limits."""

    tenant_id: str
    key_id: str | None = None  # None: the local gateway's --no-auth
    rps: int | None = None
    max_in_flight: int | None = None
    max_running: int | None = None
    tpm: int | None = None  # LLM tokens a minute the tenant's calls may use
    budget: Budget | None = None  # what the key may spend a day and a month, when it is bounded


def authorizer_context(
    tenant_id: str,
    key_id: str,
    *,
    rps: float | None = None,
    max_in_flight: int | None = None,
    max_running: int | None = None,
    tpm: int | None = None,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """The authorizer's context for a valid key (strings and numbers only, as API Gateway wants;
    a limit the key does not have is left out)."""
    context: dict[str, Any] = {"tenant_id": tenant_id, "key_id": key_id}
    limits = {"rps": rps, "max_in_flight": max_in_flight, "max_running": max_running, "tpm": tpm}
    context.update({name: value for name, value in limits.items() if value is not None})
    if budget is not None:
        # Text, so that the amount arrives exactly as it was set (a float would round it)
        amounts = {"budget_usd_day": budget.day_usd, "budget_usd_month": budget.month_usd}
        context.update({name: str(value) for name, value in amounts.items() if value is not None})
    return context


def caller_of(event: Mapping[str, Any]) -> Caller | None:
    """The caller the route's authorizer let through, None when no authorizer ran."""
    context = ((event.get("requestContext") or {}).get("authorizer") or {}).get("lambda") or {}
    if not context.get("tenant_id"):
        return None

    def number(name: str) -> int | None:
        value = context.get(name)
        return None if value is None else int(value)

    return Caller(
        tenant_id=str(context["tenant_id"]),
        key_id=str(context["key_id"]) if context.get("key_id") else None,
        rps=number("rps"),
        max_in_flight=number("max_in_flight"),
        max_running=number("max_running"),
        tpm=number("tpm"),
        budget=_budget(context),
    )


def _budget(context: Mapping[str, Any]) -> Budget | None:
    day, month = context.get("budget_usd_day"), context.get("budget_usd_month")
    if day is None and month is None:
        return None
    return Budget(day_usd=day, month_usd=month)
