"""A batch run as the provider's own batch jobs (`mode: "provider"`): the rules that need no AWS.

Its items are tasks as a fan-out batch's are (results, counts, retries, budgets, events and the
webhook stay as they are), created in processing with no lease and sent to no lane: each chunk
of the batch becomes one or more provider jobs (`job_parts`: one model a job, within the
provider's per-job limits). A job's identity follows from its batch, chunk and part (`job_tag`),
so a redelivered or crashed chunk finds its job instead of sending a second one. Waiting costs
no compute: a `look` message on BatchFanoutQueue, delayed by SQS (`look_delay`), asks the
provider where each job stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel

from llmtasks.domain.llm_request import LLMRequest

BatchMode = Literal["tasks", "provider"]
JobPhase = Literal["creating", "running", "ended"]

# The providers a stack can send batch jobs to (llm_provider); Bedrock's joins with its client.
BATCH_API_PROVIDERS = frozenset({"openai", "mock"})
# Looks at a running job: the first after LOOK_FIRST_S, each later one LOOK_GROWTH times the
# last, up to SQS's longest delay.
LOOK_FIRST_S = 30
LOOK_GROWTH = 1.5
LOOK_MAX_S = 900
# Results a look ends in one message; the rest go on in the next (delayed by nothing). Each
# page reads the job's results from their start again (the provider's files are streamed, not
# kept), so pages are large: a few minutes of writes at most.
INGEST_PAGE = 2000
# What an item the provider's window closed on fails with: retryable through POST .../retry.
EXPIRED = "expired"
# A job padded to a provider's fewest records repeats its first request under these ids.
PAD_PREFIX = "pad-"


def look_delay(looks: int, first_s: float = LOOK_FIRST_S) -> int:
    """Seconds before look number `looks` (0: the first after the job was sent)."""
    return int(min(LOOK_MAX_S, first_s * LOOK_GROWTH**looks))


def job_tag(batch_id: str, chunk: int, part: int) -> str:
    """The job's name at the provider (OpenAI's metadata, Bedrock's job name: letters, digits and
    hyphens): what a chunk that lost the job's id looks it up by."""
    return f"llmtasks-{batch_id}-{chunk}-{part}"


def item_custom_id(index: int) -> str:
    """An item's custom_id in its job: its place in the batch (the tenant's custom_id may be
    absent; its own stays on the task)."""
    return f"i{index}"


def index_of(custom_id: str) -> int | None:
    """The batch index a job's custom_id names; None for a pad or a line not of this batch."""
    if not custom_id.startswith("i") or not custom_id[1:].isdigit():
        return None
    return int(custom_id[1:])


def provider_refusal(provider: str) -> str | None:
    """Why a stack on `provider` cannot run a provider batch; None when it can."""
    if provider in BATCH_API_PROVIDERS:
        return None
    return (
        f"This stack's provider ({provider}) has no batch API llmtasks can send jobs to:"
        " submit the batch with mode 'tasks'."
    )


def item_refusal(request: LLMRequest) -> str | None:
    """Why one item cannot be a line of a provider's job; None when it can."""
    if request.file_ids():
        return "names uploaded files, which a provider's batch job cannot read: use mode 'tasks'"
    return None


class ProviderJob(BaseModel):
    """One provider job of a batch, as TasksTable keeps it (`pjob#<batch>#<chunk>#<part>`):
    written `creating` before the provider is asked, then with the provider's id (`running`),
    and `ended` once its results are in the items."""

    batch_id: str
    chunk: int
    part: int
    phase: JobPhase = "creating"
    job_id: str | None = None
    looks: int = 0
    # The provider's request counts at the last look (never lower than an earlier one's).
    completed: int = 0
    failed: int = 0
    expires_at: int

    @property
    def tag(self) -> str:
        return job_tag(self.batch_id, self.chunk, self.part)

    @property
    def name(self) -> str:
        """Its key in the batch's `provider_counts`."""
        return f"{self.chunk}-{self.part}"


def job_parts(lines: Sequence[tuple[int, str, int]], *, max_requests: int, max_bytes: int) -> list[list[int]]:
    """The chunk's items (index, model, encoded bytes), in index order, as jobs: one model a
    job (in the order models first appear), each within `max_requests` lines and `max_bytes`.
    The same lines always give the same parts, so a part's number names the same items."""
    by_model: dict[str, list[tuple[int, int]]] = {}
    for index, model, size in lines:
        by_model.setdefault(model, []).append((index, size))
    parts: list[list[int]] = []
    for items in by_model.values():
        current: list[int] = []
        size_so_far = 0
        for index, size in items:
            if current and (len(current) >= max_requests or size_so_far + size > max_bytes):
                parts.append(current)
                current, size_so_far = [], 0
            current.append(index)
            size_so_far += size
        if current:
            parts.append(current)
    return parts


def shown_counts(exact: dict[str, int], total: int, running: dict[str, list[int]] | None) -> dict[str, int]:
    """A provider batch's counts while its jobs run: completed and failed at least the
    providers' request counts summed over the jobs (`running`: job name -> [completed, failed]),
    never below the exact ones. What the providers count past the exact ones is taken from the
    items not ended yet, processing first, then pending (the stream may not have counted an item
    created processing yet), so the counts still add up to `total`."""
    if not running:
        return exact
    room = exact["pending"] + exact["processing"]
    more_completed = max(0, sum(counts[0] for counts in running.values()) - exact["completed"])
    more_failed = max(0, sum(counts[1] for counts in running.values()) - exact["failed"])
    take_completed = min(more_completed, room)
    take_failed = min(more_failed, room - take_completed)
    taken = take_completed + take_failed
    from_processing = min(taken, exact["processing"])
    return exact | {
        "completed": exact["completed"] + take_completed,
        "failed": exact["failed"] + take_failed,
        "processing": exact["processing"] - from_processing,
        "pending": exact["pending"] - (taken - from_processing),
    }
