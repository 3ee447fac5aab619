"""The Bedrock provider (Converse), against botocore's Stubber with replies shaped like Bedrock's
documented ones: no request leaves the machine."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber
from botocore.validate import validate_parameters
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmtasks.aws.batch_store import BatchStore
from llmtasks.aws.queues import Queue
from llmtasks.aws.store import TaskStore
from llmtasks.domain.batches import SubmitBatchRequest
from llmtasks.domain.bedrock_models import Capabilities, capabilities
from llmtasks.domain.errors import RATE_LIMITED, InvalidInput, LLMError
from llmtasks.domain.llm_request import ChatMessage, LLMRequest
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import SubmitTaskRequest, TaskStatus
from llmtasks.domain.rules import SizeLimits, check_limits
from llmtasks.llm import provider_from_settings
from llmtasks.llm.bedrock import JSON_OBJECT_INSTRUCTION, BedrockConverse, converse_request
from llmtasks.services.batches import BatchService
from llmtasks.services.tasks import TaskService
from llmtasks.settings import Settings
from tests.conftest import StackSettings
from tests.helpers import HANG_S, blobs, eventually, serve, task_lanes
from tests.unit.test_worker import Worker

pytestmark = pytest.mark.unit
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


@pytest.fixture
def client() -> Any:
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    )


def converse_reply(text: str, *, inputs: int = 12, outputs: int = 30) -> dict[str, Any]:
    """A Converse reply as Bedrock's API reference shows one."""
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": inputs, "outputTokens": outputs, "totalTokens": inputs + outputs},
        "metrics": {"latencyMs": 812},
    }


