"""Provider batches (`mode: "provider"`): a batch's chunks sent as the provider's batch jobs, on
moto in-process with the mock LLM's Batch API over real HTTP (OpenAIBatchJobs), through the
handlers the template names. The rules alone (backoff, parts, counts) first."""

from __future__ import annotations

import base64
import json
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from llmtasks.api.openai_batch_files import ENDPOINTS, line_parser
from llmtasks.aws.provider_jobs import ProviderJobs, job_key
from llmtasks.aws.queues import Queue
from llmtasks.aws.store import TaskStore
from llmtasks.domain.batches import BatchStatus
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import FanoutMessage
from llmtasks.domain.models import TaskStatus
from llmtasks.domain.provider_batches import (
    LOOK_MAX_S,
    ProviderJob,
    index_of,
    item_custom_id,
    job_parts,
    job_tag,
    look_delay,
    provider_refusal,
    shown_counts,
)
from llmtasks.llm.batch_jobs import OPENAI_BATCH_LIMITS, BatchLimits
from llmtasks.llm.keys import LlmEndpoint
from llmtasks.llm.openai_batches import OpenAIBatchJobs
from llmtasks.services.batch_inputs import BatchInputReader
from llmtasks.services.batch_items import BatchFanout
from llmtasks.services.batch_outcomes import batch_task_id, read_chunk
from llmtasks.services.provider_batches import JobEnds, ProviderBatches
from llmtasks.services.tasks import TaskService
from llmtasks.settings import Settings
from llmtasks_local.mock_llm import reply_text
from tests.conftest import Aws, RunningMock
from tests.helpers import blobs, eventually, task_lanes
from tests.unit.test_api import Api
from tests.unit.test_background_runs import SECRET, completed_event, signed
from tests.unit.test_batches import Rig, counters
from tests.unit.test_input_files import PNG, upload_file

pytestmark = pytest.mark.unit
CHUNK = 4

# --- the rules ---------------------------------------------------------------------------------


def test_looks_back_off_by_half_again_each_time_up_to_sqs_s_longest_delay() -> None:
    assert [look_delay(n, 30) for n in range(5)] == [30, 45, 67, 101, 151]
    assert look_delay(20, 30) == LOOK_MAX_S == 900
    assert look_delay(3, 0) == 0  # a stack that looks at once (the tests')


def test_a_chunk_s_jobs_hold_one_model_each_within_the_provider_s_limits() -> None:
    lines = [(0, "a", 10), (1, "b", 10), (2, "a", 10), (3, "a", 30), (4, "a", 10), (5, "b", 10)]
    assert job_parts(lines, max_requests=2, max_bytes=1000) == [[0, 2], [3, 4], [1, 5]]
    assert job_parts(lines, max_requests=10, max_bytes=40) == [[0, 2], [3, 4], [1, 5]]
    assert job_parts(lines, max_requests=10, max_bytes=1000) == [[0, 2, 3, 4], [1, 5]]
    # A line larger than a job's bytes still goes, alone (the provider says why it refuses it).
    assert job_parts([(0, "a", 50), (1, "a", 5)], max_requests=10, max_bytes=20) == [[0], [1]]


def test_custom_ids_name_the_item_s_place_and_pads_name_none() -> None:
    assert index_of(item_custom_id(1234)) == 1234
    assert index_of("pad-0") is None
    assert index_of("i") is None
    assert job_tag("b" * 32, 3, 1) == f"llmtasks-{'b' * 32}-3-1"


