"""API keys, as the operator makes and ends them (`llmtasks keys`, and the local stack's own keys):
rows of the deployment's ApiKeysTable, written as the authorizer reads them."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

from llmtasks.aws.apikeys import MAX_IN_FLIGHT, ApiKey, ApiKeys
from llmtasks.domain.budgets import Budget

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

__all__ = ["MAX_IN_FLIGHT", "ApiKey", "Keys"]


class Keys:
    def __init__(self, api_keys_table: str, dynamodb: DynamoDBClient) -> None:
        self._keys = ApiKeys(api_keys_table, dynamodb)

    def create(
        self,
        tenant: str,
        *,
        name: str = "",
        rps: int | None = None,
        max_in_flight: int | None = None,
        max_running: int | None = None,
        tpm: int | None = None,
        budget_usd_day: Decimal | None = None,
        budget_usd_month: Decimal | None = None,
    ) -> tuple[str, ApiKey]:
        """A new key of `tenant` and its record; the key itself is not kept (its hash is)."""
        budget = Budget(day_usd=budget_usd_day, month_usd=budget_usd_month)
        return self._keys.create(
            tenant,
            name=name,
            rps=rps,
            max_in_flight=max_in_flight,
            max_running=max_running,
            tpm=tpm,
            budget=budget,
        )

    def all(self) -> list[ApiKey]:
        return self._keys.all()

    def revoke(self, key_id: str) -> ApiKey | None:
        """The revoked key's record; None when no key has that id."""
        return self._keys.revoke(key_id)