def test_a_request_becomes_converse_arguments_and_the_reply_a_completion(client: Any) -> None:
    request = LLMRequest(
        messages=[
            ChatMessage(role="user", content="Name a queue."),
            ChatMessage(role="assistant", content="SQS."),
            ChatMessage(role="user", content="Another?"),
        ],
        system="Be brief.",
        max_tokens=64,
        temperature=0.2,
    )
    expected = {
        "modelId": MODEL,
        "system": [{"text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"text": "Name a queue."}]},
            {"role": "assistant", "content": [{"text": "SQS."}]},
            {"role": "user", "content": [{"text": "Another?"}]},
        ],
        "inferenceConfig": {"maxTokens": 64, "temperature": 0.2},
    }
    with Stubber(client) as stub:
        stub.add_response("converse", converse_reply("Kafka."), expected)
        completion = asyncio.run(
            BedrockConverse(default_model=MODEL, client=client).complete(request, timeout_s=5)
        )
        stub.assert_no_pending_responses()
    assert completion.text == "Kafka."
    assert completion.model == MODEL
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (
        12,
        30,
        42,
    )


def test_a_flex_request_asks_bedrocks_flex_tier_and_the_reply_says_the_tier_that_served_it(
    client: Any,
) -> None:
    request = LLMRequest(messages=[ChatMessage(role="user", content="Hi")], service_tier="flex")
    expected = {
        "modelId": MODEL,
        "messages": [{"role": "user", "content": [{"text": "Hi"}]}],
        "serviceTier": {"type": "flex"},
    }
    # Bedrock answers with the tier that served the call (ConverseResponse.serviceTier).
    reply = {**converse_reply("Hello."), "serviceTier": {"type": "default"}}
    with Stubber(client) as stub:
        stub.add_response("converse", reply, expected)
        completion = asyncio.run(
            BedrockConverse(default_model=MODEL, client=client).complete(request, timeout_s=5)
        )
        stub.assert_no_pending_responses()
    assert completion.usage.service_tier == "default"


def test_service_tier_auto_asks_bedrock_for_no_tier(client: Any) -> None:
    request = LLMRequest(messages=[ChatMessage(role="user", content="Hi")], service_tier="auto")
    assert "serviceTier" not in converse_arguments(request, client)


@pytest.mark.parametrize(
    ("error", "status", "transient", "code"),
    [
        ("ThrottlingException", 429, True, RATE_LIMITED),
        ("ModelNotReadyException", 429, True, RATE_LIMITED),
        ("ModelTimeoutException", 408, True, "llm_http_408"),
        ("InternalServerException", 500, True, "llm_http_500"),
        ("ServiceUnavailableException", 503, True, "llm_http_503"),
        ("ValidationException", 400, False, "llm_http_400"),
        ("AccessDeniedException", 403, False, "llm_http_403"),
        ("ResourceNotFoundException", 404, False, "llm_http_404"),
        ("ModelErrorException", 424, False, "llm_http_424"),
    ],
)
def test_bedrock_errors_are_transient_or_permanent_as_http_errors_are(
    client: Any, error: str, status: int, transient: bool, code: str
) -> None:
    with Stubber(client) as stub:
        stub.add_client_error(
            "converse", service_error_code=error, service_message="no", http_status_code=status
        )
        with pytest.raises(LLMError) as raised:
            asyncio.run(
                BedrockConverse(default_model=MODEL, client=client).complete(
                    LLMRequest(prompt="hi"), timeout_s=5
                )
            )
    assert (raised.value.transient, raised.value.code) == (transient, code)
    assert error in str(raised.value)


def test_a_reply_without_text_or_tool_calls_fails_the_task(client: Any) -> None:
    reply = converse_reply("")
    reply["output"]["message"]["content"] = []
    with Stubber(client) as stub:
        stub.add_response("converse", reply)
        with pytest.raises(LLMError) as raised:
            asyncio.run(
                BedrockConverse(default_model=MODEL, client=client).complete(
                    LLMRequest(prompt="hi"), timeout_s=5
                )
            )
    assert (raised.value.code, raised.value.transient) == ("llm_invalid_reply", False)


def test_settings_choose_bedrock(settings: Settings) -> None:
    chosen = settings.model_copy(update={"llm_provider": "bedrock", "llm_model": MODEL})
    provider = provider_from_settings(chosen)
    assert isinstance(provider, BedrockConverse)


def test_the_worker_retries_a_throttled_bedrock_call_and_completes_the_task(
    worker: Worker, client: Any
) -> None:
    task_id = worker.submit("Summarise Bedrock in five words")
    bedrock = BedrockConverse(default_model=MODEL, client=client)
    unstreamed = {"progress_interval_s": 0}  # Converse, not ConverseStream
    with Stubber(client) as stub:
        stub.add_client_error("converse", service_error_code="ThrottlingException", http_status_code=429)
        stub.add_response("converse", converse_reply("Managed access to foundation models."))
        assert worker.run_queued(llm=bedrock, **unstreamed) == {"batchItemFailures": []}
        throttled = worker.task(task_id)
        assert (throttled.status, throttled.last_error_code) == (TaskStatus.PENDING, RATE_LIMITED)
        retry = eventually(worker.queued, bool, timeout_s=HANG_S, what="the retry's message")
        assert worker.run(retry, llm=bedrock, **unstreamed) == {"batchItemFailures": []}
    done = worker.task(task_id)
    assert (done.status, done.result, done.attempts, done.model) == (
        TaskStatus.COMPLETED,
        "Managed access to foundation models.",
        2,
        MODEL,
    )


# --- the request's mapping -----------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n tiny"
PDF = b"%PDF-1.7 tiny"
THINKING = "anthropic.claude-3-7-sonnet-20250219-v1:0"
CLAUDE_35 = "anthropic.claude-3-5-sonnet-20240620-v1:0"


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def converse_arguments(request: LLMRequest, client: Any, model: str = MODEL) -> dict[str, Any]:
    """converse_request's arguments, checked against Converse's input shape as botocore has it."""
    arguments = converse_request(request, model)
    shape = client.meta.service_model.operation_model("Converse").input_shape
    validate_parameters(arguments, shape)
    return arguments


def complete(client: Any, request: LLMRequest, reply: dict[str, Any], model: str = MODEL) -> Completion:
    """One Converse call against the Stubber, which checks the arguments it is sent."""
    with Stubber(client) as stub:
        stub.add_response("converse", reply, converse_request(request, model))
        completion = asyncio.run(
            BedrockConverse(default_model=model, client=client).complete(request, timeout_s=5)
        )
        stub.assert_no_pending_responses()
    return completion


def test_images_and_documents_are_sent_as_their_bytes(client: Any) -> None:
    request = LLMRequest(
        messages=[
            ChatMessage.model_validate(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Compare these."},
                        {"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}},
                        {
                            "type": "file",
                            "file": {
                                "file_data": data_url("application/pdf", PDF),
                                "filename": "Q3 report.v2.pdf",
                            },
                        },
                        {
                            "type": "file",
                            "file": {
                                "file_data": base64.b64encode(b"a,b\n1,2").decode(),
                                "filename": "rows.csv",
                            },
                        },
                        {"type": "file", "file": {"file_data": base64.b64encode(PDF).decode()}},
                        {"type": "file", "file": {"file_data": data_url("application/pdf", PDF)}},
                    ],
                }
            )
        ]
    )
    blocks = converse_arguments(request, client, CLAUDE_35)["messages"][0]["content"]
    assert blocks == [
        {"text": "Compare these."},
        {"image": {"format": "png", "source": {"bytes": PNG}}},
        {"document": {"format": "pdf", "name": "Q3 report-v2", "source": {"bytes": PDF}}},
        {"document": {"format": "csv", "name": "rows", "source": {"bytes": b"a,b\n1,2"}}},
        # Bare base64 without a name is a PDF; names stay unique within the request.
        {"document": {"format": "pdf", "name": "document", "source": {"bytes": PDF}}},
        {"document": {"format": "pdf", "name": "document (2)", "source": {"bytes": PDF}}},
    ]


