"""Budgets that hold: a key's spend per UTC day and month, reserved at submit (the most a task
can cost) in one conditional write, settled to the real cost once tasks end, never overshot,
also under concurrent submits; a batch's items reserve as they fan out."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from llmtasks.aws.budgets import BudgetExhausted, KeyBudgets
from llmtasks.aws.store import TaskStore
from llmtasks.domain.budgets import Budget, Periods
from llmtasks.domain.caller import Caller, authorizer_context, caller_of
from llmtasks.domain.input_files import FileFacts
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.media_tokens import IMAGE_TOKENS, PAGE_TEXT_TOKENS
from llmtasks.domain.models import AttemptRecord, SubmitTaskRequest, TaskStatus, Usage
from llmtasks.domain.pricing import MESSAGE_OVERHEAD_TOKENS, ModelPrice, PriceTable
from llmtasks.llm.openai import OpenAIChat
from llmtasks.records import sqs_record
from llmtasks.services.batch_items import BatchFanout
from llmtasks.services.tasks import TaskService
from llmtasks.settings import Settings
from llmtasks.worker.runner import TaskRunner
from tests.conftest import Aws, RunningMock
from tests.documents import pdf_document
from tests.helpers import blobs, task_lanes
from tests.unit.test_api import Api, assert_problem
from tests.unit.test_batches import CHUNK, Rig
from tests.unit.test_cost import FixedLLM
from tests.unit.test_worker import Worker

pytestmark = pytest.mark.unit

# A dollar per million tokens in and out, 100 tokens of reply at most: a prompt of 4 bytes can
# cost (4 + 8 x 2 + 100) tokens, 0.00012 USD.
PRICES = PriceTable(
    models={"mock-model": ModelPrice(input=Decimal(1), output=Decimal(1), max_output_tokens=100)}
)
MOST = Decimal("0.00012")


def test_the_most_a_call_can_cost_counts_a_token_a_byte_and_the_reply_s_limit() -> None:
    prices = PriceTable(
        models={
            "m": ModelPrice(
                input=Decimal(2), cached_input=Decimal(1), output=Decimal(10), max_output_tokens=50
            )
        }
    )
    one = LLMRequest(prompt="héllo", system="be brief", max_tokens=7)  # 6 + 8 bytes, two messages
    assert (
        prices.most_cost(one, "m") == (Decimal(6 + 8 + MESSAGE_OVERHEAD_TOKENS * 3) * 2 + 7 * 10) / 1_000_000
    )
    # No max_tokens: the model's output limit from the table
    assert prices.most_cost(LLMRequest(prompt="hi"), "m") == (Decimal(2 + 16) * 2 + 50 * 10) / 1_000_000
    # A model the table lacks costs 0, and so reserves nothing
    assert prices.most_cost(one, "unknown") == 0
    # The bound is never below what the provider can bill for the same call
    billed = Usage(prompt_tokens=6 + 8 + MESSAGE_OVERHEAD_TOKENS * 3, completion_tokens=7)
    assert Decimal(repr(prices.price(billed, "m").cost_usd)) <= prices.most_cost(one, "m")
    assert PRICES.most_cost(LLMRequest(prompt="q000"), "mock-model") == MOST


def test_a_budget_rides_the_authorizer_s_context_as_exact_text() -> None:
    budget = Budget(day_usd=Decimal("0.1"), month_usd=Decimal("12.345678"))
    context = authorizer_context("acme", "k1", budget=budget)
    assert context["budget_usd_day"] == "0.1"

    caller = caller_of({"requestContext": {"authorizer": {"lambda": context}}})
    assert caller is not None
    assert caller.budget == budget
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Budget(day_usd=Decimal(-1))


class Clock:
    def __init__(self, at: datetime) -> None:
        self.now = at.timestamp()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 12, 3, 12, 0, tzinfo=UTC))


@pytest.fixture
def budgets(aws: Aws, settings: Settings, clock: Clock) -> KeyBudgets:
    assert settings.limits_table_name is not None
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    return KeyBudgets(settings.limits_table_name, aws.dynamodb, tasks=store, clock=clock)


def service(aws: Aws, settings: Settings, budgets: KeyBudgets, clock: Clock) -> TaskService:
    return TaskService(
        settings.model_copy(update={"price_table": PRICES, "llm_model": "mock-model"}),
        TaskStore(settings.tasks_table_name, aws.dynamodb),
        task_lanes(settings, aws.sqs),
        results=blobs(settings),
        budgets=budgets,
        clock=clock,
    )


def caller(day: str | None = None, month: str | None = None) -> Caller:
    budget = Budget(
        day_usd=None if day is None else Decimal(day), month_usd=None if month is None else Decimal(month)
    )
    return Caller(tenant_id="acme", key_id="k1", budget=budget)


def counters(aws: Aws, settings: Settings) -> dict[str, Any]:
    """The key's budget item: its period and what is reserved or spent in it."""
    item = aws.dynamodb.get_item(TableName=settings.limits_table_name, Key={"pk": {"S": "budget#k1"}})["Item"]
    return {
        "day": item["day"]["S"],
        "month": item["month"]["S"],
        "dn": Decimal(item["dn"]["N"]),
        "mn": Decimal(item["mn"]["N"]),
    }