def test_counts_while_jobs_run_are_the_provider_s_never_below_the_exact_ones() -> None:
    exact = {"pending": 0, "processing": 10, "completed": 0, "failed": 0, "cancelled": 0}
    shown = shown_counts(exact, 10, {"0-0": [3, 1], "1-0": [2, 0]})
    assert shown == {"pending": 0, "processing": 4, "completed": 5, "failed": 1, "cancelled": 0}
    # Exact counts past the provider's (a job ended, its items counted): the exact ones hold.
    later = {"pending": 0, "processing": 2, "completed": 7, "failed": 1, "cancelled": 0}
    assert shown_counts(later, 10, {"0-0": [3, 1], "1-0": [2, 0]}) == later
    assert shown_counts(exact, 10, {}) == exact
    # The stream has not counted every item created processing yet: the rest come from pending.
    lagging = {"pending": 6, "processing": 4, "completed": 0, "failed": 0, "cancelled": 0}
    assert shown_counts(lagging, 10, {"0-0": [7, 0]}) == {
        "pending": 3,
        "processing": 0,
        "completed": 7,
        "failed": 0,
        "cancelled": 0,
    }
    # Never past what is left to end (a cancel ended the others).
    cancelled = {"pending": 0, "processing": 2, "completed": 0, "failed": 0, "cancelled": 8}
    assert shown_counts(cancelled, 10, {"0-0": [5, 1]}) == {
        "pending": 0,
        "processing": 0,
        "completed": 2,
        "failed": 0,
        "cancelled": 8,
    }


def test_only_providers_with_a_batch_api_take_provider_batches() -> None:
    assert provider_refusal("openai") is None
    refusal = provider_refusal("bedrock")
    assert refusal is not None
    assert "no batch API" in refusal


# --- through the handlers ----------------------------------------------------------------------


class RecordingQueue(Queue):
    """BatchFanoutQueue, with each look's delay kept (moto hides a delayed message until due)."""

    def __init__(self, url: str, client: Any) -> None:
        super().__init__(url, client)
        self.delays: list[tuple[FanoutMessage, float]] = []

    def send(self, body: Any, *, delay_s: float = 0, **kwargs: Any) -> str:
        if isinstance(body, FanoutMessage) and body.action == "look":
            self.delays.append((body, delay_s))
        return super().send(body, delay_s=delay_s, **kwargs)


class ProviderRig(Rig):
    def __init__(
        self,
        aws: Aws,
        handler: Any,
        settings: Settings,
        mock_llm: RunningMock,
        limits: BatchLimits = OPENAI_BATCH_LIMITS,
        page: int = 500,
    ) -> None:
        super().__init__(aws, handler, settings, mock_llm)
        self.jobs_store = ProviderJobs(settings.tasks_table_name, aws.dynamodb)
        self.provider = OpenAIBatchJobs(LlmEndpoint(mock_llm.url, "sk-batch"), timeout_s=10, limits=limits)
        self.looks = RecordingQueue(settings.batch_fanout_queue_url, aws.sqs)
        self.provider_batches = ProviderBatches(
            settings, self.store, self.jobs_store, self.provider, self.looks, blobs(settings), page=page
        )
        self.fanout = BatchFanout(
            settings,
            self.store,
            self.batches,
            self.lanes,
            ends=self.ends,
            results=blobs(settings),
            provider=self.provider_batches,
            inputs=BatchInputReader(
                settings,
                self.batches,
                blobs(settings),
                self.fanout_queue,
                parsers={endpoint: line_parser(endpoint) for endpoint in ENDPOINTS},
            ),
        )
        self.mock = mock_llm

    def provider_jobs(self, batch_id: str) -> list[dict[str, Any]]:
        """The batch's jobs the mock holds (GET /v1/batches: the mock serves every test)."""
        listed = httpx.get(f"{self.mock.url}/batches", params={"limit": 100}).json()["data"]
        prefix = f"llmtasks-{batch_id}-"
        return [job for job in listed if job["metadata"]["llmtasks_job"].startswith(prefix)]

    def settle(self, batch_id: str, *, timeout_s: float = 30) -> None:
        """Fan-out messages and looks delivered, the stream counted, until the batch has ended."""

        def step() -> BatchStatus:
            self.fan_out()
            self.count(self.stream())
            return self.batch(batch_id).status

        eventually(step, lambda status: status.is_terminal, timeout_s=timeout_s, every_s=0.1, what="the end")


