"""A provider's own batch API (OpenAI's Batch API, Bedrock's batch inference) as one protocol.

A job is many requests sent at once and answered within the provider's window (24 hours) at
about half the on-demand price. `BatchJobs.submit` sends the lines and returns the provider's job
id; `look` says where the job stands (`JobStatus`, in the words of llmtasks' own batches);
`results` reads its answers once it has ended; `cancel` asks the provider to stop it. The calls
are synchronous: the batch function that makes them waits on nothing else, and Bedrock's client
is boto3. Each provider's per-job limits are a `BatchLimits` constant here; a batch past them is
split into several jobs by the caller (or padded to `min_records`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Protocol

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion


@dataclass(frozen=True)
class BatchLimits:
    """What one job may hold: requests (lines), bytes of its input file, and the fewest records
    the provider takes (a smaller job is padded by the caller, or refused)."""

    max_requests: int
    max_bytes: int
    min_records: int = 0


# OpenAI: 50,000 requests and 200 MB a batch input file.
OPENAI_BATCH_LIMITS = BatchLimits(max_requests=50_000, max_bytes=200 * 1024 * 1024, min_records=0)


class JobState(StrEnum):
    """A provider job's state, in llmtasks' batch words. Each provider maps its own onto these
    (its word is kept in `JobStatus.provider_status`)."""

    PENDING = "pending"  # accepted, its input being checked or waiting its turn
    PROCESSING = "processing"  # requests running, or their results being written
    COMPLETED = "completed"  # ended; every request answered or failed, results readable
    FAILED = "failed"  # the job failed whole (its input refused, ...): `error` says why, no results
    EXPIRED = "expired"  # the window ended first: results of the requests that ran are readable
    CANCELLING = "cancelling"  # cancel asked; requests under way finish
    CANCELLED = "cancelled"  # stopped: results of the requests that ran are readable

    @property
    def is_ended(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.EXPIRED, JobState.CANCELLED)

    @property
    def has_results(self) -> bool:
        """Whether `results` has anything to read (a job that failed whole has not)."""
        return self in (JobState.COMPLETED, JobState.EXPIRED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobStatus:
    """One look at a job. The counts are the provider's while it runs (0 before it has counted
    the input); exact ones come from `results`. `output_ref` and `error_ref` are where its results
    are, in the provider's terms (OpenAI: the output and error file ids; Bedrock: the output's S3
    URI, errors in the same files); `results` reads them."""

    job_id: str
    state: JobState
    provider_status: str
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_ref: str | None = None
    error_ref: str | None = None
    error: str | None = None  # why a FAILED job failed, in the provider's words


class JobResult(NamedTuple):
    """One request's outcome, by the `custom_id` it was sent with: its completion, or the error
    it ended with, an `LLMError` whose `code` says why: `llm_http_<status>` for the provider's
    answer to it (transient as a single call's would be), `llm_batch_expired` for one the window
    closed on (transient: worth a retry), `llm_batch_<code>` for the provider's other reasons. A
    request that never ran (the job was cancelled first) may be absent: compare with what was sent."""

    custom_id: str
    outcome: Completion | LLMError


class BatchJobs(Protocol):
    """A provider's batch API. Errors of the calls themselves (the provider unreachable, a 4xx)
    raise `LLMError` as a provider's single calls do; a job past `limits` raises ValueError
    before anything is sent."""

    limits: BatchLimits

    def encode(self, model: str, custom_id: str, request: LLMRequest) -> bytes:
        """The line the job's input file holds for this request (newline included): what the
        caller sums to keep a job within `limits.max_bytes`."""
        ...

    def submit(self, model: str, lines: Sequence[tuple[str, LLMRequest]], *, tag: str) -> str:
        """Sends the requests (custom_id, request: unique custom_ids) as one job of `model`; the
        provider's job id. `tag` names the job at the provider (OpenAI's metadata, Bedrock's job
        name), so that a job whose id was lost can be found again."""
        ...

    def find(self, tag: str) -> str | None:
        """The id of the newest job submitted with `tag`, if the provider still lists one: what
        a submit that crashed before storing its id looks for before it sends again."""
        ...

    def look(self, job_id: str) -> JobStatus: ...

    def results(self, job: JobStatus) -> Iterator[JobResult]:
        """The answers of an ended job (`job.state.has_results`), in the provider's order."""
        ...

    def cancel(self, job_id: str) -> None:
        """Asks the provider to stop the job; it goes through CANCELLING to CANCELLED."""
        ...
