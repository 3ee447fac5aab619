"""A local stack that keeps its state: stopped with Ctrl-C while calls run, it lets them finish
(the grace period), keeps tables, queues and stream positions in its state dir, and after a
restart the tasks left go on; `--reset` starts empty."""

from __future__ import annotations

import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmtasks_local.emulator.launcher import descendants
from llmtasks_local.mock_llm import MockConfig, MockLLM, reply_text
from tests.e2e.conftest import derived_template, start_stack, wait_terminal
from tests.helpers import HANG_S, eventually, serve

pytestmark = pytest.mark.e2e
TASKS = 20


@pytest.fixture
def slow_mock() -> Iterator[tuple[MockLLM, str]]:
    # Outside the stack, so that its counts span both runs of the stack.
    mock = MockLLM(MockConfig(latency_s=1.5))
    with serve(mock.app()) as url:
        yield mock, url + "/v1"


@pytest.mark.timeout(300)
def test_a_stack_stopped_halfway_finishes_its_calls_then_goes_on_after_a_restart(
    slow_mock: tuple[MockLLM, str], tmp_path: Path
) -> None:
    mock, url = slow_mock
    directory = tmp_path
    # Two invocations of two records at a time: 20 tasks of 1.5 s take 7.5 s, so a stop once six
    # are done leaves calls in flight and tasks in the queue.
    batch_of_ten = "BatchSize: 10\n            MaximumBatchingWindowInSeconds"
    template = derived_template(directory, {batch_of_ten: batch_of_ten.replace("10", "2")})
    args = (
        "-t",
        str(template),
        "--state-dir",
        str(directory / "state"),
        "--grace",
        "30",
        "--parameter-overrides",
        "WorkerMaxConcurrency=2 WorkerCallSlots=2 WorkerBatchingWindowSeconds=0",
    )
    env = {"LLM_BASE_URL": url}
    first = start_stack(*args, env=env)
    prompts = [f"survive {i}" for i in range(TASKS)]
    with first.client() as client:
        ids = [client.post("/tasks", json={"prompt": p}).json()["task_id"] for p in prompts]
    # Halfway: six calls done and some running (between two invocations none may be).
    eventually(
        lambda: (mock.stats.completed, mock.stats.in_flight),
        lambda seen: seen[0] >= 6 and seen[1] > 0,
        timeout_s=HANG_S,
        every_s=0.02,
        what="six calls done and others running",
    )
    assert first.stop() == 0  # one SIGINT
    assert mock.stats.in_flight == 0  # the calls in flight finished before it exited
    assert "delivered again" not in first.log.read_text()  # within the grace: none was cut
    done_before = mock.stats.completed
    assert done_before < TASKS
    assert "State kept in" in first.log.read_text()

    second = start_stack(*args, env=env)
    try:
        assert second.api_key == first.api_key  # its keys table was kept too
        with second.client() as client:
            tasks = [wait_terminal(client, task_id) for task_id in ids]
    finally:
        second.stop()
    assert [task["status"] for task in tasks] == ["completed"] * TASKS
    assert [task["result"] for task in tasks] == [reply_text(p) for p in prompts]
    # None billed twice: one call a task, across both runs.
    assert mock.stats.calls == TASKS
    assert all(outcomes == ["ok"] for outcomes in mock.stats.outcomes_by_prompt.values())

    emptied = start_stack(*args, "--reset", env=env)
    try:
        with emptied.client() as client:
            assert client.get(f"/tasks/{ids[0]}").status_code == 404
    finally:
        emptied.stop()


@pytest.mark.timeout(300)
def test_a_second_ctrl_c_stops_at_once_and_the_cut_calls_run_again_after_a_restart(
    slow_mock: tuple[MockLLM, str], tmp_path: Path
) -> None:
    mock, url = slow_mock
    mock.config = MockConfig(latency_s=60)
    directory = tmp_path
    args = ("--state-dir", str(directory / "state"), "--grace", "120")
    first = start_stack(*args, env={"LLM_BASE_URL": url})
    with first.client() as client:
        ids = [client.post("/tasks", json={"prompt": f"cut {i}"}).json()["task_id"] for i in range(2)]
    eventually(lambda: mock.stats.in_flight, lambda n: n == 2, timeout_s=HANG_S, what="both calls in flight")
    first.process.send_signal(signal.SIGINT)
    # The second SIGINT once the first is taken (two sent before its handler ran are one)
    eventually(
        lambda: "Stopping: the calls in flight" in first.log.read_text(),
        bool,
        timeout_s=HANG_S,
        what="the first SIGINT taken",
    )
    assert first.stop() == 0  # the second SIGINT
    # It ended before either call was answered: it waited out neither the grace nor the calls.
    assert mock.stats.completed == 0
    assert "2 message(s) of unfinished invocations will be delivered again" in first.log.read_text()
    mock.config = MockConfig()
    second = start_stack(*args, env={"LLM_BASE_URL": url})
    try:
        with second.client() as client:
            tasks = [wait_terminal(client, task_id) for task_id in ids]
    finally:
        second.stop()
    # At once, not after TaskQueue's visibility timeout: the message came back, and its next
    # delivery took the task over from the one the stop cut short.
    assert [task["status"] for task in tasks] == ["completed", "completed"]
    assert [task["attempts"] for task in tasks] == [2, 2]


@pytest.mark.timeout(300)
def test_a_state_dir_that_refuses_writes_turns_submits_into_503_and_the_stack_says_so(tmp_path: Path) -> None:
    directory = tmp_path
    stack = start_stack("--state-dir", str(directory / "state"))
    try:
        [endpoint] = [pid for pid in descendants(stack.process.pid) if b"moto_server" in _cmdline(pid)]
        with stack.client() as client:
            assert client.post("/tasks", json={"prompt": "before"}).status_code == 202
            # No file of the endpoint may grow: write(2) fails, as on a full disk.
            resource.prlimit(endpoint, resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
            refused = client.post("/tasks", json={"prompt": "refused"})
            listed = client.get("/tasks").json()["data"]
            eventually(
                stack.log.read_text,
                lambda log: "Error: the state dir cannot be written" in log,
                timeout_s=HANG_S,
                what="the stack saying the state dir cannot be written",
            )
            resource.prlimit(
                endpoint, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            )
            after = client.post("/tasks", json={"prompt": "after"})
            eventually(
                stack.log.read_text,
                lambda log: "The state dir can be written again" in log,
                timeout_s=HANG_S,
                what="the stack saying the state dir takes changes again",
            )
    finally:
        stack.stop()
    assert refused.status_code == 503, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.headers.get("retry-after"), (refused.headers, refused.text)
    assert len(listed) == 1  # "before" alone: nothing of the refused submit was stored
    assert after.status_code == 202


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()
