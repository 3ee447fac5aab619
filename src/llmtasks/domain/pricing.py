"""What a call cost: its usage priced from a table of per-model prices (USD per million tokens).

The default table is `llmtasks/prices.json`, with the date and source of its prices; a deploy
replaces it whole with the template's PriceTable parameter (settings.PriceSettings). A model the
table lacks prices at 0 with `cost_unknown` set: never a guess (a dated snapshot may cost other
than its alias, so names match exactly). Decimal arithmetic throughout: the per-token prices
are exact decimals, and so are the sums DynamoDB keeps of them.
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from llmtasks.domain.models import Usage

PER = Decimal(1_000_000)
# Costs are kept to the nano-dollar: a token of the cheapest model is 2.5e-8 USD.
COST_PLACES = Decimal("1e-12")

Price = Annotated[Decimal, Field(ge=0, le=100_000, allow_inf_nan=False)]


class ModelPrice(BaseModel):
    """One model's prices, USD per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: Price
    output: Price
    # Prompt tokens the provider served from its cache (OpenAI's prompt_tokens_details.cached_tokens,
    # Bedrock's cacheReadInputTokens); the input price when the model has no cache price.
    cached_input: Price | None = None
    # The most a call can write: what a budget reserves for a task that sets no max_tokens.
    max_output_tokens: int | None = Field(default=None, ge=1)


class PriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    as_of: date | None = None
    source: str | None = None
    models: dict[str, ModelPrice]

    def price(self, usage: Usage, model: str) -> Usage:
        """`usage` with its cost: `cost_usd` from this table, or 0 and `cost_unknown` when the
        table has no price for `model`."""
        prices = self.models.get(model)
        if prices is None:
            return usage.model_copy(update={"cost_usd": 0.0, "cost_unknown": True})
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        cost = (
            (usage.prompt_tokens - cached) * prices.input
            + cached * (prices.input if prices.cached_input is None else prices.cached_input)
            + usage.completion_tokens * prices.output
        ) / PER
        return usage.model_copy(update={"cost_usd": float(cost.quantize(COST_PLACES)), "cost_unknown": False})
