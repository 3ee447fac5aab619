"""How a task reads as OpenAI's Response object, state by state, and how OpenAI's request fields
become a task's (the SDK's own round trips are in tests/e2e/test_openai.py)."""

from __future__ import annotations

import pytest
from openai.types.responses import Response

from llmtasks.api.openai import response_object
from llmtasks.api.openai_requests import CreateResponse
from llmtasks.domain.batches import BatchStatus, BatchView
from llmtasks.domain.errors import RATE_LIMITED, InvalidInput
from llmtasks.domain.events import openai_event
from llmtasks.domain.llm_request import ChatMessage, LLMRequest
from llmtasks.domain.models import TaskStatus, TaskView, Usage
from tests.helpers import pending_task, stored_batch

pytestmark = pytest.mark.unit
NOW = 1_790_000_000.0


@pytest.mark.parametrize(
    ("status", "openai_status"),
    [
        (TaskStatus.PENDING, "queued"),
        (TaskStatus.PROCESSING, "in_progress"),
        (TaskStatus.COMPLETED, "completed"),
        (TaskStatus.FAILED, "failed"),
        (TaskStatus.CANCELLED, "cancelled"),
    ],
)
def test_each_task_state_reads_as_openais_and_the_sdk_parses_it(
    status: TaskStatus, openai_status: str
) -> None:
    task = pending_task("a" * 32, now=NOW).model_copy(
        update={"status": status, "result": "the answer" if status is TaskStatus.COMPLETED else None}
    )

    parsed = Response.model_validate(response_object(task))

    assert parsed.id == "resp_" + "a" * 32
    assert parsed.status == openai_status
    assert parsed.output_text == ("the answer" if status is TaskStatus.COMPLETED else "")
    assert (parsed.error is None) == (status is not TaskStatus.FAILED)


@pytest.mark.parametrize(
    ("error_code", "openai_code"), [(RATE_LIMITED, "rate_limit_exceeded"), ("llm_http_500", "server_error")]
)
def test_a_failed_task_says_why_in_openais_codes(error_code: str, openai_code: str) -> None:
    task = pending_task("b" * 32, now=NOW).model_copy(
        update={"status": TaskStatus.FAILED, "error": "the provider gave up", "error_code": error_code}
    )

    error = response_object(task)["error"]

    assert error == {"code": openai_code, "message": "the provider gave up"}


def test_usage_and_the_request_fields_come_back_in_openais_names() -> None:
    request = LLMRequest(prompt="p", model="m-1", system="be brief", max_tokens=64, temperature=0.3)
    task = pending_task("c" * 32, now=NOW, request=request).model_copy(
        update={
            "status": TaskStatus.COMPLETED,
            "result": "x",
            "completed_at": NOW + 5,
            "usage": Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
            "metadata": {"job": "7"},
        }
    )

    body = response_object(task)

    assert (body["model"], body["instructions"], body["max_output_tokens"], body["temperature"]) == (
        "m-1",
        "be brief",
        64,
        0.3,
    )
    assert (body["usage"]["input_tokens"], body["usage"]["output_tokens"], body["usage"]["total_tokens"]) == (
        3,
        4,
        7,
    )
    assert (body["created_at"], body["completed_at"], body["metadata"]) == (
        int(NOW),
        int(NOW + 5),
        {"job": "7"},
    )


def test_openais_request_becomes_a_task_request() -> None:
    asked = CreateResponse.model_validate(
        {
            "model": "m",
            "input": [
                {"role": "developer", "content": "rules"},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                },
            ],
            "instructions": "sys",
            "max_output_tokens": 10,
            "temperature": 1.5,
            "metadata": {"k": "v"},
            "background": True,
            "webhook_url": "https://example.com/hook",
        }
    ).task_request()

    assert asked.messages == [
        ChatMessage(role="system", content="rules"),
        ChatMessage(role="user", content="ab"),
    ]
    assert (asked.model, asked.system, asked.max_tokens, asked.temperature) == ("m", "sys", 10, 1.5)
    assert asked.metadata == {"k": "v"}
    assert (asked.webhook_url, asked.webhook_format) == ("https://example.com/hook", "openai")
    plain = CreateResponse.model_validate({"input": "hello", "background": True}).task_request()
    assert (plain.prompt, plain.webhook_format) == ("hello", None)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": "x"}, "background"),
        ({"input": "x", "background": False}, "background"),
        ({"input": "x", "background": True, "store": False}, "store"),
    ],
)
def test_what_a_task_cannot_serve_is_refused_naming_openais_field(
    body: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        CreateResponse.model_validate(body).task_request()

    assert refused.value.field == field


@pytest.mark.parametrize(
    ("status", "event_type"),
    [
        (TaskStatus.COMPLETED, "response.completed"),
        (TaskStatus.FAILED, "response.failed"),
        (TaskStatus.CANCELLED, "response.cancelled"),
    ],
)
def test_a_responses_webhook_event_is_openais_for_its_terminal_state(
    status: TaskStatus, event_type: str
) -> None:
    view = TaskView.of(pending_task("d" * 32, now=NOW).model_copy(update={"status": status}))

    event = openai_event("msg_0123", view)

    assert {k: event[k] for k in ("object", "id", "type", "data")} == {
        "object": "event",
        "id": "evt_0123",
        "type": event_type,
        "data": {"id": "resp_" + "d" * 32},
    }


@pytest.mark.parametrize(
    ("status", "event_type"),
    [
        (BatchStatus.COMPLETED, "batch.completed"),
        (BatchStatus.COMPLETED_WITH_ERRORS, "batch.completed"),
        (BatchStatus.CANCELLED, "batch.cancelled"),
        (BatchStatus.FAILED, "batch.failed"),
    ],
)
def test_a_batchs_webhook_event_is_openais_for_its_terminal_state(
    status: BatchStatus, event_type: str
) -> None:
    batch = stored_batch("e" * 32, now=NOW, status=status, tenant_id="t")

    event = openai_event("msg_4567", BatchView.of(batch))

    assert (event["type"], event["data"]) == (event_type, {"id": "batch_" + "e" * 32})
