"""The mock LLM as OpenAI's Responses API, over real HTTP on 127.0.0.1 and through the official
openai SDK: the chat rules read through Responses items, background mode (queued, in progress,
completed; cancel; polls counted) and its webhook events signed as OpenAI signs them."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI
from openai.types.webhooks import ResponseCancelledWebhookEvent, ResponseCompletedWebhookEvent
from pydantic import BaseModel
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmtasks_local.mock_llm import MockConfig, MockLLM, reply_text
from tests.helpers import HANG_S, serve

pytestmark = pytest.mark.unit

SECRET = "whsec_" + base64.b64encode(b"mock-webhook-secret-0123456789ab").decode()
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME: Any = {
    "type": "function",
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
}


class Label(BaseModel):
    label: Literal["invoice", "contract", "letter"]
    pages: int


@pytest.fixture(autouse=True)
def mock(mock_server: tuple[MockLLM, str]) -> MockLLM:
    """The module's mock with default knobs and zeroed counters, for every test."""
    mock_server[0].configure(MockConfig(), reseed=True)
    mock_server[0].reset_stats()
    return mock_server[0]


@pytest.fixture
def client(mock_server: tuple[MockLLM, str], mock: MockLLM) -> OpenAI:
    return OpenAI(base_url=mock_server[1], api_key="sk-mock", max_retries=0)


class Receiver:
    """A webhook endpoint on 127.0.0.1 that keeps what it gets; it answers 500 to the first
    `fail_first` deliveries."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, dict[str, str]]] = []
        self.fail_first = 0
        self.arrived = threading.Condition()

    async def receive(self, request: Request) -> Response:
        body = await request.body()
        with self.arrived:
            self.deliveries.append((body, dict(request.headers)))
            self.arrived.notify_all()
            failing = len(self.deliveries) <= self.fail_first
        return Response(status_code=500 if failing else 200)

    def wait_for(self, count: int) -> list[tuple[bytes, dict[str, str]]]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.deliveries) >= count, timeout=HANG_S)
            return list(self.deliveries)


@pytest.fixture
def receiver(mock: MockLLM) -> Iterator[Receiver]:
    """A receiver the mock's webhooks go to, retried without pause."""
    receiver = Receiver()
    with serve(Starlette(routes=[Route("/hook", receiver.receive, methods=["POST"])])) as url:
        changes = {"webhook_url": url + "/hook", "webhook_secret": SECRET, "webhook_retry_s": 0.0}
        mock.configure(MockConfig.model_validate({**mock.config.model_dump(), **changes}), reseed=False)
        yield receiver


def finished(client: OpenAI, response_id: str) -> Any:
    """The response polled until it leaves queued and in_progress."""
    give_up = time.monotonic() + HANG_S
    while True:
        response = client.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress"):
            return response
        assert time.monotonic() < give_up, "the background response never ended"
        time.sleep(0.05)


# --- background mode -------------------------------------------------------------------------------


def test_a_background_response_is_queued_then_completes_with_the_chat_answer(
    client: OpenAI, mock: MockLLM
) -> None:
    prompt = "summarise the quarter [mock:background-s=0.6]"
    started = time.monotonic()
    created = client.responses.create(model="gpt-4o", input=prompt, background=True)
    assert (created.status, created.background, created.output, created.usage) == ("queued", True, [], None)
    assert created.id.startswith("resp_")

    response = finished(client, created.id)

    assert time.monotonic() - started >= 0.6
    assert response.status == "completed"
    assert response.output_text == reply_text(prompt)  # what the chat endpoint answers
    assert response.completed_at is not None
    assert response.usage is not None
    assert response.usage.input_tokens == len(prompt.split())
    assert response.usage.output_tokens == len(reply_text(prompt).split())
    stats = mock.stats
    assert (stats.background_started, stats.background_completed, stats.responses) == (1, 1, 1)
    assert stats.background_polls >= 1  # every GET counted: how often the worker asked
    assert stats.params["background"] == 1


def test_a_background_response_is_in_progress_once_out_of_the_queue(client: OpenAI) -> None:
    created = client.responses.create(model="gpt-4o", input="long [mock:background-s=600]", background=True)
    time.sleep(1.0)  # queued for a quarter of its time, a second at most
    assert client.responses.retrieve(created.id).status == "in_progress"
    client.responses.cancel(created.id)


