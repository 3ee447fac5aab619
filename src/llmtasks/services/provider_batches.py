"""A provider batch's chunks as the provider's batch jobs (BatchFunction, from BatchFanoutQueue).

- `start`: once a chunk's items exist (created processing, with no lease and on no lane, by
  BatchFanout), each of its parts (`job_parts`) becomes one job: its item is written
  `creating`, the job sent with its tag, then its id stored, then its first look sent delayed.
  A copy of the message that finds the id creates nothing; one that finds `creating` without an
  id (its first run died between the provider's answer and the store) asks the provider for the
  job by its tag before it sends one.
- `look`: where the job stands. Running: its request counts stored, the next look sent with a
  longer delay (SQS's, so the wait bills no Lambda time). Ended: its results end the items, a
  page a message (completed with the answer priced at the batch tier, failed with the
  provider's error, `expired` when the window closed on them, cancelled when the job was
  cancelled first); the items' changes move the batch's counts on the stream as any task's do.
- `cancel`: the provider's cancel of each running job, and a look at once; items whose job was
  never sent are cancelled here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from llmtasks.aws.provider_jobs import ProviderJobs
from llmtasks.domain.batches import Batch, BatchItem
from llmtasks.domain.errors import BackendError, LLMError, TaskConflict, TaskNotFound
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion, FanoutMessage
from llmtasks.domain.models import AttemptRecord, Task, TaskStatus
from llmtasks.domain.provider_batches import (
    EXPIRED,
    INGEST_PAGE,
    PAD_PREFIX,
    ProviderJob,
    index_of,
    item_custom_id,
    item_refusal,
    job_parts,
    job_tag,
    look_delay,
)
from llmtasks.domain.rules import Clock
from llmtasks.llm.batch_jobs import BatchJobs, JobResult, JobState, JobStatus
from llmtasks.observability import logger
from llmtasks.services.batch_outcomes import batch_task_id

if TYPE_CHECKING:
    from llmtasks.aws.queues import Queue
    from llmtasks.aws.results import ResultBlobs
    from llmtasks.aws.store import TaskStore
    from llmtasks.settings import FanoutSettings

# The error code of an item whose job failed whole (its input refused, ...), and of one a job
# that ended left without an answer.
JOB_FAILED = "provider_batch_failed"
INGEST_THREADS = 8
NO_ANSWER = "provider_batch_no_answer"


def is_waiting(task: Task) -> bool:
    """An item waiting on its job: processing with no worker's lease, not run again since."""
    return task.status is TaskStatus.PROCESSING and task.lease_id is None and task.retried_at is None


