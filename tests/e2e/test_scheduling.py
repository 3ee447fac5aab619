"""Priority and fairness on the local stack, as a multi-tenant user meets them: one tenant's
backlog does not hold up a quiet tenant's tasks or anyone's high-priority task. The test checks
the order in which tasks end, never how long they took."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import RunningStack, start_stack, still_running
from tests.helpers import eventually

pytestmark = pytest.mark.e2e

FLOOD = 120  # 4 s calls on 20 call slots: a backlog of six waves, 24 s
# (2 s calls made a 12 s backlog, shorter than the urgent lane's cold start on a loaded machine.)
CALL_S = 4.0


@pytest.fixture(scope="module")
def small_stack() -> Iterator[RunningStack]:
    """Two worker invocations of ten calls: 20 call slots, so a hundred tasks make a backlog."""
    running = start_stack("--parameter-overrides", "WorkerMaxConcurrency=2 WorkerCallSlots=10")
    yield running
    running.stop()


def submit_all(client: httpx.Client, bodies: list[dict[str, Any]]) -> list[str]:
    def one(body: dict[str, Any]) -> str:
        reply = client.post("/tasks", json=body)
        assert reply.status_code == 202, reply.text
        return str(reply.json()["task_id"])

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, bodies))


def statuses(client: httpx.Client, task_ids: list[str]) -> list[str]:
    return [str(client.get(f"/tasks/{task_id}").json()["status"]) for task_id in task_ids]


def ended_at(client: httpx.Client, task_ids: list[str]) -> dict[str, float]:
    def read() -> dict[str, Any]:
        if still_running(client):
            return {}
        return {task_id: client.get(f"/tasks/{task_id}").json() for task_id in task_ids}

    tasks = eventually(
        read,
        lambda found: bool(found) and all(t["status"] == "completed" for t in found.values()),
        timeout_s=180,
        every_s=1,
        what="every task completed",
    )
    return {task_id: datetime.fromisoformat(t["completed_at"]).timestamp() for task_id, t in tasks.items()}


def overtaken(task: float, earlier: dict[str, float]) -> int:
    """How many of the earlier submitted tasks ended after `task` did."""
    return sum(1 for end in earlier.values() if end > task)


def test_a_quiet_tenant_and_a_high_priority_task_overtake_another_tenant_s_backlog(
    small_stack: RunningStack,
) -> None:
    small_stack.configure_mock(latency_s=CALL_S)
    flood_key = small_stack.cli("keys", "create", "--tenant", "flood").strip()
    quiet_key = small_stack.cli("keys", "create", "--tenant", "quiet").strip()
    with small_stack.client(flood_key) as flood, small_stack.client(quiet_key) as quiet:
        backlog = submit_all(flood, [{"prompt": f"flood {i}"} for i in range(FLOOD)])
        # Once the flood is running (read through the API: a CLI process takes seconds to
        # start on a loaded machine, and the backlog drains meanwhile), a quiet tenant's tasks
        # and the flood's own urgent one
        eventually(
            lambda: statuses(flood, backlog[:3]),
            lambda found: "pending" not in found,
            timeout_s=60,
            what="the flood's first calls running",
        )
        quiet_ids = submit_all(quiet, [{"prompt": f"quiet {i}"} for i in range(3)])
        [urgent] = submit_all(flood, [{"prompt": "urgent", "priority": "high"}])
        [usual] = submit_all(flood, [{"prompt": "usual"}])
        # What FIFO would have kept ahead of them: the flood tasks still waiting (read after
        # the submits, so no more than waited when they came)
        waiting = statuses(flood, backlog).count("pending")
        flood_ends = ended_at(flood, backlog)
        quiet_ends = ended_at(quiet, quiet_ids)
        urgent_end = ended_at(flood, [urgent])[urgent]
        usual_end = ended_at(flood, [usual])[usual]
    # 120 tasks of 4 s on 20 slots make 24 s of backlog; the reads above take a few seconds
    assert waiting >= FLOOD // 3, f"only {waiting} flood tasks still waited: no backlog to overtake"
    # A FIFO queue would end each of them after every earlier flood task (none overtaken). Here
    # the quiet tenant's tasks come first while the flood is noisy, and the urgent one has a lane
    # of its own: each ends ahead of most of the backlog still waiting when it came.
    for end in quiet_ends.values():
        assert overtaken(end, flood_ends) >= waiting // 2, (waiting, sorted(quiet_ends.values()))
    # The urgent task's lane runs invocations of its own, and the first starts a worker sandbox:
    # a cold start that took 10 s on a loaded CI machine. So a quarter of the waiting backlog,
    # not half: FIFO would be none, and the flood's usual task (below) overtakes at most 20.
    assert overtaken(urgent_end, flood_ends) >= waiting // 4, waiting
    # The flood's own normal task waits its turn behind its backlog
    assert overtaken(usual_end, flood_ends) <= 20