def weather_tool(name: str = "weather") -> dict[str, Any]:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return {
        "type": "function",
        "function": {"name": name, "description": "Weather now.", "parameters": schema},
    }


def test_a_tool_run_maps_to_tool_config_tool_use_and_tool_results_and_its_calls_come_back(
    client: Any,
) -> None:
    request = LLMRequest.model_validate(
        {
            "system": "Use the tools.",
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {"role": "user", "content": "Weather in Oslo and Bergen?"},
                {
                    "role": "assistant",
                    "content": "Looking.",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "weather", "arguments": '{"city": "Bergen"}'},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "4 C, rain"},
                {"role": "tool", "tool_call_id": "c2", "content": "6 C"},
                {"role": "user", "content": "And Tromso?"},
            ],
            "tools": [weather_tool()],
            "tool_choice": "required",
        }
    )
    arguments = converse_arguments(request, client)
    assert arguments["system"] == [{"text": "Use the tools."}, {"text": "Be terse."}]
    assert arguments["messages"] == [
        {"role": "user", "content": [{"text": "Weather in Oslo and Bergen?"}]},
        {
            "role": "assistant",
            "content": [
                {"text": "Looking."},
                {"toolUse": {"toolUseId": "c1", "name": "weather", "input": {"city": "Oslo"}}},
                {"toolUse": {"toolUseId": "c2", "name": "weather", "input": {"city": "Bergen"}}},
            ],
        },
        {
            # The results and the next question in one user turn: Converse alternates roles.
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "c1", "content": [{"text": "4 C, rain"}]}},
                {"toolResult": {"toolUseId": "c2", "content": [{"text": "6 C"}]}},
                {"text": "And Tromso?"},
            ],
        },
    ]
    assert arguments["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "weather",
                    "description": "Weather now.",
                    "inputSchema": {"json": weather_tool()["function"]["parameters"]},
                }
            }
        ],
        "toolChoice": {"any": {}},
    }
    reply = converse_reply("")
    reply["stopReason"] = "tool_use"
    reply["output"]["message"]["content"] = [
        {"toolUse": {"toolUseId": "c3", "name": "weather", "input": {"city": "Tromso"}}}
    ]
    completion = complete(client, request, reply)
    assert (completion.text, completion.finish_reason) == ("", "tool_calls")
    assert [call.model_dump() for call in completion.tool_calls or []] == [
        {"id": "c3", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Tromso"}'}}
    ]


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        (None, None),
        ("auto", {"auto": {}}),
        ("required", {"any": {}}),
        ({"type": "function", "function": {"name": "weather"}}, {"tool": {"name": "weather"}}),
    ],
)
def test_tool_choice_maps_to_converse_tool_choice(client: Any, tool_choice: Any, expected: Any) -> None:
    request = LLMRequest.model_validate(
        {"prompt": "Oslo?", "tools": [weather_tool()], "tool_choice": tool_choice}
    )
    config = converse_arguments(request, client)["toolConfig"]
    assert config.get("toolChoice") == expected
    assert [tool["toolSpec"]["name"] for tool in config["tools"]] == ["weather"]


