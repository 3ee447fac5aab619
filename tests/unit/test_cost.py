"""What every call cost: the price table, a task's billed attempts summed, the spend counters
that `GET /usage` reads by day, model and key, a batch's sum, and the LlmCostUsd metric."""

from __future__ import annotations

import threading
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from llmtasks.aws.store import TaskStore
from llmtasks.aws.usage import UsageCounters, utc_day
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import SubmitTaskRequest, Task, TaskStatus, Usage
from llmtasks.domain.pricing import ModelPrice, PriceTable
from llmtasks.domain.usage import KEPT_DAYS, days_read, default_first
from llmtasks.settings import Settings, default_price_table
from llmtasks_local.mock_llm import reply_text
from tests.conftest import Aws, RunningMock
from tests.helpers import emf_records
from tests.unit.test_api import Api, assert_problem, task_service
from tests.unit.test_worker import Worker, redelivered

pytestmark = pytest.mark.unit

# Round prices, so that each expected cost is written out by hand below.
PRICES = PriceTable(
    models={
        "mock-model": ModelPrice(
            input=Decimal(2), cached_input=Decimal("0.5"), output=Decimal(8), max_output_tokens=1000
        ),
        "other-model": ModelPrice(input=Decimal(1), output=Decimal(1), max_output_tokens=1000),
    }
)


def test_a_call_is_priced_per_million_tokens_its_cached_prompt_tokens_at_the_cached_price() -> None:
    usage = Usage(prompt_tokens=1_000, cached_tokens=400, completion_tokens=250, total_tokens=1_250)
    priced = PRICES.price(usage, "mock-model")
    # 600 x 2 + 400 x 0.5 + 250 x 8, per million
    assert priced.cost_usd == pytest.approx(0.0034, abs=0)
    assert priced.cost_usd == float(Decimal("0.0034"))
    assert not priced.cost_unknown
    # A model without a cache price pays its input price for cached tokens
    assert PRICES.price(usage, "other-model").cost_usd == float(Decimal("0.00125"))


def test_a_model_the_table_lacks_costs_zero_and_says_so_never_a_guess() -> None:
    priced = PRICES.price(Usage(prompt_tokens=10, completion_tokens=10, total_tokens=20), "mock-model-2025")
    assert (priced.cost_usd, priced.cost_unknown) == (0.0, True)


def test_the_default_table_is_dated_sourced_and_prices_the_default_model() -> None:
    table = default_price_table()
    assert table.as_of is not None
    assert table.source
    assert Settings().llm_model in table.models
    assert all(p.max_output_tokens for p in table.models.values())


def test_the_price_table_parameter_replaces_the_default_and_a_bad_one_fails_the_cold_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "PRICE_TABLE", '{"models": {"m": {"input": "1.5", "output": 3, "max_output_tokens": 9}}}'
    )
    assert Settings().price_table.models == {
        "m": ModelPrice(input=Decimal("1.5"), output=Decimal(3), max_output_tokens=9)
    }
    monkeypatch.setenv("PRICE_TABLE", "")
    assert Settings().price_table == default_price_table()
    for bad in (
        '{"models": {"m": {"input": -1, "output": 1, "max_output_tokens": 9}}}',
        "not json",
        '{"models": {"m": {}}}',
    ):
        monkeypatch.setenv("PRICE_TABLE", bad)
        with pytest.raises(ValueError, match="price_table"):
            Settings()


def test_usage_reads_openai_s_cached_prompt_tokens() -> None:
    usage = Usage.model_validate(
        {
            "prompt_tokens": 9,
            "completion_tokens": 1,
            "total_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 4},
        }
    )
    assert usage.cached_tokens == 4


class FixedLLM:
    """An LLM that bills `usage` for every answer; `during` runs while the call is out."""

    def __init__(self, usage: Usage, during: Any = None) -> None:
        self.usage = usage
        self.during = during

    async def complete(
        self, request: LLMRequest, *, timeout_s: float, on_progress: Any = None, tokens: int = 0
    ) -> Completion:
        if self.during is not None:
            self.during()
        return Completion(text="answer", model="mock-model", usage=self.usage)