def test_a_background_response_takes_the_configured_latency_without_a_directive(
    client: OpenAI, mock: MockLLM
) -> None:
    mock.configure(MockConfig(latency_s=0.5), reseed=False)
    started = time.monotonic()
    created = client.responses.create(model="gpt-4o", input="hello", background=True)
    assert client.responses.retrieve(created.id).status in ("queued", "in_progress")
    assert finished(client, created.id).status == "completed"
    assert time.monotonic() - started >= 0.5


def test_cancel_stops_a_background_response_and_is_counted(client: OpenAI, mock: MockLLM) -> None:
    created = client.responses.create(
        model="gpt-4o", input="long one [mock:background-s=60]", background=True
    )

    cancelled = client.responses.cancel(created.id)

    assert (cancelled.status, cancelled.output) == ("cancelled", [])
    assert client.responses.retrieve(created.id).status == "cancelled"
    # Cancelling again answers the cancelled response again (OpenAI: idempotent)
    assert client.responses.cancel(created.id).status == "cancelled"
    stats = mock.stats
    assert (stats.background_cancelled, stats.cancel_requests, stats.background_completed) == (1, 2, 0)


def test_a_finished_or_synchronous_response_cannot_be_cancelled(client: OpenAI) -> None:
    done = client.responses.create(model="gpt-4o", input="quick [mock:background-s=0]", background=True)
    assert done.status == "queued"  # as OpenAI answers every create, however short the work
    assert finished(client, done.id).status == "completed"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(done.id)
    assert refused.value.body["message"] == "Cannot cancel a completed response."  # type: ignore[index]

    synchronous = client.responses.create(model="gpt-4o", input="now")
    assert synchronous.status == "completed"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(synchronous.id)
    assert refused.value.body["message"] == "Cannot cancel a synchronous response."  # type: ignore[index]

    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nothing")


