"""Bedrock batch inference as `BatchJobs`: a job of Converse requests, its files in S3.

A job's requests are written as one JSONL object in the stack's bucket and sent with
CreateModelInvocationJob, `modelInvocationType` Converse: each record's `modelInput` is the
Converse request body llm/bedrock.py builds for a single call (without the model, which the job
names), and each answer's `modelOutput` the Converse response it reads, so a batch takes what a
single call takes, for every model family. Bedrock runs the job as the stack's batch service
role (template.yaml: BedrockBatchRole), which reads the input prefix and writes the output one.

The files, under PREFIX in the bucket, by the job's tag:
- `input/<tag>/records.jsonl`: `{"recordId", "modelInput"}` a line, record ids R0000000001...
  in the order sent (Bedrock's ids are alphanumeric: the callers' custom_ids are not sent);
- `input/<tag>/ids.json`: each record id's custom_id and answer tool, and the model, which
  `results` reads to give each answer its custom_id (Bedrock reads only records.jsonl);
- `output/<tag>/<job id>/records.jsonl.out` and `manifest.json.out`: Bedrock's.

Bedrock refuses a job of fewer than `limits.min_records` records: a smaller job is padded with
one-token requests whose record ids start with P (P0000000001...). They are not in ids.json,
so `results` drops them; their count is in the job name (`-pad<n>`), so that `look` counts
without them. Past `limits` (records or bytes a job) `submit` raises ValueError: the caller
splits. The job name and clientRequestToken are made from the tag: a submit sent again (a crash,
a redelivery) gets the job the first created, never a second one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion
from llmtasks.llm import http_error_code, is_transient_status
from llmtasks.llm.batch_jobs import BatchLimits, JobResult, JobState, JobStatus
from llmtasks.llm.bedrock import answer_tool, converse_completion, converse_request

if TYPE_CHECKING:
    from mypy_boto3_bedrock import BedrockClient
    from mypy_boto3_s3 import S3Client

# Bedrock's default quotas (Service Quotas, per model and account): at least 100 records a job,
# at most 50,000 records a job and a file, 1 GB a file (one file a job here).
BEDROCK_BATCH_LIMITS = BatchLimits(max_requests=50_000, max_bytes=1024**3, min_records=100)
PREFIX = "bedrock-batch"
INVOCATION_TYPE: Literal["Converse"] = "Converse"
PAD_INPUT = {
    "messages": [{"role": "user", "content": [{"text": "Reply OK."}]}],
    "inferenceConfig": {"maxTokens": 1},
}
# Converse request fields a batch record does not carry: the model is the job's.
_NOT_IN_RECORD = ("modelId", "requestMetadata")
# A job name has at most 63 characters: the tag's part leaves room for `-pad<n>` (n < 100).
_TAG_MAX = 56
_PAD_NAME = re.compile(r"-pad(\d+)$")

STATES = {
    "Submitted": JobState.PENDING,
    "Validating": JobState.PENDING,
    "Scheduled": JobState.PENDING,
    "InProgress": JobState.PROCESSING,
    "Completed": JobState.COMPLETED,
    # Bedrock's words: not every record could be processed (in time); the rest have results.
    "PartiallyCompleted": JobState.COMPLETED,
    "Failed": JobState.FAILED,
    "Expired": JobState.EXPIRED,
    "Stopping": JobState.CANCELLING,
    "Stopped": JobState.CANCELLED,
}


def record_id(index: int, *, pad: bool = False) -> str:
    return f"{'P' if pad else 'R'}{index:010d}"


def job_name(tag: str, pads: int = 0) -> str:
    """The job's name (and its files' folder): the tag in the characters Bedrock allows, and when
    they changed or cut it, a digest of the whole tag (two tags never share a job); then the
    padding's count."""
    safe = re.sub(r"[^a-zA-Z0-9-]", "-", tag).strip("-")
    if safe != tag or len(safe) > _TAG_MAX or _PAD_NAME.search(safe):
        safe = f"{safe[: _TAG_MAX - 13]}-{hashlib.sha256(tag.encode()).hexdigest()[:12]}".lstrip("-")
    return safe + (f"-pad{pads}" if pads else "")


