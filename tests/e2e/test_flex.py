"""The flex tier on the local stack: a task with `service_tier: "flex"` that meets the mock's
429 Resource Unavailable goes back on its queue, then completes at the flex price; one whose
timeout_s runs out first fails saying so."""

from __future__ import annotations

from decimal import Decimal

import pytest

from llmtasks.settings import default_price_table
from tests.e2e.conftest import RunningStack, wait_terminal

pytestmark = pytest.mark.e2e

# A model the default price table prices at a flex tier (OpenAI offers flex for o4-mini).
FLEX_MODEL = "o4-mini"


@pytest.mark.timeout(120)
def test_a_flex_task_goes_back_on_its_queue_twice_then_completes_at_the_flex_price(
    fresh_mock: RunningStack,
) -> None:
    prompt = "Sort these invoices [mock:flex-unavailable=2]"
    body = {"prompt": prompt, "model": FLEX_MODEL, "service_tier": "flex", "max_retries": 0}
    with fresh_mock.client() as client:
        submitted = client.post("/tasks", json=body)
        assert submitted.status_code == 202, submitted.text
        task = wait_terminal(client, submitted.json()["task_id"], timeout_s=90)
    # Then it completed without spending a retry: each refusal gave its attempt back
    assert (task["status"], task["attempts"]) == ("completed", 1), task
    assert fresh_mock.mock_stats()["outcomes_by_prompt"][prompt] == [
        "flex_unavailable",
        "flex_unavailable",
        "ok",
    ]
    # And it cost the flex price of the one call that was served, at the tier the mock said
    usage = task["usage"]
    assert (usage["service_tier"], usage["tier_unpriced"], usage["cost_unknown"]) == ("flex", False, False)
    flex = default_price_table().models[FLEX_MODEL].flex
    assert flex is not None
    assert flex.cached_input is not None
    uncached = usage["prompt_tokens"] - usage["cached_tokens"]
    expected = (
        uncached * flex.input
        + usage["cached_tokens"] * flex.cached_input
        + usage["completion_tokens"] * flex.output
    ) / Decimal(1_000_000)
    assert usage["cost_usd"] == pytest.approx(float(expected), rel=1e-9)
    assert usage["cost_usd"] > 0


@pytest.mark.timeout(120)
def test_a_flex_task_whose_timeout_runs_out_before_flex_capacity_fails_saying_so(
    fresh_mock: RunningStack,
) -> None:
    prompt = "Never served [mock:flex-unavailable=999]"
    body = {"prompt": prompt, "model": FLEX_MODEL, "service_tier": "flex", "timeout_s": 4}
    with fresh_mock.client() as client:
        submitted = client.post("/tasks", json=body)
        assert submitted.status_code == 202, submitted.text
        task = wait_terminal(client, submitted.json()["task_id"], timeout_s=60)
    outcomes = fresh_mock.mock_stats()["outcomes_by_prompt"][prompt]
    assert (task["status"], task["error_code"]) == ("failed", "llm_flex_unavailable"), (task, outcomes)
    assert "no flex capacity came before its timeout_s (4 s) ran out" in task["error"]
    assert outcomes
    assert set(outcomes) == {"flex_unavailable"}