def test_a_synchronous_response_is_answered_at_once_and_kept_unless_store_is_false(client: OpenAI) -> None:
    response = client.responses.create(model="gpt-4o", input="hi there", instructions="be brief")
    assert (response.status, response.output_text) == ("completed", reply_text("hi there"))
    assert response.instructions == "be brief"
    assert client.responses.retrieve(response.id).output_text == reply_text("hi there")

    unkept = client.responses.create(model="gpt-4o", input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_a_drawn_500_fails_a_background_response_and_a_429_refuses_it(client: OpenAI, mock: MockLLM) -> None:
    mock.configure(MockConfig(rate_500=1.0), reseed=False)
    failed = finished(client, client.responses.create(model="gpt-4o", input="x", background=True).id)
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.error.code == "server_error"
    assert mock.stats.background_failed == 1

    mock.configure(MockConfig(rate_429=1.0, retry_after_s=2), reseed=False)
    with pytest.raises(openai.RateLimitError) as limited:
        client.responses.create(model="gpt-4o", input="x", background=True)
    assert limited.value.response.headers["retry-after"] == "2"
    assert mock.stats.background_started == 1


# --- webhooks --------------------------------------------------------------------------------------


def test_the_end_of_a_background_response_is_posted_as_openai_s_signed_event(
    client: OpenAI, mock: MockLLM, receiver: Receiver
) -> None:
    created = client.responses.create(model="gpt-4o", input="hi [mock:background-s=0.2]", background=True)

    [(body, headers)] = receiver.wait_for(1)

    event = json.loads(body)
    Webhook(SECRET).verify(body, headers)  # raises when the signature does not hold
    assert headers["webhook-id"].startswith("wh_")
    assert event["type"] == "response.completed"
    assert (event["object"], event["data"]) == ("event", {"id": created.id})
    assert event["id"].startswith("evt_")
    # The openai SDK's own check takes it too, and the response it names has completed
    unwrapped = client.webhooks.unwrap(body, headers, secret=SECRET)
    assert isinstance(unwrapped, ResponseCompletedWebhookEvent)
    assert client.responses.retrieve(unwrapped.data.id).status == "completed"
    assert mock.stats.webhooks_sent == 1


def test_a_cancel_is_posted_as_response_cancelled(client: OpenAI, receiver: Receiver) -> None:
    created = client.responses.create(model="gpt-4o", input="long [mock:background-s=60]", background=True)
    client.responses.cancel(created.id)
    [(body, headers)] = receiver.wait_for(1)
    event = client.webhooks.unwrap(body, headers, secret=SECRET)
    assert isinstance(event, ResponseCancelledWebhookEvent)
    assert event.data.id == created.id


def test_a_webhook_the_receiver_refuses_is_sent_again_under_the_same_id(
    client: OpenAI, mock: MockLLM, receiver: Receiver
) -> None:
    receiver.fail_first = 2
    client.responses.create(model="gpt-4o", input="hi [mock:background-s=0]", background=True)
    deliveries = receiver.wait_for(3)
    assert len({headers["webhook-id"] for _, headers in deliveries}) == 1
    for body, headers in deliveries:
        Webhook(SECRET).verify(body, headers)
    give_up = time.monotonic() + HANG_S
    while mock.stats.webhooks_sent < 1:
        assert time.monotonic() < give_up
        time.sleep(0.02)
    assert (mock.stats.webhooks_sent, mock.stats.webhook_failures) == (1, 2)


def test_no_webhook_goes_out_for_a_synchronous_response(client: OpenAI, receiver: Receiver) -> None:
    client.responses.create(model="gpt-4o", input="now")
    done = client.responses.create(model="gpt-4o", input="later [mock:background-s=0]", background=True)
    [(body, _)] = receiver.wait_for(1)
    assert json.loads(body)["data"]["id"] == done.id


def test_a_webhook_url_needs_a_whsec_secret() -> None:
    with pytest.raises(ValueError, match="webhook_secret"):
        MockConfig(webhook_url="http://127.0.0.1:9/hook")
    with pytest.raises(ValueError, match="whsec_"):
        MockConfig(webhook_url="http://127.0.0.1:9/hook", webhook_secret="whsec_not base64!")


# --- tools -----------------------------------------------------------------------------------------


def test_call_tools_answers_function_call_items_with_arguments_that_fit(client: OpenAI) -> None:
    response = client.responses.create(
        model="gpt-4o", input="weather in Paris in celsius [mock:call-tools]", tools=[WEATHER, TIME]
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert all(c.call_id.startswith("call_") and c.id and c.id.startswith("fc_") for c in calls)
    arguments = json.loads(calls[0].arguments)
    jsonschema.validate(arguments, WEATHER["parameters"])
    assert arguments["unit"] == "celsius"
    assert not [item for item in response.output if item.type == "message"]


@pytest.mark.parametrize(
    ("choice", "parallel", "called"),
    [
        ("required", False, ["get_weather"]),
        ({"type": "function", "name": "get_time"}, True, ["get_time"]),
        (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "get_time"}],
            },
            True,
            ["get_time"],
        ),
        ("none", True, []),
    ],
)
def test_which_tools_are_called_follows_tool_choice(
    mock_server: tuple[MockLLM, str], choice: Any, parallel: bool, called: list[str]
) -> None:
    body = {
        "model": "gpt-4o",
        "input": "go [mock:call-tools]",
        "tools": [WEATHER, TIME],
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
    }
    reply = httpx.post(f"{mock_server[1]}/responses", json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    assert [i["name"] for i in reply.json()["output"] if i["type"] == "function_call"] == called


def test_an_agent_run_goes_on_through_function_call_output_items(client: OpenAI, mock: MockLLM) -> None:
    """`[mock:agent-steps=2]`: a call of each tool in turn, then an answer from their outputs; each
    step a background response, its outputs sent back as items (the whole history each time)."""
    history: list[Any] = [{"role": "user", "content": "plan the trip [mock:agent-steps=2]"}]
    called = []
    for _ in range(2):
        created = client.responses.create(
            model="gpt-4o", input=history, tools=[WEATHER, TIME], background=True
        )
        response = finished(client, created.id)
        [call] = [item for item in response.output if item.type == "function_call"]
        called.append(call.name)
        history += [
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": f"{call.name} done"},
        ]
    final = finished(
        client,
        client.responses.create(model="gpt-4o", input=history, tools=[WEATHER, TIME], background=True).id,
    )

    assert called == ["get_weather", "get_time"]
    last_call = history[-1]["call_id"]
    assert final.output_text == f"Mock answer from the tool results: {last_call}: get_time done"
    assert mock.stats.background_completed == 3


def test_previous_response_id_carries_the_history(client: OpenAI) -> None:
    first = client.responses.create(model="gpt-4o", input="plan [mock:agent-steps=1]", tools=[WEATHER])
    [call] = [item for item in first.output if item.type == "function_call"]

    second = client.responses.create(
        model="gpt-4o",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
    )

    # The agent directive came from the first response's input: one step done, so it answers
    assert second.output_text == f"Mock answer from the tool results: {call.call_id}: sunny"
    assert second.previous_response_id == first.id
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="gpt-4o", previous_response_id="resp_unknown", input="x")