class BedrockBatchJobs:
    """`BatchJobs` on Bedrock batch inference; `role_arn` is the service role Bedrock assumes."""

    limits = BEDROCK_BATCH_LIMITS

    def __init__(self, *, bedrock: BedrockClient, s3: S3Client, bucket: str, role_arn: str) -> None:
        self._bedrock = bedrock
        self._s3 = s3
        self._bucket = bucket
        self._role_arn = role_arn

    def encode(self, model: str, custom_id: str, request: LLMRequest) -> bytes:
        return self._line(record_id(0), self._model_input(model, request))

    def submit(self, model: str, lines: Sequence[tuple[str, LLMRequest]], *, tag: str) -> str:
        custom_ids = [custom_id for custom_id, _ in lines]
        if len(set(custom_ids)) != len(custom_ids):
            raise ValueError("The custom_ids of a job must be unique.")
        if len(lines) > self.limits.max_requests:
            raise ValueError(f"A Bedrock batch job takes at most {self.limits.max_requests} records.")
        records: list[bytes] = []
        ids: dict[str, dict[str, Any]] = {}
        for index, (custom_id, request) in enumerate(lines, 1):
            records.append(self._line(record_id(index), self._model_input(model, request)))
            ids[record_id(index)] = {"custom_id": custom_id, "answer": answer_tool(request)}
        pads = max(0, self.limits.min_records - len(lines))
        records += [self._line(record_id(n, pad=True), PAD_INPUT) for n in range(1, pads + 1)]
        body = b"".join(records)
        if len(body) > self.limits.max_bytes:
            raise ValueError(f"A Bedrock batch job's input takes at most {self.limits.max_bytes} bytes.")
        name = job_name(tag, pads)
        folder = job_name(tag)
        with _calls("S3"):
            self._s3.put_object(Bucket=self._bucket, Key=f"{PREFIX}/input/{folder}/records.jsonl", Body=body)
            sidecar = json.dumps({"model": model, "records": ids}).encode()
            self._s3.put_object(Bucket=self._bucket, Key=f"{PREFIX}/input/{folder}/ids.json", Body=sidecar)
        with _calls("Bedrock"):
            created = self._bedrock.create_model_invocation_job(
                jobName=name,
                roleArn=self._role_arn,
                clientRequestToken=hashlib.sha256(name.encode()).hexdigest(),
                modelId=model,
                inputDataConfig={
                    "s3InputDataConfig": {
                        "s3Uri": f"s3://{self._bucket}/{PREFIX}/input/{folder}/records.jsonl"
                    }
                },
                outputDataConfig={
                    "s3OutputDataConfig": {"s3Uri": f"s3://{self._bucket}/{PREFIX}/output/{folder}/"}
                },
                modelInvocationType=INVOCATION_TYPE,
            )
        return created["jobArn"]

    def find(self, tag: str) -> str | None:
        plain = job_name(tag)
        with _calls("Bedrock"):
            listed = self._bedrock.list_model_invocation_jobs(
                nameContains=plain, sortBy="CreationTime", sortOrder="Descending", maxResults=100
            )
        for job in listed.get("invocationJobSummaries", []):
            if job["jobName"] == plain or _PAD_NAME.sub("", job["jobName"]) == plain:
                return job["jobArn"]
        return None

    def look(self, job_id: str) -> JobStatus:
        with _calls("Bedrock"):
            job: Any = self._bedrock.get_model_invocation_job(jobIdentifier=job_id)
        found = _PAD_NAME.search(job.get("jobName", ""))
        pads = int(found.group(1)) if found else 0
        status = job.get("status", "Submitted")
        state = STATES.get(status, JobState.PENDING)
        output = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"].rstrip("/")
        return JobStatus(
            job_id=job["jobArn"],
            state=state,
            provider_status=status,
            total=max(0, int(job.get("totalRecordCount", 0)) - pads),
            completed=max(0, int(job.get("successRecordCount", 0)) - pads),
            failed=int(job.get("errorRecordCount", 0)),
            output_ref=f"{output}/{job['jobArn'].rsplit('/', 1)[-1]}/" if state.has_results else None,
            error=job.get("message") if state is JobState.FAILED else None,
        )

    def results(self, job: JobStatus) -> Iterator[JobResult]:
        """Each sent record's outcome, in the order sent (padding dropped); a record Bedrock
        wrote no line for is absent."""
        if job.output_ref is None:
            return
        bucket, _, output = job.output_ref.removeprefix("s3://").partition("/")
        folder = output.rstrip("/").split("/")[-2]
        with _calls("S3"):
            sidecar = json.loads(self._read(bucket, f"{PREFIX}/input/{folder}/ids.json"))
            listed = self._s3.list_objects_v2(Bucket=bucket, Prefix=output)
            keys = [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".jsonl.out")]
            lines = [line for key in keys for line in self._read(bucket, key).splitlines() if line.strip()]
        ids: dict[str, dict[str, Any]] = sidecar["records"]
        answered: dict[str, dict[str, Any]] = {}
        for line in lines:
            record = json.loads(line)
            if record.get("recordId") in ids:
                answered[record["recordId"]] = record
        for rid in sorted(answered):
            yield JobResult(
                ids[rid]["custom_id"], _outcome(answered[rid], sidecar["model"], ids[rid]["answer"])
            )

    def cancel(self, job_id: str) -> None:
        with _calls("Bedrock"):
            self._bedrock.stop_model_invocation_job(jobIdentifier=job_id)

    def _read(self, bucket: str, key: str) -> str:
        return self._s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()

    def _model_input(self, model: str, request: LLMRequest) -> dict[str, Any]:
        arguments = converse_request(request, model)
        return {name: value for name, value in arguments.items() if name not in _NOT_IN_RECORD}

    def _line(self, rid: str, model_input: dict[str, Any]) -> bytes:
        return (
            json.dumps({"recordId": rid, "modelInput": model_input}, separators=(",", ":")) + "\n"
        ).encode()


