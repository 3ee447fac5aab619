"""A provider batch on the local stack, end to end: 300 items sent as the mock's OpenAI batch
jobs (a chunk of 100 a job), looked at through delayed messages, with a share of failed lines.
Every poll checks the counts (they add up, finished ones never go down); at the end they are
exact, the results come back in order with their custom_ids, the webhook arrives once, no
on-demand call was made, and a retry runs the failed items as ordinary tasks."""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from llmtasks_local.mock_llm import MockConfig, MockLLM, reply_text
from tests.e2e.conftest import RunningStack, start_stack
from tests.e2e.test_batches import Progress, batch_events, results_of
from tests.helpers import WebhookReceiver, eventually, serve

pytestmark = pytest.mark.e2e

ITEMS = 300


@pytest.fixture(scope="module")
def provider_stack() -> Iterator[RunningStack]:
    stack = start_stack(env={"PROVIDER_BATCH_LOOK_S": "1", "PROVIDER_BATCH_CHUNK_SIZE": "100"})
    try:
        yield stack
    finally:
        stack.stop()


@pytest.mark.timeout(300)
def test_a_provider_batch_completes_with_exact_counts_ordered_results_and_one_webhook(
    provider_stack: RunningStack, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    provider_stack.configure_mock(batch_delay_s=4, rate_batch_fail=0.05)
    items = [{"prompt": f"document {i}", "custom_id": f"doc-{i}"} for i in range(ITEMS)]
    with provider_stack.client() as client:
        secret = client.get("/webhooks/secret").json()["key"]
        reply = client.post("/batches", json={"items": items, "webhook_url": url, "mode": "provider"})
        assert reply.status_code == 202, reply.text
        batch_id = reply.json()["batch_id"]
        final = Progress(client, batch_id, ITEMS).until_ended(timeout_s=240)
        rows = results_of(client, batch_id)
        hook.wait_for(1)
        time.sleep(1)  # a second event, if one were coming, would be here by now
        stats = provider_stack.mock_stats()
        failed = [row["index"] for row in rows if row["status"] == "failed"]
        assert final["status"] == ("completed_with_errors" if failed else "completed")
        assert (final["completed"], final["failed"]) == (ITEMS - len(failed), len(failed))
        assert [row["custom_id"] for row in rows] == [f"doc-{i}" for i in range(ITEMS)]
        assert Counter(row["status"] for row in rows) == {"completed": ITEMS - len(failed)} | (
            {"failed": len(failed)} if failed else {}
        )
        assert all(
            row["result"] == reply_text(f"document {row['index']}")
            for row in rows
            if row["status"] == "completed"
        )
        assert stats["calls"] == 0  # every answer came from the jobs
        assert stats["batches_created"] == ITEMS // 100
        [event] = batch_events(hook, secret)
        assert (event.type, event.data.batch_id) == ("batch.completed", batch_id)
        if failed:
            retried = client.post(f"/batches/{batch_id}/retry")
            assert retried.status_code == 202, retried.text
            # (A retry moves the failed items back to pending: no Progress, whose finished counts
            # never go down.)
            again = eventually(
                lambda: client.get(f"/batches/{batch_id}").json(),
                lambda view: view["status"] in ("completed", "completed_with_errors"),
                timeout_s=120,
                what="the retried batch's end",
            )
            assert (again["status"], again["completed"]) == ("completed", ITEMS)
            assert provider_stack.mock_stats()["calls"] == len(failed)  # as on-demand tasks


@pytest.mark.timeout(300)
def test_the_openai_sdk_s_batch_flow_runs_unchanged_with_the_provider_mode(
    provider_stack: RunningStack,
) -> None:
    provider_stack.configure_mock(batch_delay_s=2, rate_batch_fail=0.0)
    lines = b"".join(
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"sdk {i}"}]},
            }
        ).encode()
        + b"\n"
        for i in range(150)
    )
    with OpenAI(base_url=provider_stack.api + "/v1", api_key=provider_stack.api_key, max_retries=0) as openai:
        uploaded = openai.files.create(file=("in.jsonl", lines), purpose="batch")
        created = openai.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"mode": "provider"},
        )
        ended = eventually(
            lambda: openai.batches.retrieve(created.id),
            lambda batch: batch.status in ("completed", "failed", "cancelled", "expired"),
            timeout_s=240,
            every_s=0.5,
            what="the batch's end",
        )
        assert ended.status == "completed"
        assert ended.request_counts is not None
        assert (ended.request_counts.completed, ended.request_counts.failed) == (150, 0)
        assert ended.output_file_id is not None
        output = openai.files.content(ended.output_file_id).text.splitlines()
    answers = {json.loads(line)["custom_id"]: json.loads(line)["response"]["body"] for line in output}
    assert sorted(answers) == sorted(f"req-{i}" for i in range(150))
    assert answers["req-7"]["choices"][0]["message"]["content"] == reply_text("sdk 7")
    stats = provider_stack.mock_stats()
    assert (stats["calls"], stats["batches_created"]) == (0, 2)  # 150 lines, 100 a job


@pytest.fixture
def outside_llm() -> Iterator[tuple[MockLLM, str]]:
    # Outside the stack, so that its jobs and counts span both of the stack's runs.
    mock = MockLLM(MockConfig(batch_delay_s=12))
    with serve(mock.app()) as url:
        yield mock, url + "/v1"


@pytest.mark.load
@pytest.mark.crash
@pytest.mark.timeout(600)
def test_a_crash_while_the_jobs_run_loses_nothing_and_sends_no_second_job(
    outside_llm: tuple[MockLLM, str], receiver: tuple[WebhookReceiver, str], tmp_path: Path
) -> None:
    mock, llm_url = outside_llm
    hook, url = receiver
    seed = int(os.environ.get("CRASH_SEED", random.randrange(1_000_000)))
    kill_after_s = random.Random(seed).uniform(0.5, 8)  # in the fan-out, the jobs' sends or the looks
    print(f"CRASH_SEED={seed}: the stack is killed {kill_after_s:.1f} s after the submit")
    args = ("--state-dir", str(tmp_path / "state"))
    env = {"LLM_BASE_URL": llm_url, "PROVIDER_BATCH_LOOK_S": "1", "PROVIDER_BATCH_CHUNK_SIZE": "100"}
    items = [{"prompt": f"crash item {i}", "custom_id": f"item-{i}"} for i in range(ITEMS)]
    first = start_stack(*args, env=env)
    with first.client(timeout=60) as client:
        reply = client.post("/batches", json={"items": items, "webhook_url": url, "mode": "provider"})
        assert reply.status_code == 202, reply.text
        batch_id = reply.json()["batch_id"]
        time.sleep(kill_after_s)
        first.crash()
    second = start_stack(*args, env=env)
    try:
        with second.client() as client:
            final = eventually(
                lambda: client.get(f"/batches/{batch_id}").json(),
                lambda view: view["status"] in ("completed", "completed_with_errors"),
                timeout_s=300,
                every_s=1,
                what="the batch ended",
            )
            rows = results_of(client, batch_id)
            hook.wait_for(1)
            time.sleep(1)
    finally:
        second.stop(timeout_s=60)
    assert (final["status"], final["completed"]) == ("completed", ITEMS)
    assert [(row["custom_id"], row["status"]) for row in rows] == [
        (f"item-{i}", "completed") for i in range(ITEMS)
    ]
    assert mock.stats.batches_created == ITEMS // 100  # one job a chunk, whatever the crash cut
    assert mock.stats.calls == 0
    assert [json.loads(d.body)["type"] for d in hook.deliveries] == ["batch.completed"]
