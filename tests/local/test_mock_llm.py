"""The mock LLM's barrier, which end-to-end tests of overlap end on: no call is answered before
`hold_until_in_flight` calls have been in flight at once, streamed or not."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from llmtasks_local.mock_llm import MockConfig, MockLLM
from tests.helpers import HANG_S, eventually, serve

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("stream", [False, True])
def test_a_held_call_is_answered_only_once_the_barrier_s_count_is_in_flight(stream: bool) -> None:
    # hang_s bounds the hold: a test that failed before its second call leaves no call held an hour
    mock = MockLLM(MockConfig(hold_until_in_flight=2, hang_s=HANG_S))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    with serve(mock.app()) as url, ThreadPoolExecutor(2) as pool:

        def call() -> int:
            return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=HANG_S).status_code

        first = pool.submit(call)
        eventually(lambda: mock.stats.calls, lambda n: n == 1, timeout_s=HANG_S, what="the first call")
        # Held: no answer while it is alone (an unheld one takes milliseconds; only the second
        # call lets it go, so a loaded machine cannot fail this wait, only slow it)
        with pytest.raises(TimeoutError):
            first.result(timeout=0.3)
        second = pool.submit(call)
        assert (first.result(timeout=HANG_S), second.result(timeout=HANG_S)) == (200, 200)
    assert (mock.stats.max_in_flight, mock.stats.completed) == (2, 2)
