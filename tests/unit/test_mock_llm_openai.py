"""The mock LLM as an OpenAI Chat Completions provider in miniature, over real HTTP on 127.0.0.1
and through the official openai SDK: content parts, structured outputs, tools, reasoning models,
the other parameters, and OpenAI's 400 for what OpenAI refuses."""

from __future__ import annotations

import base64
import json
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from llmtasks_local.mock_llm import MockConfig, MockLLM, reply_text
from llmtasks_local.mock_llm.schema import broken, instance

pytestmark = pytest.mark.unit

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG not really").decode()
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}


class Label(BaseModel):
    label: Literal["invoice", "contract", "letter"]
    confidence: float
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


def post(mock_server: tuple[MockLLM, str], body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{mock_server[1]}/chat/completions", json=body, timeout=10)


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


# --- content parts ---------------------------------------------------------------------------------


def test_image_parts_reach_the_provider_counted_at_openai_s_documented_tokens(
    client: OpenAI, mock: MockLLM
) -> None:
    reply = client.chat.completions.create(
        model="gpt-4o",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is in these two"},
                    {"type": "image_url", "image_url": {"url": PNG, "detail": "high"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
                ],
            }
        ],
    )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == 5 + 765 + 85  # five words, a high-detail image, a low one
    assert reply.choices[0].message.content == reply_text("what is in these two")
    assert (mock.stats.images, mock.stats.files, mock.stats.calls) == (2, 0, 1)


def test_file_and_audio_parts_are_counted_and_their_decoded_bytes_summed(
    mock_server: tuple[MockLLM, str], mock: MockLLM
) -> None:
    pdf = b"%PDF-1.4 " + b"x" * 391  # 400 bytes: 100 tokens, and 85 for the file
    audio = b"\x00" * 6400  # two tokens of audio
    file_data = "data:application/pdf;base64," + base64.b64encode(pdf).decode()
    body = {
        "model": "gpt-4o-audio-preview",
        "messages": user(
            {"type": "text", "text": "read this"},
            {"type": "file", "file": {"file_data": file_data, "filename": "x.pdf"}},
            {"type": "file", "file": {"file_id": "file-abc"}},
            {
                "type": "input_audio",
                "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"},
            },
        ),
    }
    reply = post(mock_server, body)
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert usage["prompt_tokens"] == 2 + (85 + 100) + 85 + 2
    assert usage["prompt_tokens_details"]["audio_tokens"] == 2
    stats = mock.stats
    assert (stats.files, stats.file_bytes, stats.audio_parts, stats.images) == (2, 400, 1, 0)


def test_every_role_is_taken_an_assistant_s_content_null_beside_its_tool_calls(
    mock_server: tuple[MockLLM, str],
) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": [{"type": "text", "text": "really brief"}]},
        {"role": "user", "content": "weather in Paris?", "name": "ann"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    reply = post(mock_server, {"model": "gpt-4o", "messages": messages, "tools": [WEATHER]})
    assert reply.status_code == 200, reply.text
    # After a tool message the answer quotes the tool results: a multi-step run used them
    assert (
        reply.json()["choices"][0]["message"]["content"]
        == "Mock answer from the tool results: call_1: sunny, 21 C"
    )


MALFORMED = [
    pytest.param(
        {"messages": user({"type": "picture", "picture": {}})},
        ("messages[0].content[0].type", "invalid_value"),
        id="unknown part type",
    ),
    pytest.param(
        {"messages": user({"type": "image_url", "image_url": {"detail": "low"}})},
        ("messages[0].content[0].image_url.url", "missing_required_parameter"),
        id="image_url without url",
    ),
    pytest.param(
        {"messages": user({"type": "image_url", "image_url": {"url": "data:image/png;base64,not base64!"}})},
        ("messages[0].content[0].image_url", "invalid_value"),
        id="a data URL not base64",
    ),
    pytest.param(
        {"messages": user({"type": "file", "file": {"filename": "x.pdf"}})},
        ("messages[0].content[0].file", "missing_required_parameter"),
        id="a file with neither id nor data",
    ),
    pytest.param(
        {"messages": user({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}})},
        ("messages[0].content[0].input_audio.format", "invalid_value"),
        id="an audio format OpenAI does not take",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": "hi", "mood": "happy"}]},
        ("messages[0].mood", "unknown_parameter"),
        id="an unknown field in a message",
    ),
    pytest.param(
        {"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": PNG}}]}]},
        ("messages[0].content[0]", "invalid_value"),
        id="an image from the system",
    ),
    pytest.param(
        {"messages": [{"role": "tool", "content": "42"}]},
        ("messages[0].tool_call_id", "missing_required_parameter"),
        id="a tool message without its call's id",
    ),
    pytest.param({"n": 2}, ("n", "unsupported_value"), id="more than one choice"),
    pytest.param({"stop": ["a", "b", "c", "d", "e"]}, ("stop", "invalid_type"), id="five stop strings"),
    pytest.param(
        {"max_completion_tokens": "10"}, ("max_completion_tokens", "invalid_type"), id="a cap as text"
    ),
    pytest.param(
        {"stream_options": {"include_usage": True}}, ("stream_options", "invalid_value"), id="unstreamed"
    ),
    pytest.param(
        {"reasoning_effort": "extreme"}, ("reasoning_effort", "invalid_value"), id="an unknown effort"
    ),
    pytest.param(
        {"tool_choice": {"type": "function", "function": {"name": "nowhere"}}, "tools": [WEATHER]},
        ("tool_choice", "invalid_value"),
        id="a tool_choice naming no tool",
    ),
]


