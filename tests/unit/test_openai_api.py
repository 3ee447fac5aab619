"""How a task reads as OpenAI's Response object, state by state, and how OpenAI's request fields
become a task's (the SDK's own round trips are in tests/e2e/test_openai.py)."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from llmtasks.api.openai import response_object
from llmtasks.api.openai_batch_files import line_parser
from llmtasks.api.openai_objects import chat_completion
from llmtasks.api.openai_requests import CreateResponse
from llmtasks.api.openai_responses import _Segment, resumed_after, run_events
from llmtasks.domain.batches import BatchStatus, BatchView
from llmtasks.domain.errors import RATE_LIMITED, InvalidInput
from llmtasks.domain.events import openai_event
from llmtasks.domain.llm_request import (
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    FunctionTool,
    JsonSchemaFormat,
    JsonSchemaSpec,
    LLMRequest,
    ToolCall,
)
from llmtasks.domain.mcp_servers import DENIED, McpListedTool, McpServer
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import Task, TaskStatus, TaskView, Usage
from llmtasks.domain.runs import RequiredAction
from llmtasks.domain.steps import RunStep
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
    request = LLMRequest(
        prompt="p", model="m-1", system="be brief", max_completion_tokens=64, temperature=0.3
    )
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

    assert body["text"] == {"format": {"type": "text"}}
    assert (body["tools"], body["tool_choice"], body["reasoning"]) == ([], "auto", None)
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
    # max_output_tokens counts reasoning, as max_completion_tokens does (max_tokens does not)
    assert (asked.model, asked.system, asked.max_completion_tokens, asked.temperature) == (
        "m",
        "sys",
        10,
        1.5,
    )
    assert asked.max_tokens is None
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
    ("status", "finish_reason", "event_type"),
    [
        (TaskStatus.COMPLETED, "stop", "response.completed"),
        (TaskStatus.COMPLETED, "tool_calls", "response.completed"),
        (TaskStatus.COMPLETED, "length", "response.incomplete"),
        (TaskStatus.COMPLETED, "content_filter", "response.incomplete"),
        (TaskStatus.FAILED, "length", "response.failed"),
        (TaskStatus.CANCELLED, None, "response.cancelled"),
    ],
)
def test_a_responses_webhook_event_is_openais_for_its_terminal_state(
    status: TaskStatus, finish_reason: str | None, event_type: str
) -> None:
    task = pending_task("d" * 32, now=NOW).model_copy(
        update={"status": status, "finish_reason": finish_reason}
    )
    view = TaskView.of(task)

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


# --- the whole Responses request, and the Response's output items ------------------------------

PNG = "data:image/png;base64,iVBORw0KGgo="
PDF = "data:application/pdf;base64,JVBERi0xLjQK"
LABEL = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["invoice", "contract"]}},
    "required": ["label"],
    "additionalProperties": False,
}


def test_responses_input_items_tools_and_formats_become_one_chat_completions_request() -> None:
    asked = CreateResponse.model_validate(
        {
            "model": "gpt-5",
            "background": True,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Classify these"},
                        {"type": "input_image", "image_url": PNG, "detail": "low"},
                        {"type": "input_image", "file_id": "file-abc", "detail": "auto"},
                        {"type": "input_file", "file_data": PDF, "filename": "a.pdf"},
                    ],
                },
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Looking it up", "annotations": []}],
                },
                {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q":"a"}'},
                {"type": "function_call", "call_id": "call_2", "name": "lookup", "arguments": '{"q":"b"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "found a"},
                {
                    "type": "function_call_output",
                    "call_id": "call_2",
                    "output": [{"type": "input_text", "text": "found b"}],
                },
            ],
            "reasoning": {"effort": "high", "summary": "auto"},
            "text": {"format": {"type": "json_schema", "name": "Label", "schema": LABEL, "strict": True}},
            "tools": [
                {
                    "type": "function",
                    "name": "lookup",
                    "description": "Look up",
                    "strict": True,
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            ],
            "tool_choice": {"type": "function", "name": "lookup"},
            "parallel_tool_calls": False,
            "max_output_tokens": 2000,
            "top_p": 0.5,
            "top_logprobs": 3,
            "service_tier": "flex",
            "prompt_cache_key": "k",
            "user": "u",
            "safety_identifier": "s",
            "truncation": "disabled",
            "include": [],
            "store": True,
        }
    ).task_request()

    user, assistant, tool_1, tool_2 = asked.messages or []
    assert [part.model_dump(exclude_none=True) for part in user.parts()] == [
        {"type": "text", "text": "Classify these"},
        {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
        {"type": "image_url", "image_url": {"file_id": "file-abc", "detail": "auto"}},
        {"type": "file", "file": {"file_data": PDF, "filename": "a.pdf"}},
    ]
    # The reasoning item has no place in a chat; the calls join the assistant's message
    assert assistant.content == "Looking it up"
    assert [(call.id, call.function.arguments) for call in assistant.tool_calls or []] == [
        ("call_1", '{"q":"a"}'),
        ("call_2", '{"q":"b"}'),
    ]
    assert [(m.role, m.tool_call_id, m.content) for m in (tool_1, tool_2)] == [
        ("tool", "call_1", "found a"),
        ("tool", "call_2", "found b"),
    ]
    assert asked.parameters() == {
        "max_completion_tokens": 2000,
        "top_p": 0.5,
        "logprobs": True,
        "top_logprobs": 3,
        "reasoning_effort": "high",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Label", "schema": LABEL, "strict": True},
        },
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look up",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                    "strict": True,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
        "parallel_tool_calls": False,
        "service_tier": "flex",
        "prompt_cache_key": "k",
        "user": "u",
        "safety_identifier": "s",
    }


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools"),
        (
            {"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "file_search"}},
            "tool_choice",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://x/a.pdf"}]}]},
            "input.0.content.0.file_url",
        ),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ],
)
def test_what_openai_has_and_a_task_cannot_serve_is_refused_by_its_path(
    fields: dict[str, object], param: str
) -> None:
    body = {"input": "x", "background": True, **fields}

    with pytest.raises(InvalidInput) as refused:
        CreateResponse.model_validate(body).task_request()

    assert refused.value.field == param
    assert refused.value.slug == "unsupported-parameter"


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"conversation": "conv_1"}, ("conversation",)),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, ("input",)),
        ({"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]}, ("input",)),
    ],
)
def test_fields_and_items_a_task_has_no_place_for_fail_validation_naming_them(
    fields: dict[str, object], where: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as invalid:
        CreateResponse.model_validate({"input": "x", "background": True, **fields})

    assert invalid.value.errors()[0]["loc"][: len(where)] == where


def test_a_value_the_task_refuses_is_named_in_openais_words() -> None:
    body = {"input": "x", "background": True, "reasoning": {"effort": "high"}}
    tool = {"type": "function", "name": "f", "parameters": None, "strict": None}

    with pytest.raises(InvalidInput) as refused:
        CreateResponse.model_validate({**body, "tools": [tool, tool]}).task_request()

    assert "each tool needs a name of its own" in refused.value.detail
    # Without tools, auto and none change nothing, and parallel calls mean nothing: not sent.
    plain = CreateResponse.model_validate({**body, "tool_choice": "none", "parallel_tool_calls": True})
    assert plain.task_request().parameters() == {"reasoning_effort": "high"}


def completed(request: LLMRequest, **fields: object) -> Task:
    return pending_task("f" * 32, now=NOW, request=request).model_copy(
        update={"status": TaskStatus.COMPLETED, "completed_at": NOW + 1, **fields}
    )


TOOLS_REQUEST = LLMRequest(
    prompt="p",
    reasoning_effort="low",
    response_format=JsonSchemaFormat(
        type="json_schema", json_schema=JsonSchemaSpec(name="Label", json_schema=LABEL, strict=True)
    ),
    tools=[
        FunctionTool(
            type="function", function=FunctionDefinition(name="lookup", parameters={"type": "object"})
        )
    ],
    tool_choice="required",
)
CALLS = [
    ToolCall(id="call_1", function=FunctionCall(name="lookup", arguments='{"q":"a"}')),
    ToolCall(id="call_2", function=FunctionCall(name="lookup", arguments='{"q":"b"}')),
]


def test_a_completed_task_s_output_is_reasoning_then_message_then_function_calls() -> None:
    task = completed(
        TOOLS_REQUEST,
        result='{"label": "invoice"}',
        reasoning="It says invoice.",
        tool_calls=CALLS,
        finish_reason="tool_calls",
        usage=Usage(
            prompt_tokens=10, completion_tokens=70, total_tokens=80, cached_tokens=4, reasoning_tokens=64
        ),
    )

    parsed = Response.model_validate(response_object(task))

    assert [item.type for item in parsed.output] == ["reasoning", "message", "function_call", "function_call"]
    reasoning, _, first, second = parsed.output
    assert reasoning.type == "reasoning"
    assert [part.text for part in reasoning.summary] == ["It says invoice."]
    assert [(c.call_id, c.name, c.arguments) for c in (first, second) if c.type == "function_call"] == [
        ("call_1", "lookup", '{"q":"a"}'),
        ("call_2", "lookup", '{"q":"b"}'),
    ]
    assert parsed.output_text == '{"label": "invoice"}'
    assert parsed.usage is not None
    assert parsed.usage.input_tokens_details.cached_tokens == 4
    assert parsed.usage.output_tokens_details.reasoning_tokens == 64
    # The request comes back as OpenAI's Response says it
    assert parsed.text is not None
    assert parsed.text.model_dump(exclude_none=True, by_alias=True)["format"] == {
        "type": "json_schema",
        "name": "Label",
        "schema": LABEL,
        "strict": True,
    }
    assert [(tool.type, getattr(tool, "name", None)) for tool in parsed.tools] == [("function", "lookup")]
    assert parsed.tool_choice == "required"
    assert parsed.reasoning is not None
    assert parsed.reasoning.effort == "low"


def test_tool_calls_alone_have_no_message_and_a_refusal_is_a_refusal_part() -> None:
    calls_only = Response.model_validate(
        response_object(completed(TOOLS_REQUEST, result="", tool_calls=CALLS))
    )
    refused = Response.model_validate(
        response_object(completed(LLMRequest(prompt="p"), result="", refusal="I cannot help with that."))
    )

    assert [item.type for item in calls_only.output] == ["function_call", "function_call"]
    [message] = refused.output
    assert message.type == "message"
    assert [(part.type, getattr(part, "refusal", None)) for part in message.content] == [
        ("refusal", "I cannot help with that.")
    ]
    assert refused.output_text == ""


def test_an_answer_cut_at_the_limit_is_incomplete_and_an_invalid_one_failed() -> None:
    cut = Response.model_validate(
        response_object(completed(LLMRequest(prompt="p"), result="Half an ans", finish_reason="length"))
    )
    invalid = Response.model_validate(
        response_object(
            pending_task("a" * 32, now=NOW).model_copy(
                update={
                    "status": TaskStatus.FAILED,
                    "error_code": "invalid_output",
                    "error": "The answer does not fit the schema.",
                    "result": "{",
                }
            )
        )
    )

    assert (cut.status, cut.incomplete_details and cut.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert cut.output_text == "Half an ans"
    assert invalid.status == "failed"
    assert invalid.error is not None
    assert (invalid.error.code, invalid.error.message) == (
        "server_error",
        "The answer does not fit the schema.",
    )
    assert invalid.output == []


def test_a_response_s_events_end_with_its_reasoning_and_function_calls_as_the_sdk_reads_them() -> None:
    task = completed(TOOLS_REQUEST, result="", reasoning="thought", tool_calls=CALLS)
    out = _Segment(task.task_id, starting_after=-1)

    out.ended(task, chunks=0)

    events = [
        TypeAdapter(ResponseStreamEvent).validate_python(json.loads(block.split("\ndata: ")[1]))
        for block in out.lines
    ]
    assert [e.sequence_number for e in events] == list(range(4, 4 + len(events)))
    assert [e.type for e in events][3:] == [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        *[
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
        ]
        * 2,
        "response.completed",
    ]
    arguments = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert arguments == ['{"q":"a"}', '{"q":"b"}']
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [1, 2, 3]


# --- runs: a response that calls functions, and goes on ----------------------------------------


def waiting_run(calls: list[ToolCall], step: int = 0, **fields: object) -> Task:
    """A run waiting in requires_action for the outputs of `calls`, which model step `step` asked."""
    return pending_task("e" * 32, now=NOW, request=TOOLS_REQUEST, max_steps=20).model_copy(
        update={
            "status": TaskStatus.REQUIRES_ACTION,
            "required_action": RequiredAction(tool_calls=calls),
            "action_step": step,
            "usage": Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7),
            **fields,
        }
    )


def model_step(number: int, calls: list[ToolCall] | None = None, text: str = "") -> RunStep:
    usage = Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7)
    answer = Completion(text=text, model="m", usage=usage, finish_reason="tool_calls" if calls else "stop")
    return RunStep(
        step=number,
        type="model_call",
        started_at=NOW,
        ended_at=NOW,
        completion=answer.model_copy(update={"tool_calls": calls}),
    )


def client_step(number: int, call: ToolCall, output: str) -> RunStep:
    return RunStep(
        step=number,
        type="tool_call",
        started_at=NOW,
        ended_at=NOW,
        tool_call=call,
        source="client",
        output=output,
    )


def parsed_events(events: list[tuple[int, str, dict[str, object]]]) -> list[ResponseStreamEvent]:
    adapter: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
    return [
        adapter.validate_python({"type": kind, "sequence_number": n, **fields}) for n, kind, fields in events
    ]


def test_a_run_waiting_for_its_client_is_a_completed_response_with_the_calls_to_answer() -> None:
    task = waiting_run(CALLS, step=2)

    parsed = Response.model_validate(response_object(task))

    # As OpenAI's response that called functions: completed, so an SDK poll loop ends
    assert parsed.status == "completed"
    assert parsed.output_text == ""
    assert [(item.type, item.call_id, item.name, item.arguments, item.status) for item in parsed.output] == [
        ("function_call", "call_1", "lookup", '{"q":"a"}', "completed"),
        ("function_call", "call_2", "lookup", '{"q":"b"}', "completed"),
    ]
    # Each item is named by the model step that asked, so a later wait's never repeat them
    assert [item.id for item in parsed.output] == ["fc_" + "e" * 32 + "_2_0", "fc_" + "e" * 32 + "_2_1"]
    assert parsed.usage is not None
    assert parsed.usage.total_tokens == 7


def test_a_run_s_events_keep_their_numbers_from_its_wait_to_its_answer() -> None:
    [call, _] = CALLS
    waiting = waiting_run([call])
    asked = [model_step(0, [call])]
    answered = [*asked, client_step(1, call, "Ada")]
    resumed = waiting.model_copy(update={"status": TaskStatus.PROCESSING, "required_action": None})
    done = resumed.model_copy(
        update={"status": TaskStatus.COMPLETED, "result": "Ada it is", "completed_at": NOW}
    )

    at_wait = parsed_events(run_events(waiting, asked))
    going_on = parsed_events(run_events(resumed, answered))
    at_end = parsed_events(run_events(done, [*answered, model_step(2, text="Ada it is")]))

    # The wait: the function call's events, then the response that completed with it
    assert [e.type for e in at_wait] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert at_wait[3].delta == '{"q":"a"}'
    # Once answered, the same events (read by anyone at any time), then in_progress, then the answer
    assert [(e.sequence_number, e.type) for e in going_on] == [
        *[(e.sequence_number, e.type) for e in at_wait],
        (7, "response.in_progress"),
    ]
    assert [(e.sequence_number, e.type) for e in at_end][:8] == [
        (e.sequence_number, e.type) for e in going_on
    ]
    assert [e.type for e in at_end][8:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert at_end[-1].response.output_text == "Ada it is"
    # Each event reads the same whenever it is read (a snapshot in progress has no usage yet)
    assert [e.model_dump() for e in at_end[:7]] == [e.model_dump() for e in at_wait]
    assert at_end[7].model_dump() == going_on[7].model_dump()
    # A continuation's stream starts after the wait it answered
    assert resumed_after(resumed, answered) == 6


@pytest.mark.parametrize(
    ("status", "last"),
    [(TaskStatus.FAILED, "response.failed"), (TaskStatus.CANCELLED, "response.incomplete")],
)
def test_a_run_that_ends_otherwise_ends_its_events_as_openai_does(status: TaskStatus, last: str) -> None:
    task = waiting_run([CALLS[0]]).model_copy(update={"status": status, "required_action": None})

    events = parsed_events(run_events(task, [model_step(0, [CALLS[0]])]))

    assert [e.type for e in events] == ["response.created", "response.in_progress", last]


# --- runs with remote MCP servers --------------------------------------------------------------

DOCS = {
    "type": "mcp",
    "server_label": "docs",
    "server_url": "https://docs.example/mcp",
    "headers": {"Authorization": "Bearer s3cret"},
    "allowed_tools": ["search"],
    "require_approval": "never",
}


def test_an_mcp_tool_becomes_the_task_s_mcp_server_beside_its_functions() -> None:
    body = CreateResponse.model_validate(
        {"input": "x", "background": True, "tools": [DOCS, {"type": "function", "name": "ask_user"}]}
    )

    request = body.task_request()

    assert request.mcp_servers == [McpServer.model_validate(DOCS)]
    assert request.run_steps == 20  # tools: a run
    # The provider is offered the functions; the worker offers the server's tools as functions
    assert [tool.function.name for tool in request.llm_request().tools or []] == ["ask_user"]


@pytest.mark.parametrize(
    ("tool", "field"),
    [
        ({**DOCS, "connector_id": "connector_gmail"}, "connector_id"),
        ({**DOCS, "server_label": "a__b"}, "server_label"),
        ({"type": "mcp", "server_label": "docs"}, "server_url"),
    ],
)
def test_an_mcp_tool_a_run_cannot_serve_is_refused_naming_its_field(
    tool: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError, match=field):
        CreateResponse.model_validate({"input": "x", "background": True, "tools": [tool]})


def mcp_run_steps() -> list[RunStep]:
    """A run that listed the docs server's tools, called one (which failed), then another."""
    listed = McpListedTool(
        name="search",
        function_name="docs__search",
        description="Search the documents",
        input_schema={"type": "object", "properties": {"query": {"type": "string"}}},
        read_only=True,
    )
    search = ToolCall(id="call_s", function=FunctionCall(name="docs__search", arguments='{"query":"a"}'))
    again = ToolCall(id="call_t", function=FunctionCall(name="docs__search", arguments='{"query":"b"}'))

    def mcp_call(number: int, call: ToolCall, output: str) -> RunStep:
        return RunStep(
            step=number,
            type="tool_call",
            started_at=NOW,
            ended_at=NOW,
            tool_call=call,
            source="mcp",
            output=output,
            server_label="docs",
        )

    return [
        RunStep(
            step=0, type="mcp_list_tools", started_at=NOW, ended_at=NOW, server_label="docs", tools=[listed]
        ),
        model_step(1, [search]),
        mcp_call(2, search, "error: No document holds 'a'"),
        model_step(3, [again]),
        mcp_call(4, again, "queues: Queues"),
        model_step(5, text="Queues it is"),
    ]


