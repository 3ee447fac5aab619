"""The official `openai` SDK, unchanged, against the local stack: background responses created,
retrieved to completion and cancelled, their webhooks verified by the SDK, the Batch API from
upload to output file, and every refusal raised as the SDK's own exception."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from typing import Literal

import openai
import pytest
from openai import OpenAI
from openai.types import Batch
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from openai.types.webhooks import BatchCompletedWebhookEvent, ResponseCompletedWebhookEvent
from pydantic import BaseModel

from llmtasks_local.mcp_docs import serving
from llmtasks_local.mock_llm import reply_text
from tests.e2e.conftest import RunningStack
from tests.helpers import HANG_S, ROOT, WebhookReceiver, eventually, free_port

pytestmark = pytest.mark.e2e


@pytest.fixture
def client(fresh_mock: RunningStack) -> Iterator[OpenAI]:
    # What a user of the SDK changes: the base URL and the key (an llmtasks one).
    with OpenAI(base_url=fresh_mock.api + "/v1", api_key=fresh_mock.api_key, max_retries=0) as sdk:
        yield sdk


def ended(client: OpenAI, response: Response) -> Response:
    return eventually(
        lambda: client.responses.retrieve(response.id),
        lambda seen: seen.status not in ("queued", "in_progress"),
        timeout_s=HANG_S,
        every_s=0.2,
        what=f"{response.id} ended",
    )


def test_a_background_response_is_created_then_retrieved_to_completion(client: OpenAI) -> None:
    created = client.responses.create(
        model="gpt-test", input="Summarise the report", background=True, metadata={"job": "report-7"}
    )

    assert created.id.startswith("resp_")
    assert created.status == "queued"
    assert created.background is True
    done = ended(client, created)
    assert done.status == "completed"
    assert done.output_text == reply_text("Summarise the report")
    assert done.metadata == {"job": "report-7"}
    assert done.usage is not None
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens > 0
    assert done.completed_at is not None
    assert done.completed_at >= done.created_at


def test_messages_and_instructions_reach_the_model_as_a_chat(client: OpenAI) -> None:
    created = client.responses.create(
        model="gpt-test",
        instructions="Answer in one line.",
        input=[
            {"role": "developer", "content": "Be exact."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is "},
                    {"type": "input_text", "text": "2+2?"},
                ],
            },
        ],
        background=True,
        max_output_tokens=50,
        temperature=0.2,
    )

    done = ended(client, created)
    assert done.status == "completed"
    # The mock answers the last user message; the request's own fields come back as sent.
    assert done.output_text == reply_text("What is 2+2?")
    assert (done.instructions, done.max_output_tokens, done.temperature) == ("Answer in one line.", 50, 0.2)


def test_a_running_response_is_cancelled_and_stays_cancelled(
    client: OpenAI, fresh_mock: RunningStack
) -> None:
    fresh_mock.configure_mock(latency_s=30)
    created = client.responses.create(model="gpt-test", input="a long essay", background=True)
    eventually(
        fresh_mock.mock_stats,
        lambda stats: stats["in_flight"] == 1,
        timeout_s=HANG_S,
        what="the call running",
    )

    cancelled = client.responses.cancel(created.id)

    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(created.id).status == "cancelled"
    assert client.responses.cancel(created.id).status == "cancelled"  # again: as it ended


def test_a_field_llmtasks_cannot_serve_is_refused_by_name(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="gpt-test", input="x", background=True, tools=[{"type": "web_search"}])

    assert refused.value.status_code == 400
    assert refused.value.param == "tools"
    assert refused.value.code == "unsupported_parameter"


def test_a_synchronous_response_is_refused_with_the_way_to_the_native_api(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="gpt-test", input="x")

    assert refused.value.param == "background"
    assert "background=true" in refused.value.message


def test_an_invalid_value_is_a_bad_request_naming_the_field(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="gpt-test", input="x", background=True, temperature=7)

    assert refused.value.param == "temperature"


def test_unknown_and_other_tenants_responses_are_not_found(client: OpenAI, fresh_mock: RunningStack) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve("resp_0123456789abcdef0123456789abcdef")
    assert "resp_0123456789abcdef0123456789abcdef" in missing.value.message

    mine = client.responses.create(model="gpt-test", input="mine", background=True)
    other_key = fresh_mock.cli("keys", "create", "--tenant", "someone-else").strip()
    with OpenAI(base_url=fresh_mock.api + "/v1", api_key=other_key, max_retries=0) as other:
        with pytest.raises(openai.NotFoundError):
            other.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            other.responses.cancel(mine.id)


def test_a_bad_key_is_the_sdks_permission_error_from_the_gateway(fresh_mock: RunningStack) -> None:
    # API Gateway answers an authorizer's deny itself (403 {"message": "Forbidden"}); an HTTP
    # API cannot give it OpenAI's 401 shape, so the SDK raises its 403 error.
    sdk = OpenAI(base_url=fresh_mock.api + "/v1", api_key="lt_nope_nope", max_retries=0)
    with sdk, pytest.raises(openai.PermissionDeniedError) as refused:
        sdk.responses.retrieve("resp_0123456789abcdef0123456789abcdef")
    assert refused.value.status_code == 403
    assert refused.value.body == {"message": "Forbidden"}


# --- the Batch API ---------------------------------------------------------------------------------


def jsonl(lines: list[object]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def chat_line(custom_id: str, question: str) -> dict[str, object]:
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": question}], "max_tokens": 100}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def batch_ended(client: OpenAI, batch: Batch) -> Batch:
    return eventually(
        lambda: client.batches.retrieve(batch.id),
        lambda seen: seen.status in ("completed", "failed", "cancelled", "expired"),
        timeout_s=240,
        every_s=1,
        what=f"{batch.id} ended",
    )


@pytest.mark.timeout(600)
def test_a_batch_of_200_requests_runs_to_completed_with_every_custom_id_once_in_its_output(
    client: OpenAI,
) -> None:
    lines = [chat_line(f"request-{i}", f"question {i}") for i in range(200)]
    uploaded = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    assert (uploaded.purpose, uploaded.bytes) == ("batch", len(jsonl(lines)))

    created = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "7"},
    )
    assert created.status == "validating"  # its file is read in the background
    done = batch_ended(client, created)

    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        200,
        200,
        0,
    )
    assert done.metadata == {"run": "7"}
    assert done.output_file_id is not None
    assert done.error_file_id is None
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in output) == sorted(f"request-{i}" for i in range(200))
    by_id = {line["custom_id"]: line for line in output}
    answer = by_id["request-42"]["response"]
    assert answer["status_code"] == 200
    assert answer["body"]["object"] == "chat.completion"
    assert answer["body"]["choices"][0]["message"]["content"] == reply_text("question 42")
    # A later read finds the same files.
    assert client.batches.retrieve(created.id).output_file_id == done.output_file_id


def test_lines_that_cannot_be_served_go_to_the_error_file_and_the_rest_runs(client: OpenAI) -> None:
    lines: list[object] = [chat_line("good-1", "one"), chat_line("good-2", "two")]
    lines.append(
        {
            **chat_line("uses-tools", "three"),
            "body": {"messages": [{"role": "user", "content": "x"}], "tools": []},
        }
    )
    lines.append({**chat_line("wrong-url", "four"), "url": "/v1/embeddings"})
    data = jsonl(lines) + b"not json at all\n"
    uploaded = client.files.create(file=("mixed.jsonl", data), purpose="batch")

    done = batch_ended(
        client,
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    )

    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 2, 3)
    assert done.output_file_id is not None
    assert done.error_file_id is not None
    output = [json.loads(line) for line in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in output) == ["good-1", "good-2"]
    errors = [json.loads(line) for line in client.files.content(done.error_file_id).text.splitlines()]
    assert [line["custom_id"] for line in errors] == ["uses-tools", "wrong-url", None]
    assert "tools" in errors[0]["error"]["message"]
    assert "line 5" in errors[2]["error"]["message"]


def test_a_responses_batch_answers_with_response_objects(client: OpenAI) -> None:
    line = {
        "custom_id": "r-1",
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": "gpt-test", "input": "hi"},
    }
    uploaded = client.files.create(file=("r.jsonl", jsonl([line])), purpose="batch")

    done = batch_ended(
        client,
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"),
    )

    assert done.output_file_id is not None
    [output] = [json.loads(text) for text in client.files.content(done.output_file_id).text.splitlines()]
    body = output["response"]["body"]
    assert body["object"] == "response"
    assert body["output"][0]["content"][0]["text"] == reply_text("hi")


def test_a_cancelled_batch_ends_cancelled_with_its_unrun_requests_in_the_error_file(
    client: OpenAI, fresh_mock: RunningStack
) -> None:
    fresh_mock.configure_mock(latency_s=30)
    uploaded = client.files.create(
        file=("slow.jsonl", jsonl([chat_line(f"slow-{i}", "x") for i in range(20)])), purpose="batch"
    )
    created = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    # Cancelled once its file is read (cancelled while validating, it would end with no request)
    eventually(
        lambda: client.batches.retrieve(created.id),
        lambda seen: seen.status == "in_progress",
        timeout_s=HANG_S,
        every_s=0.5,
        what=f"{created.id} in progress",
    )

    client.batches.cancel(created.id)
    done = batch_ended(client, created)

    assert done.status == "cancelled"
    assert done.error_file_id is not None
    errors = [json.loads(line) for line in client.files.content(done.error_file_id).text.splitlines()]
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert len(errors) == 20 - (done.request_counts.completed if done.request_counts else 0)

    # Retried with llmtasks' own API (OpenAI has none), its cancelled requests run, and the batch
    # ends again with files of its own: every request's answer in the output, no error file
    fresh_mock.configure_mock(latency_s=0)
    with fresh_mock.client() as native:
        retried = native.post(
            f"/batches/{created.id.removeprefix('batch_')}/retry", json={"statuses": ["cancelled"]}
        )
    assert retried.status_code == 202, retried.text
    again = batch_ended(client, created)
    assert again.status == "completed"
    assert again.output_file_id is not None
    assert again.output_file_id != done.output_file_id
    assert again.error_file_id is None
    output = [json.loads(line) for line in client.files.content(again.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in output) == sorted(f"slow-{i}" for i in range(20))


@pytest.mark.timeout(600)
def test_a_file_over_the_gateway_s_limit_goes_up_in_parts_and_its_large_output_comes_down_presigned(
    client: OpenAI, fresh_mock: RunningStack
) -> None:
    fresh_mock.configure_mock(reply_chars=200_000)  # 40 answers of 200 KB: an 8 MB output file
    lines = [chat_line(f"big-{i}", f"question {i} " + "y" * 170_000) for i in range(40)]
    data = jsonl(lines) + b"{broken\n"
    assert len(data) > 6_291_456  # more than one request through the gateway can carry

    # The SDK's own chunked upload, unchanged but for a part size within a request's 6 MB (its
    # body base64-encoded in the invocation's event).
    upload = client.uploads.upload_file_chunked(
        file=data,
        filename="big.jsonl",
        bytes=len(data),
        mime_type="application/jsonl",
        purpose="batch",
        part_size=4 * 1024 * 1024,
    )
    assert upload.status == "completed"
    assert upload.file is not None
    assert (upload.file.bytes, upload.file.filename) == (len(data), "big.jsonl")
    other_key = fresh_mock.cli("keys", "create", "--tenant", "upload-snoop").strip()
    with OpenAI(base_url=fresh_mock.api + "/v1", api_key=other_key, max_retries=0) as other:
        with pytest.raises(openai.NotFoundError):
            other.uploads.parts.create(upload_id=upload.id, data=b"{}")
        with pytest.raises(openai.BadRequestError):  # its file is not another tenant's either
            other.batches.create(
                input_file_id=upload.file.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
    with pytest.raises(openai.BadRequestError):  # completed: it takes no more parts
        client.uploads.parts.create(upload_id=upload.id, data=b"{}")

    done = batch_ended(
        client,
        client.batches.create(
            input_file_id=upload.file.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    )
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        41,
        40,
        1,
    )
    assert done.output_file_id is not None
    assert done.error_file_id is not None
    # Over 4 MiB: a 307 to a presigned GET, which the SDK follows.
    output = client.files.content(done.output_file_id).content
    assert len(output) > 8_000_000
    answers = {line["custom_id"]: line for line in map(json.loads, output.splitlines())}
    assert sorted(answers) == sorted(f"big-{i}" for i in range(40))
    content = answers["big-7"]["response"]["body"]["choices"][0]["message"]["content"]
    assert content == reply_text(lines[7]["body"]["messages"][0]["content"], 200_000)  # type: ignore[index]
    [refused] = [json.loads(line) for line in client.files.content(done.error_file_id).text.splitlines()]
    assert refused["error"]["message"] == "line 41: not JSON"


def test_an_upload_s_parts_must_add_up_and_an_ended_upload_takes_no_more(client: OpenAI) -> None:
    upload = client.uploads.create(
        bytes=10, filename="x.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    part = client.uploads.parts.create(upload_id=upload.id, data=b'{"a": 1}\n')
    with pytest.raises(openai.BadRequestError) as short:
        client.uploads.complete(upload_id=upload.id, part_ids=[part.id])
    assert "9 bytes" in short.value.message
    with pytest.raises(openai.BadRequestError):
        client.uploads.complete(upload_id=upload.id, part_ids=[part.id, "part_nope"])
    assert client.uploads.cancel(upload.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):
        client.uploads.parts.create(upload_id=upload.id, data=b"{}")
    with pytest.raises(openai.BadRequestError):
        client.uploads.create(bytes=10, filename="x.jsonl", mime_type="text/plain", purpose="fine-tune")


def test_batch_api_refusals_are_the_sdks_exceptions(client: OpenAI, fresh_mock: RunningStack) -> None:
    with pytest.raises(openai.BadRequestError) as no_file:
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert no_file.value.param == "input_file_id"
    uploaded = client.files.create(file=("one.jsonl", jsonl([chat_line("a", "b")])), purpose="batch")
    with pytest.raises(openai.BadRequestError) as endpoint:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")  # type: ignore[arg-type]
    assert endpoint.value.param == "endpoint"
    with pytest.raises(openai.BadRequestError) as purpose:
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    assert purpose.value.param == "purpose"
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_0123456789abcdef0123456789abcdef")
    other_key = fresh_mock.cli("keys", "create", "--tenant", "file-snoop").strip()
    other = OpenAI(base_url=fresh_mock.api + "/v1", api_key=other_key, max_retries=0)
    with other, pytest.raises(openai.NotFoundError):
        other.files.content(uploaded.id)


def test_a_response_with_a_webhook_url_gets_openais_event_which_the_sdk_verifies(
    client: OpenAI, fresh_mock: RunningStack, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    with fresh_mock.client() as native:
        secret = native.get("/webhooks/secret").json()["key"]

    created = client.responses.create(
        model="gpt-test", input="notify me", background=True, extra_body={"webhook_url": url}
    )
    [delivery] = hook.wait_for(1)

    event = client.webhooks.unwrap(delivery.body, delivery.headers, secret=secret)
    assert isinstance(event, ResponseCompletedWebhookEvent)
    assert event.type == "response.completed"
    assert event.data.id == created.id
    with pytest.raises(openai.InvalidWebhookSignatureError):
        client.webhooks.unwrap(delivery.body, delivery.headers, secret="whsec_" + "A" * 32)


def test_the_same_idempotency_key_gives_the_same_response_not_a_second_call(
    client: OpenAI, fresh_mock: RunningStack
) -> None:
    key = {"Idempotency-Key": "report-2026-11-30"}
    first = client.responses.create(model="gpt-test", input="once", background=True, extra_headers=key)
    again = client.responses.create(model="gpt-test", input="once", background=True, extra_headers=key)

    assert again.id == first.id
    ended(client, first)
    assert fresh_mock.mock_stats()["calls"] == 1


def test_a_batch_with_a_webhook_url_gets_openais_batch_completed_which_the_sdk_verifies(
    client: OpenAI, fresh_mock: RunningStack, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    with fresh_mock.client() as native:
        secret = native.get("/webhooks/secret").json()["key"]
    uploaded = client.files.create(
        file=("two.jsonl", jsonl([chat_line("a", "1"), chat_line("b", "2")])), purpose="batch"
    )

    created = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"webhook_url": url},
    )
    [delivery] = hook.wait_for(1, timeout_s=HANG_S)

    event = client.webhooks.unwrap(delivery.body, delivery.headers, secret=secret)
    assert isinstance(event, BatchCompletedWebhookEvent)
    assert event.data.id == created.id
    # It ended once its files were written: whoever is told it ended finds them
    ended = client.batches.retrieve(created.id)
    assert ended.status == "completed"
    assert ended.output_file_id is not None


def test_a_response_streams_to_the_sdk_and_resumes_from_any_event(
    client: OpenAI, fresh_mock: RunningStack
) -> None:
    fresh_mock.configure_mock(latency_s=4, reply_chars=300)
    spec = importlib.util.spec_from_file_location("openai_stream", ROOT / "examples/openai_stream.py")
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    # The example's loop: create(stream=True), then retrieve(stream=True, starting_after=...) per segment
    events = list(example.stream_response(client, model="gpt-test", input="stream it"))
    whole = reply_text("stream it", 300)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2  # a 4 s call writes its text every 2 s
    assert "".join(deltas) == whole == events[-1].response.output_text
    # Read again later from an old event: the same events after it
    again = list(client.responses.retrieve(events[0].response.id, stream=True, starting_after=2))
    assert [(e.sequence_number, e.type) for e in again] == [(e.sequence_number, e.type) for e in events[3:]]


# --- the whole request: structured outputs, tools, images ---------------------------------------


class Label(BaseModel):
    """What a document is: the SDK makes the strict JSON schema of it."""

    kind: Literal["invoice", "contract", "letter"]
    confidence: float


LOOKUP = {
    "type": "function",
    "name": "lookup_customer",
    "description": "Find a customer by name",
    "parameters": {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
        "additionalProperties": False,
    },
    "strict": True,
}
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJ"
    "RU5ErkJggg=="
)


def test_responses_parse_with_a_pydantic_model_gives_text_the_model_validates(
    client: OpenAI, fresh_mock: RunningStack
) -> None:
    created = client.responses.parse(
        model="gpt-test",
        input="Which kind of document is this? It is an invoice for March.",
        text_format=Label,
        reasoning={"effort": "low"},
        background=True,
    )

    done = ended(client, created)
    assert done.status == "completed"
    label = Label.model_validate_json(done.output_text)
    assert label.kind == "invoice"  # the mock takes the enum value the text names first
    assert done.text is not None
    assert done.text.format is not None
    assert done.text.format.type == "json_schema"
    assert done.usage is not None
    assert done.usage.output_tokens_details.reasoning_tokens > 0
    assert fresh_mock.mock_stats()["structured"] == 1


def test_a_response_with_tools_required_ends_with_function_call_items(client: OpenAI) -> None:
    created = client.responses.create(
        model="gpt-test",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Who is Ada?"}]}],
        tools=[LOOKUP],  # type: ignore[list-item]
        tool_choice="required",
        background=True,
    )

    # The run waits for the call's output: a response that completed with the call to answer
    done = ended(client, created)
    assert done.status == "completed"
    calls = [item for item in done.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["lookup_customer"]
    assert calls[0].status == "completed"
    assert isinstance(json.loads(calls[0].arguments)["name"], str)
    assert done.tool_choice == "required"
    # The history sent back with the call's output, without previous_response_id, is a new
    # response answered from it
    again = client.responses.create(
        model="gpt-test",
        input=[
            {"role": "user", "content": "Who is Ada?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": calls[0].name,
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Ada Lovelace, id 7"},
        ],
        tools=[LOOKUP],  # type: ignore[list-item]
        background=True,
    )
    answered = ended(client, again)
    assert answered.status == "completed"
    assert "Ada Lovelace, id 7" in answered.output_text


def function_output(call_id: str, output: str) -> dict[str, str]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def test_a_client_function_is_answered_with_previous_response_id_and_the_run_goes_on(
    client: OpenAI,
) -> None:
    # Given a response whose model calls a function the client runs
    created = client.responses.create(
        model="gpt-test",
        input="Who is Ada? [mock:call-tools]",
        tools=[LOOKUP],
        background=True,  # type: ignore[list-item]
    )

    # When it is polled as OpenAI's SDK users do, it completes with the call to answer
    waiting = ended(client, created)
    assert waiting.status == "completed"
    [call] = waiting.output
    assert call.type == "function_call"
    assert (call.name, call.status) == ("lookup_customer", "completed")
    assert waiting.output_text == ""

    # And the call's output sent with previous_response_id sets the same run going again
    answer = client.responses.create(
        model="gpt-test",
        previous_response_id=waiting.id,
        input=[function_output(call.call_id, "Ada Lovelace, id 7")],  # type: ignore[list-item]
        tools=[LOOKUP],  # type: ignore[list-item]
        background=True,
    )
    assert answer.id == waiting.id
    assert answer.status == "in_progress"

    # Then it answers from the output
    done = ended(client, answer)
    assert done.status == "completed"
    assert "Ada Lovelace, id 7" in done.output_text
    assert [item.type for item in done.output] == ["message"]

    # And a completed response continues as a conversation: a new response with its history
    followed = client.responses.create(
        model="gpt-test", previous_response_id=done.id, input="And her father?", background=True
    )
    assert followed.id != done.id
    again = ended(client, followed)
    fresh = ended(client, client.responses.create(model="gpt-test", input="And her father?", background=True))
    assert again.output_text == fresh.output_text == reply_text("And her father?")
    assert again.usage is not None
    assert fresh.usage is not None
    assert again.usage.input_tokens > fresh.usage.input_tokens  # the history went with it


def test_a_continuation_that_cannot_be_served_is_the_sdk_s_error_saying_why(client: OpenAI) -> None:
    waiting = ended(
        client,
        client.responses.create(
            model="gpt-test",
            input="Who is Ada? [mock:call-tools]",
            tools=[LOOKUP],
            background=True,  # type: ignore[list-item]
        ),
    )
    [call] = waiting.output
    assert call.type == "function_call"

    # An id that names no response of this tenant
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(
            model="gpt-test",
            previous_response_id="resp_" + "0" * 32,
            input=[function_output(call.call_id, "x")],  # type: ignore[list-item]
            background=True,
        )
    assert unknown.value.param == "previous_response_id"
    # Outputs that do not answer exactly the calls it waits for, or a message beside them
    for wrong in (
        [function_output("call_other", "x")],
        [function_output(call.call_id, "x"), function_output("call_other", "y")],
        [function_output(call.call_id, "x"), {"role": "user", "content": "and?"}],
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(
                model="gpt-test",
                previous_response_id=waiting.id,
                input=wrong,  # type: ignore[arg-type]
                background=True,
            )
        assert refused.value.param is not None
        assert refused.value.param.startswith("input")
    assert client.responses.retrieve(waiting.id).status == "completed"  # still waiting

    # A cancelled response is not continued
    running = client.responses.create(
        model="gpt-test",
        input="Who is Ada? [mock:call-tools]",
        tools=[LOOKUP],
        background=True,  # type: ignore[list-item]
    )
    assert client.responses.cancel(running.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError) as cancelled:
        client.responses.create(
            model="gpt-test", previous_response_id=running.id, input="go on", background=True
        )
    assert cancelled.value.param == "previous_response_id"
    assert "cancelled" in cancelled.value.message

    # Answered once, the same answer again (a retry whose reply was lost) is the same response;
    # another answer to the call is refused: the conversation has no open call
    answer = [function_output(call.call_id, "Ada Lovelace")]
    first = client.responses.create(
        model="gpt-test",
        previous_response_id=waiting.id,
        input=answer,
        background=True,  # type: ignore[arg-type]
    )
    again = client.responses.create(
        model="gpt-test",
        previous_response_id=waiting.id,
        input=answer,
        background=True,  # type: ignore[arg-type]
    )
    assert again.id == first.id == waiting.id
    assert ended(client, waiting).status == "completed"
    with pytest.raises(openai.BadRequestError) as answered:
        client.responses.create(
            model="gpt-test",
            previous_response_id=waiting.id,
            input=[function_output(call.call_id, "Grace Hopper")],  # type: ignore[list-item]
            background=True,
        )
    assert answered.value.param == "input"


def test_a_run_s_stream_gives_its_function_call_then_goes_on_after_the_output(client: OpenAI) -> None:
    # Given a streamed response whose model calls a client function
    first = list(
        client.responses.create(
            model="gpt-test",
            input="Who is Ada? [mock:call-tools]",
            tools=[LOOKUP],  # type: ignore[list-item]
            background=True,
            stream=True,
        )
    )
    # (a segment may end before the call: read on as examples/openai_stream.py does)
    while first[-1].type not in ("response.completed", "response.failed", "response.incomplete"):
        first += list(
            client.responses.retrieve(
                first[0].response.id, stream=True, starting_after=first[-1].sequence_number
            )
        )

    # Then its events are OpenAI's for a function call, ending with the completed response
    assert [e.sequence_number for e in first] == list(range(len(first)))
    assert [e.type for e in first] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    call = first[-2].item
    assert call.type == "function_call"
    assert first[3].delta == call.arguments
    assert [item.type for item in first[-1].response.output] == ["function_call"]

    # When the output goes back streamed, the events go on from there to the answer
    rest = list(
        client.responses.create(
            model="gpt-test",
            previous_response_id=first[0].response.id,
            input=[function_output(call.call_id, "Ada Lovelace, id 7")],  # type: ignore[list-item]
            background=True,
            stream=True,
        )
    )
    while rest[-1].type not in ("response.completed", "response.failed", "response.incomplete"):
        rest += list(
            client.responses.retrieve(
                first[0].response.id, stream=True, starting_after=rest[-1].sequence_number
            )
        )
    assert [e.sequence_number for e in rest] == list(range(len(first), len(first) + len(rest)))
    assert rest[0].type == "response.in_progress"
    assert rest[-1].type == "response.completed"
    assert "Ada Lovelace, id 7" in rest[-1].response.output_text
    deltas = [e.delta for e in rest if e.type == "response.output_text.delta"]
    assert "".join(deltas) == rest[-1].response.output_text
    # And read again from the start, the whole run's events are the same ones
    whole = list(client.responses.retrieve(first[0].response.id, stream=True))
    assert [(e.sequence_number, e.type) for e in whole] == [(e.sequence_number, e.type) for e in first + rest]


def test_a_response_with_an_mcp_server_gives_its_lists_and_calls_as_mcp_items_and_events(
    client: OpenAI,
) -> None:
    # Given a response whose model calls two tools of an MCP server (on 127.0.0.1), unapproved
    with serving(free_port()) as docs:
        server = {
            "type": "mcp",
            "server_label": "docs",
            "server_url": docs,
            "allowed_tools": ["read_document", "list_documents"],
            "require_approval": "never",
        }
        created = client.responses.create(
            model="gpt-test", input="Research [mock:agent-steps=2]", background=True, tools=[server]
        )
        done = ended(client, created)
    events = list(client.responses.retrieve(created.id, stream=True))

    # Then the response lists the server's tools, then its two calls, before its answer
    assert done.status == "completed", done.error
    assert [item.type for item in done.output] == ["mcp_list_tools", "mcp_call", "mcp_call", "message"]
    listed, first, second, _ = done.output
    assert listed.type == "mcp_list_tools"
    assert [tool.name for tool in listed.tools] == ["read_document", "list_documents"]
    assert first.type == second.type == "mcp_call"
    assert (first.server_label, first.name, first.status) == ("docs", "read_document", "failed")
    assert (second.name, second.status) == ("list_documents", "completed")
    assert second.output is not None
    assert "webhooks: Signed webhooks" in second.output
    assert "webhooks: Signed webhooks" in done.output_text
    assert done.tools[0].type == "mcp"
    # And its stream gives the same items' events, numbered in order, then the response
    kinds = [event.type for event in events]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    for kind in (
        "response.mcp_list_tools.completed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call.failed",
        "response.mcp_call.completed",
    ):
        assert kind in kinds
    assert kinds[-1] == "response.completed"
    assert events[-1].response.output == done.output


def test_a_batch_of_chat_completions_with_a_schema_an_image_and_tools_parses_as_the_sdk_s(
    client: OpenAI, fresh_mock: RunningStack
) -> None:
    schema = {"name": "Label", "schema": Label.model_json_schema(), "strict": False}
    tool = {"type": "function", "function": {k: LOOKUP[k] for k in ("name", "description", "parameters")}}

    def line(custom_id: str, text: str) -> dict[str, object]:
        content = [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
        ]
        body = {
            "model": "gpt-test",
            "messages": [{"role": "developer", "content": "Label it."}, {"role": "user", "content": content}],
            "response_format": {"type": "json_schema", "json_schema": schema},
            "tools": [tool],
            "max_completion_tokens": 300,
            "seed": 1,
        }
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}

    uploaded = client.files.create(
        file=("typed.jsonl", jsonl([line("a", "a contract"), line("b", "a letter")])), purpose="batch"
    )
    done = batch_ended(
        client,
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    )

    assert done.status == "completed"
    assert done.output_file_id is not None
    lines = [json.loads(text) for text in client.files.content(done.output_file_id).text.splitlines()]
    answers = {line["custom_id"]: ChatCompletion.model_validate(line["response"]["body"]) for line in lines}
    kinds = {
        key: Label.model_validate_json(answer.choices[0].message.content or "").kind
        for key, answer in answers.items()
    }
    assert kinds == {"a": "contract", "b": "letter"}
    for answer in answers.values():
        assert answer.choices[0].finish_reason == "stop"
        assert answer.usage is not None
        assert answer.usage.completion_tokens_details is not None
        assert answer.usage.prompt_tokens_details is not None
    stats = fresh_mock.mock_stats()
    assert (stats["images"], stats["structured"]) == (2, 2)
