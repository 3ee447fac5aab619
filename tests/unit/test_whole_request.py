"""The whole request through the worker: a task asks for a schema, tools, a reasoning model or
an image, the mock LLM answers as OpenAI documents it, and the task keeps the whole answer."""

from __future__ import annotations

import base64
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from llmtasks.aws.store import TaskStore
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.models import INVALID_OUTPUT, SubmitTaskRequest, TaskStatus, TaskView
from llmtasks.settings import Settings
from tests.conftest import Aws, RunningMock
from tests.helpers import pending_task
from tests.unit.test_worker import Worker

pytestmark = pytest.mark.unit

LABEL_SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["invoice", "contract", "letter"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["label", "confidence"],
    "additionalProperties": False,
}
LABEL_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "Label", "schema": LABEL_SCHEMA, "strict": True},
}
PIXEL = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture
def worker(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> Worker:
    overrides = {"retry_base_delay_s": 0.0, "worker_call_slots": 0, "progress_interval_s": 0.0}
    return Worker(aws, handler, settings.model_copy(update=overrides), mock_llm)


def submit(worker: Worker, **body: Any) -> str:
    return worker.service.submit("default", SubmitTaskRequest.model_validate(body)).task.task_id


def view(worker: Worker, task_id: str) -> TaskView:
    return TaskView.of(worker.task(task_id))


def test_a_schema_task_with_an_image_completes_with_its_parsed_object(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id = submit(
        worker,
        messages=[
            {"role": "developer", "content": "Classify the document."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "This scan is a signed contract."},
                    {"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}},
                ],
            },
        ],
        response_format=LABEL_FORMAT,
        top_p=0.5,
        seed=7,
        presence_penalty=0.25,
        service_tier="flex",
        prompt_cache_key="docs",
        safety_identifier="user-1",
    )
    worker.run_queued()
    task = view(worker, task_id)
    assert task.status is TaskStatus.COMPLETED
    assert task.parsed["label"] == "contract"  # the prompt steered the mock's enum
    assert task.result is not None
    assert task.output is not None
    assert task.output.content == task.result
    assert task.finish_reason == "stop"
    assert mock_llm.stats.images == 1
    assert mock_llm.stats.structured == 1
    sent = mock_llm.stats.params
    for name in ("response_format", "top_p", "seed", "presence_penalty", "service_tier", "prompt_cache_key"):
        assert sent.get(name) == 1, name


def test_an_answer_that_misfits_its_schema_is_retried_and_billed_then_completes(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id = submit(worker, prompt="an invoice", response_format=LABEL_FORMAT, max_retries=2)
    mock_llm.configure(rate_invalid_json=1.0)
    worker.run_queued()
    stored = worker.task(task_id)
    assert (stored.status, stored.last_error_code) == (TaskStatus.PENDING, INVALID_OUTPUT)
    assert stored.attempt_log[0].usage is not None  # the misfit answer was billed, and counted
    mock_llm.configure()
    worker.run_queued()
    task = view(worker, task_id)
    assert (task.status, task.attempts, task.parsed["label"]) == (TaskStatus.COMPLETED, 2, "invoice")
    assert task.usage is not None
    assert task.usage.prompt_tokens == 2 * stored.attempt_log[0].usage.prompt_tokens  # both attempts


def test_a_task_whose_every_answer_misfits_fails_invalid_output_with_the_last_text_kept(
    worker: Worker, mock_llm: RunningMock
) -> None:
    task_id = submit(
        worker, prompt="[mock:invalid-json] a letter", response_format=LABEL_FORMAT, max_retries=1
    )
    worker.run_queued()
    worker.run_queued()
    task = view(worker, task_id)
    assert (task.status, task.error_code, task.attempts) == (TaskStatus.FAILED, INVALID_OUTPUT, 2)
    assert task.error is not None
    assert "does not fit the schema" in task.error
    assert task.result
    assert task.result.startswith("{")
    assert task.parsed is None
    assert worker.queued() == []
    assert mock_llm.stats.calls == 2


def test_a_json_object_answer_is_parsed(worker: Worker) -> None:
    task_id = submit(worker, prompt="give me json", response_format={"type": "json_object"})
    worker.run_queued()
    task = view(worker, task_id)
    assert task.status is TaskStatus.COMPLETED
    assert isinstance(task.parsed, dict)


@pytest.mark.parametrize("streamed", [False, True])
def test_the_models_calls_of_client_tools_come_back_as_the_action_it_waits_for(
    worker: Worker, mock_llm: RunningMock, streamed: bool
) -> None:
    task_id = submit(
        worker,
        prompt="Weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    worker.run_queued(progress_interval_s=0.05 if streamed else 0.0)
    task = view(worker, task_id)
    assert task.status is TaskStatus.REQUIRES_ACTION
    assert task.required_action is not None
    [call] = task.required_action.tool_calls
    assert call.function.name == "get_weather"
    assert call.id.startswith("call_")
    assert "city" in call.function.arguments


def test_a_tool_run_s_history_goes_back_to_the_model(worker: Worker) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
    }
    task_id = submit(
        worker,
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        ],
        tools=[WEATHER_TOOL],
    )
    worker.run_queued()
    task = view(worker, task_id)
    assert task.status is TaskStatus.COMPLETED
    assert task.result is not None
    assert "sunny, 21 C" in task.result


def test_a_reasoning_model_reports_and_is_billed_its_reasoning_tokens(worker: Worker) -> None:
    task_id = submit(
        worker, prompt="think hard", model="o4-mini", reasoning_effort="high", max_completion_tokens=5000
    )
    worker.run_queued()
    task = view(worker, task_id)
    assert task.status is TaskStatus.COMPLETED
    usage = task.usage
    assert usage is not None
    assert usage.reasoning_tokens == 1024
    assert usage.completion_tokens > usage.reasoning_tokens  # reasoning is part of the reply's tokens
    prices = worker.settings.price_table.models["o4-mini"]
    expected = (usage.prompt_tokens * prices.input + usage.completion_tokens * prices.output) / Decimal(10**6)
    assert Decimal(repr(usage.cost_usd)) == expected.quantize(Decimal("1e-12"))


def test_a_refusal_completes_with_the_refusal_and_no_parsed_object(worker: Worker) -> None:
    task_id = submit(worker, prompt="[mock:refuse] something", response_format=LABEL_FORMAT)
    worker.run_queued()
    task = view(worker, task_id)
    assert task.status is TaskStatus.COMPLETED
    assert task.output is not None
    assert task.output.refusal
    assert task.output.content is None
    assert task.parsed is None


def test_a_schema_dynamodb_could_not_hold_as_a_map_is_kept_exactly(worker: Worker) -> None:
    """Empty keys, nesting past 32 levels and 40-digit numbers: a DynamoDB map refuses each."""
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    schema = {
        "type": "object",
        "properties": {"": {"type": "string"}, "deep": deep, "big": {"type": "integer", "maximum": 10**40}},
    }
    request = LLMRequest(
        prompt="p", response_format={"type": "json_schema", "json_schema": {"name": "S", "schema": schema}}
    )
    store = TaskStore(worker.settings.tasks_table_name, worker.aws.dynamodb)
    assert store.create(pending_task("odd", now=worker.clock(), ttl_s=600, request=request))
    assert worker.task("odd").request.json_schema == schema


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "p", "n": 2}, "n"),
        (
            {
                "prompt": "p",
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "nope"}},
            },
            "",
        ),
        ({"prompt": "p", "tool_choice": "auto"}, ""),
        ({"prompt": "p", "top_logprobs": 3}, ""),
        (
            {
                "prompt": "p",
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "S", "schema": {"type": 5}},
                },
            },
            "response_format",
        ),
        (
            {
                "messages": [
                    {"role": "system", "content": [{"type": "image_url", "image_url": {"url": PIXEL}}]}
                ]
            },
            "messages",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%"}}],
                    }
                ]
            },
            "messages",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "file", "file": {"filename": "x.pdf"}}]}]},
            "messages",
        ),
        ({"messages": [{"role": "tool", "content": "result"}]}, "messages"),
        ({"prompt": "p", "top_p": 1.5}, "top_p"),
        ({"prompt": "p", "reasoning_effort": "extreme"}, "reasoning_effort"),
    ],
)
def test_a_request_a_provider_would_refuse_is_refused_at_submit(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        SubmitTaskRequest.model_validate(body)
    if field:
        assert any(str(error["loc"][0]) == field for error in refused.value.errors())
