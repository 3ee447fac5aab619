"""Providers on the local stack: a pool of two keys, each at its own mock LLM on 127.0.0.1,
one of which answers 429 for a while."""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Iterator

import pytest

from llmtasks_local.mock_llm import MockConfig, MockLLM
from tests.e2e.conftest import RunningStack, start_stack, wait_terminal
from tests.helpers import serve

pytestmark = pytest.mark.e2e


def max_in_any_window(times: list[float], *, seconds: float) -> int:
    """The most of `times` inside any half-open window `seconds` long."""
    ordered = sorted(times)
    return max((bisect.bisect_left(ordered, t + seconds) - i for i, t in enumerate(ordered)), default=0)


@pytest.fixture(scope="module")
def pooled() -> Iterator[tuple[RunningStack, MockLLM, MockLLM]]:
    limited, healthy = MockLLM(MockConfig(rate_429=1.0, retry_after_s=5)), MockLLM()
    with serve(limited.app()) as limited_url, serve(healthy.app()) as healthy_url:
        keys = [
            {"api_key": "sk-first", "base_url": limited_url + "/v1"},
            {"api_key": "sk-second", "base_url": healthy_url + "/v1"},
        ]
        stack = start_stack(env={"LLM_BASE_URL": healthy_url + "/v1", "LLM_KEYS": json.dumps(keys)})
        try:
            yield stack, limited, healthy
        finally:
            stack.stop()


@pytest.mark.timeout(300)  # a hang's cap: sixty tasks and a stack's start, on a loaded machine
def test_the_healthy_key_carries_the_load_while_the_other_is_rate_limited(
    pooled: tuple[RunningStack, MockLLM, MockLLM],
) -> None:
    stack, limited, healthy = pooled
    with stack.client() as client:
        ids = [client.post("/tasks", json={"prompt": f"pool {i}"}).json()["task_id"] for i in range(30)]
        tasks = [wait_terminal(client, task_id) for task_id in ids]
    assert {task["status"] for task in tasks} == {"completed"}
    assert all(task["attempts"] == 1 for task in tasks)  # none waited out the 429's Retry-After
    assert healthy.stats.completed == 30
    assert limited.stats.completed == 0
    # Each sandbox (a process of its own) learns of the 429 from its own first call to that key,
    # then rests it for the Retry-After (5 s): at most one call a sandbox in any 5 s, and the
    # worker has WorkerMaxConcurrency + BatchMaxConcurrency + HighMaxConcurrency (10 + 5 + 2)
    # sandboxes, whichever of its three queues' pollers made each call. (A slow run outlasts one
    # Retry-After, and a sandbox may then try the key again: the rule holds per window.)
    assert limited.stats.calls >= 1
    assert max_in_any_window(limited.stats.arrivals, seconds=5.0) <= 17
    # Once the first key answers again, it serves its share.
    limited.config = MockConfig()
    time.sleep(5)
    with stack.client() as client:
        ids = [client.post("/tasks", json={"prompt": f"pool later {i}"}).json()["task_id"] for i in range(30)]
        later = [wait_terminal(client, task_id) for task_id in ids]
    assert {task["status"] for task in later} == {"completed"}
    assert limited.stats.completed > 0