def test_tool_choice_none_sends_no_tools_unless_the_history_calls_them(client: Any) -> None:
    bare = LLMRequest.model_validate({"prompt": "Oslo?", "tools": [weather_tool()], "tool_choice": "none"})
    assert "toolConfig" not in converse_arguments(bare, client)
    call = {"id": "c1", "type": "function", "function": {"name": "forecast", "arguments": "{}"}}
    history = LLMRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": "Oslo?"},
                {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "rain"},
            ],
            "tools": [weather_tool()],
            "tool_choice": "none",
        }
    )
    # Converse needs the tools a history's calls name: the request's, and a bare one for a call
    # of a tool the request no longer has.
    config = converse_arguments(history, client)["toolConfig"]
    assert config == {
        "tools": [
            {
                "toolSpec": {
                    "name": "weather",
                    "description": "Weather now.",
                    "inputSchema": {"json": weather_tool()["function"]["parameters"]},
                }
            },
            {"toolSpec": {"name": "forecast", "inputSchema": {"json": {"type": "object"}}}},
        ]
    }


SCHEMA = {"type": "object", "properties": {"label": {"enum": ["spam", "ham"]}}, "required": ["label"]}


def schema_request(**more: Any) -> LLMRequest:
    form = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
    return LLMRequest.model_validate({"prompt": "Spam? Buy now!", "response_format": form, **more})


def test_a_json_schema_is_answered_through_a_forced_tool_whose_input_is_the_text(client: Any) -> None:
    request = schema_request()
    assert converse_arguments(request, client)["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "verdict",
                    "description": "Give the answer as this tool's input.",
                    "inputSchema": {"json": SCHEMA},
                }
            }
        ],
        "toolChoice": {"tool": {"name": "verdict"}},
    }
    reply = converse_reply("")
    reply["stopReason"] = "tool_use"
    reply["output"]["message"]["content"] = [
        {"toolUse": {"toolUseId": "t1", "name": "verdict", "input": {"label": "spam"}}}
    ]
    completion = complete(client, request, reply)
    assert (json.loads(completion.text), completion.finish_reason, completion.tool_calls) == (
        {"label": "spam"},
        "stop",
        None,
    )


def test_a_json_schema_beside_tools_lets_the_model_call_a_tool_or_answer(client: Any) -> None:
    config = converse_arguments(schema_request(tools=[weather_tool()]), client)["toolConfig"]
    assert [tool["toolSpec"]["name"] for tool in config["tools"]] == ["weather", "verdict"]
    assert config["toolChoice"] == {"any": {}}


def test_json_object_is_asked_for_in_the_system_prompt(client: Any) -> None:
    request = LLMRequest(
        prompt="A colour as JSON.", system="Be brief.", response_format={"type": "json_object"}
    )
    assert converse_arguments(request, client)["system"] == [
        {"text": "Be brief."},
        {"text": JSON_OBJECT_INSTRUCTION},
    ]


def test_sampling_stop_limit_and_user_map_to_inference_config_and_request_metadata(client: Any) -> None:
    request = LLMRequest(
        prompt="Count.",
        max_tokens=10,
        max_completion_tokens=50,
        temperature=0.3,
        top_p=0.9,
        stop=["7", "END"],
        user="user-42",
        safety_identifier="sid:abc",
    )
    arguments = converse_arguments(request, client)
    assert arguments["inferenceConfig"] == {
        "maxTokens": 50,
        "temperature": 0.3,
        "topP": 0.9,
        "stopSequences": ["7", "END"],
    }
    assert arguments["requestMetadata"] == {"user": "user-42", "safety_identifier": "sid:abc"}
    one = converse_arguments(LLMRequest(prompt="Count.", stop="7"), client)
    assert one["inferenceConfig"] == {"stopSequences": ["7"]}