class ProviderBatches:
    def __init__(
        self,
        settings: FanoutSettings,
        store: TaskStore,
        jobs: ProviderJobs,
        provider: BatchJobs,
        queue: Queue,
        results: ResultBlobs,
        *,
        clock: Clock = time.time,
        page: int = INGEST_PAGE,
    ) -> None:
        self._page_size = page  # results a look ends, the rest in the next
        self._settings = settings
        self._store = store
        self._jobs = jobs
        self._provider = provider
        self._queue = queue
        self._results = results
        self._clock = clock

    def _model(self, item: BatchItem) -> str:
        return item.model or self._settings.llm_model

    def _parts(self, items: list[tuple[int, BatchItem]]) -> list[list[int]]:
        """The chunk's jobs: the same every time the chunk is read (its manifest does not change)."""
        limits = self._provider.limits
        lines = [(index, self._model(item), len(self._encode(index, item))) for index, item in items]
        return job_parts(lines, max_requests=limits.max_requests, max_bytes=limits.max_bytes)

    def _encode(self, index: int, item: BatchItem) -> bytes:
        return self._provider.encode(self._model(item), item_custom_id(index), item.llm_request())

    def start(self, batch: Batch, chunk: int, items: list[tuple[int, BatchItem]]) -> None:
        """Each part of the chunk sent as one job, at most once (see the module's docstring)."""
        by_index = dict(items)
        for part, indexes in enumerate(self._parts(items)):
            job, fresh = self._jobs.begin(
                ProviderJob(batch_id=batch.batch_id, chunk=chunk, part=part, expires_at=batch.expires_at)
            )
            if job.phase == "ended":
                continue
            if job.job_id is not None:
                # Its first run stored the id; its look may not have been sent: send one, under
                # the job's look count (a copy of the chain's pending look, dropped after it).
                self._send_look(job, job.looks)
                continue
            job_id = None if fresh else self._provider.find(job.tag)
            if job_id is None:
                lines = self._sendable(batch, [(i, by_index[i]) for i in indexes])
                if not lines:
                    self._jobs.ended(job)
                    continue
                job_id = self._submit(batch, job, self._model(by_index[indexes[0]]), lines)
                if job_id is None:
                    continue
            else:
                logger.info("provider job found by its tag", batch_id=batch.batch_id, tag=job.tag)
            stored = self._jobs.started(job, job_id)
            if stored.job_id != job_id:
                # Another copy of the message sent its own and stored it first: stop this one.
                logger.warning("a second provider job; cancelled", batch_id=batch.batch_id, job_id=job_id)
                self._provider.cancel(job_id)
                continue
            logger.info("provider job sent", batch_id=batch.batch_id, chunk=chunk, part=part, job_id=job_id)
            self._jobs.note_provider_id(stored, job_id)
            self._send_look(stored, 0)

    def _submit(
        self, batch: Batch, job: ProviderJob, model: str, lines: list[tuple[str, LLMRequest]]
    ) -> str | None:
        """The job sent; None when the provider refused it for good (or it breaks the provider's
        per-job limits: one line over its bytes): its items fail with why, and it has ended. A
        transient refusal raises: the chunk's message comes back and tries again."""
        try:
            return self._provider.submit(model, lines, tag=job.tag)
        except LLMError as refused:
            if refused.transient:
                raise
            error = refused
        except ValueError as past_limits:
            error = LLMError(
                f"The provider's batch job cannot hold it: {past_limits}", code=JOB_FAILED, transient=False
            )
        logger.warning("provider job refused", batch_id=batch.batch_id, tag=job.tag, code=error.code)
        indexes = [index for custom_id, _ in lines if (index := index_of(custom_id)) is not None]
        tasks = self._store.get_many([batch_task_id(batch.batch_id, index) for index in indexes])
        for task in tasks.values():
            if is_waiting(task):
                self._end(task, None, error)
        self._jobs.ended(job)
        return None

    def _sendable(self, batch: Batch, items: list[tuple[int, BatchItem]]) -> list[tuple[str, LLMRequest]]:
        """The job's lines: its items still waiting (not refused by the budget, not cancelled);
        one a job cannot carry (an uploaded file named, from an input file) failed here. Padded
        with copies of the first to the provider's fewest records."""
        tasks = self._store.get_many([batch_task_id(batch.batch_id, index) for index, _ in items])
        lines: list[tuple[str, LLMRequest]] = []
        for index, item in items:
            task = tasks.get(batch_task_id(batch.batch_id, index))
            if task is None or not is_waiting(task):
                continue
            request = item.llm_request()
            refusal = item_refusal(request)
            if refusal is not None:
                self._end(task, None, LLMError(f"The item {refusal}.", code="invalid_input", transient=False))
                continue
            lines.append((item_custom_id(index), request))
        pads = max(0, self._provider.limits.min_records - len(lines)) if lines else 0
        lines += [(f"{PAD_PREFIX}{n}", lines[0][1]) for n in range(pads)]
        return lines

    def _send_look(self, job: ProviderJob, looks: int, *, offset: int = 0, now: bool = False) -> None:
        """Look number `looks` at the job: due after its backoff, or at once. A job follows one
        chain of looks: a look runs unless a later one has (the job counts them), so copies (a
        redelivery, a chunk's message again, a cancel's look) die out at the next."""
        delay = 0 if now else look_delay(looks, self._settings.provider_batch_look_s)
        message = FanoutMessage(
            batch_id=job.batch_id, chunk=job.chunk, part=job.part, action="look", looks=looks, offset=offset
        )
        self._queue.send(message, delay_s=delay)

    def look(self, batch: Batch, message: FanoutMessage, items: list[tuple[int, BatchItem]]) -> None:
        """One look at the job (see the module's docstring). The provider unreachable (a
        transient error): the same look again after its backoff, as a message of its own, so an
        outage longer than the queue's redeliveries leaves the job its looks."""
        chunk, part = message.chunk, message.part
        job = self._jobs.get(batch.batch_id, chunk, part)
        if job is None or job.phase != "running" or job.job_id is None or message.looks < job.looks:
            tag = job_tag(batch.batch_id, chunk, part)
            logger.info("a look at a job not running, or a copy; dropped", batch_id=batch.batch_id, tag=tag)
            return
        try:
            self._look(batch, job, job.job_id, message, items)
        except LLMError as failed:
            if failed.code == "llm_http_404":
                # The provider has no such job (deleted there, or past its retention): nothing
                # of it will come; its items fail with why, retryable as tasks.
                logger.warning("provider job not found; its items fail", tag=job.tag)
                gone = JobStatus(job.job_id, JobState.FAILED, "not_found", error=str(failed))
                self._sweep(batch, sorted(self._parts(items)[part]), gone)
                self._jobs.ended(job)
                return
            if not failed.transient:
                raise
            logger.warning("provider job not looked at; again later", tag=job.tag, code=failed.code)
            self._send_look(job, message.looks, offset=message.offset)

    def _look(
        self,
        batch: Batch,
        job: ProviderJob,
        job_id: str,
        message: FanoutMessage,
        items: list[tuple[int, BatchItem]],
    ) -> None:
        part, offset = message.part, message.offset
        status = self._provider.look(job_id)
        if not status.state.is_ended:
            # The next look first, then this one counted: a crash between leaves the next to
            # go on (this one's redelivery is stale by then); the other order could leave the
            # job no look.
            self._send_look(job, message.looks + 1)
            self._jobs.looked(job, message.looks, completed=status.completed, failed=status.failed)
            return
        indexes = set(self._parts(items)[part])
        if status.state.has_results:
            page = self._page(status, offset)
            self._ingest(batch, indexes, page)
            if len(page) == self._page_size:
                self._send_look(job, message.looks, offset=offset + self._page_size, now=True)
                return
        self._sweep(batch, sorted(indexes), status)
        self._jobs.looked(job, message.looks, completed=status.completed, failed=status.failed)
        self._jobs.ended(job)
        logger.info("provider job ended", batch_id=batch.batch_id, job_id=job.job_id, state=status.state)

    def _page(self, status: JobStatus, offset: int) -> list[JobResult]:
        page: list[JobResult] = []
        for number, result in enumerate(self._provider.results(status)):
            if number < offset:
                continue
            page.append(result)
            if len(page) == self._page_size:
                break
        return page

    def _ingest(self, batch: Batch, indexes: set[int], page: Iterable[JobResult]) -> None:
        """Each result of the page ends its item (one of this job's, still waiting)."""
        wanted = {index_of(result.custom_id): result for result in page}
        ids = {batch_task_id(batch.batch_id, i): i for i in sorted(i for i in wanted if i in indexes)}
        tasks = self._store.get_many(list(ids))
        due = [
            (task, wanted[index].outcome)
            for task_id, index in ids.items()
            if (task := tasks.get(task_id)) is not None and is_waiting(task)
        ]

        def end(work: tuple[Task, Completion | LLMError]) -> None:
            task, outcome = work
            if isinstance(outcome, LLMError) and outcome.code == "llm_batch_cancelled":
                self._cancel(task)
            else:
                self._end(task, outcome if isinstance(outcome, Completion) else None, outcome)

        # In index order, a few at once: each item's end is a few writes, a page thousands of items.
        with ThreadPoolExecutor(INGEST_THREADS) as pool:
            list(pool.map(end, due))

    def _sweep(self, batch: Batch, indexes: list[int], status: JobStatus) -> None:
        """The job's items its results left waiting: cancelled when it was cancelled, `expired`
        when its window closed, failed when it failed whole or gave no answer for them."""
        tasks = self._store.get_many([batch_task_id(batch.batch_id, index) for index in indexes])
        for task in tasks.values():
            if not is_waiting(task):
                continue
            if status.state is JobState.CANCELLED:
                self._cancel(task)
            elif status.state is JobState.EXPIRED:
                error = "The provider's batch window closed before it ran the item."
                self._end(task, None, LLMError(error, code=EXPIRED, transient=True))
            elif status.state is JobState.FAILED:
                said = status.error or "the provider failed the job without saying why"
                self._end(
                    task,
                    None,
                    LLMError(f"The provider's batch job failed: {said}", code=JOB_FAILED, transient=False),
                )
            else:
                error = "The provider's batch job ended without an answer for the item."
                self._end(task, None, LLMError(error, code=NO_ANSWER, transient=False))

    def _cancel(self, task: Task) -> None:
        with contextlib.suppress(TaskNotFound, TaskConflict):  # ended meanwhile (a DELETE of it)
            self._store.cancel(task.task_id, tenant_id=task.tenant_id, now=self._clock())

    def _end(self, task: Task, completion: Completion | None, outcome: Completion | LLMError | None) -> None:
        """One item ended with its job's answer (priced at the batch tier, counted in its
        tenant's and batch's spend once the item holds it) or its error."""
        now = self._clock()
        started = task.attempt_started_at or task.started_at or task.created_at
        if completion is not None:
            usage = self._settings.price_table.price(completion.usage, completion.model, "batch")
            completion = completion.model_copy(update={"usage": usage})
            text = completion.text
            result_ref = None
            if len(text.encode()) > self._settings.max_inline_result_bytes:
                result_ref = self._results.put(task.task_id, text)
            attempt = AttemptRecord(
                attempt=max(task.attempts, 1),
                started_at=started,
                ended_at=now,
                outcome="completed",
                usage=usage,
            )
            if self._store.end_provider_item(
                task.task_id,
                status=TaskStatus.COMPLETED,
                now=now,
                attempt=attempt,
                completion=completion,
                result_ref=result_ref,
            ):
                # After the write: a look sent again finds the item ended and charges nothing twice.
                self._charge(task, completion)
                self._store.output.ended(task, TaskStatus.COMPLETED)
            return
        error = (
            outcome
            if isinstance(outcome, LLMError)
            else LLMError("no answer", code=NO_ANSWER, transient=False)
        )
        code = EXPIRED if error.code in (EXPIRED, "llm_batch_expired") else error.code
        attempt = AttemptRecord(
            attempt=max(task.attempts, 1), started_at=started, ended_at=now, outcome="failed", error_code=code
        )
        if self._store.end_provider_item(
            task.task_id,
            status=TaskStatus.FAILED,
            now=now,
            attempt=attempt,
            error=str(error),
            error_code=code,
        ):
            self._store.output.ended(task, TaskStatus.FAILED)

    def _charge(self, task: Task, completion: Completion) -> None:
        try:
            self._store.usage.charge(task, completion.usage, model=completion.model, now=self._clock())
        except BackendError:
            logger.exception("usage not counted", task_id=task.task_id)

    def cancel(self, batch: Batch, chunk: int, items: list[tuple[int, BatchItem]]) -> None:
        """The chunk's jobs cancelled at the provider, each looked at at once (its last look ends
        what it finished and cancels the rest); its waiting items whose job was never sent
        cancelled here."""
        for part, indexes in enumerate(self._parts(items)):
            job = self._jobs.get(batch.batch_id, chunk, part)
            if job is not None and job.phase == "ended":
                continue
            if job is not None and job.job_id is not None:
                self._provider.cancel(job.job_id)
                self._send_look(job, job.looks, now=True)
                continue
            tasks = self._store.get_many([batch_task_id(batch.batch_id, index) for index in indexes])
            for task in tasks.values():
                if is_waiting(task):
                    self._cancel(task)


class JobEnds:
    """The provider's word that a job ended (its webhook: OpenAI's `batch.completed`, ...): a
    look at the job sent at once instead of at its next backoff. It carries the job's look
    count, so it is a copy of the chain's pending look and the later of the two is dropped."""

    def __init__(self, jobs: ProviderJobs, queue: Queue) -> None:
        self._jobs = jobs
        self._queue = queue

    def ended(self, job_id: str) -> bool:
        """Whether a running job of a batch is `job_id` (then its look is sent)."""
        job = self._jobs.of_provider_id(job_id)
        if job is None or job.phase != "running":
            return False
        look = FanoutMessage(
            batch_id=job.batch_id, chunk=job.chunk, part=job.part, action="look", looks=job.looks
        )
        self._queue.send(look)
        logger.info("provider job ended: looked at now", batch_id=job.batch_id, tag=job.tag)
        return True
