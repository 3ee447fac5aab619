"""A pool of LLM keys: how keys are given, how a 429 moves traffic to the others, and what the
task records (the key's index, never the key)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmtasks.domain.models import TaskStatus
from llmtasks.llm import provider_from_settings
from llmtasks.llm.keys import KeyPool, LlmEndpoint, endpoints_from_settings, parse_keys
from llmtasks.llm.openai import OpenAIChat
from llmtasks.settings import Settings
from llmtasks_local.mock_llm import MockConfig, MockLLM
from tests.conftest import Aws
from tests.helpers import eventually, serve
from tests.unit.test_worker import Worker

pytestmark = pytest.mark.unit
URL = "https://llm.example/v1"


def test_keys_are_read_from_each_format() -> None:
    assert parse_keys("k1, k2\nk3", base_url=URL) == [LlmEndpoint(URL, k) for k in ("k1", "k2", "k3")]
    assert parse_keys('["a", "b"]', base_url=URL) == [LlmEndpoint(URL, "a"), LlmEndpoint(URL, "b")]
    mixed = json.dumps([{"api_key": "a"}, {"api_key": "b", "base_url": "https://other.example/v1"}])
    assert parse_keys(mixed, base_url=URL) == [
        LlmEndpoint(URL, "a"),
        LlmEndpoint("https://other.example/v1", "b"),
    ]
    with pytest.raises(ValueError, match="entry"):
        parse_keys('[{"key": "a"}]', base_url=URL)


def test_settings_give_the_pool_from_the_inline_list_a_file_or_one_key(
    settings: Settings, tmp_path: Path
) -> None:
    base = settings.model_copy(update={"llm_base_url": URL})
    assert endpoints_from_settings(base) == [LlmEndpoint(URL)]  # a keyless server
    one = Settings.model_validate({**base.model_dump(), "llm_api_key": "sk-1"})
    assert endpoints_from_settings(one) == [LlmEndpoint(URL, "sk-1")]
    inline = Settings.model_validate({**base.model_dump(), "llm_keys": "sk-1,sk-2"})
    assert [e.api_key for e in endpoints_from_settings(inline)] == ["sk-1", "sk-2"]
    keys_file = tmp_path / "keys"
    keys_file.write_text("sk-a\nsk-b\n")
    from_file = Settings.model_validate({**base.model_dump(), "llm_keys_file": str(keys_file)})
    assert [e.api_key for e in endpoints_from_settings(from_file)] == ["sk-a", "sk-b"]
    assert isinstance(provider_from_settings(from_file), OpenAIChat)


def test_the_pool_goes_round_and_skips_a_resting_key() -> None:
    now = [100.0]
    pool = KeyPool([LlmEndpoint(URL, k) for k in ("a", "b", "c")], clock=lambda: now[0])
    assert [pool.pick() for _ in range(4)] == [0, 1, 2, 0]
    pool.rest(1, 10)
    assert [pool.pick() for _ in range(4)] == [2, 0, 2, 0]
    assert pool.pick(besides=frozenset({0, 2})) == 1  # every other key is out: the one back soonest
    now[0] += 10
    assert sorted({pool.pick() for _ in range(3)}) == [0, 1, 2]


@pytest.fixture
def two_mocks() -> Iterator[tuple[MockLLM, str, MockLLM, str]]:
    first, second = MockLLM(MockConfig(rate_429=1.0, retry_after_s=3)), MockLLM()
    with serve(first.app()) as first_url, serve(second.app()) as second_url:
        yield first, first_url + "/v1", second, second_url + "/v1"


def test_while_one_key_is_rate_limited_the_other_carries_every_task(
    worker: Worker, two_mocks: tuple[MockLLM, str, MockLLM, str]
) -> None:
    limited, limited_url, healthy, healthy_url = two_mocks
    now = [1000.0]  # the pool's clock: a key's rest ends when the test moves it on
    pool = KeyPool(
        [LlmEndpoint(limited_url, "sk-limited"), LlmEndpoint(healthy_url, "sk-healthy")], clock=lambda: now[0]
    )
    llm = OpenAIChat(pool=pool, default_model="mock-model")
    ids = [worker.submit(f"pooled {i}") for i in range(20)]
    # 20 tasks in two invocations of ten concurrent calls. In the first, the calls that went
    # round to the limited key before its first 429 came back go to the healthy key at once;
    # then it rests for its Retry-After, and the second invocation sends it nothing.
    messages = worker.queued()
    assert worker.run(messages[:10], llm=llm) == {"batchItemFailures": []}
    first_share = limited.stats.calls
    assert 1 <= first_share <= 5
    assert worker.run(messages[10:], llm=llm) == {"batchItemFailures": []}
    assert limited.stats.calls == first_share
    tasks = [worker.task(task_id) for task_id in ids]
    assert {task.status for task in tasks} == {TaskStatus.COMPLETED}
    assert {task.llm_key_index for task in tasks} == {1}
    assert all(task.attempts == 1 for task in tasks)  # no task waited for a retry
    assert healthy.stats.calls == 20
    # Once its rest is over and it answers again, the first key takes its turn again.
    limited.config = MockConfig()
    now[0] += 3  # its Retry-After
    later = [worker.submit(f"pooled later {i}") for i in range(6)]
    worker.run(eventually(worker.queued, lambda q: len(q) == 6, timeout_s=5), llm=llm)
    assert {worker.task(task_id).llm_key_index for task_id in later} == {0, 1}
    stored = worker.aws.dynamodb.get_item(
        TableName=worker.settings.tasks_table_name, Key={"pk": {"S": f"task#{later[0]}"}}
    )["Item"]
    assert "sk-" not in json.dumps(stored)  # the index is recorded, never the key


def test_when_every_key_is_rate_limited_the_task_waits_for_its_retry(
    worker: Worker, two_mocks: tuple[MockLLM, str, MockLLM, str]
) -> None:
    limited, limited_url, other, other_url = two_mocks
    other.config = MockConfig(rate_429=1.0, retry_after_s=3)
    llm = OpenAIChat(pool=KeyPool([LlmEndpoint(limited_url), LlmEndpoint(other_url)]), default_model="m")
    task_id = worker.submit("nowhere to go")
    worker.run_queued(llm=llm)
    task = worker.task(task_id)
    assert (task.status, task.last_error_code) == (TaskStatus.PENDING, "llm_rate_limited")
    assert limited.stats.calls + other.stats.calls == 2  # each key tried once, then the retry waits


def test_in_aws_the_pool_comes_from_the_secret(aws: Aws, settings: Settings) -> None:
    import boto3

    keys = [{"api_key": "sk-a"}, {"api_key": "sk-b", "base_url": "https://eu.llm.example/v1"}]
    arn = boto3.client("secretsmanager").create_secret(Name="llm-keys", SecretString=json.dumps(keys))["ARN"]
    chosen = Settings.model_validate(
        {**settings.model_dump(), "llm_base_url": URL, "llm_api_key_secret_arn": arn}
    )
    assert endpoints_from_settings(chosen) == [
        LlmEndpoint(URL, "sk-a"),
        LlmEndpoint("https://eu.llm.example/v1", "sk-b"),
    ]