def test_concurrent_submits_get_exactly_the_tasks_the_budget_fits(
    aws: Aws, settings: Settings, budgets: KeyBudgets, clock: Clock
) -> None:
    tasks = service(aws, settings, budgets, clock)
    key = caller(day=str(MOST * 12))  # twelve tasks' most cost, to the cent's millionth
    outcomes: list[str] = []

    def submit(n: int) -> None:
        try:
            tasks.submit("acme", SubmitTaskRequest(prompt=f"q{n:03}"), caller=key)
            outcomes.append("accepted")
        except BudgetExhausted:
            outcomes.append("refused")

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(outcomes) == {"accepted": 12, "refused": 28}
    assert counters(aws, settings)["dn"] == MOST * 12  # reserved: all of it, not a cent more
    assert len(aws.messages("TaskQueue")) == 12  # a refused submit left nothing behind


def test_a_refusal_is_a_429_budget_exhausted_problem_with_the_day_s_end_as_retry_after(
    aws: Aws, handler: Any, settings: Settings, budgets: KeyBudgets, clock: Clock
) -> None:
    api = Api(aws, handler, service(aws, settings, budgets, clock))
    key = authorizer_context("acme", "k1", budget=Budget(day_usd=MOST))
    assert api.call("POST", "/tasks", {"prompt": "q001"}, key=key)["statusCode"] == 202
    refused = api.call("POST", "/tasks", {"prompt": "q002"}, key=key)
    problem = assert_problem(refused, 429)
    assert problem["type"].endswith("/budget_exhausted")
    assert int(refused["headers"]["Retry-After"]) == 12 * 3600  # noon to midnight, UTC
    assert "budget (0.00012 USD a day) has no room" in problem["detail"]
    assert api.service.list_tasks("acme", status=None, limit=10, cursor=None)[0] != []
    # A month's budget refuses until the month's end: 2027-01-01, 28.5 days from noon on the 3rd
    key = authorizer_context("acme", "k2", budget=Budget(month_usd=Decimal(0)))
    refused = api.call("POST", "/tasks", {"prompt": "q003"}, key=key)
    assert_problem(refused, 429)
    assert int(refused["headers"]["Retry-After"]) == 28 * 86_400 + 12 * 3600


def test_ended_tasks_are_settled_to_what_they_cost_and_a_failure_before_a_billed_attempt_to_nothing(
    aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock, budgets: KeyBudgets, clock: Clock
) -> None:
    tasks = service(aws, settings, budgets, clock)
    key = caller(day=str(MOST * 3))
    worker = Worker(
        aws, handler, settings.model_copy(update={"price_table": PRICES, "worker_call_slots": 0}), mock_llm
    )
    # The worker on the service's clock: the tasks' TTL runs on it, and a day on, real time found
    # them expired (from 2026-12-04 12:00, a day after this clock's time).
    worker.service, worker.clock = tasks, clock
    ids = [
        tasks.submit("acme", SubmitTaskRequest(prompt=f"q00{n}"), caller=key).task.task_id for n in range(3)
    ]
    with pytest.raises(BudgetExhausted):
        tasks.submit("acme", SubmitTaskRequest(prompt="q003"), caller=key)
    # One completes (it costs 10 tokens in, 20 out: 0.00003), one is cancelled before any call
    billed = Usage(prompt_tokens=10, completion_tokens=20, total_tokens=30)
    [first, *_] = worker.queued()
    worker.run([first], llm=FixedLLM(billed))
    tasks.cancel("acme", ids[1])
    assert worker.task(ids[0]).status is TaskStatus.COMPLETED
    # The next submit finds no room, settles the two ended tasks, and fits
    tasks.submit("acme", SubmitTaskRequest(prompt="q004"), caller=key)
    assert counters(aws, settings)["dn"] == Decimal("0.00003") + MOST * 2  # q002 and q004 reserved
    # And no more than that: a third reservation would overshoot
    with pytest.raises(BudgetExhausted):
        tasks.submit("acme", SubmitTaskRequest(prompt="q005"), caller=key)


def test_a_new_day_starts_the_day_s_counter_over_and_the_month_s_goes_on(
    aws: Aws, settings: Settings, budgets: KeyBudgets, clock: Clock
) -> None:
    tasks = service(aws, settings, budgets, clock)
    key = caller(day=str(MOST), month=str(MOST * 2))
    tasks.submit("acme", SubmitTaskRequest(prompt="q001"), caller=key)
    with pytest.raises(BudgetExhausted):
        tasks.submit("acme", SubmitTaskRequest(prompt="q002"), caller=key)
    clock.now += 86_400  # the next day: the day has room, the month one task more
    tasks.submit("acme", SubmitTaskRequest(prompt="q002"), caller=key)
    assert counters(aws, settings) == {
        "day": "2026-12-04",
        "month": "2026-12",
        "dn": MOST,
        "mn": MOST * 2,
    }
    clock.now += 86_400
    with pytest.raises(BudgetExhausted) as refused:
        tasks.submit("acme", SubmitTaskRequest(prompt="q003"), caller=key)
    # The month is what is full: its end, not the day's
    assert (
        refused.value.retry_after_s == Periods.at(clock.now).month_ends - clock.now == 26 * 86_400 + 12 * 3600
    )