def mcp_run(**fields: object) -> Task:
    body = CreateResponse.model_validate({"input": "x", "background": True, "tools": [DOCS]}).task_request()
    return pending_task("d" * 32, now=NOW, request=body.llm_request(), max_steps=20).model_copy(
        update={
            "status": TaskStatus.COMPLETED,
            "mcp_servers": body.mcp_servers,
            "result": "Queues it is",
            "completed_at": NOW + 1,
            **fields,
        }
    )


def test_a_completed_mcp_run_lists_its_servers_tools_and_calls_before_its_answer() -> None:
    parsed = Response.model_validate(response_object(mcp_run(), mcp_run_steps()))

    assert [item.type for item in parsed.output] == ["mcp_list_tools", "mcp_call", "mcp_call", "message"]
    listed, failed, called, _ = parsed.output
    assert listed.type == "mcp_list_tools"
    assert (listed.server_label, [(t.name, t.description) for t in listed.tools]) == (
        "docs",
        [("search", "Search the documents")],
    )
    assert listed.tools[0].input_schema == {"type": "object", "properties": {"query": {"type": "string"}}}
    # Each call by the server's name of its tool; a failed one says why in its error
    assert failed.type == called.type == "mcp_call"
    assert (failed.name, failed.arguments, failed.output, failed.status) == (
        "search",
        '{"query":"a"}',
        None,
        "failed",
    )
    assert failed.error is not None
    assert (called.server_label, called.output, called.error, called.status) == (
        "docs",
        "queues: Queues",
        None,
        "completed",
    )
    assert len({item.id for item in parsed.output}) == 4
    assert parsed.output_text == "Queues it is"
    # The server comes back as the request gave it, its headers never
    [tool] = parsed.tools
    assert tool.type == "mcp"
    assert (tool.server_label, tool.server_url, tool.headers) == ("docs", "https://docs.example/mcp", None)
    assert "s3cret" not in json.dumps(response_object(mcp_run(), mcp_run_steps()))


