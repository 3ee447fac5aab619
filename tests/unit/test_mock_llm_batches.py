"""The mock LLM as OpenAI's Files and Batches APIs, over real HTTP on 127.0.0.1 and through the
official openai SDK: a batch validated, run and finished on the mock's clock with its counts
moving; its output and error files in OpenAI's line shapes; a share of failed lines; OpenAI's
validation errors and per-job limits; cancel, expiry, listing; the batch.* webhooks."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types import Batch
from openai.types.webhooks import BatchCompletedWebhookEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmtasks_local.mock_llm import MockConfig, MockLLM, reply_text
from tests.helpers import HANG_S, serve

pytestmark = pytest.mark.unit

SECRET = "whsec_" + base64.b64encode(b"mock-batch-webhook-secret-012345").decode()
CHAT = "/v1/chat/completions"
ENDED = ("completed", "failed", "expired", "cancelled")


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[MockLLM, str]]:
    mock = MockLLM()
    with serve(mock.app()) as url:
        yield mock, url + "/v1"


@pytest.fixture(autouse=True)
def mock(server: tuple[MockLLM, str]) -> MockLLM:
    """The module's mock with quick batches and zeroed counters, for every test."""
    server[0].configure(MockConfig(batch_delay_s=0.5, seed=7), reseed=True)
    server[0].reset_stats()
    return server[0]


@pytest.fixture
def client(server: tuple[MockLLM, str]) -> OpenAI:
    return OpenAI(base_url=server[1], api_key="sk-mock", max_retries=0)


def knobs(mock: MockLLM, **changes: Any) -> None:
    mock.configure(MockConfig.model_validate({**mock.config.model_dump(), **changes}), reseed=True)


def line(custom_id: str, content: str, *, model: str = "gpt-4o-mini", url: str = CHAT) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(lines: list[Any]) -> bytes:
    return b"".join(
        (json.dumps(x) if not isinstance(x, bytes) else x.decode()).encode() + b"\n" for x in lines
    )


def create(client: OpenAI, data: bytes, endpoint: Any = CHAT, **extra: Any) -> Batch:
    uploaded = client.files.create(file=("input.jsonl", data), purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h", **extra
    )


def ended(client: OpenAI, batch_id: str, seen: list[Batch] | None = None) -> Batch:
    """The batch polled until it ends; every look kept in `seen`."""
    give_up = time.monotonic() + HANG_S
    while True:
        batch = client.batches.retrieve(batch_id)
        if seen is not None:
            seen.append(batch)
        if batch.status in ENDED:
            return batch
        assert time.monotonic() < give_up, "the batch never ended"
        time.sleep(0.02)


