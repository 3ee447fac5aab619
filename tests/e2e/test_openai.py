"""The official `openai` SDK, unchanged, against the local stack: background responses created,
retrieved to completion and cancelled, and every refusal raised as the SDK's own exception."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response

from llmtasks.llm.mock import reply_text
from tests.e2e.conftest import RunningStack
from tests.helpers import eventually

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
        timeout_s=60,
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
        fresh_mock.mock_stats, lambda stats: stats["in_flight"] == 1, timeout_s=30, what="the call running"
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


def test_a_bad_key_is_the_sdks_authentication_error(fresh_mock: RunningStack) -> None:
    sdk = OpenAI(base_url=fresh_mock.api + "/v1", api_key="lt_nope_nope", max_retries=0)
    with sdk, pytest.raises(openai.AuthenticationError) as refused:
        sdk.responses.retrieve("resp_0123456789abcdef0123456789abcdef")

    assert refused.value.status_code == 401
    assert refused.value.code == "invalid_api_key"