def test_a_denied_mcp_call_is_a_failed_mcp_call_saying_so() -> None:
    steps = mcp_run_steps()
    steps[4] = steps[4].model_copy(update={"output": DENIED})

    denied = Response.model_validate(response_object(mcp_run(), steps)).output[2]

    assert denied.type == "mcp_call"
    assert (denied.status, denied.output) == ("failed", None)
    assert DENIED in json.dumps(denied.model_dump()["error"])


def test_a_completed_mcp_run_s_events_give_its_mcp_items_before_its_answer() -> None:
    steps = mcp_run_steps()
    done = mcp_run()

    events = parsed_events(run_events(done, steps))
    running = parsed_events(run_events(done.model_copy(update={"status": TaskStatus.PROCESSING}), steps))

    call_events = [
        "response.output_item.added",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
    ]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
        *call_events,
        "response.mcp_call.failed",
        "response.output_item.done",
        *call_events,
        "response.mcp_call.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # Each item's events name it, at its place in the output
    listed = events[2]
    assert listed.type == "response.output_item.added"
    assert {(e.output_index, e.item_id) for e in events[3:5]} == {(0, listed.item.id)}
    delta = events[14]
    assert delta.type == "response.mcp_call_arguments.delta"
    assert (delta.output_index, delta.delta) == (2, '{"query":"b"}')
    assert events[-1].response.output[2].output == "queues: Queues"
    # While the run goes on, its events so far are the same ones
    assert [e.model_dump() for e in running] == [e.model_dump() for e in events[:2]]