@pytest.fixture
def rig(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> ProviderRig:
    mock_llm.configure(batch_delay_s=0.6)
    overrides = {"provider_batch_chunk_size": CHUNK, "provider_batch_look_s": 0.0, "retry_base_delay_s": 0.0}
    return ProviderRig(aws, handler, settings.model_copy(update=overrides), mock_llm)


def items(count: int) -> list[dict[str, Any]]:
    return [{"prompt": f"item {i}", "custom_id": f"c{i}"} for i in range(count)]


def test_a_provider_batch_runs_as_jobs_and_keeps_the_batch_contract(rig: ProviderRig) -> None:
    accepted = rig.submit(items(10), mode="provider", webhook_url="http://127.0.0.1:9/hook")
    batch_id = accepted["batch_id"]
    assert rig.batch(batch_id).chunk_size == CHUNK
    # The fan-out writes the items processing and sends one job a chunk: no item on a lane.
    rig.fan_out()
    assert rig.aws.messages("BatchTaskQueue") == []
    tasks = rig.store.get_many([batch_task_id(batch_id, i) for i in range(10)])
    assert {task.status for task in tasks.values()} == {TaskStatus.PROCESSING}
    assert all(task.lease_id is None for task in tasks.values())
    jobs = rig.provider_jobs(batch_id)
    assert len(jobs) == 3  # 10 items, 4 a chunk
    assert sorted(job["metadata"]["llmtasks_job"] for job in jobs) == [
        job_tag(batch_id, chunk, 0) for chunk in range(3)
    ]
    rig.settle(batch_id)
    batch = rig.batch(batch_id)
    assert batch.status is BatchStatus.COMPLETED
    assert (
        counters(batch)
        == rig.full_count(batch)
        == Counter({"completed": 10, "pending": 0, "processing": 0, "failed": 0, "cancelled": 0})
    )
    # The worker never called the LLM: the jobs answered every item.
    assert rig.mock.stats.calls == 0
    results = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"]
    assert [(r["index"], r["custom_id"], r["status"]) for r in results] == [
        (i, f"c{i}", "completed") for i in range(10)
    ]
    assert [r["result"] for r in results] == [reply_text(f"item {i}") for i in range(10)]
    assert all(r["usage"]["total_tokens"] > 0 and r["attempts"] == 1 for r in results)
    view = rig.api.call("GET", f"/batches/{batch_id}")["json"]
    assert view["mode"] == "provider"
    assert view["usage"]["total_tokens"] == sum(r["usage"]["total_tokens"] for r in results)
    # One batch.completed event, as for any batch.
    events = rig.relay(rig.stream())
    assert [(e.event_type, e.batch_id) for e in events] == [("batch.completed", batch_id)]


def test_a_redelivered_chunk_sends_no_second_job(rig: ProviderRig) -> None:
    batch_id = rig.submit(items(3), mode="provider")["batch_id"]
    [message] = rig.aws.messages("BatchFanoutQueue")
    for _ in range(3):  # SQS is at-least-once: the same message three times
        rig.batch_fn(rig._sqs_event("BatchFanoutQueue", [message]), rig.batch_ctx)
    assert len(rig.provider_jobs(batch_id)) == 1
    rig.settle(batch_id)
    assert rig.batch(batch_id).completed == 3


def test_a_chunk_that_died_between_the_job_and_its_id_finds_the_job_by_its_tag(rig: ProviderRig) -> None:
    batch_id = rig.submit(items(3), mode="provider")["batch_id"]
    batch = rig.batch(batch_id)
    # Its first run wrote the job `creating`, sent it, and died before storing the id.
    rig.jobs_store.begin(ProviderJob(batch_id=batch_id, chunk=0, part=0, expires_at=batch.expires_at))
    lines = [(item_custom_id(i), LLMRequest(prompt=f"item {i}")) for i in range(3)]
    sent = rig.provider.submit("gpt-4o-mini", lines, tag=job_tag(batch_id, 0, 0))
    rig.fan_out()
    assert [job["id"] for job in rig.provider_jobs(batch_id)] == [sent]
    stored = rig.jobs_store.get(batch_id, 0, 0)
    assert stored is not None
    assert (stored.phase, stored.job_id) == ("running", sent)
    rig.settle(batch_id)
    assert rig.batch(batch_id).completed == 3


def test_looks_back_off_and_store_the_provider_s_counts(
    aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock
) -> None:
    mock_llm.configure(batch_delay_s=30)
    overrides = {"provider_batch_chunk_size": CHUNK, "provider_batch_look_s": 10.0}
    rig = ProviderRig(aws, handler, settings.model_copy(update=overrides), mock_llm)
    batch_id = rig.submit(items(4), mode="provider")["batch_id"]
    rig.fan_out()
    for _ in range(3):  # each look delivered at once here (their delays are SQS's)
        rig.fanout.handle(rig.looks.delays[-1][0], sent_at=time.time())
    assert [(message.looks, delay) for message, delay in rig.looks.delays] == [
        (0, 10),
        (1, 15),
        (2, 22),
        (3, 33),
    ]
    job = rig.jobs_store.get(batch_id, 0, 0)
    assert job is not None
    assert (job.phase, job.looks) == ("running", 3)
    assert rig.batch(batch_id).provider_counts == {"0-0": [job.completed, job.failed]}
    # A copy of a look already done (SQS redelivers), and the chunk's message again: the job
    # keeps one chain of looks.
    rig.fanout.handle(rig.looks.delays[1][0], sent_at=time.time())
    assert len(rig.looks.delays) == 4
    rig.fanout.handle(FanoutMessage(batch_id=batch_id, chunk=0), sent_at=time.time())
    again = rig.looks.delays[-1][0]
    assert again.looks == 3  # the same look number as the chain's pending one
    for copy in (rig.looks.delays[3][0], again):
        rig.fanout.handle(copy, sent_at=time.time())
    assert [message.looks for message, _ in rig.looks.delays[5:]] == [4]  # one next look, not two
    assert len(rig.provider_jobs(batch_id)) == 1


def test_failed_and_expired_lines_fail_their_items_and_a_retry_runs_them_as_tasks(
    rig: ProviderRig, mock_llm: RunningMock
) -> None:
    batch_id = rig.submit(
        [{"prompt": "ok 0"}, {"prompt": "[mock:batch-fail] 1"}, {"prompt": "ok 2"}], mode="provider"
    )["batch_id"]
    rig.settle(batch_id)
    batch = rig.batch(batch_id)
    assert batch.status is BatchStatus.COMPLETED_WITH_ERRORS
    results = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"]
    assert [r["status"] for r in results] == ["completed", "failed", "completed"]
    assert results[1]["error_code"] == "llm_http_500"
    # The retry runs the failed item as an ordinary task, on its lane.
    reply = rig.api.call("POST", f"/batches/{batch_id}/retry")
    assert reply["statusCode"] == 202, reply
    rig.fan_out()
    assert rig.run_items() == 1
    assert mock_llm.stats.calls == 1
    rig.count(rig.stream())
    # (The mock's batch-fail mark fails a job's line only: the on-demand call answers.)
    assert rig.batch(batch_id).status is BatchStatus.COMPLETED
    retried = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"][1]
    assert (retried["status"], retried["result"]) == ("completed", reply_text("[mock:batch-fail] 1"))


def test_lines_the_window_closed_on_fail_expired(rig: ProviderRig, mock_llm: RunningMock) -> None:
    mock_llm.configure(batch_delay_s=60, batch_expire_s=0.3)
    batch_id = rig.submit(items(4), mode="provider")["batch_id"]
    rig.settle(batch_id)
    results = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"]
    assert {r["error_code"] for r in results} == {"expired"}
    assert rig.batch(batch_id).failed == 4


def test_a_cancel_cancels_the_jobs_and_their_unrun_items(rig: ProviderRig, mock_llm: RunningMock) -> None:
    mock_llm.configure(batch_delay_s=60)
    batch_id = rig.submit(items(6), mode="provider")["batch_id"]
    rig.fan_out()
    reply = rig.api.call("POST", f"/batches/{batch_id}/cancel")
    assert reply["statusCode"] == 200, reply
    rig.settle(batch_id)
    batch = rig.batch(batch_id)
    assert batch.status is BatchStatus.CANCELLED
    assert counters(batch) == rig.full_count(batch)
    assert batch.cancelled == 6
    assert {job["status"] for job in rig.provider_jobs(batch_id)} == {"cancelled"}


def test_a_provider_batch_is_refused_where_the_provider_has_no_batch_api(
    aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock
) -> None:
    rig = ProviderRig(aws, handler, settings.model_copy(update={"llm_provider": "bedrock"}), mock_llm)
    reply = rig.api.call("POST", "/batches", {"items": items(2), "mode": "provider"})
    assert reply["statusCode"] == 422
    assert "no batch API" in reply["json"]["detail"]


def test_an_item_naming_an_uploaded_file_is_refused_in_a_provider_batch(rig: ProviderRig) -> None:
    def item(file_id: str) -> dict[str, Any]:
        part = {"type": "image_url", "image_url": {"file_id": file_id}}
        return {"messages": [{"role": "user", "content": [part]}]}

    # A file the tenant has is still no line of a provider's job: 422, saying so
    uploaded = upload_file(rig, PNG, "vision")["json"]["id"]
    reply = rig.api.call("POST", "/batches", {"items": [item(uploaded)], "mode": "provider"})
    assert reply["statusCode"] == 422
    assert "uploaded files" in reply["json"]["detail"]
    # One it does not have is a 404, as in any batch
    unknown = rig.api.call("POST", "/batches", {"items": [item("file-" + "0" * 32)], "mode": "provider"})
    assert unknown["statusCode"] == 404


def test_v1_batches_takes_the_mode_and_answers_in_openai_s_files(rig: ProviderRig) -> None:
    request = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}
    data = b"".join(
        json.dumps(
            {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": request}
        ).encode()
        + b"\n"
        for i in range(6)
    )
    rig.service.put_file("default", "file-" + "b" * 32, data, filename="in.jsonl", purpose="batch")
    created = rig.api.call(
        "POST",
        "/v1/batches",
        {
            "input_file_id": "file-" + "b" * 32,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "mode": "provider",
        },
    )
    assert created["statusCode"] == 200, created
    batch_id = created["json"]["id"].removeprefix("batch_")
    assert rig.batch(batch_id).mode == "provider"
    rig.settle(batch_id)
    assert len(rig.provider_jobs(batch_id)) == 2  # 6 lines, 4 a chunk
    ended = rig.api.call("GET", f"/v1/batches/batch_{batch_id}")["json"]
    assert (ended["status"], ended["request_counts"]) == (
        "completed",
        {"total": 6, "completed": 6, "failed": 0},
    )
    output = rig.api.call("GET", f"/v1/files/{ended['output_file_id']}/content")
    body = base64.b64decode(output["body"]) if output.get("isBase64Encoded") else output["body"].encode()
    assert [json.loads(line)["custom_id"] for line in body.splitlines()] == [f"r{i}" for i in range(6)]
    assert rig.mock.stats.calls == 0


def test_get_counts_the_provider_s_progress_while_the_job_runs(
    rig: ProviderRig, mock_llm: RunningMock
) -> None:
    mock_llm.configure(batch_delay_s=4)
    batch_id = rig.submit(items(4), mode="provider")["batch_id"]
    rig.fan_out()
    rig.count(rig.stream())

    def looked() -> dict[str, Any]:
        rig.fanout.handle(rig.looks.delays[-1][0], sent_at=time.time())
        return dict(rig.api.call("GET", f"/batches/{batch_id}")["json"])

    view = eventually(looked, lambda v: v["completed"] > 0, timeout_s=20, what="a count from the provider")
    exact = rig.batch(batch_id)
    assert exact.completed == 0  # no item has ended: the count is the provider's
    assert view["status"] == "processing"
    assert view["completed"] + view["failed"] + view["processing"] == 4
    rig.settle(batch_id)
    assert rig.api.call("GET", f"/batches/{batch_id}")["json"]["completed"] == 4


def test_a_job_the_provider_fails_whole_fails_its_items_with_why(
    rig: ProviderRig, mock_llm: RunningMock
) -> None:
    mock_llm.configure(batch_delay_s=0.6, batch_max_requests=2)  # the mock refuses 4 lines a job
    batch_id = rig.submit(items(4), mode="provider")["batch_id"]
    rig.settle(batch_id)
    results = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"]
    assert {r["error_code"] for r in results} == {"provider_batch_failed"}
    assert "The provider's batch job failed" in results[0]["error"]
    assert rig.batch(batch_id).status is BatchStatus.COMPLETED_WITH_ERRORS


def test_a_line_past_the_provider_s_bytes_fails_alone_and_the_rest_run(
    aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock
) -> None:
    mock_llm.configure(batch_delay_s=0.6)
    overrides = {"provider_batch_chunk_size": CHUNK, "provider_batch_look_s": 0.0}
    # A provider whose jobs hold 1,000 bytes.
    limits = BatchLimits(max_requests=100, max_bytes=1000)
    rig = ProviderRig(aws, handler, settings.model_copy(update=overrides), mock_llm, limits)
    big = {"prompt": "x" * 2000, "custom_id": "big"}
    batch_id = rig.submit([*items(2), big], mode="provider")["batch_id"]
    rig.settle(batch_id)
    results = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"]
    assert [(r["custom_id"], r["status"]) for r in results] == [
        ("c0", "completed"),
        ("c1", "completed"),
        ("big", "failed"),
    ]
    assert results[2]["error_code"] == "provider_batch_failed"
    assert len(rig.provider_jobs(batch_id)) == 1  # the big line's job was never sent


def test_a_look_the_provider_does_not_answer_comes_again_after_its_backoff(
    rig: ProviderRig, settings: Settings
) -> None:
    batch_id = rig.submit(items(2), mode="provider")["batch_id"]
    rig.fan_out()
    [(pending, _)] = rig.looks.delays
    unreachable = ProviderBatches(
        rig.settings,
        rig.store,
        rig.jobs_store,
        OpenAIBatchJobs(LlmEndpoint("http://127.0.0.1:9/v1", "sk-batch"), timeout_s=2),
        rig.looks,
        blobs(settings),
    )
    batch = rig.batch(batch_id)
    unreachable.look(batch, pending, list(enumerate(read_chunk(blobs(settings), batch, 0))))
    assert [message for message, _ in rig.looks.delays] == [pending, pending]  # the same look again
    job = rig.jobs_store.get(batch_id, 0, 0)
    assert job is not None
    assert (job.phase, job.looks) == ("running", 0)
    rig.settle(batch_id)  # and it goes on once the provider answers
    assert rig.batch(batch_id).completed == 2


def test_an_ended_job_s_results_end_their_items_a_page_a_look(
    aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock
) -> None:
    mock_llm.configure(batch_delay_s=0.6, rate_batch_fail=0.0)
    overrides = {"provider_batch_chunk_size": CHUNK, "provider_batch_look_s": 0.0}
    rig = ProviderRig(aws, handler, settings.model_copy(update=overrides), mock_llm, page=3)
    batch_id = rig.submit(items(4), mode="provider")["batch_id"]
    rig.settle(batch_id)
    pages = [message.offset for message, _ in rig.looks.delays if message.offset]
    assert pages == [3]  # 4 results: 3, then the last one in the next look
    assert rig.batch(batch_id).completed == 4


def test_a_job_short_of_the_provider_s_fewest_records_is_padded_and_its_pads_ignored(
    aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock
) -> None:
    mock_llm.configure(batch_delay_s=0.6, rate_batch_fail=0.0)
    overrides = {"provider_batch_chunk_size": CHUNK, "provider_batch_look_s": 0.0}
    limits = BatchLimits(max_requests=100, max_bytes=1_000_000, min_records=5)  # as Bedrock's 100
    rig = ProviderRig(aws, handler, settings.model_copy(update=overrides), mock_llm, limits)
    batch_id = rig.submit(items(2), mode="provider")["batch_id"]
    rig.settle(batch_id)
    [job] = rig.provider_jobs(batch_id)
    assert job["request_counts"]["total"] == 5  # two items and three copies of the first
    results = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"]
    assert [(r["custom_id"], r["result"]) for r in results] == [
        ("c0", reply_text("item 0")),
        ("c1", reply_text("item 1")),
    ]
    assert rig.batch(batch_id).completed == 2


def test_a_batch_cancelled_before_its_fan_out_sends_no_job(rig: ProviderRig) -> None:
    batch_id = rig.submit(items(6), mode="provider")["batch_id"]
    assert rig.api.call("POST", f"/batches/{batch_id}/cancel")["statusCode"] == 200
    rig.settle(batch_id)
    batch = rig.batch(batch_id)
    assert (batch.status, batch.cancelled) == (BatchStatus.CANCELLED, 6)
    assert rig.provider_jobs(batch_id) == []


def test_a_job_the_provider_no_longer_has_fails_its_items(rig: ProviderRig) -> None:
    batch_id = rig.submit(items(2), mode="provider")["batch_id"]
    rig.fan_out()
    [(pending, _)] = rig.looks.delays
    # The provider forgot the job (deleted there, past its retention).
    rig.aws.dynamodb.update_item(
        TableName=rig.settings.tasks_table_name,
        Key=job_key(batch_id, 0, 0),
        UpdateExpression="SET job_id = :gone",
        ExpressionAttributeValues={":gone": {"S": "batch_" + "0" * 32}},
    )
    rig.fanout.handle(pending, sent_at=time.time())
    rig.count(rig.stream())
    results = rig.api.call("GET", f"/batches/{batch_id}/results")["json"]["data"]
    assert [(r["status"], r["error_code"]) for r in results] == [("failed", "provider_batch_failed")] * 2
    job = rig.jobs_store.get(batch_id, 0, 0)
    assert job is not None
    assert job.phase == "ended"
    assert rig.batch(batch_id).status is BatchStatus.COMPLETED_WITH_ERRORS


def test_the_provider_s_webhook_of_a_job_s_end_sends_its_look_at_once(
    rig: ProviderRig, aws: Aws, handler: Any, settings: Settings
) -> None:
    secret = settings.model_copy(update={"openai_webhook_secret": SECRET})
    # SubmitFunction's task service, wired as wiring/api.py wires it.
    service = TaskService(
        secret,
        TaskStore(secret.tasks_table_name, aws.dynamodb),
        task_lanes(secret, aws.sqs),
        results=blobs(secret),
        job_ended=JobEnds(rig.jobs_store, rig.looks).ended,
    )
    api = Api(aws, handler, service)
    batch_id = rig.submit(items(2), mode="provider")["batch_id"]
    rig.fan_out()
    job = rig.jobs_store.get(batch_id, 0, 0)
    assert job is not None
    assert job.job_id is not None
    event = completed_event(job.job_id) | {"type": "batch.completed"}
    payload, headers = signed(event)
    taken = api.call("POST", "/provider-webhooks/openai", raw=payload, headers=headers)
    assert (taken["statusCode"], taken["json"]) == (200, {"woken": True})
    [first, (now, delay)] = rig.looks.delays
    assert (now.looks, delay, now.chunk, now.part) == (first[0].looks, 0, 0, 0)  # a copy, undelayed
    payload, headers = signed(completed_event("batch_unknown") | {"type": "batch.completed"})
    assert api.call("POST", "/provider-webhooks/openai", raw=payload, headers=headers)["json"] == {
        "woken": False
    }
    rig.settle(batch_id)
    assert rig.batch(batch_id).completed == 2