# --- content, structure, reasoning, usage ----------------------------------------------------------


def test_content_parts_are_counted_as_the_chat_endpoint_counts_them(client: OpenAI, mock: MockLLM) -> None:
    pdf = base64.b64encode(b"%PDF-1.4 " + b"x" * 391).decode()  # 400 bytes: 100 tokens and 85
    response = client.responses.create(
        model="gpt-4o",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what are these"},
                    {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
                    {
                        "type": "input_file",
                        "filename": "a.pdf",
                        "file_data": f"data:application/pdf;base64,{pdf}",
                    },
                ],
            }
        ],
    )
    assert response.usage is not None
    assert response.usage.input_tokens == 3 + 85 + 85 + 100
    assert (mock.stats.images, mock.stats.files, mock.stats.file_bytes) == (1, 1, 400)


def test_a_json_schema_format_gets_json_that_fits_and_parse_reads_it(client: OpenAI) -> None:
    response = client.responses.parse(model="gpt-4o", input="label this contract", text_format=Label)
    assert response.output_parsed == Label(label="contract", pages=0)


def test_reasoning_gives_a_reasoning_item_and_its_tokens_in_usage(client: OpenAI) -> None:
    response = client.responses.create(
        model="o3", input="think hard", reasoning={"effort": "high", "summary": "auto"}
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].summary  # type: ignore[union-attr]
    usage = response.usage
    assert usage is not None
    assert usage.output_tokens_details.reasoning_tokens == 1024
    assert usage.output_tokens == 1024 + len(reply_text("think hard").split())
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert response.reasoning is not None
    assert response.reasoning.effort == "high"


def test_max_output_tokens_leaves_the_response_incomplete(
    client: OpenAI, mock: MockLLM, receiver: Receiver
) -> None:
    created = client.responses.create(
        model="gpt-4o",
        input="a long answer " * 10 + "[mock:background-s=0]",
        max_output_tokens=16,
        background=True,
    )
    response = finished(client, created.id)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.output_tokens == 16
    [(body, headers)] = receiver.wait_for(1)
    assert client.webhooks.unwrap(body, headers, secret=SECRET).type == "response.incomplete"


@pytest.mark.parametrize(
    ("change", "param"),
    [
        pytest.param({"colour": "red"}, "colour", id="an unknown parameter"),
        pytest.param({"input": None}, "input", id="no input"),
        pytest.param({"background": True, "store": False}, "store", id="background unstored"),
        pytest.param({"max_output_tokens": 8}, "max_output_tokens", id="a cap under 16"),
        pytest.param(
            {"input": [{"type": "function_call_output", "output": "x"}]},
            "input[0].call_id",
            id="an output without its call",
        ),
        pytest.param({"tools": [{"type": "web_search"}]}, "tools[0].type", id="a tool the mock cannot serve"),
        pytest.param({"text": {"format": {"type": "yaml"}}}, "text.format.type", id="an unknown format"),
        pytest.param(
            {"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "hi"}]}]},
            "input[0].content[0].type",
            id="input_text from the assistant",
        ),
        pytest.param(
            {"input": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            "input[0].content[0].type",
            id="a chat part",
        ),
    ],
)
def test_a_malformed_request_gets_openai_s_400(
    mock_server: tuple[MockLLM, str], mock: MockLLM, change: dict[str, Any], param: str
) -> None:
    body = {"model": "gpt-4o", "input": "hi", **change}
    reply = httpx.post(f"{mock_server[1]}/responses", json=body, timeout=10)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["param"], error["type"]) == (param, "invalid_request_error")
    assert (mock.stats.invalid_requests, mock.stats.calls) == (1, 0)


def test_the_chat_knobs_hold_for_a_synchronous_response(client: OpenAI, mock: MockLLM) -> None:
    mock.configure(MockConfig(rate_500=1.0), reseed=False)
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model="gpt-4o", input="x")
    assert mock.stats.errors_500 == 1

    mock.configure(MockConfig(key_limits={"sk-mock": {"rpm": 1}}), reseed=False)
    first = client.responses.with_raw_response.create(model="gpt-4o", input="x")
    assert first.headers["x-ratelimit-limit-requests"] == "1"
    with pytest.raises(openai.RateLimitError):
        client.responses.create(model="gpt-4o", input="x", background=True)
    assert (mock.stats.key_limited, mock.stats.background_started) == (1, 0)
    assert mock.stats.tokens_by_key["mock"] == first.parse().usage.total_tokens  # type: ignore[union-attr]