def test_an_mcp_call_to_approve_is_an_approval_request_and_its_events_keep_their_numbers() -> None:
    # Given a run whose model asked for a docs call that needs approval (require_approval always)
    steps = mcp_run_steps()[:2]
    servers = [McpServer.model_validate({**DOCS, "require_approval": "always"})]
    waiting = mcp_run(
        status=TaskStatus.REQUIRES_ACTION,
        result=None,
        completed_at=None,
        mcp_servers=servers,
        required_action=RequiredAction(
            tool_calls=[],
            mcp_approval_requests=[
                {"id": "call_s", "server_label": "docs", "name": "search", "arguments": '{"query":"a"}'}
            ],
        ),
        action_step=1,
        usage=Usage(prompt_tokens=5, completion_tokens=2, total_tokens=7),  # its model step's
    )

    # Then its response completed with the request to approve, as OpenAI's that needs approval
    parsed = Response.model_validate(response_object(waiting, steps))
    [request] = parsed.output
    assert request.type == "mcp_approval_request"
    assert (request.id, request.server_label, request.name, request.arguments) == (
        "call_s",
        "docs",
        "search",
        '{"query":"a"}',
    )
    at_wait = parsed_events(run_events(waiting, steps))
    assert [e.type for e in at_wait] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]

    # When it is approved (the call not made yet), then made, then answered: the same events go on
    approved = waiting.model_copy(
        update={"status": TaskStatus.PROCESSING, "required_action": None, "approved_calls": ["call_s"]}
    )
    made = [*steps, mcp_run_steps()[2].model_copy(update={"output": "queues: Queues"})]
    done = approved.model_copy(
        update={"status": TaskStatus.COMPLETED, "result": "Queues it is", "completed_at": NOW + 1}
    )
    going_on = parsed_events(run_events(approved, steps))
    at_end = parsed_events(run_events(done, [*made, model_step(3, text="Queues it is")]))
    assert [e.model_dump() for e in going_on[:5]] == [e.model_dump() for e in at_wait]
    assert going_on[5].type == "response.in_progress"
    assert [e.model_dump() for e in at_end[:6]] == [e.model_dump() for e in going_on]
    assert [item.type for item in at_end[-1].response.output] == ["mcp_list_tools", "mcp_call", "message"]
    # A continuation's stream starts after the wait it answered
    assert resumed_after(approved, steps) == 4


