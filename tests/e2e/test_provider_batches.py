"""A provider batch on the local stack, end to end: 300 items sent as the mock's OpenAI batch
jobs (a chunk of 100 a job), looked at through delayed messages, with a share of failed lines.
Every poll checks the counts (they add up, finished ones never go down); at the end they are
exact, the results come back in order with their custom_ids, the webhook arrives once, no
on-demand call was made, and a retry runs the failed items as ordinary tasks."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest

from llmtasks_local.mock_llm import reply_text
from tests.e2e.conftest import RunningStack, start_stack
from tests.e2e.test_batches import Progress, batch_events, results_of
from tests.helpers import WebhookReceiver, eventually

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
