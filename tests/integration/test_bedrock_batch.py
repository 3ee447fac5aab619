"""Bedrock batch inference on the local stack's AWS endpoint (moto_patches/bedrock_batch.py),
through boto3's `bedrock` client, and llm/bedrock_batch.py's jobs end to end against it.

Two moto servers of their own, as the local stack embeds it: one whose records all succeed, one
that fails a tenth of them (LLMTASKS_BEDROCK_BATCH_ERROR_RATE); both end a job one second after
its submit (LLMTASKS_BEDROCK_BATCH_DELAY_S)."""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import JsonSchemaFormat, LLMRequest
from llmtasks.domain.messages import Completion
from llmtasks.llm.batch_jobs import JobState, JobStatus
from llmtasks.llm.bedrock_batch import (
    BEDROCK_BATCH_LIMITS,
    PREFIX,
    BedrockBatchJobs,
    job_name,
    job_parts,
    record_id,
)
from llmtasks_local.emulator.processes import stop
from llmtasks_local.moto_patches import bedrock_batch as emulator_patterns
from llmtasks_local.moto_patches import bedrock_batch_run as emulator
from tests.helpers import HANG_S, local_client, moto_endpoint
from tests.integration.test_durable_state import Endpoint

pytestmark = pytest.mark.integration
ROLE = "arn:aws:iam::123456789012:role/llmtasks-bedrock-batch"
MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
ERROR_RATE = 0.1


@pytest.fixture(scope="module")
def endpoints() -> Iterator[dict[str, str]]:
    """A server whose records succeed, and one that fails ERROR_RATE of them."""
    saved = {name: os.environ.get(name) for name in (emulator.DELAY_VARIABLE, emulator.ERROR_RATE_VARIABLE)}
    os.environ[emulator.DELAY_VARIABLE] = "1"
    try:
        os.environ[emulator.ERROR_RATE_VARIABLE] = "0"
        with moto_endpoint() as plain:
            os.environ[emulator.ERROR_RATE_VARIABLE] = str(ERROR_RATE)
            with moto_endpoint() as failing:
                yield {"plain": plain, "failing": failing}
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Stack:
    def __init__(self, url: str) -> None:
        options = {"endpoint_url": url, "region_name": "us-east-1"}
        options |= {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        self.bedrock = boto3.client("bedrock", **options)
        self.s3 = boto3.client("s3", **options)
        self.bucket = f"results-{uuid.uuid4().hex[:10]}"
        self.s3.create_bucket(Bucket=self.bucket)

    def put_records(self, key: str, records: list[dict[str, Any]]) -> str:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body="\n".join(json.dumps(r) for r in records))
        return f"s3://{self.bucket}/{key}"

    def create(self, input_uri: str, **fields: Any) -> str:
        request = {
            "jobName": f"job-{uuid.uuid4().hex[:8]}",
            "roleArn": ROLE,
            "modelId": MODEL,
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": input_uri}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": f"s3://{self.bucket}/out/"}},
        }
        arn: str = self.bedrock.create_model_invocation_job(**(request | fields))["jobArn"]
        return arn

    def wait(self, arn: str, *, until: frozenset[str] = emulator.ENDED) -> tuple[dict[str, Any], list[str]]:
        """The job once its status is in `until`, and every status seen on the way."""
        seen: list[str] = []
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            job: dict[str, Any] = self.bedrock.get_model_invocation_job(jobIdentifier=arn)
            if not seen or seen[-1] != job["status"]:
                seen.append(job["status"])
            if job["status"] in until:
                return job, seen
            time.sleep(0.05)
        raise AssertionError(f"job {arn} still {seen[-1]}")

    def lines(self, key: str) -> list[dict[str, Any]]:
        body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()
        return [json.loads(line) for line in body.splitlines()]

    def keys(self, prefix: str) -> list[str]:
        return sorted(
            o["Key"] for o in self.s3.list_objects_v2(Bucket=self.bucket, Prefix=prefix).get("Contents", [])
        )


def converse_records(count: int, text: str = "item") -> list[dict[str, Any]]:
    return [
        {
            "recordId": f"CALL{n:07d}",
            "modelInput": {"messages": [{"role": "user", "content": [{"text": f"{text} {n}"}]}]},
        }
        for n in range(count)
    ]


@pytest.fixture
def plain(endpoints: dict[str, str]) -> Stack:
    return Stack(endpoints["plain"])


