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
`[mock:batch-error]` always is. Each job is kept as an object of the endpoint's own S3 (bucket
llmtasks-local-bedrock-jobs), so a state dir keeps it across a restart (even a SIGKILL) and the
first Bedrock call after runs it on. Differences from AWS, by design: no IAM (the role is only
checked for its form); that bucket shows in ListBuckets.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import string
import threading
from datetime import datetime
from typing import Any

from moto.bedrock.models import BedrockBackend
from moto.bedrock.responses import BedrockResponse
from moto.core.exceptions import JsonRESTError
from moto.utilities.utils import get_partition

from llmtasks_local import moto_patches
from llmtasks_local.moto_patches.bedrock_batch_run import (
    DEFAULT_DELAY_S,
    DELAY_VARIABLE,
    ENDED,
    ERROR_RATE_VARIABLE,
    InvocationJob,
    JobRun,
    kept_jobs,
)

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


class ValidationException(JsonRESTError):
    code = 400

    def __init__(self, message: str) -> None:
        super().__init__("ValidationException", message)


class ResourceNotFoundException(JsonRESTError):
    code = 404

    def __init__(self, message: str) -> None:
        super().__init__("ResourceNotFoundException", message)


_loading = threading.Lock()


def _jobs(backend: BedrockBackend) -> dict[str, InvocationJob]:
    """The backend's jobs; at the first call of a process, those it kept before a restart, each
    unended one run on from where its times put it (a job Stopping is Stopped)."""
    jobs: dict[str, InvocationJob] | None = getattr(backend, "_llmtasks_invocation_jobs", None)
    if jobs is not None:
        return jobs
    with _loading:
        jobs = getattr(backend, "_llmtasks_invocation_jobs", None)
        if jobs is None:
            jobs = {job.arn: job for job in kept_jobs(backend.account_id, backend.region_name)}
            for job in jobs.values():
                if job.status == "Stopping":
                    job.move("Stopped")
                elif job.status not in ENDED:
                    _start(job)
            backend._llmtasks_invocation_jobs = jobs  # type: ignore[attr-defined]
    return jobs


def _start(job: InvocationJob) -> None:
    threading.Thread(target=JobRun(job).run, name=f"bedrock-batch-{job.job_id}", daemon=True).start()


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
    job.keep()
    _start(job)
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