def lines_of(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    return [] if file_id is None else [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


# --- a batch from create to results ----------------------------------------------------------------


def test_a_batch_is_validated_run_and_completed_with_its_counts_moving(client: OpenAI, mock: MockLLM) -> None:
    prompts = [f"question {i}" for i in range(40)]
    created = create(client, jsonl([line(f"q{i}", p) for i, p in enumerate(prompts)]), metadata={"job": "j1"})
    assert (created.status, created.request_counts and created.request_counts.total) == ("validating", 0)

    looks: list[Batch] = []
    batch = ended(client, created.id, looks)

    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        40,
        40,
        0,
    )
    statuses = [look.status for look in looks]
    assert statuses.index("in_progress") < statuses.index("completed")
    moving = {
        look.request_counts.completed
        for look in looks
        if look.status == "in_progress" and look.request_counts
    }
    assert any(0 < done < 40 for done in moving), "request_counts never moved between 0 and the total"
    assert batch.in_progress_at
    assert batch.completed_at
    assert batch.finalizing_at
    assert (batch.metadata, batch.model, batch.error_file_id) == ({"job": "j1"}, "gpt-4o-mini", None)
    output = lines_of(client, batch.output_file_id)
    assert [x["custom_id"] for x in output] == [f"q{i}" for i in range(40)]
    first = output[0]
    assert first["error"] is None
    assert first["id"].startswith("batch_req_")
    assert first["response"]["status_code"] == 200
    assert first["response"]["body"]["object"] == "chat.completion"
    assert first["response"]["body"]["choices"][0]["message"]["content"] == reply_text("question 0")
    assert batch.usage is not None
    assert batch.usage.input_tokens == sum(x["response"]["body"]["usage"]["prompt_tokens"] for x in output)
    assert client.files.retrieve(batch.output_file_id or "").purpose == "batch_output"
    assert (mock.stats.batches_created, mock.stats.batch_lines_run, mock.stats.files_uploaded) == (1, 40, 1)
    assert mock.stats.batches_ended == {"completed": 1}


def test_each_line_is_answered_as_the_chat_endpoint_answers_it_mock_tags_included(client: OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    data = jsonl(
        [
            line("plain", "hello"),
            line("refused", "hello [mock:refuse]"),
            {
                **line("tools", "hello [mock:call-tools]"),
                "body": {**line("t", "x [mock:call-tools]")["body"], "tools": tools},
            },
        ]
    )
    batch = ended(client, create(client, data).id)

    answers = {
        x["custom_id"]: x["response"]["body"]["choices"][0] for x in lines_of(client, batch.output_file_id)
    }
    assert answers["plain"]["message"]["content"] == reply_text("hello")
    assert answers["refused"]["message"]["refusal"]
    assert answers["refused"]["message"]["content"] is None
    assert answers["tools"]["finish_reason"] == "tool_calls"
    assert answers["tools"]["message"]["tool_calls"][0]["function"]["name"] == "lookup"


def test_a_batch_of_the_responses_endpoint_answers_response_objects(client: OpenAI) -> None:
    body = {"model": "gpt-4o-mini", "input": "hi there"}
    data = jsonl([{"custom_id": "r1", "method": "POST", "url": "/v1/responses", "body": body}])
    batch = ended(client, create(client, data, endpoint="/v1/responses").id)

    [answer] = lines_of(client, batch.output_file_id)
    assert answer["response"]["body"]["object"] == "response"
    assert answer["response"]["body"]["status"] == "completed"
    assert answer["response"]["body"]["output"][0]["content"][0]["text"] == reply_text("hi there")


# --- failures ---------------------------------------------------------------------------------------


def test_a_share_of_failed_lines_goes_to_the_error_file_as_500s(client: OpenAI, mock: MockLLM) -> None:
    knobs(mock, rate_batch_fail=0.3)
    batch = ended(client, create(client, jsonl([line(f"q{i}", f"p {i}") for i in range(100)])).id)

    assert batch.status == "completed"
    assert batch.request_counts is not None
    output, errors = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
    assert batch.request_counts.failed == len(errors) == mock.stats.batch_lines_failed
    assert 10 <= len(errors) <= 50  # about 30 of 100
    assert batch.request_counts.completed == len(output) == 100 - len(errors)
    assert {x["custom_id"] for x in output} | {x["custom_id"] for x in errors} == {
        f"q{i}" for i in range(100)
    }
    failed = errors[0]
    assert failed["error"] is None
    assert failed["response"]["status_code"] == 500
    assert failed["response"]["body"]["error"]["type"] == "server_error"


def test_a_marked_line_fails_and_a_line_openai_would_refuse_is_a_400(client: OpenAI) -> None:
    refused = line("bad", "x")
    refused["body"]["temperature_x"] = 1
    batch = ended(
        client, create(client, jsonl([line("ok", "fine"), line("boom", "x [mock:batch-fail]"), refused])).id
    )

    errors = {x["custom_id"]: x["response"] for x in lines_of(client, batch.error_file_id)}
    assert errors["boom"]["status_code"] == 500
    assert errors["bad"]["status_code"] == 400
    assert "temperature_x" in errors["bad"]["body"]["error"]["message"]
    assert [x["custom_id"] for x in lines_of(client, batch.output_file_id)] == ["ok"]


@pytest.mark.parametrize(
    ("lines", "code", "line_no"),
    [
        ([line("a", "x"), line("a", "y")], "duplicate_custom_id", 2),
        ([line("a", "x"), b"{not json"], "invalid_json_line", 2),
        ([line("a", "x"), line("b", "y", model="gpt-4o")], "model_mismatch", 2),
        ([line("a", "x", url="/v1/embeddings")], "url_mismatch", 1),
        ([{"method": "POST", "url": CHAT, "body": {"model": "m"}}], "missing_required_parameter", 1),
    ],
)
def test_a_bad_input_file_fails_the_batch_with_openai_s_error_and_line(
    client: OpenAI, mock: MockLLM, lines: list[Any], code: str, line_no: int
) -> None:
    batch = ended(client, create(client, jsonl(lines)).id)

    assert batch.status == "failed"
    assert batch.failed_at
    assert batch.errors is not None
    assert batch.errors.data
    assert (batch.errors.data[0].code, batch.errors.data[0].line) == (code, line_no)
    assert (batch.output_file_id, batch.error_file_id) == (None, None)
    assert mock.stats.batch_lines_run == 0


def test_an_empty_file_fails_the_batch(client: OpenAI) -> None:
    batch = ended(client, create(client, b"\n").id)
    assert batch.status == "failed"
    assert batch.errors
    assert batch.errors.data
    assert batch.errors.data[0].code == "empty_file"


def test_openai_s_per_job_limits_hold(client: OpenAI, mock: MockLLM) -> None:
    knobs(mock, batch_max_requests=3, batch_max_bytes=1000)
    batch = ended(client, create(client, jsonl([line(f"q{i}", "x") for i in range(4)])).id)
    assert batch.status == "failed"
    assert batch.errors
    assert batch.errors.data
    assert batch.errors.data[0].code == "too_many_tasks"

    with pytest.raises(openai.BadRequestError, match="too large"):
        client.files.create(file=("input.jsonl", b"x" * 1001), purpose="batch")
    assert (
        ended(client, create(client, jsonl([line(f"q{i}", "x") for i in range(3)])).id).status == "completed"
    )


def test_a_create_openai_would_refuse_is_a_400(client: OpenAI) -> None:
    uploaded = client.files.create(file=("input.jsonl", jsonl([line("a", "x")])), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="embeddings"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="No such File"):
        client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="jsonl"):
        client.files.create(file=("notes.txt", b"{}"), purpose="batch")


# --- cancel and expiry ------------------------------------------------------------------------------


def test_a_cancelled_batch_keeps_the_lines_it_ran_and_no_others(client: OpenAI, mock: MockLLM) -> None:
    knobs(mock, batch_delay_s=4.0)
    created = create(client, jsonl([line(f"q{i}", "x") for i in range(200)]))
    give_up = time.monotonic() + HANG_S
    while (counts := client.batches.retrieve(created.id).request_counts) is None or counts.completed < 5:
        assert time.monotonic() < give_up
        time.sleep(0.02)

    cancelling = client.batches.cancel(created.id)
    batch = ended(client, created.id)

    assert cancelling.status == "cancelling"
    assert cancelling.cancelling_at
    assert batch.status == "cancelled"
    assert batch.cancelled_at
    assert batch.request_counts
    ran = lines_of(client, batch.output_file_id)
    assert 5 <= len(ran) == batch.request_counts.completed < 200
    assert batch.error_file_id is None  # the lines not run are in neither file
    assert batch.request_counts.total == 200
    assert mock.stats.batches_ended == {"cancelled": 1}
    # Cancelled again: answered as it is; an ended batch cannot be cancelled
    assert client.batches.cancel(created.id).status == "cancelled"
    done = ended(client, create(client, jsonl([line("a", "x")])).id)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(done.id)


def test_an_expired_batch_writes_its_lines_not_run_as_batch_expired(client: OpenAI, mock: MockLLM) -> None:
    knobs(mock, batch_delay_s=4.0, batch_expire_s=1.0)
    batch = ended(client, create(client, jsonl([line(f"q{i}", "x") for i in range(100)])).id)

    assert batch.status == "expired"
    assert batch.expired_at
    assert batch.request_counts
    ran, expired = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
    assert 0 < len(ran) < 100
    assert len(ran) + len(expired) == 100
    assert [x["custom_id"] for x in ran + expired] == [f"q{i}" for i in range(100)]
    assert {x["error"]["code"] for x in expired} == {"batch_expired"}
    assert all(x["response"] is None for x in expired)
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(ran), len(expired))
    assert mock.stats.batch_lines_run == len(ran)