def test_function_call_outputs_become_the_tool_outputs_a_waiting_run_takes() -> None:
    body = CreateResponse.model_validate(
        {
            "previous_response_id": "resp_" + "e" * 32,
            "input": [
                {"type": "function_call_output", "call_id": "call_1", "output": "Ada"},
                {
                    "type": "function_call_output",
                    "call_id": "call_2",
                    "output": [{"type": "input_text", "text": "B"}],
                },
            ],
            "background": True,
        }
    )

    outputs = body.tool_outputs()

    assert [(o.tool_call_id, o.output) for o in outputs.tool_outputs] == [("call_1", "Ada"), ("call_2", "B")]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "go on"}, "input"),
        (
            {
                "input": [
                    {"type": "function_call_output", "call_id": "c", "output": "o"},
                    {"role": "user", "content": "and?"},
                ]
            },
            "input.1",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "o"}] * 2}, "input"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "o"}], "background": False},
            "background",
        ),
    ],
)
def test_outputs_a_waiting_run_cannot_take_are_refused_naming_the_field(
    fields: dict[str, object], param: str
) -> None:
    body = CreateResponse.model_validate({"background": True, **fields})

    with pytest.raises(InvalidInput) as refused:
        body.tool_outputs()

    assert refused.value.field == param


def test_a_completed_response_s_conversation_comes_before_the_new_input() -> None:
    history = [
        ChatMessage(role="user", content="Who is Ada?"),
        ChatMessage(role="assistant", content="A mathematician."),
    ]
    body = CreateResponse.model_validate(
        {"input": "And her father?", "instructions": "Be brief.", "background": True}
    )

    asked = body.task_request(history=history)

    assert asked.messages == [*history, ChatMessage(role="user", content="And her father?")]
    assert asked.system == "Be brief."  # this request's own, as OpenAI carries none over


