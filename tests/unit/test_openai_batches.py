"""OpenAIBatchJobs (llm/openai_batches.py) against the mock LLM's Batch API over real HTTP on
127.0.0.1: a job submitted, looked at and read back in llmtasks' terms; lines built as
OpenAIChat builds a call; failed, expired and cancelled requests; the per-job limits; a job
found again by its tag."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion
from llmtasks.llm.batch_jobs import BatchJobs, BatchLimits, JobState, JobStatus
from llmtasks.llm.keys import LlmEndpoint
from llmtasks.llm.openai import OpenAIChat, chat_body
from llmtasks.llm.openai_batches import OpenAIBatchJobs
from llmtasks_local.mock_llm import MockConfig, MockLLM, reply_text
from tests.helpers import HANG_S, free_port, serve

pytestmark = pytest.mark.unit

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[MockLLM, str]]:
    mock = MockLLM()
    with serve(mock.app()) as url:
        yield mock, url + "/v1"


@pytest.fixture(autouse=True)
def mock(server: tuple[MockLLM, str]) -> MockLLM:
    server[0].configure(MockConfig(batch_delay_s=0.5, seed=3), reseed=True)
    server[0].reset_stats()
    return server[0]


@pytest.fixture
def jobs(server: tuple[MockLLM, str]) -> OpenAIBatchJobs:
    return OpenAIBatchJobs(LlmEndpoint(server[1], "sk-batch"), timeout_s=10)


def knobs(mock: MockLLM, **changes: Any) -> None:
    mock.configure(MockConfig.model_validate({**mock.config.model_dump(), **changes}), reseed=True)


def prompts(count: int, mark: dict[int, str] | None = None) -> list[tuple[str, LLMRequest]]:
    marks = mark or {}
    return [(f"item-{i}", LLMRequest(prompt=f"prompt {i}{marks.get(i, '')}")) for i in range(count)]


def ended(jobs: OpenAIBatchJobs, job_id: str, seen: list[JobStatus] | None = None) -> JobStatus:
    give_up = time.monotonic() + HANG_S
    while not (status := jobs.look(job_id)).state.is_ended:
        if seen is not None:
            seen.append(status)
        assert time.monotonic() < give_up, "the job never ended"
        time.sleep(0.02)
    return status


def test_it_fits_the_provider_neutral_protocol(jobs: OpenAIBatchJobs) -> None:
    typed: BatchJobs = jobs
    assert typed.limits == BatchLimits(max_requests=50_000, max_bytes=200 * 1024 * 1024, min_records=0)


def test_a_job_is_submitted_looked_at_and_read_back(jobs: OpenAIBatchJobs, mock: MockLLM) -> None:
    lines = prompts(30)
    job_id = jobs.submit(MODEL, lines, tag="batch-1/part-0")

    seen: list[JobStatus] = []
    status = ended(jobs, job_id, seen)

    assert {look.state for look in seen} <= {JobState.PENDING, JobState.PROCESSING}
    assert JobState.PROCESSING in {look.state for look in seen}
    assert (status.state, status.provider_status) == (JobState.COMPLETED, "completed")
    assert (status.total, status.completed, status.failed) == (30, 30, 0)
    assert status.state.has_results
    assert status.output_ref is not None
    assert status.error_ref is None
    results = list(jobs.results(status))
    assert [r.custom_id for r in results] == [custom_id for custom_id, _ in lines]
    first = results[0].outcome
    assert isinstance(first, Completion)
    assert (first.text, first.model, first.finish_reason) == (reply_text("prompt 0"), MODEL, "stop")
    assert first.usage.total_tokens > 0
    assert mock.stats.batch_lines_run == 30


def test_a_line_is_the_body_openai_chat_sends_for_the_same_request(
    server: tuple[MockLLM, str], jobs: OpenAIBatchJobs, mock: MockLLM
) -> None:
    request = LLMRequest.model_validate(
        {
            "messages": [{"role": "user", "content": "Label this [mock:refuse]"}],
            "system": "Be brief.",
            "temperature": 0.2,
            "max_completion_tokens": 50,
            "response_format": {"type": "json_object"},
        }
    )
    line = json.loads(jobs.encode(MODEL, "one", request))
    assert line == {
        "custom_id": "one",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": chat_body(request, MODEL),
    }

    # The mock counts each top-level parameter it is sent: one call, then one batch line
    asyncio.run(OpenAIChat(base_url=server[1], default_model=MODEL).complete(request, timeout_s=5))
    by_call = dict(mock.stats.params)
    mock.reset_stats()
    status = ended(jobs, jobs.submit(MODEL, [("one", request)], tag="t"))
    assert mock.stats.params == by_call
    [(_, outcome)] = list(jobs.results(status))
    assert isinstance(outcome, Completion)
    assert outcome.refusal  # the [mock:refuse] tag held for the line as for the call


def test_failed_lines_come_back_as_llm_errors_by_custom_id(jobs: OpenAIBatchJobs) -> None:
    lines = prompts(10, {3: " [mock:batch-fail]", 7: " [mock:batch-fail]"})
    status = ended(jobs, jobs.submit(MODEL, lines, tag="t"))

    assert (status.state, status.completed, status.failed) == (JobState.COMPLETED, 8, 2)
    outcomes = dict(jobs.results(status))
    assert set(outcomes) == {custom_id for custom_id, _ in lines}
    failed = {custom_id: o for custom_id, o in outcomes.items() if isinstance(o, LLMError)}
    assert set(failed) == {"item-3", "item-7"}
    assert {(e.code, e.transient) for e in failed.values()} == {("llm_http_500", True)}


def test_an_expired_job_reads_its_lines_not_run_as_retryable_errors(
    jobs: OpenAIBatchJobs, mock: MockLLM
) -> None:
    knobs(mock, batch_delay_s=4.0, batch_expire_s=1.0)
    status = ended(jobs, jobs.submit(MODEL, prompts(50), tag="t"))

    assert status.state is JobState.EXPIRED
    assert status.state.has_results
    outcomes = dict(jobs.results(status))
    assert len(outcomes) == 50
    expired = [o for o in outcomes.values() if isinstance(o, LLMError)]
    assert 0 < len(expired) < 50
    assert {(e.code, e.transient) for e in expired} == {("llm_batch_expired", True)}


def test_a_cancelled_job_stops_and_keeps_what_ran(jobs: OpenAIBatchJobs, mock: MockLLM) -> None:
    knobs(mock, batch_delay_s=4.0)
    job_id = jobs.submit(MODEL, prompts(200), tag="t")
    give_up = time.monotonic() + HANG_S
    while jobs.look(job_id).completed < 5:
        assert time.monotonic() < give_up
        time.sleep(0.02)

    jobs.cancel(job_id)
    assert jobs.look(job_id).state is JobState.CANCELLING
    status = ended(jobs, job_id)

    assert status.state is JobState.CANCELLED
    results = list(jobs.results(status))
    assert 5 <= len(results) == status.completed < 200
    assert all(isinstance(r.outcome, Completion) for r in results)
    jobs.cancel(job_id)  # a job that ended: nothing left to stop, no error


def test_a_job_the_provider_refuses_is_failed_with_its_reasons_and_no_results(
    jobs: OpenAIBatchJobs, mock: MockLLM
) -> None:
    knobs(mock, batch_max_requests=2)
    status = ended(jobs, jobs.submit(MODEL, prompts(3), tag="t"))

    assert status.state is JobState.FAILED
    assert not status.state.has_results
    assert status.error is not None
    assert "too_many_tasks" in status.error
    assert list(jobs.results(status)) == []


def test_a_job_past_the_limits_is_refused_before_anything_is_sent(
    server: tuple[MockLLM, str], mock: MockLLM
) -> None:
    small = OpenAIBatchJobs(LlmEndpoint(server[1], "sk"), limits=BatchLimits(max_requests=3, max_bytes=600))
    with pytest.raises(ValueError, match="at most 3 requests"):
        small.submit(MODEL, prompts(4), tag="t")
    with pytest.raises(ValueError, match="at most 600 bytes"):
        small.submit(MODEL, [("a", LLMRequest(prompt="x" * 700))], tag="t")
    with pytest.raises(ValueError, match="unique"):
        small.submit(MODEL, [("a", LLMRequest(prompt="x")), ("a", LLMRequest(prompt="y"))], tag="t")
    with pytest.raises(ValueError, match="at least 1"):
        small.submit(MODEL, [], tag="t")
    assert (mock.stats.files_uploaded, mock.stats.batches_created) == (0, 0)


def test_a_job_is_found_again_by_its_tag(jobs: OpenAIBatchJobs) -> None:
    first = jobs.submit(MODEL, prompts(1), tag="batch-9/part-0")
    second = jobs.submit(MODEL, prompts(1), tag="batch-9/part-1")

    assert jobs.find("batch-9/part-0") == first
    assert jobs.find("batch-9/part-1") == second
    assert jobs.find("batch-9/part-2") is None


def test_the_calls_errors_are_llm_errors(jobs: OpenAIBatchJobs) -> None:
    with pytest.raises(LLMError) as missing:
        jobs.look("batch_nope")
    assert (missing.value.code, missing.value.transient) == ("llm_http_404", False)

    gone = OpenAIBatchJobs(LlmEndpoint(f"http://127.0.0.1:{free_port()}/v1", "sk"), timeout_s=2)
    with pytest.raises(LLMError) as unreachable:
        gone.look("batch_x")
    assert (unreachable.value.code, unreachable.value.transient) == ("llm_unreachable", True)