@pytest.fixture
def failing(endpoints: dict[str, str]) -> Stack:
    return Stack(endpoints["failing"])


# --- the control plane, as boto3 sees it ------------------------------------------------------


def test_a_converse_job_runs_through_its_statuses_and_writes_bedrock_s_output(plain: Stack) -> None:
    uri = plain.put_records("in/calls.jsonl", converse_records(100))

    arn = plain.create(uri, modelInvocationType="Converse")
    job, seen = plain.wait(arn)

    assert seen[0] == "Submitted"
    assert seen[-1] == "Completed"
    assert "InProgress" in seen
    assert seen.index("InProgress") < seen.index("Completed")
    assert job["totalRecordCount"] == job["successRecordCount"] == 100
    assert job["errorRecordCount"] == 0
    assert job["modelInvocationType"] == "Converse"
    assert job["endTime"] >= job["submitTime"]
    job_id = arn.rsplit("/", 1)[1]
    assert plain.keys("out/") == [f"out/{job_id}/calls.jsonl.out", f"out/{job_id}/manifest.json.out"]
    lines = plain.lines(f"out/{job_id}/calls.jsonl.out")
    assert [line["recordId"] for line in lines] == [f"CALL{n:07d}" for n in range(100)]
    first = lines[0]
    assert first["modelInput"] == converse_records(1)[0]["modelInput"]
    assert first["modelOutput"]["output"]["message"]["content"][0]["text"].endswith("item 0")
    assert first["modelOutput"]["stopReason"] == "end_turn"
    manifest = json.loads(
        plain.s3.get_object(Bucket=plain.bucket, Key=f"out/{job_id}/manifest.json.out")["Body"].read()
    )
    assert (
        manifest["totalRecordCount"]
        == manifest["processedRecordCount"]
        == manifest["successRecordCount"]
        == 100
    )
    assert manifest["inputTokenCount"] > 0
    assert manifest["outputTokenCount"] > 0


def test_an_invoke_model_job_answers_claude_s_native_body_and_a_marked_record_fails(plain: Stack) -> None:
    records = [
        {
            "recordId": f"R{n:010d}",
            "modelInput": {
                "anthropic_version": "bedrock-2023-05-31",
                "max_tokens": 64,
                "messages": [
                    {"role": "user", "content": "fail me [mock:batch-error]" if n == 7 else f"hi {n}"}
                ],
            },
        }
        for n in range(100)
    ]
    uri = plain.put_records("claude/in.jsonl", records)

    arn = plain.create(uri)  # InvokeModel, the default type
    job, _ = plain.wait(arn)

    assert job["status"] == "PartiallyCompleted"
    assert job["errorRecordCount"] == 1
    assert job["successRecordCount"] == 99
    lines = plain.lines(f"out/{arn.rsplit('/', 1)[1]}/in.jsonl.out")
    answer = lines[0]["modelOutput"]
    assert answer["type"] == "message"
    assert answer["role"] == "assistant"
    assert answer["stop_reason"] == "end_turn"
    assert answer["content"][0]["type"] == "text"
    assert answer["content"][0]["text"].endswith("hi 0")
    assert answer["usage"]["input_tokens"] > 0
    assert lines[7]["error"]["errorCode"] == 500
    assert "modelOutput" not in lines[7]


def test_the_same_client_request_token_returns_the_same_job(plain: Stack) -> None:
    uri = plain.put_records("token/in.jsonl", converse_records(100))

    first = plain.create(uri, clientRequestToken="batch-42")
    again = plain.create(uri, clientRequestToken="batch-42", jobName="another-name")
    other = plain.create(uri, clientRequestToken="batch-43")

    assert first == again != other
    named = plain.bedrock.list_model_invocation_jobs(nameContains=job_name_of(plain, first))[
        "invocationJobSummaries"
    ]
    assert [job["jobArn"] for job in named] == [first]