# --- batch lines -------------------------------------------------------------------------------


def test_a_chat_line_takes_the_whole_chat_completions_body() -> None:
    body = {
        "model": "gpt-test",
        "messages": [
            {"role": "developer", "content": "Label documents."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "this"},
                    {"type": "image_url", "image_url": {"url": PNG, "detail": "high"}},
                ],
            },
        ],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Label", "schema": LABEL, "strict": True},
        },
        "tools": [{"type": "function", "function": {"name": "lookup"}}],
        "tool_choice": "auto",
        "max_completion_tokens": 500,
        "seed": 7,
        "stop": ["END"],
        "n": 1,
        "stream": False,
    }
    line = {"custom_id": "c-1", "method": "POST", "url": "/v1/chat/completions", "body": body}

    item = line_parser("/v1/chat/completions")(line)

    assert item.custom_id == "c-1"
    assert item.json_schema == LABEL
    assert [part.type for part in item.parts()] == ["text", "text", "image_url"]
    assert {k: item.parameters()[k] for k in ("max_completion_tokens", "seed", "stop", "tool_choice")} == {
        "max_completion_tokens": 500,
        "seed": 7,
        "stop": ["END"],
        "tool_choice": "auto",
    }


@pytest.mark.parametrize(
    ("url", "body", "named"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, "'n'"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "stream": True},
            "'stream'",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "audio": {}}, "'audio'"),
        ("/v1/chat/completions", {"prompt": "x"}, "'prompt'"),
        ("/v1/responses", {"input": "x", "stream": True}, "'stream'"),
        ("/v1/responses", {"input": "x", "tools": [{"type": "web_search"}]}, "web_search"),
    ],
)
def test_a_line_a_task_cannot_serve_is_refused_naming_what(
    url: str, body: dict[str, object], named: str
) -> None:
    line = {"custom_id": "c", "method": "POST", "url": url, "body": body}

    with pytest.raises(ValueError, match=named):
        line_parser(url)(line)