@pytest.mark.parametrize(("change", "expected"), MALFORMED)
def test_a_malformed_request_gets_openai_s_400_naming_the_parameter(
    mock_server: tuple[MockLLM, str], mock: MockLLM, change: dict[str, Any], expected: tuple[str, str]
) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **change}
    reply = post(mock_server, body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (*expected, "invalid_request_error")
    assert error["message"]
    # Refused before the call: no spend, nothing counted but the refusal
    assert (mock.stats.calls, mock.stats.invalid_requests) == (0, 1)


def test_an_unknown_top_level_parameter_is_refused_in_openai_s_words(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], extra_body={"temperatur": 0.5}
        )
    assert refused.value.status_code == 400
    assert refused.value.body == {
        "message": "Unrecognized request argument supplied: temperatur",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


# --- structured outputs ----------------------------------------------------------------------------


def test_parse_with_a_pydantic_model_gets_the_label_the_prompt_names(client: OpenAI, mock: MockLLM) -> None:
    reply = client.chat.completions.parse(
        model="gpt-4o-mini",
        messages=[
            {"role": "system", "content": "Classify the document as invoice, contract or letter."},
            {"role": "user", "content": "This Contract is made between A and B; see the invoice later."},
        ],
        response_format=Label,
    )
    parsed = reply.choices[0].message.parsed
    # The user's text names contract first (any case); the system's list of labels does not steer
    assert parsed == Label(label="contract", confidence=0.0, pages=0)
    assert (mock.stats.structured, mock.stats.invalid_json) == (1, 0)


def test_without_a_label_in_the_prompt_the_enum_s_first_value_is_given(client: OpenAI) -> None:
    reply = client.chat.completions.parse(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "no hint here"}], response_format=Label
    )
    assert reply.choices[0].message.parsed == Label(label="invoice", confidence=0.0, pages=0)


def test_a_label_in_a_file_s_data_steers_the_enum(mock_server: tuple[MockLLM, str]) -> None:
    pdf = b"%PDF-1.4\nBT (Dear Sir, this letter) Tj ET\n%%EOF"
    file_data = "data:application/pdf;base64," + base64.b64encode(pdf).decode()
    body = {
        "model": "gpt-4o",
        "messages": user(
            {"type": "text", "text": "classify"}, {"type": "file", "file": {"file_data": file_data}}
        ),
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "label", "schema": Label.model_json_schema(), "strict": True},
        },
    }
    content = post(mock_server, body).json()["choices"][0]["message"]["content"]
    assert json.loads(content)["label"] == "letter"


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "count": {"type": "integer", "minimum": 3, "maximum": 9},
        "ratio": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "price": {"type": "number", "maximum": -2},
        "done": {"type": "boolean"},
        "nothing": {"type": "null"},
        "kind": {"const": "fixed"},
        "maybe": {"type": ["integer", "null"], "minimum": 5},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 6}, "minItems": 2},
        "none": {"type": "array", "items": {"type": "string"}, "maxItems": 0},
        "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "one": {"oneOf": [{"$ref": "#/definitions/Point"}, {"type": "null"}]},
        "tree": {"$ref": "#/$defs/Node"},
    },
    "required": ["id", "count", "ratio", "price", "done", "nothing", "kind", "maybe", "tags", "tree"],
    "additionalProperties": False,
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
            },
            "required": ["name", "children"],
            "additionalProperties": False,
        }
    },
    "definitions": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
}


