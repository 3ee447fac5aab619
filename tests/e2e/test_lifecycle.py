"""The task lifecycle on the local stack: retries, cancellation and deadlines, over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import RunningStack
from tests.e2e.test_local_stack import wait_terminal
from tests.helpers import HANG_S, eventually

pytestmark = pytest.mark.e2e


def read_task(client: httpx.Client, task_id: str) -> Callable[[], dict[str, Any]]:
    def read() -> dict[str, Any]:
        task: dict[str, Any] = client.get(f"/tasks/{task_id}").json()
        return task

    return read


def wait_for(client: httpx.Client, task_id: str, status: str, timeout_s: float = HANG_S) -> dict[str, Any]:
    return eventually(read_task(client, task_id), lambda t: t["status"] == status, timeout_s=timeout_s)


def test_a_rate_limited_task_shows_its_retry_then_completes(fresh_mock: RunningStack) -> None:
    fresh_mock.configure_mock(rate_429=1.0, retry_after_s=3)
    with fresh_mock.client() as client:
        sent_at = time.time()
        task_id = client.post("/tasks", json={"prompt": "retry me"}).json()["task_id"]
        # Given a 429 with Retry-After: 3, the task waits in the queue, not in the function
        task = eventually(
            read_task(client, task_id),
            lambda t: t["attempts"] >= 1 and t["status"] == "pending",
            timeout_s=HANG_S,
        )
        retry_at = datetime.fromisoformat(task["next_attempt_at"]).timestamp()
        # At least Retry-After after the submit (the 429 came later), at most that from now: a
        # bound on now alone failed when the read lagged the retry's write under CI's load.
        assert retry_at - sent_at >= 2
        assert retry_at - time.time() <= 4
        fresh_mock.configure_mock(reset=False, rate_429=0.0)
        done = wait_terminal(client, task_id)
    assert (done["status"], done["attempts"]) == ("completed", 2)
    assert fresh_mock.mock_stats()["outcomes_by_prompt"] == {"retry me": ["429", "ok"]}


def test_a_retry_after_of_days_fails_the_task_with_a_clear_error(fresh_mock: RunningStack) -> None:
    fresh_mock.configure_mock(rate_429=1.0, retry_after_s=114 * 3600)
    with fresh_mock.client() as client:
        task_id = client.post("/tasks", json={"prompt": "come back next week"}).json()["task_id"]
        task = wait_terminal(client, task_id)
    assert (task["status"], task["error_code"]) == ("failed", "retry_after_too_long")
    assert "410400 s" in task["error"]


def test_cancelling_a_pending_task_keeps_it_from_the_llm(fresh_mock: RunningStack) -> None:
    # Given a task waiting for its retry
    fresh_mock.configure_mock(rate_429=1.0, retry_after_s=2)
    with fresh_mock.client() as client:
        task_id = client.post("/tasks", json={"prompt": "cancel while waiting"}).json()["task_id"]
        eventually(read_task(client, task_id), lambda t: t["attempts"] >= 1, timeout_s=HANG_S)
        wait_for(client, task_id, "pending")
        fresh_mock.configure_mock(reset=False, rate_429=0.0)
        # When it is cancelled
        assert client.post(f"/tasks/{task_id}/cancel").json()["status"] == "cancelled"
        time.sleep(3)  # past the retry's delay
        task = client.get(f"/tasks/{task_id}").json()
    # Then the retry never reaches the LLM
    assert task["status"] == "cancelled"
    assert fresh_mock.mock_stats()["outcomes_by_prompt"] == {"cancel while waiting": ["429"]}


def test_cancelling_a_processing_task_discards_its_late_result(fresh_mock: RunningStack) -> None:
    fresh_mock.configure_mock(latency_s=2)
    with fresh_mock.client() as client:
        task_id = client.post("/tasks", json={"prompt": "too slow"}).json()["task_id"]
        wait_for(client, task_id, "processing")
        assert client.post(f"/tasks/{task_id}/cancel").json()["status"] == "cancelled"
        # the provider answers after all
        eventually(fresh_mock.mock_stats, lambda stats: stats["completed"] >= 1, timeout_s=HANG_S)
        time.sleep(0.5)
        task = client.get(f"/tasks/{task_id}").json()
    assert (task["status"], task["result"]) == ("cancelled", None)


def test_a_task_that_cannot_finish_in_time_fails_with_deadline_exceeded(fresh_mock: RunningStack) -> None:
    fresh_mock.configure_mock(latency_s=10)
    with fresh_mock.client() as client:
        task_id = client.post("/tasks", json={"prompt": "hurry", "timeout_s": 2}).json()["task_id"]
        task = wait_terminal(client, task_id)
    assert (task["status"], task["error_code"]) == ("failed", "deadline_exceeded")
    # The call was cut at the deadline: the mock's 10 s stream never reached its end
    assert fresh_mock.mock_stats()["completed"] == 0
    assert fresh_mock.mock_stats()["outcomes_by_prompt"] == {"hurry": ["ok"]}
    # and the provider saw the caller go away (the mock stops waiting when its client does): its
    # call ends unanswered, however long a loaded machine takes to tell it
    eventually(fresh_mock.mock_stats, lambda stats: stats["in_flight"] == 0, timeout_s=HANG_S)
    assert fresh_mock.mock_stats()["completed"] == 0