@pytest.mark.parametrize(
    ("effort", "limit", "budget", "max_tokens"),
    [
        ("minimal", None, 1024, 1024 + 4096),
        ("high", None, 8192, 8192 + 4096),
        ("xhigh", None, 16384, 16384 + 4096),
        # The limit counts the reasoning, as OpenAI's max_completion_tokens does.
        ("high", 5000, 4999, 5000),
        ("low", 30000, 2048, 30000),
    ],
)
def test_reasoning_effort_becomes_claude_thinking_within_the_limit(
    client: Any, effort: str, limit: int | None, budget: int, max_tokens: int
) -> None:
    request = LLMRequest.model_validate(
        {"prompt": "Prove it.", "reasoning_effort": effort, "max_completion_tokens": limit}
    )
    arguments = converse_arguments(request, client, THINKING)
    assert arguments["additionalModelRequestFields"] == {
        "thinking": {"type": "enabled", "budget_tokens": budget}
    }
    assert arguments["inferenceConfig"] == {"maxTokens": max_tokens}


def test_no_reasoning_effort_or_none_asks_no_thinking(client: Any) -> None:
    for request in (LLMRequest(prompt="Hi."), LLMRequest(prompt="Hi.", reasoning_effort="none")):
        assert "additionalModelRequestFields" not in converse_arguments(request, client, THINKING)


def test_reasoning_blocks_come_back_as_the_completions_reasoning(client: Any) -> None:
    reply = converse_reply("42.")
    reply["output"]["message"]["content"] = [
        {"reasoningContent": {"reasoningText": {"text": "Six times seven.", "signature": "sig"}}},
        {"text": "42."},
    ]
    request = LLMRequest(prompt="6*7?", reasoning_effort="low")
    completion = complete(client, request, reply, THINKING)
    assert (completion.text, completion.reasoning, completion.finish_reason) == (
        "42.",
        "Six times seven.",
        "stop",
    )


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("content_filtered", "content_filter"),
        ("guardrail_intervened", "content_filter"),
    ],
)
def test_the_stop_reason_becomes_openais_finish_reason(
    client: Any, stop_reason: str, finish_reason: str
) -> None:
    reply = converse_reply("Partial")
    reply["stopReason"] = stop_reason
    assert complete(client, LLMRequest(prompt="Go."), reply).finish_reason == finish_reason


def test_a_task_its_model_cannot_take_fails_at_the_provider_without_a_call(client: Any) -> None:
    request = LLMRequest(prompt="Hi.", seed=7)
    with Stubber(client) as stub, pytest.raises(LLMError) as raised:
        asyncio.run(BedrockConverse(default_model=MODEL, client=client).complete(request, timeout_s=5))
    stub.assert_no_pending_responses()
    assert (raised.value.code, raised.value.transient) == ("llm_unsupported_input", False)
    assert "seed" in str(raised.value)


# --- ConverseStream ------------------------------------------------------------------------------


def event_message(event_type: str, payload: dict[str, Any]) -> bytes:
    """One message of AWS's event stream encoding, as Bedrock sends ConverseStream's events."""
    headers = b""
    for name, value in (
        (":event-type", event_type),
        (":content-type", "application/json"),
        (":message-type", "event"),
    ):
        headers += (
            struct.pack(">B", len(name))
            + name.encode()
            + b"\x07"
            + struct.pack(">H", len(value))
            + value.encode()
        )
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 12 + len(headers) + len(body) + 4, len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + body
    return message + struct.pack(">I", zlib.crc32(message))