def test_the_generated_json_fits_its_schema_and_the_broken_json_does_not() -> None:
    made = instance(SCHEMA)
    jsonschema.validate(made, SCHEMA)
    assert made["count"] == 3
    assert 0 < made["ratio"] <= 1
    assert made["price"] <= -2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken(SCHEMA), SCHEMA)


def test_a_marker_or_the_rate_knob_gets_json_that_breaks_its_schema(
    mock_server: tuple[MockLLM, str], mock: MockLLM
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}}

    def answer(prompt: str) -> Any:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": prompt}], "response_format": fmt}
        return json.loads(post(mock_server, body).json()["choices"][0]["message"]["content"])

    jsonschema.validate(answer("fine"), SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(answer("break it [mock:invalid-json]"), SCHEMA)
    mock.configure(MockConfig(rate_invalid_json=1.0), reseed=False)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(answer("fine again"), SCHEMA)
    assert (mock.stats.structured, mock.stats.invalid_json) == (3, 2)


def test_json_object_mode_answers_a_json_object_and_the_marker_cuts_it_short(
    mock_server: tuple[MockLLM, str],
) -> None:
    def content(prompt: str) -> str:
        body = {
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": prompt}],
            "response_format": {"type": "json_object"},
        }
        return str(post(mock_server, body).json()["choices"][0]["message"]["content"])

    assert isinstance(json.loads(content("answer in JSON")), dict)
    with pytest.raises(json.JSONDecodeError):
        json.loads(content("answer in JSON [mock:invalid-json]"))


def test_a_refusal_marker_gets_message_refusal_and_no_content(client: OpenAI, mock: MockLLM) -> None:
    reply = client.chat.completions.parse(
        model="gpt-4o", messages=[{"role": "user", "content": "[mock:refuse] please"}], response_format=Label
    )
    message = reply.choices[0].message
    assert (message.content, message.parsed, reply.choices[0].finish_reason) == (None, None, "stop")
    assert message.refusal


# --- tools -----------------------------------------------------------------------------------------


def test_tool_choice_required_calls_every_tool_with_arguments_that_fit(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "weather in Paris, in celsius, and the time"}],
        tools=[WEATHER, TIME],
        tool_choice="required",
    )
    choice = reply.choices[0]
    calls = choice.message.tool_calls or []
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]  # type: ignore[union-attr]
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    arguments = json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    assert arguments["unit"] == "celsius"


@pytest.mark.parametrize(
    ("choice", "parallel", "prompt", "called"),
    [
        ("required", False, "go", ["get_weather"]),
        ({"type": "function", "function": {"name": "get_time"}}, True, "go", ["get_time"]),
        ("auto", True, "just talk", []),
        ("auto", True, "use them [mock:call-tools]", ["get_weather", "get_time"]),
        ("none", True, "use them [mock:call-tools]", []),
    ],
)
def test_which_tools_are_called_follows_tool_choice_and_parallel_tool_calls(
    mock_server: tuple[MockLLM, str], choice: Any, parallel: bool, prompt: str, called: list[str]
) -> None:
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": prompt}],
        "tools": [WEATHER, TIME],
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
    }
    message = post(mock_server, body).json()["choices"][0]["message"]
    assert [c["function"]["name"] for c in message.get("tool_calls") or []] == called
    assert (message["content"] is None) == bool(called)


def test_tool_calls_stream_as_openai_streams_them(client: OpenAI) -> None:
    with client.chat.completions.stream(
        model="gpt-4o",
        messages=[{"role": "user", "content": "weather please [mock:call-tools]"}],
        tools=[WEATHER, TIME],
        stream_options={"include_usage": True},
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "mock", "unit": "celsius"}),
        ("get_time", {"zone": "mock"}),
    ]
    # The arguments came in several deltas each, and the SDK put them together
    assert sum(e.type == "tool_calls.function.arguments.delta" for e in events) > 2
    assert final.usage is not None
    assert final.usage.completion_tokens > 0