def test_a_chat_line_s_answer_is_a_chat_completion_the_sdk_parses() -> None:
    task = completed(
        TOOLS_REQUEST,
        result="",
        tool_calls=CALLS,
        finish_reason="tool_calls",
        model="gpt-test-1",
    )
    usage = Usage(
        prompt_tokens=10, completion_tokens=70, total_tokens=80, cached_tokens=4, reasoning_tokens=64
    )

    parsed = ChatCompletion.model_validate(chat_completion(task, usage, int(NOW)))

    [choice] = parsed.choices
    assert (choice.finish_reason, choice.message.content, parsed.model) == ("tool_calls", None, "gpt-test-1")
    assert [(c.id, c.function.name) for c in choice.message.tool_calls or [] if c.type == "function"] == [
        ("call_1", "lookup"),
        ("call_2", "lookup"),
    ]
    assert parsed.usage is not None
    assert parsed.usage.prompt_tokens_details is not None
    assert parsed.usage.completion_tokens_details is not None
    assert (
        parsed.usage.prompt_tokens_details.cached_tokens,
        parsed.usage.completion_tokens_details.reasoning_tokens,
    ) == (4, 64)
    refusal = ChatCompletion.model_validate(
        chat_completion(completed(LLMRequest(prompt="p"), result="", refusal="No."), None, int(NOW))
    )
    assert (refusal.choices[0].message.content, refusal.choices[0].message.refusal) == (None, "No.")


