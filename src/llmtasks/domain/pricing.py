"""What a call cost: its usage priced from a table of per-model prices (USD per million tokens).

The default table is `llmtasks/prices.json`, with the date and source of its prices; a deploy
replaces it whole with the template's PriceTable parameter (settings.PriceSettings). A model the
table lacks prices at 0 with `cost_unknown` set: never a guess (a dated snapshot may cost other
than its alias, so names match exactly). Decimal arithmetic throughout: the per-token prices
are exact decimals, and so are the sums DynamoDB keeps of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from llmtasks.domain.input_files import FileFacts
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.media_tokens import inline_media_bytes, media_tokens
from llmtasks.domain.models import Usage

PER = Decimal(1_000_000)
# Tokens a chat format adds around each message and before the reply (OpenAI's is 3-4 a message
# and 3 for the reply): the bound counts more than any of them.
MESSAGE_OVERHEAD_TOKENS = 8
# Costs are kept to the nano-dollar: a token of the cheapest model is 2.5e-8 USD.
COST_PLACES = Decimal("1e-12")
# The reply a rate limit counts for a call of a model the table lacks, when the call sets no
# max_completion_tokens: a guess, settled to the real usage once the answer is in.
UNPRICED_OUTPUT_TOKENS = 4_096

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
    max_output_tokens: int = Field(ge=1, le=10_000_000)


class PriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    as_of: date | None = None
    source: str | None = None
    models: dict[str, ModelPrice]

    def price(self, usage: Usage, model: str, tier: str | None = None) -> Usage:
        """`usage` with its cost: `cost_usd` from this table, or 0 and `cost_unknown` when the
        table has no price for `model`. `tier` ("batch": a provider's batch job) names the
        column to price at; this table has the standard one only, an upper bound for it."""
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

    def most_cost(
        self, request: LLMRequest, model: str, files: Mapping[str, FileFacts] | None = None
    ) -> Decimal:
        """The most one call of `request` can cost, with no tokenizer: no BPE token is shorter
        than one byte, so the prompt's text has at most as many tokens as bytes (plus the chat
        format's own), images and documents their documented bounds (media_tokens), at the
        dearer of the input prices; the reply at most its `output_limit` (max_completion_tokens
        or max_tokens, reasoning included), else the model's output limit, at the output price.
        `files` sizes the files named by id (one not in it is bound as the largest a task may
        name). 0 for a model the table lacks (priced at 0)."""
        prices = self.models.get(model)
        if prices is None:
            return Decimal(0)
        prompt_tokens = most_prompt_tokens(request, model, files or {})
        input_price = max(prices.input, prices.cached_input or prices.input)
        output_tokens = request.output_limit or prices.max_output_tokens
        return ((prompt_tokens * input_price + output_tokens * prices.output) / PER).quantize(COST_PLACES)

    def most_tokens(
        self, request: LLMRequest, model: str, files: Mapping[str, FileFacts] | None = None
    ) -> int:
        """The most tokens one call of `request` can use, as most_cost counts them (a provider's
        tokens-a-minute limit counts the prompt and the reply alike): the reply at most its
        `output_limit`, else the model's output limit, else UNPRICED_OUTPUT_TOKENS."""
        prices = self.models.get(model)
        default_output = prices.max_output_tokens if prices is not None else UNPRICED_OUTPUT_TOKENS
        return most_prompt_tokens(request, model, files or {}) + (request.output_limit or default_output)


def most_prompt_tokens(request: LLMRequest, model: str, files: Mapping[str, FileFacts]) -> int:
    """The most tokens the prompt can be: no BPE token is shorter than a byte, images and
    documents at their documented bounds (media_tokens), plus the chat format's own."""
    return (
        request.text_bytes()
        - inline_media_bytes(request)
        + media_tokens(request, model, files)
        + MESSAGE_OVERHEAD_TOKENS * (len(request.chat_messages()) + 1)
    )