class StreamingBedrock:
    """ConverseStream over HTTP on 127.0.0.1: answers each call with the events it is given and
    keeps the request bodies."""

    def __init__(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.events = events
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> Starlette:
        return Starlette(
            routes=[Route("/model/{model:path}/converse-stream", self._stream, methods=["POST"])]
        )

    async def _stream(self, request: Request) -> Response:
        self.bodies.append(json.loads(await request.body()))
        content = b"".join(event_message(kind, payload) for kind, payload in self.events)
        return Response(content, media_type="application/vnd.amazon.eventstream")


def stream(
    events: list[tuple[str, dict[str, Any]]], request: LLMRequest, model: str = MODEL
) -> tuple[Completion, list[str], StreamingBedrock]:
    bedrock = StreamingBedrock(events)
    progress: list[str] = []

    async def on_progress(text: str, chunks: int) -> None:
        progress.append(text)

    with serve(bedrock.app()) as url:
        streaming_client = boto3.client(
            "bedrock-runtime",
            region_name="us-east-1",
            endpoint_url=url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
        )
        provider = BedrockConverse(default_model=model, client=streaming_client)
        completion = asyncio.run(provider.complete(request, timeout_s=10, on_progress=on_progress))
    return completion, progress, bedrock


def delta(index: int, **value: Any) -> tuple[str, dict[str, Any]]:
    return "contentBlockDelta", {"contentBlockIndex": index, "delta": value}


def ending(stop_reason: str) -> list[tuple[str, dict[str, Any]]]:
    usage = {"inputTokens": 20, "outputTokens": 9, "totalTokens": 29}
    return [
        ("messageStop", {"stopReason": stop_reason}),
        ("metadata", {"usage": usage, "metrics": {"latencyMs": 90}}),
    ]


def test_a_streamed_flex_call_asks_for_flex_and_its_metadata_says_the_tier_that_served_it() -> None:
    served = {
        "usage": {"inputTokens": 5, "outputTokens": 2, "totalTokens": 7},
        "serviceTier": {"type": "flex"},
    }
    events = [("messageStart", {"role": "assistant"}), delta(0, text="Hi."), ("metadata", served)]
    request = LLMRequest(prompt="Hello", service_tier="flex")
    completion, _, bedrock = stream(events, request)
    assert bedrock.bodies[0]["serviceTier"] == {"type": "flex"}
    assert (completion.text, completion.usage.service_tier) == ("Hi.", "flex")


def test_a_stream_assembles_reasoning_text_and_tool_calls_and_reports_the_text_as_it_grows() -> None:
    events = [
        ("messageStart", {"role": "assistant"}),
        delta(0, reasoningContent={"text": "Oslo first, "}),
        delta(0, reasoningContent={"text": "then Bergen."}),
        delta(0, reasoningContent={"signature": "sig"}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        delta(1, text="Checking "),
        delta(1, text="both."),
        ("contentBlockStop", {"contentBlockIndex": 1}),
        (
            "contentBlockStart",
            {"contentBlockIndex": 2, "start": {"toolUse": {"toolUseId": "c1", "name": "weather"}}},
        ),
        delta(2, toolUse={"input": '{"city": '}),
        delta(2, toolUse={"input": '"Oslo"}'}),
        ("contentBlockStop", {"contentBlockIndex": 2}),
        (
            "contentBlockStart",
            {"contentBlockIndex": 3, "start": {"toolUse": {"toolUseId": "c2", "name": "weather"}}},
        ),
        delta(3, toolUse={"input": '{"city": "Bergen"}'}),
        ("contentBlockStop", {"contentBlockIndex": 3}),
        *ending("tool_use"),
    ]
    request = LLMRequest(prompt="Weather?", tools=[weather_tool()], reasoning_effort="low")
    completion, progress, bedrock = stream(events, request, THINKING)
    assert progress == ["Checking ", "Checking both."]
    assert (completion.text, completion.reasoning, completion.finish_reason) == (
        "Checking both.",
        "Oslo first, then Bergen.",
        "tool_calls",
    )
    assert [
        (c.id, c.function.name, json.loads(c.function.arguments)) for c in completion.tool_calls or []
    ] == [
        ("c1", "weather", {"city": "Oslo"}),
        ("c2", "weather", {"city": "Bergen"}),
    ]
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (20, 9)
    # What went over the wire is converse_request's (bytes aside, which JSON carries as base64).
    sent = bedrock.bodies[0]
    assert sent["additionalModelRequestFields"] == {"thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert sent["toolConfig"]["tools"][0]["toolSpec"]["name"] == "weather"


def test_a_streamed_schema_answer_is_reported_and_returned_as_json_text() -> None:
    events = [
        (
            "contentBlockStart",
            {"contentBlockIndex": 0, "start": {"toolUse": {"toolUseId": "t1", "name": "verdict"}}},
        ),
        delta(0, toolUse={"input": '{"label"'}),
        delta(0, toolUse={"input": ': "ham"}'}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        *ending("tool_use"),
    ]
    completion, progress, _ = stream(events, schema_request())
    assert progress == ['{"label"', '{"label": "ham"}']
    assert (json.loads(completion.text), completion.finish_reason, completion.tool_calls) == (
        {"label": "ham"},
        "stop",
        None,
    )


# --- what a model cannot take, refused at submit ------------------------------------------------

AUDIO = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF").decode(), "format": "wav"}}


def user_parts(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "Look."}, *parts]}]}


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def document(data: str, filename: str | None = None) -> dict[str, Any]:
    return {"type": "file", "file": {"file_data": data, **({"filename": filename} if filename else {})}}