def test_a_retry_after_a_billed_attempt_reserves_again_and_fails_when_it_does_not_fit(
    aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock, budgets: KeyBudgets, clock: Clock
) -> None:
    tasks = service(aws, settings, budgets, clock)
    key = caller(day=str(MOST))
    task_id = tasks.submit("acme", SubmitTaskRequest(prompt="q001"), caller=key).task.task_id
    overrides = {"price_table": PRICES, "worker_call_slots": 0, "llm_model": "mock-model"}
    worker = Worker(aws, handler, settings.model_copy(update=overrides), mock_llm)
    worker.clock = clock
    # An earlier delivery's answer was billed and discarded (another delivery had taken the
    # task over): the call this delivery makes needs a reservation of its own, and the budget
    # has none left.
    [message] = worker.queued()
    billed = AttemptRecord(
        attempt=1,
        started_at=clock.now,
        ended_at=clock.now,
        outcome="discarded",
        usage=PRICES.price(Usage(prompt_tokens=50), "mock-model"),
    )
    worker.store.record_discarded(task_id, billed)
    event = {"Records": [sqs_record(message, aws.resources.attributes[("TaskQueue", "Arn")])]}  # type: ignore[arg-type]
    reply = worker.fn(
        event, worker.context, runner=_runner(worker, budgets, clock), queue=worker.queue, call_slots=0
    )
    assert reply == {"batchItemFailures": []}
    task = worker.task(task_id)
    assert (task.status, task.error_code) == (TaskStatus.FAILED, "budget_exhausted")
    assert mock_llm.stats.calls == 0


def _runner(worker: Worker, budgets: KeyBudgets, clock: Clock) -> TaskRunner:
    return TaskRunner(
        worker.settings,
        worker.store,
        worker.lanes,
        OpenAIChat(base_url=worker.llm_url, api_key=None, default_model="mock-model"),
        clock=clock,
        results=blobs(worker.settings),
        budgets=budgets,
    )


def test_a_batch_reserves_its_items_as_they_fan_out_and_those_past_the_budget_fail(
    aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock, budgets: KeyBudgets, clock: Clock
) -> None:
    overrides = {"batch_chunk_size": CHUNK, "price_table": PRICES, "llm_model": "mock-model"}
    rig = Rig(aws, handler, settings.model_copy(update=overrides), mock_llm)
    rig.fanout = BatchFanout(
        rig.settings,
        rig.store,
        rig.batches,
        rig.lanes,
        ends=rig.ends,
        results=blobs(rig.settings),
        budgets=budgets,
        clock=clock,
    )
    key = authorizer_context("default", "k1", budget=Budget(month_usd=MOST * 4))
    reply = rig.api.call("POST", "/batches", {"items": [{"prompt": f"q{n:03}"} for n in range(10)]}, key=key)
    assert reply["statusCode"] == 202, reply
    batch_id = reply["json"]["batch_id"]
    rig.fan_out()
    rig.count(rig.stream())
    view = rig.api.call("GET", f"/batches/{batch_id}")["json"]
    assert (view["pending"], view["failed"], view["budget_exhausted"]) == (4, 6, 6)
    assert len(aws.messages("BatchTaskQueue")) == 4  # the refused items are never queued
    items = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"]
    assert [item["error_code"] for item in items] == [None] * 4 + ["budget_exhausted"] * 6


def test_a_task_naming_a_document_reserves_its_pages_and_bytes_at_submit(
    aws: Aws, settings: Settings, budgets: KeyBudgets, clock: Clock
) -> None:
    tasks = service(aws, settings, budgets, clock)
    document = pdf_document("an invoice", pages=3, size=40_000)
    # Stored as POST /v1/files stores it: its pages counted
    blobs(settings).put_file("acme", "file-doc", document, filename="a.pdf", purpose="user_data", pages="3")
    body = SubmitTaskRequest.model_validate(
        {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-doc"}}]}]}
    )
    facts = {"file-doc": FileFacts(size=len(document), pdf=True, pages=3)}
    reserved = PRICES.most_cost(body.llm_request(), "mock-model", facts)
    # Its bytes, and three pages' images and text, beside the reply's bound
    assert reserved * 1_000_000 >= len(document) + 3 * (IMAGE_TOKENS + PAGE_TEXT_TOKENS) + 100
    with pytest.raises(BudgetExhausted):
        tasks.submit("acme", body, caller=caller(day=str(reserved - Decimal("0.000001"))))
    tasks.submit("acme", body, caller=caller(day=str(reserved)))
    assert counters(aws, settings)["dn"] == reserved
