"""Bedrock batch inference (CreateModelInvocationJob, GetModelInvocationJob,
ListModelInvocationJobs, StopModelInvocationJob) for moto, which lacks it (5.2).

`install()` adds the four operations to moto's Bedrock responses, in whatever process runs moto:
a boto3 `bedrock` client pointed at the local stack's AWS endpoint creates, reads, lists and
stops jobs as it would at AWS. The request is checked as AWS checks it (botocore's service
model: name, role ARN, model id and S3 URI patterns, the timeout's range); the same
clientRequestToken returns the job it created before. A job then runs in a thread of the moto
process, against moto's own S3:

- Submitted, then Validating: its input (one `.jsonl` object, or every one under a prefix) is
  read and checked against the quotas below; a failure ends the job Failed with AWS's message;
- Scheduled, InProgress, then after the delay every record is answered by the mock LLM's rules
  (mock_llm/bedrock.py: `[mock:...]` markers work) and written where Bedrock writes, under
  `<output s3Uri>/<job id>/`: `<input file>.out` (each line `recordId`, `modelInput`, and
  `modelOutput` or `error`) and `manifest.json.out`; the job ends Completed, or
  PartiallyCompleted when some records failed;
- StopModelInvocationJob before the end: Stopping, then Stopped, nothing written.

Knobs (environment variables of the process that runs moto, read at each create):
LLMTASKS_BEDROCK_BATCH_DELAY_S, seconds from submit to the output (default 5);
LLMTASKS_BEDROCK_BATCH_ERROR_RATE, the share of records (0 to 1, drawn from each record id, so
the same records fail at each run) answered with an error; a record whose text holds
`[mock:batch-error]` always is. Differences from AWS, by design: no IAM (the role is only
checked for its form), jobs are not kept in the state dir across a restart of the stack.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import string
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from moto.bedrock.models import BedrockBackend
from moto.bedrock.responses import BedrockResponse
from moto.core.exceptions import JsonRESTError
from moto.s3.models import s3_backends
from moto.utilities.utils import get_partition

from llmtasks_local import moto_patches

DELAY_VARIABLE = "LLMTASKS_BEDROCK_BATCH_DELAY_S"
ERROR_RATE_VARIABLE = "LLMTASKS_BEDROCK_BATCH_ERROR_RATE"
ERROR_MARKER = "[mock:batch-error]"
DEFAULT_DELAY_S = 5.0
STOPPING_S = 0.2  # how long a stopped job shows Stopping

# Bedrock's default quotas for batch inference (Service Quotas: per model and account).
MIN_RECORDS_PER_JOB = 100
MAX_RECORDS_PER_FILE = 50_000
MAX_RECORDS_PER_JOB = 50_000
MAX_FILE_BYTES = 1024**3
MAX_JOB_BYTES = 5 * 1024**3

# botocore's service model (bedrock 2023-04-20): the patterns AWS checks a create against.
JOB_NAME = re.compile(r"[a-zA-Z0-9]{1,63}(-*[a-zA-Z0-9\+\-\.]){0,63}")
ROLE_ARN = re.compile(r"arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+")
TOKEN = re.compile(r"[a-zA-Z0-9]{1,256}(-*[a-zA-Z0-9]){0,256}")
S3_URI = re.compile(
    r"s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](?:/[-!_*'().a-z0-9A-Z]+(?:/[-!_*'().a-z0-9A-Z]+)*)?/?"
)
MODEL_ID = re.compile(
    r"(arn:aws(-[^:]+)?:bedrock:[a-z0-9-]{1,20}:.+)|([a-z0-9-]{1,63}[.]{1}[a-z0-9-]{1,63}([.]?[a-z0-9-]{1,63})"
    r"([:][a-z0-9-]{1,63}){0,2})|(([0-9a-zA-Z][_-]?)+)"
)
JOB_IDENTIFIER = re.compile(
    r"((arn:aws(-[^:]+)?:bedrock:[a-z0-9-]{1,20}:[0-9]{12}:model-invocation-job/)?[a-z0-9]{12})"
)
ENDED = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})


class ValidationException(JsonRESTError):
    code = 400

    def __init__(self, message: str) -> None:
        super().__init__("ValidationException", message)


class ResourceNotFoundException(JsonRESTError):
    code = 404

    def __init__(self, message: str) -> None:
        super().__init__("ResourceNotFoundException", message)


@dataclass
class InvocationJob:
    arn: str
    name: str
    model_id: str
    role_arn: str
    input_uri: str
    output_uri: str
    invocation_type: str
    timeout_hours: int
    token: str | None
    delay_s: float
    error_rate: float
    account_id: str
    region: str
    submitted: float = field(default_factory=time.time)
    status: str = "Submitted"
    message: str | None = None
    modified: float = field(default_factory=time.time)
    ended: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def job_id(self) -> str:
        return self.arn.rsplit("/", 1)[1]

    def move(self, status: str, message: str | None = None) -> None:
        self.status, self.modified = status, time.time()
        if message is not None:
            self.message = message
        if status in ENDED:
            self.ended = self.modified

    def view(self) -> dict[str, Any]:
        """The job as GetModelInvocationJob (and a ListModelInvocationJobs summary) shows it."""
        view: dict[str, Any] = {
            "jobArn": self.arn,
            "jobName": self.name,
            "modelId": self.model_id,
            "roleArn": self.role_arn,
            "status": self.status,
            "submitTime": _iso(self.submitted),
            "lastModifiedTime": _iso(self.modified),
            "inputDataConfig": {"s3InputDataConfig": {"s3Uri": self.input_uri, "s3InputFormat": "JSONL"}},
            "outputDataConfig": {"s3OutputDataConfig": {"s3Uri": self.output_uri}},
            "timeoutDurationInHours": self.timeout_hours,
            "jobExpirationTime": _iso(self.submitted + self.timeout_hours * 3600),
            "modelInvocationType": self.invocation_type,
            **self.counts,
        }
        if self.token:
            view["clientRequestToken"] = self.token
        if self.message:
            view["message"] = self.message
        if self.ended is not None:
            view["endTime"] = _iso(self.ended)
        return view


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def _jobs(backend: BedrockBackend) -> dict[str, InvocationJob]:
    jobs: dict[str, InvocationJob] | None = getattr(backend, "_llmtasks_invocation_jobs", None)
    if jobs is None:
        jobs = {}
        backend._llmtasks_invocation_jobs = jobs  # type: ignore[attr-defined]
    return jobs


def _check(value: Any, pattern: re.Pattern[str], name: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValidationException(
            f"1 validation error detected: Value '{value}' at '{name}' failed to satisfy constraint: "
            f"Member must satisfy regular expression pattern: {pattern.pattern}"
        )
    return value


def create_job(backend: BedrockBackend, request: dict[str, Any]) -> InvocationJob:
    jobs = _jobs(backend)
    token = request.get("clientRequestToken")
    if token is not None:
        _check(token, TOKEN, "clientRequestToken")
        for job in jobs.values():
            if job.token == token:
                return job  # AWS: the same token is the same request, answered with its job
    name = _check(request.get("jobName"), JOB_NAME, "jobName")
    role = _check(request.get("roleArn"), ROLE_ARN, "roleArn")
    model = _check(request.get("modelId"), MODEL_ID, "modelId")
    s3_in = (request.get("inputDataConfig") or {}).get("s3InputDataConfig") or {}
    s3_out = (request.get("outputDataConfig") or {}).get("s3OutputDataConfig") or {}
    input_uri = _check(s3_in.get("s3Uri"), S3_URI, "inputDataConfig.s3InputDataConfig.s3Uri")
    output_uri = _check(s3_out.get("s3Uri"), S3_URI, "outputDataConfig.s3OutputDataConfig.s3Uri")
    if s3_in.get("s3InputFormat", "JSONL") != "JSONL":
        raise ValidationException("s3InputFormat must be JSONL")
    hours = request.get("timeoutDurationInHours", 24)
    if not isinstance(hours, int) or not 24 <= hours <= 168:
        raise ValidationException(
            f"1 validation error detected: Value '{hours}' at 'timeoutDurationInHours' failed to satisfy "
            "constraint: Member must have value between 24 and 168"
        )
    kind = request.get("modelInvocationType", "InvokeModel")
    if kind not in ("InvokeModel", "Converse"):
        raise ValidationException(
            f"1 validation error detected: Value '{kind}' at 'modelInvocationType' failed to satisfy "
            "constraint: Member must satisfy enum value set: [InvokeModel, Converse]"
        )
    job_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(12))
    job = InvocationJob(
        arn=f"arn:{get_partition(backend.region_name)}:bedrock:{backend.region_name}:{backend.account_id}"
        f":model-invocation-job/{job_id}",
        name=name,
        model_id=model,
        role_arn=role,
        input_uri=input_uri,
        output_uri=output_uri,
        invocation_type=kind,
        timeout_hours=hours,
        token=token,
        delay_s=float(os.environ.get(DELAY_VARIABLE) or DEFAULT_DELAY_S),
        error_rate=float(os.environ.get(ERROR_RATE_VARIABLE) or 0.0),
        account_id=backend.account_id,
        region=backend.region_name,
    )
    jobs[job.arn] = job
    threading.Thread(target=_Run(job).run, name=f"bedrock-batch-{job_id}", daemon=True).start()
    return job


def get_job(backend: BedrockBackend, identifier: str) -> InvocationJob:
    _check(identifier, JOB_IDENTIFIER, "jobIdentifier")
    for job in _jobs(backend).values():
        if identifier in (job.arn, job.job_id):
            return job
    raise ResourceNotFoundException(f"The specified job {identifier} could not be found.")


def stop_job(backend: BedrockBackend, identifier: str) -> None:
    job = get_job(backend, identifier)
    if job.status in ENDED or job.status == "Stopping":
        raise ValidationException(f"The job {job.arn} is {job.status} and cannot be stopped.")
    job.move("Stopping")
    job.stop.set()


def list_jobs(backend: BedrockBackend, query: dict[str, Any]) -> tuple[list[InvocationJob], str | None]:
    jobs = sorted(
        _jobs(backend).values(), key=lambda j: j.submitted, reverse=query.get("sortOrder") != "Ascending"
    )
    if query.get("statusEquals"):
        jobs = [j for j in jobs if j.status == query["statusEquals"]]
    if query.get("nameContains"):
        jobs = [j for j in jobs if query["nameContains"] in j.name]
    after, before = query.get("submitTimeAfter"), query.get("submitTimeBefore")
    if after is not None:
        jobs = [j for j in jobs if j.submitted > _epoch(after)]
    if before is not None:
        jobs = [j for j in jobs if j.submitted < _epoch(before)]
    start = int(query.get("nextToken") or 0)
    size = int(query.get("maxResults") or 1000)
    page = jobs[start : start + size]
    return page, str(start + size) if start + size < len(jobs) else None


def _epoch(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        return value.timestamp()
    text = str(value)
    try:
        return float(text)
    except ValueError:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class _Run:
    """One job's life in its thread: validation, the wait, the answers, the output files."""

    def __init__(self, job: InvocationJob) -> None:
        self.job = job
        self.s3 = s3_backends[job.account_id][get_partition(job.region)]

    def run(self) -> None:
        job = self.job
        if self._waits(0.1):
            return
        job.move("Validating")
        try:
            files = self._inputs()
        except ValueError as failed:
            job.move("Failed", str(failed))
            return
        total = sum(len(records) for _, records in files)
        job.counts = {"totalRecordCount": total, "processedRecordCount": 0}
        for status, share in (("Scheduled", 0.2), ("InProgress", 0.3)):
            if self._waits(share):
                return
            job.move(status)
        if self._waits(1.0):
            return
        summary = {"totalRecordCount": total, "processedRecordCount": 0, "successRecordCount": 0}
        summary |= {"errorRecordCount": 0, "inputTokenCount": 0, "outputTokenCount": 0}
        for key, records in files:
            lines = [json.dumps(self._answer(record, summary)) for record in records]
            self._put(f"{key.rsplit('/', 1)[-1]}.out", "\n".join(lines) + "\n")
        self._put("manifest.json.out", json.dumps(summary))
        job.counts = {name: summary[name] for name in ("totalRecordCount", "processedRecordCount")}
        job.counts |= {
            "successRecordCount": summary["successRecordCount"],
            "errorRecordCount": summary["errorRecordCount"],
        }
        job.move("PartiallyCompleted" if summary["errorRecordCount"] else "Completed")

    def _waits(self, share: float) -> bool:
        """Waits until `share` of the delay has passed since the submit; True when the job was
        stopped meanwhile (it is then Stopped)."""
        due = self.job.submitted + share * self.job.delay_s
        if self.job.stop.wait(max(0.0, due - time.time())):
            time.sleep(STOPPING_S)
            self.job.move("Stopped")
            return True
        return False

    def _inputs(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """Each input file's key and records, or ValueError with the reason the job fails."""
        bucket_name, _, prefix = self.job.input_uri.removeprefix("s3://").partition("/")
        try:
            bucket = self.s3.get_bucket(bucket_name)
        except Exception as missing:
            raise ValueError(f"Unable to access the S3 bucket {bucket_name}.") from missing
        keys = sorted(
            k for k in bucket.keys if k == prefix or (k.startswith(prefix) and k.endswith(".jsonl"))
        )
        if not keys:
            raise ValueError(f"No .jsonl file found at {self.job.input_uri}.")
        files, size = [], 0
        for key in keys:
            data = bytes(bucket.keys[key].value)
            size += len(data)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError(
                    f"The input file {key} exceeds the maximum file size of {MAX_FILE_BYTES} bytes."
                )
            records = [
                self._record(line, key, n)
                for n, line in enumerate(data.decode().splitlines(), 1)
                if line.strip()
            ]
            if len(records) > MAX_RECORDS_PER_FILE:
                raise ValueError(
                    f"The input file {key} has {len(records)} records: at most"
                    f" {MAX_RECORDS_PER_FILE} are allowed per file."
                )
            files.append((key, records))
        total = sum(len(records) for _, records in files)
        if total < MIN_RECORDS_PER_JOB:
            raise ValueError(
                f"The job has {total} records; a batch inference job needs at least"
                f" {MIN_RECORDS_PER_JOB} records."
            )
        if total > MAX_RECORDS_PER_JOB:
            raise ValueError(
                f"The job has {total} records: at most {MAX_RECORDS_PER_JOB} are allowed per job."
            )
        if size > MAX_JOB_BYTES:
            raise ValueError(f"The job's input exceeds the maximum job size of {MAX_JOB_BYTES} bytes.")
        return files

    def _record(self, line: str, key: str, number: int) -> dict[str, Any]:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("modelInput"), dict):
            raise ValueError(f"Line {number} of {key} is not a JSON object with a modelInput object.")
        if "recordId" not in record:  # Bedrock names a record that has no id
            record["recordId"] = "".join(
                secrets.choice(string.ascii_uppercase + string.digits) for _ in range(11)
            )
        return record

    def _answer(self, record: dict[str, Any], summary: dict[str, int]) -> dict[str, Any]:
        from llmtasks_local.mock_llm.bedrock import BedrockInputError, claude_answer, converse_answer

        summary["processedRecordCount"] += 1
        line = {"recordId": record["recordId"], "modelInput": record["modelInput"]}
        try:
            if ERROR_MARKER in json.dumps(record["modelInput"]) or self._drawn(str(record["recordId"])):
                raise _ModelError
            if self.job.invocation_type == "Converse":
                output = converse_answer(self.job.model_id, record["modelInput"])
                tokens = output["usage"]["inputTokens"], output["usage"]["outputTokens"]
            elif "anthropic." in self.job.model_id:
                output = claude_answer(self.job.model_id, record["modelInput"])
                tokens = output["usage"]["input_tokens"], output["usage"]["output_tokens"]
            else:
                raise BedrockInputError(
                    "The local emulator answers InvokeModel bodies of Anthropic models only,"
                    f" not {self.job.model_id}."
                )
        except BedrockInputError as refused:
            summary["errorRecordCount"] += 1
            return line | {"error": {"errorCode": 400, "errorMessage": str(refused)}}
        except _ModelError:
            summary["errorRecordCount"] += 1
            return line | {
                "error": {
                    "errorCode": 500,
                    "errorMessage": "The model encountered an error processing the record (mock).",
                }
            }
        summary["successRecordCount"] += 1
        summary["inputTokenCount"] += tokens[0]
        summary["outputTokenCount"] += tokens[1]
        return line | {"modelOutput": output}

    def _drawn(self, record_id: str) -> bool:
        """Whether the error share takes this record: a fixed draw from its id."""
        if self.job.error_rate <= 0:
            return False
        draw = int.from_bytes(hashlib.sha256(record_id.encode()).digest()[:8], "big") / 2**64
        return draw < self.job.error_rate

    def _put(self, name: str, body: str) -> None:
        bucket, _, prefix = self.job.output_uri.removeprefix("s3://").partition("/")
        key = "/".join(part for part in (prefix.rstrip("/"), self.job.job_id, name) if part)
        self.s3.put_object(bucket, key, body.encode())