@pytest.mark.parametrize(
    ("body", "model", "field"),
    [
        ({"logprobs": True}, MODEL, "logprobs"),
        ({"seed": 1}, MODEL, "seed"),
        ({"presence_penalty": 0.5}, MODEL, "presence_penalty"),
        ({"frequency_penalty": 0.5}, MODEL, "frequency_penalty"),
        ({"service_tier": "scale"}, MODEL, "service_tier"),
        ({"prompt_cache_key": "k"}, MODEL, "prompt_cache_key"),
        ({"user": "ünïcode"}, MODEL, "user"),
        ({"tools": [weather_tool()], "parallel_tool_calls": False}, MODEL, "parallel_tool_calls"),
        (user_parts(AUDIO), MODEL, "messages[0].content[1]"),
        (user_parts(image("https://example.com/cat.png")), CLAUDE_35, "messages[0].content[1].image_url.url"),
        (user_parts(image(data_url("image/bmp", PNG))), CLAUDE_35, "messages[0].content[1].image_url.url"),
        (
            user_parts(document(base64.b64encode(PDF).decode(), "data.zip")),
            CLAUDE_35,
            "messages[0].content[1].file",
        ),
        # Claude 3.5 Haiku reads documents but no images; Llama 3.1 neither; Mistral 7B has no tools.
        (user_parts(image(data_url("image/png", PNG))), MODEL, "messages[0].content[1]"),
        (
            user_parts(document(data_url("application/pdf", PDF))),
            "meta.llama3-1-70b-instruct-v1:0",
            "messages[0].content[1]",
        ),
        ({"tools": [weather_tool()]}, "mistral.mistral-7b-instruct-v0:2", "tools"),
        (
            {"tools": [weather_tool()], "tool_choice": "required"},
            "meta.llama3-1-70b-instruct-v1:0",
            "tool_choice",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}}},
            "meta.llama3-3-70b-instruct-v1:0",
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "v", "schema": {"type": "array"}},
                }
            },
            MODEL,
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "weather", "schema": SCHEMA},
                },
                "tools": [weather_tool()],
            },
            MODEL,
            "response_format",
        ),
        # Reasoning: Claude 3.7 and 4 only, with no sampling change, forced tool or tiny limit.
        ({"reasoning_effort": "low"}, CLAUDE_35, "reasoning_effort"),
        ({"reasoning_effort": "low"}, "amazon.nova-pro-v1:0", "reasoning_effort"),
        ({"temperature": 1.5}, MODEL, "temperature"),
        ({"reasoning_effort": "low", "temperature": 0.2}, THINKING, "temperature"),
        (
            {
                "reasoning_effort": "low",
                "tools": [weather_tool()],
                "messages": [
                    {"role": "user", "content": "Oslo?"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "weather", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "rain"},
                ],
            },
            THINKING,
            "messages[1].tool_calls",
        ),
        ({"reasoning_effort": "low", "top_p": 0.5}, THINKING, "top_p"),
        ({"reasoning_effort": "low", "max_tokens": 1024}, THINKING, "max_tokens"),
        (
            {"reasoning_effort": "low", "tools": [weather_tool()], "tool_choice": "required"},
            THINKING,
            "tool_choice",
        ),
        (
            {
                "reasoning_effort": "low",
                "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}},
            },
            THINKING,
            "response_format",
        ),
    ],
)
def test_what_a_bedrock_model_cannot_take_is_refused_naming_the_field(
    body: dict[str, Any], model: str, field: str
) -> None:
    request = SubmitTaskRequest.model_validate({"prompt": "Hi.", **body} if "messages" not in body else body)
    limits = SizeLimits(max_prompt_bytes=10**6, max_metadata_bytes=1024, bedrock_model=model)
    with pytest.raises(InvalidInput) as refused:
        check_limits(request, limits)
    assert refused.value.field == field
    assert model in refused.value.detail
    check_limits(request, SizeLimits(max_prompt_bytes=10**6, max_metadata_bytes=1024))  # not on Bedrock


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (
            user_parts(image(data_url("image/webp", PNG)), document(data_url("text/markdown", b"# x"))),
            "amazon.nova-lite-v1:0",
        ),
        (user_parts(image(data_url("image/jpeg", PNG))), "meta.llama3-2-90b-instruct-v1:0"),
        ({"tools": [weather_tool()], "tool_choice": "auto"}, "meta.llama3-1-70b-instruct-v1:0"),
        ({"tools": [weather_tool()], "tool_choice": "required"}, "mistral.mistral-large-2407-v1:0"),
        (
            {"reasoning_effort": "high", "max_completion_tokens": 20000, "tools": [weather_tool()]},
            "us.anthropic.claude-sonnet-4-20250514-v1:0",
        ),
        (
            {"reasoning_effort": "medium"},
            "arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.anthropic.claude-opus-4-20250514-v1:0",
        ),
        ({"response_format": {"type": "json_object"}, "stop": "END", "top_p": 0.9}, "some.new-model-v1"),
        ({"tools": [weather_tool()]}, "some.new-model-v1"),
        (
            {
                "reasoning_effort": "low",
                "messages": [
                    {"role": "user", "content": "Oslo?"},
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "weather", "arguments": "{}"},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "rain"},
                    {"role": "assistant", "content": "Rain in Oslo."},
                    {"role": "user", "content": "And tomorrow?"},
                ],
            },
            THINKING,
        ),
    ],
)
def test_what_a_bedrock_model_takes_passes(body: dict[str, Any], model: str) -> None:
    request = SubmitTaskRequest.model_validate({"prompt": "Hi.", **body} if "messages" not in body else body)
    check_limits(request, SizeLimits(max_prompt_bytes=10**6, max_metadata_bytes=1024, bedrock_model=model))