# --- reasoning models ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "effort", "reasoning"),
    [
        ("o3-mini", None, 256),
        ("gpt-5", "high", 1024),
        ("gpt-5.1", "none", 0),
        ("gpt-4o", "low", 64),
        ("gpt-4o", None, 0),
    ],
)
def test_reasoning_tokens_are_reported_within_completion_tokens(
    client: OpenAI, model: str, effort: Any, reasoning: int
) -> None:
    extra = {} if effort is None else {"reasoning_effort": effort}
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "think"}], **extra
    )
    usage = reply.usage
    assert usage is not None
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == reasoning
    assert usage.completion_tokens == reasoning + len(reply_text("think").split())


def test_max_completion_tokens_counts_reasoning_and_cuts_the_reply(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model="o4-mini",
        messages=[{"role": "user", "content": "a long answer please"}],
        reasoning_effort="low",
        max_completion_tokens=64 + 3,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.content == " ".join(reply_text("a long answer please").split()[:3])
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 67
    starved = client.chat.completions.create(
        model="o4-mini", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=10
    )
    assert (starved.choices[0].message.content, starved.choices[0].finish_reason) == ("", "length")


def test_a_reasoning_model_refuses_max_tokens_and_a_temperature_but_1(client: OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="o3", messages=messages, max_tokens=100)
    assert refused.value.code == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-5-mini", messages=messages, temperature=0.2)
    assert (refused.value.code, refused.value.param) == ("unsupported_value", "temperature")
    # Not stricter than OpenAI: temperature 1, and any temperature with reasoning off
    client.chat.completions.create(model="gpt-5-mini", messages=messages, temperature=1)
    client.chat.completions.create(
        model="gpt-5.1", messages=messages, temperature=0.2, reasoning_effort="none"
    )
    client.chat.completions.create(model="gpt-4o", messages=messages, temperature=0.2, max_tokens=100)


# --- the other parameters ---------------------------------------------------------------------------


def test_the_other_parameters_are_taken_and_echoed_where_openai_echoes_them(
    client: OpenAI, mock: MockLLM
) -> None:
    reply = client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "stop here STOP and not this"}],
        top_p=0.5,
        stop=["STOP", "never"],
        seed=7,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        logprobs=True,
        top_logprobs=2,
        service_tier="flex",
        prompt_cache_key="k1",
        user="u1",
        safety_identifier="s1",
        n=1,
    )
    choice = reply.choices[0]
    assert choice.message.content == reply_text("stop here STOP and not this").split("STOP")[0]
    assert (choice.finish_reason, reply.service_tier, reply.system_fingerprint) == ("stop", "flex", "fp_mock")
    assert (reply.object, reply.id.startswith("chatcmpl-"), reply.created > 0) == (
        "chat.completion",
        True,
        True,
    )
    assert choice.logprobs is not None
    assert choice.logprobs.content is not None
    tokens = choice.logprobs.content
    assert "".join(t.token for t in tokens) == choice.message.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in tokens)
    assert {"top_p", "stop", "seed", "logprobs", "service_tier", "prompt_cache_key"} <= set(mock.stats.params)


def test_a_prompt_prefix_seen_before_is_reported_as_cached_tokens(client: OpenAI, mock: MockLLM) -> None:
    mock.configure(MockConfig(cache_min_tokens=50), reseed=False)
    system: Any = {"role": "system", "content": "rule " * 60}

    def cached(question: str, key: str) -> int:
        reply = client.chat.completions.create(
            model="gpt-4o",
            messages=[system, {"role": "user", "content": question}],
            prompt_cache_key=key,
        )
        assert reply.usage is not None
        assert reply.usage.prompt_tokens_details is not None
        return reply.usage.prompt_tokens_details.cached_tokens or 0

    assert cached("first", "k") == 0
    assert cached("second", "k") == 60  # the system message, seen before
    assert cached("second", "k") == 61  # the whole prompt
    assert cached("third", "other") == 0  # another cache key, another cache
    assert mock.stats.cached_tokens == 121


def test_a_streamed_answer_carries_the_role_a_word_a_chunk_and_the_finish_reason_last(
    mock_server: tuple[MockLLM, str],
) -> None:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "stream it"}], "stream": True}
    with httpx.stream("POST", f"{mock_server[1]}/chat/completions", json=body, timeout=10) as reply:
        lines = [line.removeprefix("data: ") for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)  # none asked
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("content") or "" for d in deltas) == reply_text("stream it")
    assert [c["choices"][0]["finish_reason"] for c in chunks][-2:] == [None, "stop"]
