"""The public API's rules over HTTP on the local stack: Idempotency-Key, limits, listing,
long-poll and Retry-After."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from tests.e2e.conftest import RunningStack
from tests.helpers import HANG_S

pytestmark = pytest.mark.e2e


def problem_of(reply: httpx.Response, status: int) -> dict[str, object]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = reply.json()
    assert {"type", "title", "status", "detail"} <= set(body)
    return body


def test_idempotency_key_replays_refuses_another_body_and_is_per_tenant(fresh_mock: RunningStack) -> None:
    key = {"Idempotency-Key": f"order-{uuid.uuid4()}"}
    acme_key = fresh_mock.cli("keys", "create", "--tenant", "idem-acme").strip()
    with fresh_mock.client() as client, fresh_mock.client(acme_key) as acme:
        first = client.post("/tasks", json={"prompt": "charge once"}, headers=key)
        again = client.post("/tasks", json={"prompt": "charge once"}, headers=key)
        assert (first.status_code, again.status_code) == (202, 202)
        assert again.json() == first.json()
        assert again.headers["idempotent-replayed"] == "true"
        assert "idempotent-replayed" not in first.headers
        other = problem_of(client.post("/tasks", json={"prompt": "charge twice"}, headers=key), 422)
        assert "Idempotency-Key" in str(other["detail"])
        elsewhere = acme.post("/tasks", json={"prompt": "charge once"}, headers=key)
        assert elsewhere.status_code == 202
        assert elsewhere.json()["task_id"] != first.json()["task_id"]
    assert fresh_mock.mock_stats()["outcomes_by_prompt"].get("charge twice") is None  # type: ignore[union-attr]


def test_simultaneous_duplicates_never_make_two_tasks(fresh_mock: RunningStack) -> None:
    outcomes: list[httpx.Response] = []
    with fresh_mock.client() as client:
        for _ in range(5):
            key = {"Idempotency-Key": str(uuid.uuid4())}
            start = threading.Barrier(2)

            def send(headers: dict[str, str] = key, barrier: threading.Barrier = start) -> None:
                barrier.wait()
                outcomes.append(client.post("/tasks", json={"prompt": "race"}, headers=headers))

            threads = [threading.Thread(target=send) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    pairs = [outcomes[i : i + 2] for i in range(0, len(outcomes), 2)]
    for pair in pairs:
        assert {r.status_code for r in pair} <= {202, 409}
        accepted = {r.json()["task_id"] for r in pair if r.status_code == 202}
        assert len(accepted) == 1  # one task per key, whoever won
        for conflict in (r for r in pair if r.status_code == 409):
            problem_of(conflict, 409)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b'{"prompt": ', 400, None),
        (b'{"prompt": 42}', 422, "prompt"),
        (b'{"prompt": "p", "surprise": 1}', 422, "surprise"),
        (b'{"prompt": "p", "max_retries": 11}', 422, "max_retries"),
        (b'{"prompt": "p", "metadata": {"blob": "' + b"x" * 3000 + b'"}}', 422, "metadata"),
        (b'{"prompt": "' + b"x" * 210_000 + b'"}', 413, None),
    ],
)
def test_limits_are_clear_problems_that_change_nothing(
    fresh_mock: RunningStack, body: bytes, status: int, field: str | None
) -> None:
    def newest_task_ids(client: httpx.Client) -> list[str]:
        # Ids only: an earlier test's task may still be finishing meanwhile.
        return [t["task_id"] for t in client.get("/tasks", params={"limit": 1}).json()["data"]]

    with fresh_mock.client() as client:
        before = newest_task_ids(client)
        problem = problem_of(client.post("/tasks", content=body), status)
        if field is not None:
            assert field in str(problem["detail"]) + str(problem.get("errors"))
        assert newest_task_ids(client) == before  # no task was created


def test_listing_and_long_poll_over_http(fresh_mock: RunningStack) -> None:
    tenant_key = fresh_mock.cli("keys", "create", "--tenant", f"lister-{uuid.uuid4().hex[:6]}").strip()
    fresh_mock.configure_mock(latency_s=3)  # long enough to cancel the first while it runs
    with fresh_mock.client(tenant_key) as client:
        ids = [client.post("/tasks", json={"prompt": f"list {i}"}).json()["task_id"] for i in range(5)]
        assert client.post(f"/tasks/{ids[0]}/cancel").json()["status"] == "cancelled"
        pending = client.get(f"/tasks/{ids[-1]}")
        assert pending.json()["status"] in ("pending", "processing")
        assert pending.headers["retry-after"] == "2"
        # The long-poll returns as soon as the task is done, before its wait (the longest) runs out
        # (polled again while a loaded machine has not run the task within one wait)
        give_up = time.monotonic() + HANG_S
        while True:
            started = time.monotonic()
            done = client.get(f"/tasks/{ids[-1]}", params={"wait": 25})
            if done.json()["status"] not in ("pending", "processing") or started > give_up:
                break
        assert done.json()["status"] == "completed"
        assert time.monotonic() - started < 25
        assert "retry-after" not in done.headers
        seen, cursor = [], None
        while True:
            page = client.get("/tasks", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
            seen += [t["task_id"] for t in page["data"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == ids[::-1]
        cancelled = client.get("/tasks", params={"status": "cancelled"}).json()["data"]
        assert [t["task_id"] for t in cancelled] == [ids[0]]
        problem_of(client.get("/tasks", params={"cursor": "bogus"}), 422)
        problem_of(client.get(f"/tasks/{ids[0]}", params={"wait": 26}), 422)