@pytest.fixture(name="worker")
def priced_worker(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> Worker:
    """test_worker's, pricing from PRICES."""
    overrides = {"retry_base_delay_s": 0.0, "worker_call_slots": 0, "price_table": PRICES}
    return Worker(aws, handler, settings.model_copy(update=overrides), mock_llm)


@pytest.fixture(name="api")
def usage_api(aws: Aws, handler: Any, settings: Settings) -> Api:
    return Api(aws, handler, task_service(aws, settings))


CALL = Usage(prompt_tokens=1_000, completion_tokens=500, total_tokens=1_500)
CALL_COST = float(Decimal("0.006"))  # 1000 x 2 + 500 x 8, per million


def test_a_completed_task_s_usage_has_its_cost_and_an_unbilled_500_costs_nothing(
    worker: Worker, mock_llm: RunningMock, capsys: pytest.CaptureFixture[str]
) -> None:
    task_id = worker.submit("priced")
    mock_llm.configure(rate_500=1.0)
    worker.run_queued()
    mock_llm.configure()
    worker.run_queued()
    task = worker.task(task_id)
    assert task.status is TaskStatus.COMPLETED
    view = worker.service.get("default", task_id)
    usage = view.billed_usage
    assert usage is not None
    assert usage.total_tokens > 0
    assert usage.cost_usd == PRICES.price(task.usage, "mock-model").cost_usd > 0
    # The 500 left no usage on the timeline; the completion's attempt carries it
    assert [a.usage is not None for a in task.attempt_log] == [False, True]
    emf = emf_records(capsys.readouterr().out)
    [cost] = emf["LlmCostUsd"]
    assert cost == {
        "service": "llmtasks",
        "model": "mock-model",
        "tenant": "default",
        "value": usage.cost_usd,
    }


def test_a_call_taken_over_after_its_lease_lapsed_is_billed_with_the_call_that_completed(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # The first delivery's call outlives its lease; the redelivery takes the task over and
    # completes it; then the first call's answer arrives: discarded, but the provider billed it
    task_id = worker.submit("taken over")
    [message] = worker.queued()

    def redelivery_completes() -> None:
        lease_until = worker.task(task_id).lease_until
        worker.clock = lambda: lease_until + 1
        runs = threading.Thread(target=worker.run, args=([redelivered(message, 2)],))
        runs.start()
        runs.join()

    worker.run([message], llm=FixedLLM(CALL, during=redelivery_completes))
    task = worker.task(task_id)
    assert (task.status, task.result) == (TaskStatus.COMPLETED, reply_text("taken over"))  # the redelivery's
    assert [a.outcome for a in task.attempt_log] == ["completed", "discarded"]
    mock_call = PRICES.price(task.usage, "mock-model")
    usage = task.billed_usage
    assert usage is not None
    assert usage.cost_usd == float(Decimal(repr(mock_call.cost_usd)) + Decimal(repr(CALL_COST)))
    assert usage.prompt_tokens == task.usage.prompt_tokens + CALL.prompt_tokens
    # The tenant's counters have both calls
    report = worker.service.usage("default", first=None, last=utc_day(time.time() + 86_400), group_by="model")
    assert [(r.group, r.calls, r.cost_usd) for r in report.data] == [("mock-model", 2, usage.cost_usd)]


def test_a_task_cancelled_while_its_call_ran_keeps_what_the_call_cost(worker: Worker) -> None:
    task_id = worker.submit("cancelled mid-call")
    worker.run_queued(llm=FixedLLM(CALL, during=lambda: worker.service.cancel("default", task_id)))
    task = worker.task(task_id)
    assert (task.status, task.result) == (TaskStatus.CANCELLED, None)
    assert task.billed_usage == PRICES.price(CALL, "mock-model")
    assert worker.service.get("default", task_id).billed_usage.cost_usd == CALL_COST


def charge(
    counters: UsageCounters, *, tenant: str, key: str | None, model: str, at: datetime, usage: Usage
) -> None:
    task = Task.submitted(
        SubmitTaskRequest(prompt="p"),
        task_id="t",
        tenant_id=tenant,
        created_at=at.timestamp(),
        expires_at=int(at.timestamp()) + 60,
        key_id=key,
    )
    counters.charge(task, PRICES.price(usage, model), model=model, now=at.timestamp())


def test_usage_is_summed_by_day_by_model_and_by_key_from_the_daily_counters(aws: Aws, api: Api) -> None:
    counters = TaskStore(api.service._settings.tasks_table_name, aws.dynamodb).usage
    today = datetime.now(UTC).replace(hour=12)
    yesterday = today - timedelta(days=1)
    small = Usage(prompt_tokens=100, completion_tokens=10, total_tokens=110)  # 0.00028 on mock-model
    charge(counters, tenant="default", key="k1", model="mock-model", at=yesterday, usage=small)
    charge(counters, tenant="default", key="k1", model="mock-model", at=today, usage=small)
    charge(counters, tenant="default", key="k2", model="other-model", at=today, usage=small)  # 0.00011
    charge(counters, tenant="default", key=None, model="unpriced", at=today, usage=small)
    charge(counters, tenant="someone-else", key="k9", model="mock-model", at=today, usage=small)

    def rows(group_by: str, query: str = "") -> list[tuple[Any, ...]]:
        reply = api.call("GET", "/usage", query=f"group_by={group_by}{query}")
        assert reply["statusCode"] == 200, reply
        body = reply["json"]
        assert (body["object"], body["to"]) == ("usage", today.date().isoformat())
        assert (body["total"]["calls"], body["total"]["cost_unknown_calls"]) == (4, 1)
        assert body["total"]["cost_usd"] == pytest.approx(0.00028 * 2 + 0.00011, abs=1e-15)
        return [(r["group"], r["calls"], r["cost_usd"], r["total_tokens"]) for r in body["data"]]

    assert rows("day") == [
        (yesterday.date().isoformat(), 1, 0.00028, 110),
        (today.date().isoformat(), 3, 0.00039, 330),
    ]
    assert rows("model") == [
        ("mock-model", 2, 0.00056, 220),
        ("other-model", 1, 0.00011, 110),
        ("unpriced", 1, 0.0, 110),
    ]
    assert rows("key") == [("k1", 2, 0.00056, 220), ("k2", 1, 0.00011, 110), (None, 1, 0.0, 110)]
    # A span that leaves yesterday out
    only_today = api.call("GET", "/usage", query=f"group_by=day&from={today.date().isoformat()}")["json"]
    assert [r["group"] for r in only_today["data"]] == [today.date().isoformat()]
    assert only_today["from"] == today.date().isoformat()


@pytest.mark.parametrize(
    "query",
    [
        "group_by=week",
        "from=2026-13-01",
        "from=yesterday",
        "to=0",
        "to=20261201",
    ],
)
def test_a_bad_usage_query_is_a_422_problem(api: Api, query: str) -> None:
    assert_problem(api.call("GET", "/usage", query=query), 422)


def test_any_span_the_document_allows_is_answered_from_the_days_kept(aws: Aws, api: Api) -> None:
    # Given a call billed today
    counters = TaskStore(api.service._settings.tasks_table_name, aws.dynamodb).usage
    today = datetime.now(UTC).replace(hour=12)
    small = Usage(prompt_tokens=100, completion_tokens=10, total_tokens=110)
    charge(counters, tenant="default", key="k1", model="mock-model", at=today, usage=small)

    def report(query: str) -> dict[str, Any]:
        reply = api.call("GET", "/usage", query=query)
        assert reply["statusCode"] == 200, reply
        body: dict[str, Any] = reply["json"]
        return body

    # When the span is the longest there is, or reaches past today: today's call, from and to as asked
    widest = report("from=0001-01-01&to=9999-12-31")
    assert (widest["from"], widest["to"], widest["total"]["calls"]) == ("0001-01-01", "9999-12-31", 1)
    # A span wholly before the days kept, one after today, one that ends before it starts: no call
    for query in ("to=2000-01-01", "from=9000-01-01", f"from={today.date().isoformat()}&to=2000-01-01"):
        body = report(query)
        assert (body["data"], body["total"]["calls"]) == ([], 0), query
    # The first day, its default 29 days before `to`, never before the first day a date has
    assert report("to=0001-01-05")["from"] == "0001-01-01"


def test_a_report_reads_only_the_days_that_can_have_counters() -> None:
    today = date(2026, 12, 7)
    oldest_kept = today - timedelta(days=KEPT_DAYS - 1)
    assert days_read(date(2026, 12, 1), date(2026, 12, 3), today) == (date(2026, 12, 1), date(2026, 12, 3))
    assert days_read(date.min, date.max, today) == (oldest_kept, today)
    assert days_read(date(2000, 1, 1), oldest_kept - timedelta(days=1), today) is None
    assert days_read(today + timedelta(days=1), date.max, today) is None
    assert days_read(date(2026, 12, 3), date(2026, 12, 2), today) is None
    assert default_first(date(2026, 12, 30)) == date(2026, 12, 1)
    assert default_first(date(1, 1, 5)) == date.min


def test_a_batch_sums_its_items_billed_calls(aws: Aws, api: Api) -> None:
    counters = TaskStore(api.service._settings.tasks_table_name, aws.dynamodb).usage
    assert counters.of_batch("b" * 32).usage is None
    at = datetime.now(UTC)
    for model in ("mock-model", "mock-model", "unpriced"):
        task = Task.submitted(
            SubmitTaskRequest(prompt="p"),
            task_id="t",
            tenant_id="default",
            created_at=at.timestamp(),
            expires_at=int(at.timestamp()) + 60,
            batch_id="b" * 32,
        )
        counters.charge(task, PRICES.price(CALL, model), model=model, now=at.timestamp())
    usage = counters.of_batch("b" * 32).usage
    assert usage is not None
    assert (usage.total_tokens, usage.cost_usd, usage.cost_unknown) == (4_500, 2 * CALL_COST, True)


def test_today_is_the_utc_day() -> None:
    assert utc_day(datetime(2026, 1, 1, 23, 30, tzinfo=UTC).timestamp()) == date(2026, 1, 1)
