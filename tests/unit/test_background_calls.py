"""A model call in the provider's background mode: the Responses API's body the worker sends for
a task's chat request, the Response read back, and the submit rules of `provider_background`."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.models import SubmitTaskRequest
from llmtasks.llm import ENDED_CODE_PREFIX
from llmtasks.llm.openai_responses import completion, request_body

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_a_chat_request_becomes_a_stored_background_response_with_its_history_as_items() -> None:
    request = LLMRequest.model_validate(
        {
            "system": "Be brief.",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is here?"},
                        {"type": "image_url", "image_url": {"url": "https://img.example/a.png"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "max_completion_tokens": 500,
            "reasoning_effort": "high",
            "temperature": 0.5,
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": {"type": "object"}},
            },
        }
    )
    body = request_body(request, "gpt-test")
    assert body["background"] is True
    assert body["store"] is True
    assert body["input"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is here?"},
                {"type": "input_image", "image_url": "https://img.example/a.png", "detail": "auto"},
            ],
        },
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    assert body["max_output_tokens"] == 500
    assert body["reasoning"] == {"effort": "high"}
    assert body["temperature"] == 0.5
    assert body["tools"] == [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["text"] == {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}}
    assert "max_completion_tokens" not in body
    assert "response_format" not in body


def response(status: str, output: list[dict[str, object]] | None = None, **more: object) -> bytes:
    return json.dumps(
        {"id": "resp_1", "object": "response", "status": status, "output": output or [], **more}
    ).encode()


def test_a_running_response_has_no_answer_yet() -> None:
    assert completion(response("queued"), "m") is None
    assert completion(response("in_progress"), "m") is None


def test_a_completed_response_reads_as_a_completion_with_its_calls_reasoning_and_usage() -> None:
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thought"}]},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_9",
            "name": "get_weather",
            "arguments": "{}",
        },
    ]
    usage = {
        "input_tokens": 30,
        "output_tokens": 12,
        "total_tokens": 42,
        "input_tokens_details": {"cached_tokens": 10},
        "output_tokens_details": {"reasoning_tokens": 5},
    }
    done = completion(response("completed", output, usage=usage, model="gpt-test-2"), "m")
    assert done is not None
    assert done.text == "Checking."
    assert done.reasoning == "thought"
    assert done.finish_reason == "tool_calls"
    assert [(c.id, c.function.name) for c in done.tool_calls or []] == [("call_9", "get_weather")]
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (30, 12, 42)
    assert (done.usage.cached_tokens, done.usage.reasoning_tokens) == (10, 5)
    assert done.model == "gpt-test-2"


def test_an_incomplete_response_is_cut_for_its_reason() -> None:
    message = {"type": "message", "content": [{"type": "output_text", "text": "Half"}]}
    done = completion(
        response("incomplete", [message], incomplete_details={"reason": "max_output_tokens"}), "m"
    )
    assert done is not None
    assert (done.text, done.finish_reason) == ("Half", "length")


@pytest.mark.parametrize(
    ("status", "error", "transient"),
    [
        ("failed", {"code": "server_error", "message": "boom"}, True),
        ("failed", {"code": "invalid_prompt", "message": "no"}, False),
        ("cancelled", None, False),
    ],
)
def test_a_response_that_ended_without_an_answer_is_an_error_of_its_own_kind(
    status: str, error: dict[str, str] | None, transient: bool
) -> None:
    with pytest.raises(LLMError) as raised:
        completion(response(status, error=error), "m")
    assert raised.value.code.startswith(ENDED_CODE_PREFIX)
    assert raised.value.transient is transient


def test_a_reply_that_is_no_response_is_refused() -> None:
    with pytest.raises(LLMError) as raised:
        completion(b'{"choices": []}', "m")
    assert raised.value.code == "llm_invalid_reply"


def test_a_task_in_background_mode_is_a_run_of_one_step_without_tools() -> None:
    assert SubmitTaskRequest.model_validate({"prompt": "x", "provider_background": True}).run_steps == 1
    assert SubmitTaskRequest.model_validate({"prompt": "x"}).run_steps is None
    with_tools = SubmitTaskRequest.model_validate(
        {"prompt": "x", "provider_background": True, "tools": [WEATHER]}
    )
    assert with_tools.run_steps == 20


@pytest.mark.parametrize("field", [{"seed": 1}, {"stop": "x"}, {"logprobs": True}, {"presence_penalty": 0.5}])
def test_what_the_responses_api_has_no_place_for_is_refused_beside_background_mode(
    field: dict[str, object],
) -> None:
    with pytest.raises(ValidationError, match="background mode"):
        SubmitTaskRequest.model_validate({"prompt": "x", "provider_background": True, **field})
    SubmitTaskRequest.model_validate({"prompt": "x", **field})  # a plain call takes it


def test_audio_is_refused_beside_background_mode() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    with pytest.raises(ValidationError, match="audio"):
        SubmitTaskRequest.model_validate(
            {"messages": [{"role": "user", "content": [audio]}], "provider_background": True}
        )