# --- listing and files ------------------------------------------------------------------------------


def test_batches_are_listed_newest_first_a_page_at_a_time(client: OpenAI) -> None:
    data = jsonl([line("a", "x")])
    first, second, third = (create(client, data) for _ in range(3))

    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == [third.id, second.id]
    assert page.has_more
    ids = [b.id for b in client.batches.list(limit=2)]  # the SDK's pager follows `after`
    assert ids[:3] == [third.id, second.id, first.id]
    assert {ended(client, b.id).status for b in (first, second, third)} == {"completed"}


def test_files_are_kept_read_and_deleted(client: OpenAI) -> None:
    data = jsonl([line("a", "x")])
    uploaded = client.files.create(file=("mine.jsonl", data), purpose="batch")

    assert (uploaded.bytes, uploaded.filename, uploaded.purpose) == (len(data), "mine.jsonl", "batch")
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert client.files.content(uploaded.id).content == data
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")


# --- webhooks ---------------------------------------------------------------------------------------


class Receiver:
    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, dict[str, str]]] = []
        self.arrived = threading.Condition()

    async def receive(self, request: Request) -> Response:
        body = await request.body()
        with self.arrived:
            self.deliveries.append((body, dict(request.headers)))
            self.arrived.notify_all()
        return Response(status_code=200)

    def events_about(self, batch_id: str, count: int) -> list[tuple[bytes, dict[str, str]]]:
        """The deliveries that name `batch_id`, once `count` have come (batches of earlier tests
        may end while this one runs)."""

        def about() -> list[tuple[bytes, dict[str, str]]]:
            return [d for d in self.deliveries if json.loads(d[0])["data"]["id"] == batch_id]

        with self.arrived:
            assert self.arrived.wait_for(lambda: len(about()) >= count, timeout=HANG_S)
            return about()


def test_the_end_of_a_batch_is_posted_as_openai_s_signed_batch_event(client: OpenAI, mock: MockLLM) -> None:
    receiver = Receiver()
    with serve(Starlette(routes=[Route("/hook", receiver.receive, methods=["POST"])])) as url:
        knobs(mock, webhook_url=url + "/hook", webhook_secret=SECRET, webhook_retry_s=0.0)
        created = create(client, jsonl([line("a", "x")]))
        [(body, headers)] = receiver.events_about(created.id, 1)
        time.sleep(0.2)  # a second event would have come by now
        assert len(receiver.events_about(created.id, 1)) == 1

    event = client.webhooks.unwrap(body, headers, secret=SECRET)
    assert isinstance(event, BatchCompletedWebhookEvent)
    assert event.data.id == created.id
    assert client.batches.retrieve(created.id).status == "completed"
