"""The local stack killed with SIGKILL (itself and its moto server, as a crash or an out-of-memory
kill would) at a random moment while 300 tasks and a 300-item batch run, then started again on
the same state dir: every task it accepted ends, the batch's counts are exact, every webhook is
delivered, and the LLM is called again only for the calls the crash cut short (made before it,
their results not yet written), never for a task the stack had said completed.

The batch spans three chunks of its fan-out (100 items each), so a crash can cut it between
chunks as well as within one; a thousand items (ten chunks) took this test 129 s instead of 65,
and test_batches.py runs a thousand.

The moment is random; its seed is printed (CRASH_SEED=N repeats a run).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmtasks_local.mock_llm import MockConfig, MockLLM
from tests.e2e.conftest import start_stack, still_running
from tests.helpers import HANG_S, WebhookReceiver, eventually, serve

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.load, pytest.mark.crash]

TASKS = 300
ITEMS = 300
TERMINAL = ("completed", "failed", "cancelled")
LATENCY_S = 1.0


def completed_prompts(client: httpx.Client, accepted: dict[str, str]) -> set[str]:
    """The prompts of the accepted tasks the stack says are completed, every page of its listing:
    their results are written, so no crash after this read may call the LLM for them again."""
    done: set[str] = set()
    cursor = None
    while True:
        params: dict[str, Any] = {
            "status": "completed",
            "limit": 100,
            **({"cursor": cursor} if cursor else {}),
        }
        page = client.get("/tasks", params=params).json()
        done |= {accepted[task["task_id"]] for task in page["data"] if task["task_id"] in accepted}
        cursor = page["next_cursor"]
        if cursor is None:
            return done


@pytest.fixture
def llm() -> Iterator[tuple[MockLLM, str]]:
    # Outside the stack, so that its counts span both runs.
    mock = MockLLM(MockConfig(latency_s=LATENCY_S))
    with serve(mock.app()) as url:
        yield mock, url + "/v1"


@pytest.fixture
def receiver() -> Iterator[tuple[WebhookReceiver, str]]:
    hook = WebhookReceiver()
    with serve(hook.app()) as url:
        yield hook, url + "/hook"


@pytest.mark.timeout(900)
def test_a_crash_at_a_random_moment_loses_no_accepted_task(
    llm: tuple[MockLLM, str], receiver: tuple[WebhookReceiver, str], tmp_path: Path
) -> None:
    mock, llm_url = llm
    hook, hook_url = receiver
    seed = int(os.environ.get("CRASH_SEED", random.randrange(1_000_000)))
    kill_after_s = random.Random(seed).uniform(3, 20)  # while the submits and the calls go on
    print(f"CRASH_SEED={seed}: the stack is killed {kill_after_s:.1f} s after the first submit")
    state_dir = tmp_path / "state"
    args = ("--state-dir", str(state_dir))
    env = {"LLM_BASE_URL": llm_url}
    first = start_stack(*args, env=env)
    accepted: dict[str, str] = {}  # task id: prompt
    batch: dict[str, Any] = {}
    hooked: set[str] = set()

    def submit(i: int) -> None:
        body: dict[str, Any] = {"prompt": f"crash task {i}"}
        if i % 10 == 0:
            body["webhook_url"] = hook_url
        try:
            reply = client.post("/tasks", json=body)
        except httpx.HTTPError:
            return  # never acknowledged: the crash came first
        if reply.status_code == 202:
            accepted[reply.json()["task_id"]] = body["prompt"]
            if "webhook_url" in body:
                hooked.add(reply.json()["task_id"])

    def submit_batch() -> None:
        items = [{"prompt": f"crash item {i}", "custom_id": f"item-{i}"} for i in range(ITEMS)]
        try:
            reply = client.post("/batches", json={"items": items})
        except httpx.HTTPError:
            return
        if reply.status_code == 202:
            batch.update(reply.json())

    with first.client(timeout=60) as client, ThreadPoolExecutor(8) as pool:
        started = time.monotonic()
        pool.submit(submit_batch)
        pending = [pool.submit(submit, i) for i in range(TASKS)]
        time.sleep(max(0.0, started + kill_after_s - time.monotonic()))
        # What the stack had written before the kill, as read then (tasks completed while the
        # read went on may be missed: they count as cut short, which only loosens the bound).
        written = completed_prompts(client, dict(accepted))
        in_flight_before = mock.stats.in_flight
        first.crash()
        # A call may start between that read and the kill; the mock still counts it in flight
        # (it answers after its latency, to a connection the kill closed).
        in_flight_at_kill = max(in_flight_before, mock.stats.in_flight)
        for future in pending:
            future.result()
    calls_before = mock.stats.calls

    second = start_stack(*args, env=env)
    restarted = time.monotonic()
    try:
        with second.client() as client:
            try:
                eventually(
                    lambda: _unfinished(client, accepted),
                    lambda unfinished: not unfinished,
                    timeout_s=300,
                    every_s=1,
                    what="every accepted task ended",
                )
            except AssertionError as stuck:
                task_id = _unfinished(client, accepted)[0]["task_id"]
                story = [
                    line
                    for run in (first, second)
                    for line in run.log.read_text().splitlines()
                    if task_id in line or "backend failed" in line  # and why a read failed
                ]
                raise AssertionError(
                    f"{stuck}\n{task_id} in the stack's logs:\n" + "\n".join(story)
                ) from None
            final = {task_id: client.get(f"/tasks/{task_id}").json()["status"] for task_id in accepted}
            if batch:
                ended = eventually(
                    lambda: client.get(f"/batches/{batch['batch_id']}").json(),
                    lambda view: view["status"] in ("completed", "completed_with_errors", "cancelled"),
                    timeout_s=300,
                    every_s=1,
                    what="the batch ended",
                )
        took_s = time.monotonic() - restarted
        delivered = eventually(
            lambda: {json.loads(d.body)["data"]["task_id"] for d in hook.deliveries},
            lambda seen: hooked <= seen,
            timeout_s=HANG_S,
            every_s=0.5,
            what="every webhook task's delivery",
        )
    finally:
        second.stop(timeout_s=60)

    calls = mock.stats.outcomes_by_prompt
    repeated = sum(max(0, len(outcomes) - 1) for outcomes in calls.values())
    print(
        f"accepted {len(accepted)} tasks and {'a' if batch else 'no'} batch; killed with {in_flight_at_kill}"
        f" calls in flight, {calls_before} calls made and {len(written)} tasks completed before it; all ended"
        f" {took_s:.1f} s after the restart; {repeated} calls repeated"
    )
    assert all(status == "completed" for status in final.values())  # no LLM faults here
    if batch:
        assert (ended["status"], ended["completed"], ended["failed"], ended["cancelled"]) == (
            "completed",
            ITEMS,
            0,
            0,
        )
        assert ended["total"] == ITEMS
    assert hooked <= delivered
    # The LLM was called again only for calls the crash cut short: made before it, their results
    # not yet written; never for a task the stack had said completed.
    assert [prompt for prompt in written if len(calls[prompt]) != 1] == []
    assert repeated <= calls_before - len(written)
    assert "The last run stopped without saving" in second.log.read_text()


def _unfinished(client: httpx.Client, tasks: dict[str, str]) -> list[dict[str, Any]]:
    if running := still_running(client):
        return [{"task_id": task_id, "status": "pending or processing"} for task_id in running]
    views = (client.get(f"/tasks/{task_id}").json() for task_id in tasks)
    return [view for view in views if view.get("status") not in TERMINAL]
