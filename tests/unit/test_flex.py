"""The flex tier and the price table's tiers: a call priced at the tier that served it (batch,
flex, priority, or the standard price), the flex tier's 429 Resource Unavailable putting the task
back on its queue until its time runs out, and the mock answering flex calls as OpenAI does."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal
from typing import Any

import httpx
import pytest

from llmtasks.domain.errors import FLEX_UNAVAILABLE, LLMError
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.models import TaskStatus, Usage
from llmtasks.domain.pricing import ModelPrice, PriceTable, TierPrice
from llmtasks.llm.keys import KeyPool, LlmEndpoint
from llmtasks.llm.openai import OpenAIChat
from llmtasks.settings import default_price_table
from tests.conftest import RunningMock
from tests.helpers import HANG_S, eventually
from tests.unit.test_worker import Worker

pytestmark = pytest.mark.unit

# Round prices, so that each expected cost is written out by hand below.
PRICES = PriceTable(
    models={
        "mock-model": ModelPrice(
            input=Decimal(4),
            cached_input=Decimal(1),
            output=Decimal(16),
            max_output_tokens=1000,
            flex=TierPrice(input=Decimal(2), cached_input=Decimal("0.5"), output=Decimal(8)),
            batch=TierPrice(input=Decimal(2), output=Decimal(8)),
        ),
    }
)
USAGE = Usage(prompt_tokens=1_000, cached_tokens=400, completion_tokens=250, total_tokens=1_250)
STANDARD = float(Decimal("0.0068"))  # 600 x 4 + 400 x 1 + 250 x 16, per million
FLEX = float(Decimal("0.0034"))  # 600 x 2 + 400 x 0.5 + 250 x 8
BATCH = float(Decimal("0.004"))  # 1000 x 2 (no cache price: the input's) + 250 x 8


@pytest.mark.parametrize(
    ("served", "cost"),
    [("flex", FLEX), ("default", STANDARD), (None, STANDARD), ("scale", STANDARD), ("auto", STANDARD)],
)
def test_a_call_is_priced_at_the_tier_that_served_it(served: str | None, cost: float) -> None:
    priced = PRICES.price(USAGE.model_copy(update={"service_tier": served}), "mock-model")
    assert (priced.cost_usd, priced.tier_unpriced, priced.service_tier) == (cost, False, served)


def test_a_tier_named_by_the_caller_wins_and_batch_has_its_own_column() -> None:
    # A provider's batch job prices its lines at the batch column, whatever its usage says.
    assert PRICES.price(USAGE, "mock-model", tier="batch").cost_usd == BATCH
    assert PRICES.price(
        USAGE.model_copy(update={"service_tier": "flex"}), "mock-model", "default"
    ).cost_usd == (STANDARD)
    assert (PRICES.has_tier("mock-model", "batch"), PRICES.has_tier("mock-model", "priority")) == (
        True,
        False,
    )
    assert not PRICES.has_tier("unknown-model", "batch")


def test_a_tier_the_model_has_no_price_for_is_priced_at_its_standard_price_and_says_so() -> None:
    priced = PRICES.price(USAGE.model_copy(update={"service_tier": "priority"}), "mock-model")
    assert (priced.cost_usd, priced.tier_unpriced, priced.cost_unknown) == (STANDARD, True, False)
    unknown = PRICES.price(USAGE.model_copy(update={"service_tier": "flex"}), "other-model")
    assert (unknown.cost_usd, unknown.cost_unknown, unknown.tier_unpriced) == (0.0, True, False)


def test_a_budget_reserves_at_the_standard_price_for_a_flex_request_and_the_priority_one_for_priority() -> (
    None
):
    table = PriceTable(
        models={
            "m": ModelPrice(
                input=Decimal(1),
                output=Decimal(1),
                max_output_tokens=100,
                flex=TierPrice(input=Decimal("0.5"), output=Decimal("0.5")),
                priority=TierPrice(input=Decimal(2), output=Decimal(2)),
            )
        }
    )
    plain = LLMRequest(prompt="x", max_tokens=100)
    flex = plain.model_copy(update={"service_tier": "flex"})
    priority = plain.model_copy(update={"service_tier": "priority"})
    # a flex request may be served (and billed) at the default tier
    assert table.most_cost(flex, "m") == table.most_cost(plain, "m")
    assert table.most_cost(priority, "m") == 2 * table.most_cost(plain, "m")


def test_the_default_tables_batch_and_flex_prices_are_half_the_standard_ones() -> None:
    table = default_price_table()
    batched = {name: price.batch for name, price in table.models.items()}
    assert all(batched.values())  # every model it lists prices the provider's batch jobs
    for name, price in table.models.items():
        for tier in (price.batch, price.flex):
            if tier is not None:
                assert (tier.input * 2, tier.output * 2) == (price.input, price.output), name
    o4 = table.models["o4-mini"]
    assert o4.flex is not None
    assert o4.flex.cached_input is not None
    assert o4.cached_input is not None
    assert o4.flex.cached_input * 2 == o4.cached_input


def test_a_tasks_usage_keeps_the_tier_its_calls_share_and_none_when_they_differ() -> None:
    flex = USAGE.model_copy(update={"service_tier": "flex"})
    assert (Usage() + flex + flex).service_tier == "flex"
    assert (flex + USAGE.model_copy(update={"service_tier": "default"})).service_tier is None
    assert (flex + USAGE.model_copy(update={"tier_unpriced": True})).tier_unpriced


# --- the provider and the mock -------------------------------------------------------------------


def flex_body(prompt: str) -> dict[str, Any]:
    return {"model": "mock-model", "messages": [{"role": "user", "content": prompt}], "service_tier": "flex"}


def test_the_mock_answers_the_first_n_flex_calls_of_a_marked_prompt_429_resource_unavailable(
    mock_llm: RunningMock,
) -> None:
    prompt = "classify [mock:flex-unavailable=2]"
    with httpx.Client(base_url=mock_llm.url) as http:
        refused = [http.post("/chat/completions", json=flex_body(prompt)) for _ in range(2)]
        # a call at the default tier is never refused so
        default = http.post("/chat/completions", json={**flex_body(prompt), "service_tier": "auto"})
        served = http.post("/chat/completions", json=flex_body(prompt))
    for reply in refused:
        assert reply.status_code == 429
        error = reply.json()["error"]
        assert (error["code"], error["param"]) == ("resource_unavailable", None)
        assert error["message"].startswith("Resource Unavailable")
    assert (default.status_code, default.json()["service_tier"]) == (200, "default")
    assert (served.status_code, served.json()["service_tier"]) == (200, "flex")
    assert mock_llm.stats.outcomes_by_prompt[prompt] == ["flex_unavailable"] * 2 + ["ok", "ok"]
    # refused calls are not billed: only the two answers used the key's tokens
    assert mock_llm.stats.flex_unavailable == 2


def test_the_flex_429_is_no_rate_limit_the_key_does_not_rest_and_no_other_key_is_tried(
    mock_llm: RunningMock,
) -> None:
    pool = KeyPool([LlmEndpoint(mock_llm.url, "sk-one"), LlmEndpoint(mock_llm.url, "sk-two")])
    llm = OpenAIChat(default_model="mock-model", pool=pool)
    request = LLMRequest(prompt="[mock:flex-unavailable=1] tag", service_tier="flex")
    with pytest.raises(LLMError) as raised:
        asyncio.run(llm.complete(request, timeout_s=10))
    assert (raised.value.code, raised.value.transient) == (FLEX_UNAVAILABLE, True)
    assert mock_llm.stats.calls == 1  # flex capacity is not a key's: another key would meet the same
    assert pool.is_ready(0)
    assert pool.is_ready(1)
    done = asyncio.run(llm.complete(request, timeout_s=10))
    assert done.usage.service_tier == "flex"


# --- the worker: back on the queue until the task's time runs out ---------------------------------


@pytest.fixture
def worker(aws: Any, handler: Any, settings: Any, mock_llm: RunningMock) -> Worker:
    overrides = {"retry_base_delay_s": 0.0, "worker_call_slots": 0, "price_table": PRICES}
    return Worker(aws, handler, settings.model_copy(update=overrides), mock_llm)


def test_a_flex_task_waits_out_resource_unavailable_without_spending_retries_and_costs_the_flex_price(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a flex task with no retries, whose first two calls find no flex capacity
    task_id = worker.submit("[mock:flex-unavailable=2] sort me", service_tier="flex", max_retries=0)
    for _ in range(2):
        # When its call is refused, the task is back on its queue, its attempt given back
        assert worker.run(eventually(worker.queued, bool, timeout_s=HANG_S, what="the task's message")) == {
            "batchItemFailures": []
        }
        waiting = worker.task(task_id)
        assert (waiting.status, waiting.last_error_code, waiting.attempts) == (
            TaskStatus.PENDING,
            FLEX_UNAVAILABLE,
            0,
        )
    worker.run(eventually(worker.queued, bool, timeout_s=HANG_S, what="the third delivery"))
    # Then it completes, priced at the flex price (the two refusals billed nothing)
    done = worker.task(task_id)
    assert done.status is TaskStatus.COMPLETED
    usage = done.usage
    assert usage.service_tier == "flex"
    assert usage.cost_usd == float(
        (usage.prompt_tokens * Decimal(2) + usage.completion_tokens * Decimal(8)) / Decimal(1_000_000)
    )
    assert mock_llm.stats.outcomes_by_prompt["[mock:flex-unavailable=2] sort me"] == [
        "flex_unavailable",
        "flex_unavailable",
        "ok",
    ]


@pytest.mark.parametrize("timeout_s", [30.0, None])
def test_a_flex_task_fails_when_its_time_runs_out_before_flex_capacity_comes(
    worker: Worker, mock_llm: RunningMock, timeout_s: float | None
) -> None:
    # Given a flex task whose calls never find flex capacity, claimed 10 s before its timeout_s
    # (or, with none, the stack's flex_wait_s) runs out, and a backoff of at least 15 s (the call
    # has its 10 s: half a second was too little for a loaded machine's call to the mock)
    task_id = worker.submit("[mock:flex-unavailable=99] never", service_tier="flex", timeout_s=timeout_s)
    created = worker.task(task_id).created_at
    worker.clock = lambda: created + 20
    worker.run(worker.queued(), retry_base_delay_s=15.0, flex_wait_s=30.0)
    # Then it fails, saying why, with no message left to bring it back
    failed = worker.task(task_id)
    assert (failed.status, failed.error_code) == (TaskStatus.FAILED, FLEX_UNAVAILABLE)
    said = "its timeout_s (30 s)" if timeout_s else "the 30 s a flex task without a timeout_s waits"
    assert said in failed.error
    assert "no flex capacity came before" in failed.error
    assert mock_llm.stats.calls == 1
    time.sleep(0.1)
    assert worker.queued() == []


def test_a_flex_task_whose_message_comes_back_after_its_timeout_fails_as_a_flex_wait(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a flex task sent back on its queue once by the flex tier
    task_id = worker.submit("[mock:flex-unavailable=99] late", service_tier="flex", timeout_s=30)
    worker.run(worker.queued())
    waiting = worker.task(task_id)
    assert (waiting.status, waiting.last_error_code) == (TaskStatus.PENDING, FLEX_UNAVAILABLE)
    # When its message comes back after its timeout_s ran out
    worker.clock = lambda: waiting.created_at + 31
    worker.run(eventually(worker.queued, bool, timeout_s=HANG_S, what="the task's message"))
    # Then it fails without a call, saying it waited for flex capacity
    failed = worker.task(task_id)
    assert (failed.status, failed.error_code) == (TaskStatus.FAILED, FLEX_UNAVAILABLE)
    assert "no flex capacity came before its timeout_s (30 s) ran out" in failed.error
    assert mock_llm.stats.calls == 1
