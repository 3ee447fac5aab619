"""A local Bedrock batch inference job and its run (moto_patches/bedrock_batch.py serves the
API): the job as the API shows it, and the thread that validates its input in moto's S3, waits
out the delay, answers each record with the mock LLM's rules and writes Bedrock's output files.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import string
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from moto.s3.models import s3_backends
from moto.utilities.utils import get_partition

DELAY_VARIABLE = "LLMTASKS_BEDROCK_BATCH_DELAY_S"
ERROR_RATE_VARIABLE = "LLMTASKS_BEDROCK_BATCH_ERROR_RATE"
ERROR_MARKER = "[mock:batch-error]"
DEFAULT_DELAY_S = 5.0
STOPPING_S = 0.5  # how long a stopped job shows Stopping

# Bedrock's default quotas for batch inference (Service Quotas: per model and account).
MIN_RECORDS_PER_JOB = 100
MAX_RECORDS_PER_FILE = 50_000
MAX_RECORDS_PER_JOB = 50_000
MAX_FILE_BYTES = 1024**3
MAX_JOB_BYTES = 5 * 1024**3

ENDED = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})
RUNNING = ("Submitted", "Validating", "Scheduled", "InProgress")
# Each job is kept as a JSON object here, in the endpoint's own S3: the state dir keeps it (and
# its output) across a restart of the stack, and the next Bedrock call picks the job up again.
JOBS_BUCKET = "llmtasks-local-bedrock-jobs"
_KEPT = (
    *("arn", "name", "model_id", "role_arn", "input_uri", "output_uri", "invocation_type"),
    *("timeout_hours", "token", "delay_s", "error_rate", "account_id", "region", "submitted"),
    *("status", "message", "modified", "ended", "counts"),
)


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
        self.keep()

    def keep(self) -> None:
        """Writes the job to JOBS_BUCKET (after each change)."""
        s3 = s3_backends[self.account_id][get_partition(self.region)]
        if JOBS_BUCKET not in s3.buckets:
            s3.create_bucket(JOBS_BUCKET, self.region)
        body = json.dumps({name: getattr(self, name) for name in _KEPT}).encode()
        s3.put_object(JOBS_BUCKET, f"{self.account_id}/{self.region}/{self.job_id}.json", body)

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


def kept_jobs(account_id: str, region: str) -> list[InvocationJob]:
    """The jobs JOBS_BUCKET holds for this account and region (what a restarted endpoint had)."""
    s3 = s3_backends[account_id][get_partition(region)]
    if JOBS_BUCKET not in s3.buckets:
        return []
    bucket = s3.get_bucket(JOBS_BUCKET)
    prefix = f"{account_id}/{region}/"
    return [
        InvocationJob(**json.loads(bytes(bucket.keys[key].value)))
        for key in bucket.keys
        if key.startswith(prefix)
    ]


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


class JobRun:
    """One job's life in its thread: validation, the wait, the answers, the output files."""

    def __init__(self, job: InvocationJob) -> None:
        self.job = job
        self.s3 = s3_backends[job.account_id][get_partition(job.region)]

    def run(self) -> None:
        job = self.job
        if self._waits(0.1):
            return
        self._reach("Validating")
        try:
            files = self._inputs()
        except ValueError as failed:
            if not self._waits(0.2):  # validation takes a while, as at AWS
                job.move("Failed", str(failed))
            return
        total = sum(len(records) for _, records in files)
        job.counts = {"totalRecordCount": total, "processedRecordCount": 0}
        for status, share in (("Scheduled", 0.2), ("InProgress", 0.3)):
            if self._waits(share):
                return
            self._reach(status)
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

    def _reach(self, status: str) -> None:
        """Moves the job on to `status`, never back (a job run on after a restart of the
        endpoint goes through the steps it has passed without showing them again)."""
        if RUNNING.index(status) > RUNNING.index(self.job.status):
            self.job.move(status)

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