def _outcome(record: dict[str, Any], model: str, answer: str | None) -> Completion | LLMError:
    """A record's Completion, or the LLMError Bedrock wrote for it (its errorCode an HTTP status)."""
    if "modelOutput" in record:
        try:
            return converse_completion(record["modelOutput"], model, answer)
        except LLMError as unreadable:
            return unreadable
    written = record.get("error") or {}
    try:
        status = int(written.get("errorCode", 500))
    except (TypeError, ValueError):
        status = 500
    return LLMError(
        f"Bedrock's batch job answered {status}: {str(written.get('errorMessage', ''))[:500]}",
        code=http_error_code(status),
        transient=is_transient_status(status),
    )


@contextmanager
def _calls(service: str) -> Iterator[None]:
    """botocore's errors of a call as LLMError, classified by HTTP status as single calls are."""
    try:
        yield
    except ClientError as exc:
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500))
        raise LLMError(
            f"{service} answered {status} {error.get('Code', '')}: {error.get('Message', '')[:500]}",
            code=http_error_code(status),
            transient=is_transient_status(status),
        ) from exc
    except BotoCoreError as exc:
        raise LLMError(
            f"{service} could not be reached ({type(exc).__name__}).", code="llm_unreachable", transient=True
        ) from exc


def job_parts(
    jobs: BedrockBatchJobs, model: str, lines: Sequence[tuple[str, LLMRequest]]
) -> list[Sequence[tuple[str, LLMRequest]]]:
    """`lines` cut, in order, into the fewest runs that each fit one job's `limits` (records and
    bytes): what a caller submits as several jobs. (A short run's padding, at most 99 one-token
    records, is left out of the bytes; `submit` still refuses a job past them.)"""
    limits = jobs.limits
    parts: list[Sequence[tuple[str, LLMRequest]]] = []
    start, size = 0, 0
    for index, (custom_id, request) in enumerate(lines):
        line = len(jobs.encode(model, custom_id, request))
        if index > start and (index - start >= limits.max_requests or size + line > limits.max_bytes):
            parts.append(lines[start:index])
            start, size = index, 0
        size += line
    parts.append(lines[start:])
    return parts


def bedrock_batch_jobs(*, bucket: str, role_arn: str) -> BedrockBatchJobs:
    """The stack's: its bucket and batch service role, clients from the process's session."""
    from llmtasks.aws.clients import new_client

    return BedrockBatchJobs(
        bedrock=new_client("bedrock"), s3=new_client("s3"), bucket=bucket, role_arn=role_arn
    )