def job_name_of(stack: Stack, arn: str) -> str:
    name: str = stack.bedrock.get_model_invocation_job(jobIdentifier=arn)["jobName"]
    return name


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"roleArn": "my-role"}, "roleArn"),
        ({"roleArn": "arn:aws:iam::123456789012:user/me"}, "roleArn"),
        ({"outputDataConfig": {"s3OutputDataConfig": {"s3Uri": "https://bucket/out"}}}, "s3Uri"),
        ({"inputDataConfig": {"s3InputDataConfig": {"s3Uri": "s3://Upper_Case/in.jsonl"}}}, "s3Uri"),
        ({"jobName": "no spaces allowed"}, "jobName"),
        ({"timeoutDurationInHours": 200}, "timeoutDurationInHours"),
        ({"clientRequestToken": "under_score"}, "clientRequestToken"),
    ],
)
def test_a_create_aws_would_refuse_is_a_validation_exception(
    plain: Stack, fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(ClientError) as refused:
        plain.create(f"s3://{plain.bucket}/in.jsonl", **fields)

    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert named in refused.value.response["Error"]["Message"]


def test_a_job_below_the_minimum_records_fails_in_validation_with_the_reason(plain: Stack) -> None:
    uri = plain.put_records("few/in.jsonl", converse_records(emulator.MIN_RECORDS_PER_JOB - 1))

    job, seen = plain.wait(plain.create(uri, modelInvocationType="Converse"))

    # Validating shows for a tenth of the delay: a slow poll may miss it, never see it after.
    assert seen[-1] == "Failed"
    assert set(seen[:-1]) <= {"Submitted", "Validating"}
    assert f"at least {emulator.MIN_RECORDS_PER_JOB} records" in job["message"]
    assert plain.keys("out/") == []


def test_an_unknown_job_is_not_found(plain: Stack) -> None:
    with pytest.raises(ClientError) as missing:
        plain.bedrock.get_model_invocation_job(jobIdentifier="abcdefabcdef")

    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_stop_moves_a_running_job_to_stopping_then_stopped_and_nothing_is_written(plain: Stack) -> None:
    uri = plain.put_records("stop/in.jsonl", converse_records(100))
    arn = plain.create(uri, modelInvocationType="Converse")

    plain.bedrock.stop_model_invocation_job(jobIdentifier=arn)
    stopping = plain.bedrock.get_model_invocation_job(jobIdentifier=arn)["status"]
    job, _ = plain.wait(arn)

    assert stopping == "Stopping"
    assert job["status"] == "Stopped"
    with pytest.raises(ClientError) as again:
        plain.bedrock.stop_model_invocation_job(jobIdentifier=arn)
    assert again.value.response["Error"]["Code"] == "ValidationException"
    time.sleep(1.2)  # past the job's delay: still nothing written
    assert plain.keys(f"out/{arn.rsplit('/', 1)[1]}/") == []


def test_list_filters_by_status_and_name_newest_first(plain: Stack) -> None:
    uri = plain.put_records("list/in.jsonl", converse_records(100))
    tag = uuid.uuid4().hex[:8]
    older = plain.create(uri, jobName=f"{tag}-a")
    newer = plain.create(uri, jobName=f"{tag}-b")
    plain.bedrock.stop_model_invocation_job(jobIdentifier=older)
    plain.wait(older)

    named = plain.bedrock.list_model_invocation_jobs(nameContains=tag)["invocationJobSummaries"]
    stopped = plain.bedrock.list_model_invocation_jobs(nameContains=tag, statusEquals="Stopped")
    page = plain.bedrock.list_model_invocation_jobs(nameContains=tag, maxResults=1)

    assert [job["jobArn"] for job in named] == [newer, older]
    assert [job["jobArn"] for job in stopped["invocationJobSummaries"]] == [older]
    assert [job["jobArn"] for job in page["invocationJobSummaries"]] == [newer]
    assert "nextToken" in page
    rest = plain.bedrock.list_model_invocation_jobs(
        nameContains=tag, maxResults=1, nextToken=page["nextToken"]
    )
    assert [job["jobArn"] for job in rest["invocationJobSummaries"]] == [older]


# --- llm/bedrock_batch.py against it ------------------------------------------------------------


def jobs_of(stack: Stack) -> BedrockBatchJobs:
    return BedrockBatchJobs(bedrock=stack.bedrock, s3=stack.s3, bucket=stack.bucket, role_arn=ROLE)


def ended(jobs: BedrockBatchJobs, job_id: str) -> JobStatus:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        status = jobs.look(job_id)
        if status.state.is_ended:
            return status
        time.sleep(0.05)
    raise AssertionError(f"{job_id} did not end")


def drawn(rid: str) -> bool:
    """Whether the failing server's error share takes this record id (its rule, restated)."""
    return int.from_bytes(hashlib.sha256(rid.encode()).digest()[:8], "big") / 2**64 < ERROR_RATE


def test_150_requests_come_back_in_order_with_their_custom_ids_and_the_failed_share(failing: Stack) -> None:
    jobs = jobs_of(failing)
    lines = [(f"item-{n}", LLMRequest(prompt=f"classify document {n}")) for n in range(150)]

    job_id = jobs.submit(MODEL, lines, tag="batch_150")
    early = jobs.look(job_id)
    status = ended(jobs, job_id)
    results = list(jobs.results(status))

    assert early.state in (JobState.PENDING, JobState.PROCESSING)
    expected_failed = {f"item-{n - 1}" for n in range(1, 151) if drawn(record_id(n))}
    assert 0 < len(expected_failed) < 150
    assert status.state is JobState.COMPLETED
    assert status.provider_status == "PartiallyCompleted"
    assert (status.total, status.completed, status.failed) == (
        150,
        150 - len(expected_failed),
        len(expected_failed),
    )
    assert [r.custom_id for r in results] == [custom_id for custom_id, _ in lines]
    failed = {r.custom_id for r in results if isinstance(r.outcome, LLMError)}
    assert failed == expected_failed
    assert all(
        r.outcome.code == "llm_http_500" and r.outcome.transient
        for r in results
        if isinstance(r.outcome, LLMError)
    )
    first = (
        results[0].outcome
        if "item-0" not in failed
        else next(r.outcome for r in results if r.custom_id not in failed)
    )
    assert isinstance(first, Completion)
    assert "classify document" in first.text
    assert first.model == MODEL
    assert first.usage.prompt_tokens > 0
    assert first.finish_reason == "stop"


def test_a_small_job_is_padded_to_bedrock_s_minimum_and_the_padding_is_dropped(plain: Stack) -> None:
    jobs = jobs_of(plain)
    schema = JsonSchemaFormat.model_validate(
        {
            "type": "json_schema",
            "json_schema": {
                "name": "label",
                "schema": {
                    "type": "object",
                    "properties": {"label": {"type": "string", "enum": ["spam", "ham"]}},
                    "required": ["label"],
                },
            },
        }
    )
    lines = [("a", LLMRequest(prompt="first")), ("b", LLMRequest(prompt="second", response_format=schema))]

    job_id = jobs.submit(MODEL, lines, tag="small-batch")
    status = ended(jobs, job_id)
    results = list(jobs.results(status))

    records = plain.lines(f"{PREFIX}/input/small-batch/records.jsonl")
    assert len(records) == BEDROCK_BATCH_LIMITS.min_records
    assert [r["recordId"] for r in records[:3]] == [record_id(1), record_id(2), record_id(1, pad=True)]
    assert "modelId" not in records[0]["modelInput"]
    assert plain.bedrock.get_model_invocation_job(jobIdentifier=job_id)["jobName"] == job_name(
        "small-batch", 98
    )
    assert (status.state, status.total, status.completed, status.failed) == (JobState.COMPLETED, 2, 2, 0)
    assert [r.custom_id for r in results] == ["a", "b"]
    answer = results[1].outcome
    assert isinstance(answer, Completion)
    assert json.loads(answer.text)["label"] in ("spam", "ham")
    assert answer.tool_calls is None


def test_a_submit_sent_again_gets_the_first_job_and_find_returns_it(plain: Stack) -> None:
    jobs = jobs_of(plain)
    lines = [(f"c{n}", LLMRequest(prompt=f"p{n}")) for n in range(3)]

    first = jobs.submit(MODEL, lines, tag="b_redelivered")
    again = jobs.submit(MODEL, lines, tag="b_redelivered")

    assert first == again
    assert jobs.find("b_redelivered") == first
    assert jobs.find("b_never-sent") is None


def test_cancel_stops_the_job_and_it_ends_cancelled_with_no_results(plain: Stack) -> None:
    jobs = jobs_of(plain)
    job_id = jobs.submit(MODEL, [(f"c{n}", LLMRequest(prompt="x")) for n in range(120)], tag="to-cancel")

    jobs.cancel(job_id)
    cancelling = jobs.look(job_id)
    status = ended(jobs, job_id)

    assert cancelling.state is JobState.CANCELLING
    assert status.state is JobState.CANCELLED
    assert status.provider_status == "Stopped"
    assert list(jobs.results(status)) == []


def test_a_job_past_bedrock_s_limits_is_refused_before_anything_is_sent(plain: Stack) -> None:
    jobs = jobs_of(plain)
    jobs.limits = type(BEDROCK_BATCH_LIMITS)(max_requests=3, max_bytes=10_000, min_records=0)

    with pytest.raises(ValueError, match="at most 3 records"):
        jobs.submit(MODEL, [(f"c{n}", LLMRequest(prompt="x")) for n in range(4)], tag="too-many")
    with pytest.raises(ValueError, match="unique"):
        jobs.submit(MODEL, [("same", LLMRequest(prompt="x"))] * 2, tag="twice")

    assert plain.keys(PREFIX) == []


def test_a_batch_past_one_job_s_records_or_bytes_is_cut_in_order_into_jobs_that_fit(plain: Stack) -> None:
    jobs = jobs_of(plain)
    lines = [(f"c{n}", LLMRequest(prompt="x" * (10 if n != 4 else 175))) for n in range(7)]
    short, long = (len(jobs.encode(MODEL, c, r)) for c, r in (lines[0], lines[4]))
    jobs.limits = type(BEDROCK_BATCH_LIMITS)(max_requests=3, max_bytes=short * 3 + 50, min_records=0)

    parts = job_parts(jobs, MODEL, lines)

    # Three short lines fill a job's records; c4's line cannot join c3's within the bytes, nor
    # c5 join c4's.
    assert short + long > jobs.limits.max_bytes >= long
    assert [[c for c, _ in part] for part in parts] == [["c0", "c1", "c2"], ["c3"], ["c4"], ["c5", "c6"]]
    assert [c for part in parts for c, _ in part] == [c for c, _ in lines]
    assert job_parts(jobs, MODEL, lines[:2]) == [lines[:2]]


def test_a_provider_error_of_a_call_is_an_llm_error(plain: Stack) -> None:
    jobs = jobs_of(plain)

    with pytest.raises(LLMError) as missing:
        jobs.look("abcdefabcdef")

    assert missing.value.code == "llm_http_404"
    assert not missing.value.transient


def test_a_job_survives_a_sigkill_of_the_endpoint_and_a_submit_sent_again_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an endpoint on a state dir, whose jobs end 2 s after their submit
    monkeypatch.setenv(emulator.DELAY_VARIABLE, "2")
    monkeypatch.setenv(emulator.ERROR_RATE_VARIABLE, "0")
    endpoint = Endpoint(tmp_path / "state").start()
    try:
        stack = Stack(endpoint.url)
        jobs = jobs_of(stack)
        lines = [(f"doc-{n}", LLMRequest(prompt=f"text {n}")) for n in range(100)]
        job_id = jobs.submit(MODEL, lines, tag="b_survivor")
        assert not jobs.look(job_id).state.is_ended

        # When it is killed while the job waits, and started again
        endpoint.crash()
        endpoint.start()
        bedrock = local_client("bedrock", endpoint.url)
        restarted = BedrockBatchJobs(
            bedrock=bedrock, s3=local_client("s3", endpoint.url), bucket=stack.bucket, role_arn=ROLE
        )

        # Then the job is there, runs on to its end, and a submit sent again gets it
        status = ended(restarted, job_id)
        assert status.state is JobState.COMPLETED
        assert [r.custom_id for r in restarted.results(status)] == [c for c, _ in lines]
        assert restarted.submit(MODEL, lines, tag="b_survivor") == job_id
        listed = bedrock.list_model_invocation_jobs()["invocationJobSummaries"]
        assert [job["jobArn"] for job in listed] == [job_id]
    finally:
        if endpoint.process is not None and endpoint.process.poll() is None:
            stop(endpoint.process)


def test_tags_bedrock_s_name_rules_would_merge_still_name_jobs_of_their_own() -> None:
    tags = ["b_1", "b-1", "b.1", "x" * 80, "x" * 80 + "y", "foo-pad5"]

    names = [job_name(tag, 99) for tag in tags]

    assert len(set(names)) == len(tags)
    assert all(emulator_patterns.JOB_NAME.fullmatch(name) and len(name) <= 63 for name in names)
    assert job_name("foo-pad5") != "foo-pad5"  # never read back as five padding records
