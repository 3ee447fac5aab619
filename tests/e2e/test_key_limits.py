"""Keys' tokens a minute on the local stack: three keys of different limits at one mock LLM that
enforces them as OpenAI does, and a burst larger than their minute."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from llmtasks_local.mock_llm import MockConfig, MockLLM
from tests.e2e.conftest import RunningStack, start_stack, wait_terminal
from tests.helpers import serve

pytestmark = pytest.mark.e2e

LIMITS = {"sk-large": 6_000, "sk-medium": 3_000, "sk-small": 1_500}  # tokens a minute


@pytest.fixture(scope="module")
def limited() -> Iterator[tuple[RunningStack, MockLLM]]:
    # Each answer about 400 tokens (a word a token, as the mock counts them)
    config = MockConfig(
        key_limits={key: {"tpm": tpm} for key, tpm in LIMITS.items()}, reply_chars=2_000, pad_word_chars=4
    )
    mock = MockLLM(config)
    with serve(mock.app()) as url:
        keys = [{"api_key": key, "tpm": tpm} for key, tpm in LIMITS.items()]
        stack = start_stack(env={"LLM_BASE_URL": url + "/v1", "LLM_KEYS": json.dumps(keys)})
        try:
            yield stack, mock
        finally:
            stack.stop()


@pytest.mark.timeout(240)
def test_a_burst_past_the_keys_minute_waits_on_the_queue_and_takes_no_429(
    limited: tuple[RunningStack, MockLLM],
) -> None:
    stack, mock = limited
    # Given 30 tasks of about 410 tokens each (12,300), more than the three keys' minute (10,500)
    started = time.monotonic()
    with stack.client() as client:
        body = {"max_completion_tokens": 500}
        ids = [
            client.post("/tasks", json={"prompt": f"burst {i}", **body}).json()["task_id"] for i in range(30)
        ]
        tasks = [wait_terminal(client, task_id, timeout_s=180) for task_id in ids]
    # Then every task completed, none of their calls was answered 429, and each call reached the
    # provider once: the calls the keys' minute had no room for waited on the queue instead
    assert {task["status"] for task in tasks} == {"completed"}, [t.get("error") for t in tasks]
    seen = mock.stats.model_dump(include={"calls", "key_limited", "tokens_by_key"})
    assert mock.stats.key_limited == 0, seen
    assert mock.stats.calls == 30, seen
    assert [task["attempts"] for task in tasks] == [1] * 30, seen
    # The burst took longer than the first minute's tokens allow at once: the rest came as the
    # keys' minutes refilled, each key serving in proportion to its limit
    served = mock.stats.tokens_by_key
    assert sum(served.values()) > sum(LIMITS.values()), seen
    assert time.monotonic() - started > 5
    assert served["arge"] > served["dium"] > served["mall"], seen  # the keys' last four characters
