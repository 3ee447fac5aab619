"""Runs longer than a worker may live, on a stack of their own.

- With WorkerTimeoutSeconds=30, a run of several steps whose first model call thinks 90 s in the
  provider's background mode completes; the worker is billed (Lambda's REPORT lines) for a small
  share of the run's wall time, and the mock's signed webhook wakes the run when a call ends.
- A run SIGKILLed mid-way (the stack and its moto server) resumes on restart at its first
  unfinished step: no model step it had recorded is called again.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import llmtasks_client
from llmtasks_local.mock_llm import MockConfig, MockLLM
from tests.e2e.conftest import start_stack
from tests.helpers import HANG_S, ToolEndpoint, eventually, serve

pytestmark = pytest.mark.e2e

BACKGROUND_CALL_S = 90
# The run's later model calls each think this long in background; its tool calls are quick.
STEP_THINK_S = 15
AGENT_STEPS = 5
RUN_WAIT_S = 600
REPORT = re.compile(
    r"REPORT RequestId: \S+\tFunction: WorkerFunction\tDuration: \S+ ms\tBilled Duration: (\d+) ms"
)


@pytest.fixture
def endpoint() -> Iterator[tuple[ToolEndpoint, str]]:
    tool = ToolEndpoint()
    with serve(tool.app()) as url:
        yield tool, url + "/tool"


@pytest.mark.timeout(900)
def test_a_run_past_the_worker_s_timeout_is_billed_only_for_its_moments(
    endpoint: tuple[ToolEndpoint, str],
) -> None:
    tool, url = endpoint
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "url": url}
    stack = start_stack("--parameter-overrides", "WorkerTimeoutSeconds=30", "--report")
    try:
        stack.configure_mock(latency_s=STEP_THINK_S)
        with llmtasks_client.Client(stack.api, stack.api_key) as client:
            started = time.monotonic()
            task = client.submit(
                f"Research it [mock:background-s={BACKGROUND_CALL_S}] [mock:agent-steps={AGENT_STEPS}]",
                tools=[lookup],
                provider_background=True,
            )
            # Longer than a hang's cap: the run's own calls take minutes by design
            done = client.wait(task.task_id, timeout=RUN_WAIT_S)
            wall_s = time.monotonic() - started
            steps = client.steps(task.task_id, limit=50).steps
        stats = stack.mock_stats()
        log = stack.log.read_text()
    finally:
        stack.stop()

    assert done.status is llmtasks_client.TaskStatus.COMPLETED, done.error
    model_steps = [step for step in steps if step.type == "model_call"]
    assert len(model_steps) == AGENT_STEPS + 1
    assert len(tool.calls) == AGENT_STEPS
    # Each model step was started once at the provider, and ended there while no worker waited
    assert stats["background_started"] == AGENT_STEPS + 1
    assert stats["background_cancelled"] == 0
    # The first step's 90 s outlived the worker's 30 s timeout three times over
    first = model_steps[0]
    assert (first.ended_at - first.started_at).total_seconds() >= BACKGROUND_CALL_S
    assert wall_s >= BACKGROUND_CALL_S + AGENT_STEPS * STEP_THINK_S
    # The mock's signed webhook reached the stack's route and woke the run
    assert stats["webhooks_sent"] >= AGENT_STEPS + 1
    assert "woken by the provider's webhook" in log
    # The worker's billed time (its REPORT lines) is a small share of the run's wall time
    billed_s = sum(int(ms) for ms in REPORT.findall(log)) / 1000
    print(f"run of {wall_s:.0f} s: WorkerFunction billed {billed_s:.1f} s ({billed_s / wall_s:.1%})")
    assert billed_s > 0
    assert billed_s < 0.25 * wall_s


@pytest.mark.faults
@pytest.mark.load
@pytest.mark.crash
@pytest.mark.timeout(900)
def test_a_run_killed_mid_way_resumes_at_its_first_unfinished_step(
    endpoint: tuple[ToolEndpoint, str], tmp_path: Path
) -> None:
    tool, url = endpoint
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "url": url}
    # Outside the stack, so that its counts span both runs of it; each model call takes a second.
    mock = MockLLM(MockConfig(latency_s=1.0))
    steps = 8
    with serve(mock.app()) as llm_url:
        args = ("--state-dir", str(tmp_path / "state"))
        env = {"LLM_BASE_URL": llm_url + "/v1"}
        first = start_stack(*args, env=env)
        with llmtasks_client.Client(first.api, first.api_key) as client:
            task = client.submit(f"Research it [mock:agent-steps={steps}]", tools=[lookup])
            # Killed once the run has recorded some of its steps, and while it takes more
            recorded = eventually(
                lambda: client.steps(task.task_id, limit=50).steps,
                lambda done: sum(step.type == "model_call" for step in done) >= 3,
                timeout_s=HANG_S,
                every_s=0.2,
                what="three model steps recorded",
            )
            first.crash()
        before = sum(step.type == "model_call" for step in recorded)
        in_flight_at_kill = mock.stats.in_flight

        second = start_stack(*args, env=env)
        try:
            with llmtasks_client.Client(second.api, second.api_key) as client:
                done = client.wait(task.task_id, timeout=HANG_S)
                journal = client.steps(task.task_id, limit=50).steps
        finally:
            second.stop(timeout_s=60)

    assert done.status is llmtasks_client.TaskStatus.COMPLETED, done.error
    model_steps = [step for step in journal if step.type == "model_call"]
    assert len(model_steps) == steps + 1
    # The steps recorded before the kill stand as they were
    assert [step.ended_at for step in journal[: len(recorded)]] == [step.ended_at for step in recorded]
    # The model was called once a step, and again only for a call the kill cut short
    repeated = mock.stats.calls - len(model_steps)
    print(f"killed after {before} model steps with {in_flight_at_kill} calls in flight; {repeated} repeated")
    assert 0 <= repeated <= 1  # a run makes one call at a time
    assert len(tool.calls) >= steps
