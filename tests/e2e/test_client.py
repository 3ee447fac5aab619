"""The SDK (`llmtasks_client.Client`, `llmtasks_client.AsyncClient`) and the CLI against the local stack."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import llmtasks_client
from llmtasks_local.mock_llm import reply_text
from tests.e2e.conftest import RunningStack
from tests.helpers import HANG_S, WebhookReceiver, serve

pytestmark = pytest.mark.e2e


@dataclass
class FlakyProxy:
    """Forwards to the stack, but first answers 503 to `fail_reads` GETs and loses the reply of
    `lose_submits` POST /tasks after forwarding them (the task exists; the client hears 502)."""

    upstream: str
    fail_reads: int = 0
    lose_submits: int = 0
    seen: list[str] = field(default_factory=list)

    async def forward(self, request: Request) -> Response:
        self.seen.append(f"{request.method} {request.url.path}")
        if request.method == "GET" and self.fail_reads > 0:
            self.fail_reads -= 1
            return Response('{"message": "Service Unavailable"}', 503, media_type="application/json")
        async with httpx.AsyncClient(base_url=self.upstream, timeout=30) as client:
            upstream = await client.request(
                request.method,
                request.url.path,
                params=request.query_params,
                headers={k: v for k, v in request.headers.items() if k != "host"},
                content=await request.body(),
            )
        if request.method == "POST" and request.url.path == "/tasks" and self.lose_submits > 0:
            self.lose_submits -= 1
            return Response('{"message": "Bad Gateway"}', 502, media_type="application/json")
        return Response(
            upstream.content, upstream.status_code, media_type=upstream.headers.get("content-type")
        )

    def app(self) -> Starlette:
        methods = ["GET", "POST"]
        return Starlette(routes=[Route("/{path:path}", self.forward, methods=methods)])


@pytest.fixture
def proxy(fresh_mock: RunningStack) -> Iterator[tuple[FlakyProxy, str]]:
    flaky = FlakyProxy(fresh_mock.api)
    with serve(flaky.app()) as url:
        yield flaky, url


def test_submit_and_wait_sync_and_async(fresh_mock: RunningStack) -> None:
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        task = client.wait(client.submit("sync hello").task_id, timeout=HANG_S)
    assert task.result == reply_text("sync hello")

    async def run() -> llmtasks_client.TaskView:
        async with llmtasks_client.AsyncClient(fresh_mock.api, fresh_mock.api_key) as client:
            submitted = await client.submit(messages=[{"role": "user", "content": "async hello"}])
            return await client.wait(submitted.task_id, timeout=HANG_S)

    assert asyncio.run(run()).result == reply_text("async hello")


def test_a_failed_task_raises_with_its_error_code(fresh_mock: RunningStack) -> None:
    fresh_mock.configure_mock(rate_500=1.0)
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        submitted = client.submit("always 500", max_retries=0)
        with pytest.raises(llmtasks_client.TaskFailedError) as failed:
            client.wait(submitted.task_id, timeout=HANG_S)
        with pytest.raises(llmtasks_client.ProblemError) as problem:
            client.get("0" * 32)
    assert failed.value.error_code == "llm_http_500"
    assert (problem.value.status, problem.value.title) == (404, "Task not found")


def test_api_gateway_s_own_refusals_are_the_same_clear_sdk_error(fresh_mock: RunningStack) -> None:
    refusals = {}
    for key in (None, "lt_0123456789ab_notthesecret"):
        with (
            llmtasks_client.Client(fresh_mock.api, key) as client,
            pytest.raises(llmtasks_client.ProblemError) as refused,
        ):
            client.submit("refused at the edge")
        refusals[key] = refused.value
    missing, denied = refusals[None], refusals["lt_0123456789ab_notthesecret"]
    assert (missing.status, missing.title) == (401, "Unauthorized")
    assert "no API key was sent" in missing.detail
    assert (denied.status, denied.title) == (403, "Forbidden")
    assert "not valid, or was revoked" in denied.detail


def test_wait_survives_two_503s_on_reads(fresh_mock: RunningStack, proxy: tuple[FlakyProxy, str]) -> None:
    flaky, url = proxy
    with llmtasks_client.Client(url, fresh_mock.api_key) as client:
        submitted = client.submit("through a flaky proxy")
        flaky.fail_reads = 2
        task = client.wait(submitted.task_id, timeout=HANG_S)
    assert task.status.value == "completed"
    assert flaky.fail_reads == 0


def test_a_submit_whose_reply_is_lost_is_retried_into_the_same_task(
    fresh_mock: RunningStack, proxy: tuple[FlakyProxy, str]
) -> None:
    flaky, url = proxy
    tenant_key = fresh_mock.cli("keys", "create", "--tenant", "lost-reply").strip()
    flaky.lose_submits = 1
    with llmtasks_client.Client(url, tenant_key) as client:
        task = client.submit("exactly once")
        listed = client.list(limit=10).data
    assert flaky.seen.count("POST /tasks") == 2  # the first reply was lost; the retry replayed
    assert [t.task_id for t in listed] == [task.task_id]


def test_verify_webhook_accepts_a_delivery_and_refuses_a_tampered_one(fresh_mock: RunningStack) -> None:
    hook = WebhookReceiver()
    with serve(hook.app()) as receiver, llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        secret = httpx.get(
            f"{fresh_mock.api}/webhooks/secret", headers={"Authorization": f"Bearer {fresh_mock.api_key}"}
        ).json()["key"]
        task = client.submit("hook me", webhook_url=receiver + "/hook")
        [delivery] = hook.wait_for(1)
    event = llmtasks_client.verify_webhook(delivery.body, delivery.headers, secret)
    assert (event.type, event.data.task_id) == ("task.completed", task.task_id)
    with pytest.raises(llmtasks_client.WebhookVerificationError):
        llmtasks_client.verify_webhook(
            delivery.body.replace(b"hook me", b"hook ME"), delivery.headers, secret
        )


def test_the_cli_submits_waits_and_reports_with_exit_codes(fresh_mock: RunningStack) -> None:
    done = fresh_mock.run_cli("submit", "cli hello", "--wait")
    assert (done.returncode, done.stdout) == (0, reply_text("cli hello") + "\n")
    piped = fresh_mock.run_cli("submit", "-", "--wait", "--json", stdin="from stdin")
    assert piped.returncode == 0
    task = llmtasks_client.TaskView.model_validate_json(piped.stdout)
    assert task.result == reply_text("from stdin")
    status = fresh_mock.run_cli("status", task.task_id)
    assert status.stdout.strip() == reply_text("from stdin")
    assert task.task_id in fresh_mock.run_cli("list", "--limit", "5").stdout
    stats = fresh_mock.cli("stats")
    assert "tasks      " in stats
    # Each function's errors and throttles, and the stream consumers' lag, from the endpoint's
    # CloudWatch (the worker's line is there once its invocations' metrics were sent)
    assert re.search(r"^function   BatchFunction +errors=\d+  throttles=0  stream lag=", stats, re.M)
    assert re.search(r"^function   SubmitFunction +errors=0  throttles=0  \(", stats, re.M)
    # A task that fails: exit 1, with its error code; --max-retries 0 fails it at the first 500
    fresh_mock.configure_mock(rate_500=1.0)
    failed = fresh_mock.run_cli("submit", "cli fails", "--wait", "--max-retries", "0")
    assert failed.returncode == 1
    assert "llm_http_5" in failed.stdout
    assert fresh_mock.mock_stats()["outcomes_by_prompt"]["cli fails"] == ["500"]  # one call, no retry
    # A wait that runs out: exit 3; a wrong id: exit 2 with the problem's words
    # (a minute's call: under a loaded CI machine the three CLI processes before the cancel took
    # more than 10 s, and the task had completed)
    fresh_mock.configure_mock(rate_500=0.0, latency_s=60)
    slow = fresh_mock.run_cli("submit", "cli slow").stdout.strip()
    assert fresh_mock.run_cli("wait", slow, "--timeout", "1").returncode == 3
    assert fresh_mock.run_cli("cancel", slow).returncode == 0
    wrong = fresh_mock.run_cli("status", "f" * 32)
    assert wrong.returncode == 2
    assert "Task not found" in wrong.stderr


def test_a_running_task_shows_its_text_as_it_streams_and_the_cli_prints_it_as_it_grows(
    fresh_mock: RunningStack,
) -> None:
    fresh_mock.configure_mock(latency_s=6, reply_chars=300)
    whole = reply_text("stream to me", 300)
    with fresh_mock.client() as client:
        task_id = client.post("/tasks", json={"prompt": "stream to me"}).json()["task_id"]
        partials = []
        while (view := client.get(f"/tasks/{task_id}").json())["status"] != "completed":
            if view.get("partial_result"):
                assert view["status"] == "processing"
                assert view["progress"]["tokens"] > 0
                partials.append(view["partial_result"])
            time.sleep(0.3)
    assert partials  # written every 2 s of a 6 s call
    assert all(whole.startswith(text) for text in partials)
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(partials))
    # Some of it shown before the end (the last write may hold it all, its completion not yet
    # written: an ordering of two writes, not a fault).
    assert any(text != whole for text in partials)
    assert view["result"] == whole
    assert "partial_result" not in view or view["partial_result"] is None
    # The output's chunks, read by the SDK after the end, add up to the result; `wait --after`
    # prints what follows a chunk
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as sdk:
        chunks = list(sdk.stream(task_id))
    assert len(chunks) >= 2
    assert "".join(c.text for c in chunks) == whole
    resumed = fresh_mock.run_cli("wait", task_id, "--after", "1")
    assert (resumed.returncode, resumed.stdout) == (0, whole[len(chunks[0].text) :] + "\n")
    at_the_end = fresh_mock.run_cli("wait", task_id, "--after", str(len(chunks)))
    assert (at_the_end.returncode, at_the_end.stdout) == (0, "")
    # The CLI prints the text as it grows (its first bytes come while it still waits), then the
    # rest: stdout is the whole reply, once.
    fresh_mock.configure_mock(latency_s=6, reply_chars=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"LLMTASKS_API_URL": fresh_mock.api, "LLMTASKS_API_KEY": fresh_mock.api_key or ""}
    cli = subprocess.Popen(
        [sys.executable, "-m", "llmtasks_local.cli", "submit", "cli stream", "--wait"],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert cli.stdout is not None
    first = os.read(cli.stdout.fileno(), 10_000)
    still_waiting = cli.poll() is None
    rest = cli.stdout.read()
    assert cli.wait(timeout=HANG_S) == 0
    assert still_waiting
    assert (first + rest).decode() == reply_text("cli stream", 300) + "\n"
    assert len(first) < len(first + rest) - 1


class Classified(BaseModel):
    kind: Literal["invoice", "contract", "letter"]
    summary: str
    pages: int | None = None


# A one-pixel PNG, and a PDF whose text names its kind (the mock's enum follows a file's bytes).
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
CONTRACT_PDF = b"%PDF-1.4\n1 0 obj << >> endobj\nBT (This contract binds both parties) ET\n%%EOF\n"


def test_a_model_as_response_format_comes_back_as_its_typed_object(fresh_mock: RunningStack) -> None:
    # Given a pydantic model as the response_format of a task through the SDK
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        submitted = client.submit(
            "Classify: this is an invoice for March", response_format=Classified, seed=7, top_p=0.5
        )
        task = client.wait(submitted.task_id, timeout=HANG_S)
    # Then the answer is parsed into the model, and the task shows the whole message
    assert isinstance(task.parsed, Classified)
    assert task.parsed.kind == "invoice"  # the enum value the prompt names
    assert task.parsed == Classified.model_validate_json(task.result or "")
    assert task.finish_reason == "stop"
    assert task.output is not None
    assert task.output.content == task.result
    assert task.usage is not None
    assert task.usage.reasoning_tokens == 0
    stats = fresh_mock.mock_stats()
    assert stats["structured"] == 1
    assert (stats["params"]["seed"], stats["params"]["top_p"]) == (1, 1)


def test_image_and_file_parts_reach_the_model_through_the_sdk_and_the_cli(
    fresh_mock: RunningStack, tmp_path: Path
) -> None:
    # Given an image and a PDF as parts of a user message beside its text (the async client)
    async def run() -> llmtasks_client.TaskView:
        content = [
            "Classify the attached",
            llmtasks_client.image_part(PIXEL, detail="low"),
            llmtasks_client.file_part(CONTRACT_PDF, filename="deal.pdf"),
        ]
        async with llmtasks_client.AsyncClient(fresh_mock.api, fresh_mock.api_key) as client:
            submitted = await client.submit(
                messages=[{"role": "user", "content": content}],
                response_format=Classified,
                reasoning_effort="low",
            )
            return await client.wait(submitted.task_id, timeout=HANG_S)

    task = asyncio.run(run())
    # Then both reached the provider, and the document steered the answer
    stats = fresh_mock.mock_stats()
    assert (stats["images"], stats["files"], stats["file_bytes"]) == (1, 1, len(CONTRACT_PDF))
    assert isinstance(task.parsed, Classified)
    assert task.parsed.kind == "contract"
    assert task.usage is not None
    assert task.usage.reasoning_tokens > 0
    # When the CLI submits the same with --schema, --image and --file
    schema = tmp_path / "document_kind.json"
    schema.write_text(json.dumps(llmtasks_client.strict_json_schema(Classified)))
    (tmp_path / "pixel.png").write_bytes(PIXEL)
    (tmp_path / "letter.txt").write_text("Dear Sir, this letter is about the invoice.")
    done = fresh_mock.run_cli(
        "submit", "Classify the attached", "--wait", "--schema", str(schema),
        "--image", str(tmp_path / "pixel.png"), "--file", str(tmp_path / "letter.txt"),
    )  # fmt: skip
    # Then it prints the parsed object, which the file's words steered
    assert done.returncode == 0, done.stderr
    printed = Classified.model_validate_json(done.stdout)
    assert printed.kind == "letter"
    stats = fresh_mock.mock_stats()
    assert (stats["images"], stats["files"], stats["structured"]) == (2, 2, 2)
    # A schema file that is not JSON stops the CLI before anything is sent
    (tmp_path / "broken.json").write_text("{")
    refused = fresh_mock.run_cli("submit", "x", "--schema", str(tmp_path / "broken.json"))
    assert refused.returncode == 2
    assert "the schema is not JSON" in refused.stderr


def test_upload_file_sends_a_small_and_a_large_file_through_the_files_api(fresh_mock: RunningStack) -> None:
    # (purpose batch: the purpose the stack's Files API keeps on this branch; user_data is the same path)
    small = b'{"prompt": "a"}\n'
    large = small * (llmtasks_client.client.FILE_PART_BYTES // len(small) + 2)
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client, fresh_mock.client() as http:
        for data in (small, large):
            made = client.upload_file(data, purpose="batch", filename="items.jsonl")
            assert (made.bytes, made.filename, made.purpose) == (len(data), "items.jsonl", "batch")
            content = http.get(f"/v1/files/{made.id}/content", follow_redirects=True)
            assert content.content == data