def test_an_unknown_model_takes_text_and_tools_only() -> None:
    assert capabilities("some.new-model-v1") == Capabilities(tools=True)
    assert capabilities("us.anthropic.claude-3-7-sonnet-20250219-v1:0").reasoning


def test_a_bedrock_stack_refuses_at_submit_with_the_stack_or_the_tasks_model(
    aws: Any, settings: StackSettings
) -> None:
    bedrock = settings.model_copy(update={"llm_provider": "bedrock", "llm_model": MODEL})
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    service = TaskService(bedrock, store, task_lanes(bedrock, aws.sqs), results=blobs(bedrock))
    with pytest.raises(InvalidInput) as refused:
        service.submit("acme", SubmitTaskRequest(prompt="Think.", reasoning_effort="high"))
    assert (refused.value.status, refused.value.field) == (422, "reasoning_effort")
    assert MODEL in refused.value.detail
    assert aws.messages("TaskQueue") == []
    # A task naming a model that reasons is taken; so is anything on a stack of another provider.
    service.submit("acme", SubmitTaskRequest(prompt="Think.", reasoning_effort="high", model=THINKING))
    other = TaskService(settings, store, task_lanes(settings, aws.sqs), results=blobs(settings))
    other.submit("acme", SubmitTaskRequest(prompt="Think.", reasoning_effort="high", seed=3))
    assert len(aws.messages("TaskQueue")) == 2


def test_a_batch_item_is_refused_by_its_place(aws: Any, settings: StackSettings) -> None:
    bedrock = settings.model_copy(update={"llm_provider": "bedrock", "llm_model": MODEL})
    request = SubmitBatchRequest.model_validate({"items": [{"prompt": "a"}, {"prompt": "b", "seed": 2}]})
    service = BatchService(
        bedrock,
        TaskStore(settings.tasks_table_name, aws.dynamodb),
        BatchStore(settings.tasks_table_name, aws.dynamodb),
        Queue(settings.batch_fanout_queue_url, aws.sqs),
        results=blobs(bedrock),
    )
    with pytest.raises(InvalidInput) as refused:
        service.submit("acme", request)
    assert refused.value.field == "items[1].seed"
    assert aws.messages("BatchFanoutQueue") == []
