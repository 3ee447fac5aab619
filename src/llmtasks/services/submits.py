"""The one submit sequence that tasks and batches share: once per Idempotency-Key, the caller's
key limits held and a task's most cost reserved under the key's budget, then the work sent and
stored, an outage a 503 that says nothing was kept.

What each kind sends and stores (and in which order) is its own `create`; what it checks before
(sizes, the webhook URL) happens before this sequence, so a refused body leaves no trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar

from pydantic import BaseModel

from llmtasks.aws.budgets import KeyBudgets
from llmtasks.aws.idempotency import IdempotencyKeys, once_per_key
from llmtasks.aws.limits import KeyLimits
from llmtasks.domain.caller import Caller
from llmtasks.domain.errors import BackendError, ServiceUnavailable
from llmtasks.observability import logger

Created = TypeVar("Created", bound=BaseModel)


@dataclass(frozen=True)
class Held:
    """What a submit holds of its caller's key's max_in_flight until it ends."""

    kind: str  # "t": a task, "b": a batch (its items count)
    resource_id: str
    weight: int = 1
    # A task's most cost, reserved under its key's budget (a batch's items reserve as they fan out).
    most_cost: Decimal = Decimal(0)


@dataclass(frozen=True)
class SubmitSequence:
    idempotency: IdempotencyKeys | None
    limits: KeyLimits | None
    budgets: KeyBudgets | None = None

    def run(
        self,
        create: Callable[[], Created],
        model: type[Created],
        *,
        what: str,
        tenant: str,
        key: str | None,
        body: BaseModel,
        caller: Caller | None,
        held: Held,
    ) -> tuple[Created, bool]:
        """What `create` makes, once per (tenant, `key`), and whether this is a replay of it."""

        def first_time() -> Created:
            if caller is not None and self.limits is not None:
                self.limits.hold(caller, held.kind, held.resource_id, weight=held.weight)
            if held.kind == "t" and caller is not None and caller.budget is not None and caller.key_id:
                if self.budgets is None:
                    raise ServiceUnavailable(
                        "This key has a budget, and budgets are counted in LimitsTable: none is set."
                    )
                self.budgets.reserve(caller.key_id, caller.budget, held.resource_id, held.most_cost)
            try:
                return create()
            except BackendError as exc:
                logger.exception(f"{what} submit failed", resource_id=held.resource_id)
                raise ServiceUnavailable(
                    f"The {what} could not be stored or queued; nothing was kept. Retry."
                ) from exc

        return once_per_key(self.idempotency, first_time, model, tenant=tenant, key=key, body=body)
