"""A pool of LLM keys: how keys are given, how a 429 moves traffic to the others, and what the
task records (the key's index, never the key)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmtasks.aws.key_limits import KeyRates
from llmtasks.aws.queues import TaskLanes
from llmtasks.domain.caller import Caller
from llmtasks.domain.models import SubmitTaskRequest, Task, TaskStatus
from llmtasks.domain.rate_limits import KeyLimits, RateHeaders
from llmtasks.domain.rules import Lane
from llmtasks.llm import provider_from_settings
from llmtasks.llm.keys import KeyPool, LlmEndpoint, endpoints_from_settings, parse_keys
from llmtasks.llm.openai import OpenAIChat
from llmtasks.settings import Settings
from llmtasks_local.mock_llm import MockConfig, MockLLM
from tests.conftest import Aws, RunningMock
from tests.helpers import HANG_S, eventually, serve
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


def test_the_mock_counts_each_keys_minute_and_says_so_in_openais_headers() -> None:
    mock = MockLLM(MockConfig(key_limits={"sk-small": {"tpm": 1_000, "rpm": 2}}))
    body = {"model": "m", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 100}
    with serve(mock.app()) as url:
        first = httpx.post(
            f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-small"}
        )
        assert first.status_code == 200
        heard = RateHeaders.read(first.headers)
        assert (heard.limit_tokens, heard.limit_requests, heard.remaining_requests) == (1_000, 2, 1)
        # Counted at the answer's usage once answered, not at max_tokens
        used = first.json()["usage"]["total_tokens"]
        assert heard.remaining_tokens == 1_000 - used
        assert heard.reset_tokens_s is not None
        assert 0 < heard.reset_tokens_s < 60
        assert first.headers["x-ratelimit-reset-requests"].endswith("s")
        httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-small"})
        refused = httpx.post(
            f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-small"}
        )
        assert refused.status_code == 429
        assert RateHeaders.read(refused.headers).remaining_requests == 0
        # Another key has its own minute (and no limits here: no headers)
        other = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-b"})
        assert other.status_code == 200
        assert "x-ratelimit-limit-tokens" not in other.headers
    assert mock.stats.key_limited == 1


@pytest.fixture
def limited_mock() -> Iterator[tuple[MockLLM, str]]:
    # Three keys of different limits, counted as OpenAI counts them
    limits = {"sk-a": {"tpm": 20_000}, "sk-b": {"tpm": 10_000}, "sk-c": {"tpm": 5_000}}
    mock = MockLLM(MockConfig(key_limits=limits))
    with serve(mock.app()) as url:
        yield mock, url + "/v1"


def limited_pool(worker: Worker, url: str, *, configured: bool = True) -> KeyPool:
    limits = {"sk-a": 20_000, "sk-b": 10_000, "sk-c": 5_000}
    endpoints = [
        LlmEndpoint(url, key, KeyLimits(tpm=tpm if configured else None)) for key, tpm in limits.items()
    ]
    rates = KeyRates(worker.settings.tasks_table_name, worker.aws.dynamodb)
    return KeyPool(endpoints, rates=rates)


def test_calls_go_to_keys_with_room_and_the_rest_wait_on_the_queue_without_a_429(
    worker: Worker, limited_mock: tuple[MockLLM, str]
) -> None:
    # Given three keys of 20,000, 10,000 and 5,000 tokens a minute, and 20 tasks that may each
    # use under 4,000 (their prompt and max_completion_tokens): 8 fit the minute (5 + 2 + 1)
    mock, url = limited_mock
    llm = OpenAIChat(pool=limited_pool(worker, url), default_model="mock-model")
    ids = [worker.submit(f"sized {i}", max_completion_tokens=3_900) for i in range(20)]
    # When one invocation runs them all
    reply = worker.run(worker.queued(), llm=llm)
    assert reply == {"batchItemFailures": []}
    tasks = [worker.task(task_id) for task_id in ids]
    done = [t for t in tasks if t.status is TaskStatus.COMPLETED]
    waiting = [t for t in tasks if t.status is TaskStatus.PENDING]
    # Then the calls that fit each key's minute ran, the freest key first, and not one took a 429
    assert mock.stats.key_limited == 0
    assert 8 <= len(done) < 20  # 8 at their reservation, more as the answers gave back tokens
    assert {t.llm_key_index for t in done} == {0, 1, 2}
    assert sum(t.llm_key_index == 0 for t in done) > sum(t.llm_key_index == 2 for t in done)
    # And the others wait on the queue until the first key has room, costing no attempt
    assert len(waiting) == 20 - len(done)
    assert {t.last_error_code for t in waiting} == {"keys_full"}
    # (within the minute: when the first key has room for sure, at the latest)
    assert all(t.next_attempt_at < time.time() + 61 for t in waiting)
    # Then each comes back with its message once its key may have room, and runs when it has
    give_up = time.monotonic() + HANG_S  # past the minute the last may wait, and its run
    while any(worker.task(i).status is not TaskStatus.COMPLETED for i in ids) and time.monotonic() < give_up:
        if messages := worker.queued():
            assert worker.run(messages, llm=llm) == {"batchItemFailures": []}
        time.sleep(0.2)
    assert {worker.task(task_id).status for task_id in ids} == {TaskStatus.COMPLETED}
    assert mock.stats.key_limited == 0
    assert mock.stats.calls == 20  # each task's call reached the provider once


def test_limits_are_learned_from_the_providers_headers_and_a_429_tells_every_worker(
    worker: Worker, limited_mock: tuple[MockLLM, str]
) -> None:
    mock, url = limited_mock
    # Given a pool that knows no limits: its first answers teach them
    pool = limited_pool(worker, url, configured=False)
    llm = OpenAIChat(pool=pool, default_model="mock-model")
    worker.submit("teach", max_completion_tokens=100)
    worker.run(worker.queued(), llm=llm)
    assert pool.limits(0) == KeyLimits(tpm=20_000)  # the round's first key answered
    # When another client of that key spends its minute (llmtasks is not the key's only user)
    body = {"model": "m", "messages": [{"role": "user", "content": "word " * 19_000}], "max_tokens": 10}
    assert httpx.post(
        f"{url}/chat/completions", json=body, headers={"Authorization": "Bearer sk-a"}
    ).is_success
    # Then the next call on it takes a 429, whose headers set the key's use for every worker
    other_sandbox = KeyRates(worker.settings.tasks_table_name, worker.aws.dynamodb)
    single = OpenAIChat(pool=KeyPool([pool.endpoints[0]], rates=pool._rates), default_model="m")
    task_id = worker.submit("refused", max_completion_tokens=4_000)
    refused_after = time.time()
    worker.run(worker.queued(), llm=single)
    assert worker.task(task_id).last_error_code == "llm_rate_limited"
    assert mock.stats.key_limited == 1
    key_id = pool.endpoints[0].key_id
    now = time.time()
    wait = other_sandbox.reserve(key_id, KeyLimits(tpm=20_000), 4_000, now)
    # About 19,000 of the minute's 20,000 are used: 4,000 more fit once 3,000 are back, 9 s after
    # the 429 (which came between refused_after and now; a loaded machine may take seconds)
    assert 8 - (now - refused_after) < wait < 10


def test_a_tenants_tokens_a_minute_share_holds_its_own_calls_back_not_the_others(
    worker: Worker, mock_llm: RunningMock
) -> None:
    # Given a tenant whose key has a share of 10,000 tokens a minute, and calls of about 3,950
    # (their prompt and max_completion_tokens): two fit its minute
    mock_llm.configure(latency_s=1.0)  # the calls overlap: none gives its tokens back before the last starts
    caller = Caller(tenant_id="shared", key_id="k1", tpm=10_000)
    body = {"max_completion_tokens": 3_900}
    ids = [
        worker.service.submit(
            "shared", SubmitTaskRequest(prompt=f"share {i}", **body), caller=caller
        ).task.task_id
        for i in range(5)
    ]
    other = worker.service.submit("other", SubmitTaskRequest(prompt="other tenant", **body)).task.task_id
    # When one invocation runs them all
    assert worker.run(worker.queued()) == {"batchItemFailures": []}
    tasks = [worker.task(task_id) for task_id in ids]
    # Then two of the tenant's calls ran, its others wait on the queue for its minute, costing
    # no attempt; the other tenant's call ran
    assert [t.status for t in tasks].count(TaskStatus.COMPLETED) == 2
    waiting = [t for t in tasks if t.status is TaskStatus.PENDING]
    assert {t.last_error_code for t in waiting} == {"tenant_tpm"}
    assert len(waiting) == 3
    # Two calls hold 7,900 of its 10,000: a third fits once 1,850 are back, 11 s of its minute
    # at the latest (sooner if the running calls give back what they did not use)
    assert all(t.next_attempt_at <= time.time() + 13 for t in waiting)
    assert worker.task(other).status is TaskStatus.COMPLETED
    # The share counts what the calls used: their unused reservations came back
    rates = KeyRates(worker.settings.tasks_table_name, worker.aws.dynamodb, prefix="tenantrate#")
    assert rates.reserve("shared", KeyLimits(tpm=10_000), 9_000, time.time()) == 0.0


def test_a_waiting_task_is_due_when_its_message_comes_however_late_its_release_is_written(
    worker: Worker, limited_mock: tuple[MockLLM, str]
) -> None:
    _, url = limited_mock
    # Given a key of 60,000 tokens a minute whose whole minute another worker just reserved
    limits = KeyLimits(tpm=60_000)
    rates = KeyRates(worker.settings.tasks_table_name, worker.aws.dynamodb)
    endpoint = LlmEndpoint(url, "sk-fast", limits)
    assert rates.reserve(endpoint.key_id, limits, 60_000, time.time()) == 0.0
    rates.settle(endpoint.key_id, limits, reserved=60_000, used=60_000)  # and used it
    llm = OpenAIChat(pool=KeyPool([endpoint], rates=rates), default_model="mock-model")
    # and a table so loaded that a release is written 3 s (on the worker's clock) after its send
    now = [time.time()]
    due: list[float] = []  # when each message sent comes, on the worker's clock

    class SlowRelease(TaskLanes):
        def send(self, task: Task, *, delay_s: float = 0) -> str:
            sent = super().send(task, delay_s=delay_s)
            due.append(now[0] + delay_s)
            now[0] += 3
            return sent

    worker.lanes = SlowRelease({lane: worker.lanes[lane] for lane in Lane})
    worker.clock = lambda: now[0]
    task_id = worker.submit("waits three seconds", max_completion_tokens=3_000)
    worker.run(worker.queued(), llm=llm)
    assert worker.task(task_id).last_error_code == "keys_full"
    # When its message comes back, the seconds it was delayed after it was sent
    now[0] = due[-1]
    messages: list[dict[str, object]] = []
    give_up = time.monotonic() + HANG_S
    while not messages and time.monotonic() < give_up:
        messages = worker.queued()
        time.sleep(0.2)
    worker.run(messages, llm=llm)
    # Then the task is due and runs: its message is not dropped as an early copy
    assert worker.task(task_id).status is TaskStatus.COMPLETED