def test_a_rule_across_fields_is_refused_naming_the_field_its_message_names() -> None:
    with pytest.raises(InvalidInput) as refused:
        CreateResponse.model_validate(
            {"input": "x", "background": True, "tool_choice": "required"}
        ).task_request()

    assert refused.value.field == "tool_choice"
    assert "need 'tools'" in refused.value.detail


def test_a_line_s_text_counts_once_against_the_prompt_cap() -> None:
    text = "y" * 150_000  # under a 200 KiB cap once, over it twice
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 100}
    line = {"custom_id": "big", "method": "POST", "url": "/v1/chat/completions", "body": body}

    item = line_parser("/v1/chat/completions")(line)

    assert item.text_bytes() == len(text)


@pytest.mark.parametrize(
    ("item", "said"),
    [
        ({"role": "user", "content": [{"type": "input_image", "detail": "auto"}]}, "exactly one of 'url'"),
        ({"role": "system", "content": [{"type": "input_image", "image_url": PNG}]}, "only a user message"),
    ],
)
def test_an_item_a_task_s_message_cannot_hold_is_refused_naming_the_item(
    item: dict[str, object], said: str
) -> None:
    body = {"input": [{"role": "user", "content": "first"}, item], "background": True}

    with pytest.raises(InvalidInput) as refused:
        CreateResponse.model_validate(body).task_request()

    assert refused.value.field == "input.1"
    assert said in refused.value.detail
    assert refused.value.slug == "invalid-input"


@pytest.mark.parametrize(
    ("part", "field"),
    [
        ({"type": "input_file", "file_id": "not-a-file-id"}, "file_id"),
        ({"type": "input_file", "file_data": "not base64!"}, "file_data"),
        ({"type": "input_image", "image_url": "ftp://example.com/a.png"}, "image_url"),
    ],
)
def test_a_part_the_document_refuses_is_refused_by_the_request_model(
    part: dict[str, object], field: str
) -> None:
    """What the document states of an input part (its patterns, the fields served as null alone)
    the request's model refuses, so the API's 400 names the field."""
    body = {"input": [{"role": "user", "content": [part]}], "background": True}

    with pytest.raises(ValidationError) as refused:
        CreateResponse.model_validate(body)

    assert any(field in error["loc"] for error in refused.value.errors())