class _ModelError(Exception):
    """A record the error share (or its marker) fails."""


def _create(self: BedrockResponse) -> str:
    request = {
        name: self._get_param(name)
        for name in (
            "jobName",
            "roleArn",
            "clientRequestToken",
            "modelId",
            "inputDataConfig",
            "outputDataConfig",
            "timeoutDurationInHours",
            "modelInvocationType",
        )
        if self._get_param(name) is not None
    }
    return json.dumps({"jobArn": create_job(self.bedrock_backend, request).arn})


def _get(self: BedrockResponse) -> str:
    return json.dumps(get_job(self.bedrock_backend, self._get_param("jobIdentifier")).view())


def _stop(self: BedrockResponse) -> str:
    stop_job(self.bedrock_backend, self._get_param("jobIdentifier"))
    return json.dumps({})


def _list(self: BedrockResponse) -> str:
    names = (
        "statusEquals",
        "nameContains",
        "submitTimeAfter",
        "submitTimeBefore",
        "maxResults",
        "nextToken",
        "sortOrder",
    )
    page, token = list_jobs(self.bedrock_backend, {name: self._get_param(name) for name in names})
    body: dict[str, Any] = {"invocationJobSummaries": [job.view() for job in page]}
    if token is not None:
        body["nextToken"] = token
    return json.dumps(body)


def install() -> None:
    """Idempotent; must run before moto handles the first request."""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
    BedrockResponse.create_model_invocation_job = _create  # type: ignore[attr-defined]
    BedrockResponse.get_model_invocation_job = _get  # type: ignore[attr-defined]
    BedrockResponse.stop_model_invocation_job = _stop  # type: ignore[attr-defined]
    BedrockResponse.list_model_invocation_jobs = _list  # type: ignore[attr-defined]
