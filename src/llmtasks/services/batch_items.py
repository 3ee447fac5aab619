"""What BatchFunction does with a batch's items.

- `BatchFanout` (from BatchFanoutQueue): one chunk's items become tasks on their lane's queue
  (BatchTaskQueue; HighTaskQueue if high priority), are cancelled, or, after a retry of the
  batch, its failed or cancelled ones run again. A task's id follows from
  its batch and index, so a repeated chunk finds its own tasks and creates none twice: the LLM
  is called once per item.
- `BatchProgress` (from the table's stream): each item's status changes move the batch's
  counters exactly once; when every item is terminal the batch ends (`BatchEnds`: at once,
  or once its outcomes are written to its files), and that write (on the stream too) sends
  the one `batch.completed` webhook.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from aws_lambda_powertools.metrics import MetricUnit

from llmtasks.aws.batch_store import BatchStore, CountedChange, CountsRefused
from llmtasks.aws.budgets import BudgetExhausted, KeyBudgets
from llmtasks.aws.queues import Queue, TaskLanes
from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.store import TaskStore
from llmtasks.domain.batches import Batch, BatchFiles, BatchItem, BatchStatus
from llmtasks.domain.budgets import BUDGET_EXHAUSTED
from llmtasks.domain.errors import BackendError, RetryLater, TaskConflict, TaskNotFound
from llmtasks.domain.messages import FanoutMessage
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.domain.rules import Clock, dimensions_of
from llmtasks.observability import Metric, emit, logger
from llmtasks.services.batch_inputs import BatchInputReader
from llmtasks.services.batch_outcomes import batch_task_id, read_chunk
from llmtasks.services.counted_once import count_once
from llmtasks.services.input_files import InputFiles
from llmtasks.services.provider_batches import ProviderBatches
from llmtasks.settings import FanoutSettings

# Tasks written before their messages are sent: one TransactWriteItems (TaskStore.create_many),
# then ten SendMessageBatch calls. A group is made whole or not at all: 100 PutItems a group
# were 418 items a second locally, a 20,000-line batch's fan-out 48 s.
WRITE_GROUP = 100
# Changes in one counting transaction (DynamoDB allows 100 actions; one is the batch's).
COUNT_GROUP = 50
COUNT_ATTEMPTS = 8
# Items moved back by one retry transaction: two actions each (the task, its mark), and two more.
RETRY_GROUP = 40


def item_task(batch: Batch, index: int, item: BatchItem, *, cancelled_at: float | None) -> Task:
    """The task of one batch item; created cancelled when the batch was cancelled before it."""
    return Task.submitted(
        item,
        task_id=batch_task_id(batch.batch_id, index),
        tenant_id=batch.tenant_id,
        created_at=batch.created_at,
        expires_at=batch.expires_at,
        trace_header=batch.trace_header,
        max_running=batch.max_running,
        tpm=batch.tpm,
        key_id=batch.key_id,
        batch_id=batch.batch_id,
        batch_index=index,
        custom_id=item.custom_id,
        cancelled_at=cancelled_at,
    )


def waiting_on_job(task: Task, now: float) -> Task:
    """A provider batch's item as created: processing with no lease and on no lane, its one
    attempt under way at the provider (sweeps and workers leave it alone: no message names it)."""
    return task.model_copy(
        update={"status": TaskStatus.PROCESSING, "attempts": 1, "started_at": now, "attempt_started_at": now}
    )


class BatchFanout:
    """What BatchFunction does with one BatchFanoutQueue message."""

    def __init__(
        self,
        settings: FanoutSettings,
        store: TaskStore,
        batches: BatchStore,
        lanes: TaskLanes,
        *,
        ends: BatchEnds,
        clock: Clock = time.time,
        results: ResultBlobs,
        budgets: KeyBudgets | None = None,
        inputs: BatchInputReader | None = None,
        provider: ProviderBatches | None = None,
    ) -> None:
        self._settings = settings
        self._provider = provider
        self._ends = ends
        self._inputs = inputs
        self._store = store
        self._batches = batches
        self._lanes = lanes
        self._clock = clock
        self._results = results
        self._budgets = budgets

    def handle(self, message: FanoutMessage, *, sent_at: float) -> None:
        now = self._clock()
        batch = self._batches.get(message.batch_id, now=now)
        fresh = now - sent_at < self._settings.unwritten_task_grace_s
        if batch is None:
            if fresh:
                # Submit writes the batch item just after its messages.
                raise RetryLater(2, "the batch's item is not written yet")
            logger.warning("no batch for this message; dropped", batch_id=message.batch_id)
        elif message.action == "read":
            self._read_input(batch)
        elif message.action == "cancel":
            if message.chunk < max(batch.chunks, 1):  # a batch cancelled while validating has none
                self._cancel_chunk(batch, message.chunk)
            self._ends.if_done(batch.batch_id)
        elif message.action in ("files", "look"):
            self._of_ended_work(batch, message)
        elif batch.status is BatchStatus.VALIDATING and fresh:
            # Its file's read sends the chunks' messages just before it counts the items.
            raise RetryLater(2, "the batch's input is not counted yet")
        elif message.chunk >= batch.chunks:
            logger.warning(
                "a chunk the batch does not have; dropped", batch_id=batch.batch_id, chunk=message.chunk
            )
        elif message.action == "retry":
            if batch.retries < message.retry and fresh:
                # The retry's messages go before the batch says so (see BatchService.retry).
                raise RetryLater(2, "the batch's retry is not written yet")
            if batch.retries != message.retry:
                logger.warning("a retry the batch is not in; dropped", batch_id=batch.batch_id)
                return
            self._retry_chunk(batch, message.chunk)
        else:
            self._create_chunk(batch, message.chunk)

    def _of_ended_work(self, batch: Batch, message: FanoutMessage) -> None:
        """An ended batch's files to write, or a look at one of a provider batch's jobs."""
        if message.action == "files":
            self._ends.write_files(batch, message.retry)
            return
        items = self._items(batch, message.chunk)
        self._providers(batch).look(batch, message, items)

    def _providers(self, batch: Batch) -> ProviderBatches:
        if self._provider is None:
            raise BackendError(f"batch {batch.batch_id} runs as provider jobs: this stack sends none")
        return self._provider

    def _items(self, batch: Batch, chunk: int) -> list[tuple[int, BatchItem]]:
        return list(zip(batch.indexes(chunk), read_chunk(self._results, batch, chunk), strict=True))

    def _read_input(self, batch: Batch) -> None:
        if batch.status is not BatchStatus.VALIDATING or self._inputs is None:
            logger.warning("a read of a batch not validating; dropped", batch_id=batch.batch_id)
            return
        self._inputs.read(batch)

    def _create_chunk(self, batch: Batch, chunk: int) -> None:
        """Each task is written before its message (the reverse of a single submit): a worker
        never meets a message whose item is not there yet. A chunk that dies between the two is
        done again, and sends the messages of its tasks that no worker has claimed yet; a
        message sent twice so costs a redelivery, never a second call (the claim's lease)."""
        cancelling = batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
        cancelled_at = self._clock() if cancelling else None
        provider = batch.mode == "provider"
        items = self._items(batch, chunk)
        existing = self._store.get_many([batch_task_id(batch.batch_id, i) for i, _ in items])
        unclaimed = [
            task
            for task in existing.values()
            if task.status is TaskStatus.PENDING and not task.revision and not provider
        ]
        created = [item_task(batch, i, item, cancelled_at=cancelled_at) for i, item in items]
        created = [task for task in created if task.task_id not in existing]
        if provider and not cancelling:
            created = [waiting_on_job(task, self._clock()) for task in created]
        if not cancelling:
            created = [self._reserved(batch, task) for task in created]
        over_budget = 0
        for start in range(0, len(created), WRITE_GROUP):
            stored = self._store.create_many(created[start : start + WRITE_GROUP])
            over_budget += sum(task.status is TaskStatus.FAILED for task in stored)
            if not cancelling and not provider:
                self._lanes.send_many([task for task in stored if task.status is TaskStatus.PENDING])
        if over_budget:
            self._store.usage.count_over_budget(batch.batch_id, over_budget, expires_at=batch.expires_at)
        if not cancelling:
            submitted = Counter(
                tuple(dimensions_of(task, self._settings.llm_model).items()) for task in created
            )
            for dimensions, count in submitted.items():
                emit(Metric.SUBMITTED, count, MetricUnit.Count, **dict(dimensions))
        if unclaimed and not cancelling:
            self._lanes.send_many(unclaimed)
        if provider and not cancelling:
            self._providers(batch).start(batch, chunk, items)
        logger.info(
            "batch chunk fanned out",
            batch_id=batch.batch_id,
            chunk=chunk,
            new_tasks=len(created),  # not `created`: a LogRecord's own attribute
            resent=len(unclaimed),
            cancelling=cancelling,
        )
        if not cancelling:
            # A cancel that came while this chunk was written may have swept past tasks not yet
            # there: look once more, and cancel them if so.
            again = self._batches.get(batch.batch_id, now=self._clock())
            if again is not None and again.status is BatchStatus.CANCELLING:
                self._cancel_chunk(again, chunk)

    def _reserved(self, batch: Batch, task: Task) -> Task:
        """The item with its most cost reserved under its batch's key's budget; created failed
        (budget_exhausted, and never queued) when that does not fit."""
        if batch.budget is None or batch.key_id is None:
            return task
        if self._budgets is None:
            raise BackendError(
                "This batch's key has a budget, and budgets are counted in LimitsTable: none is set."
            )
        files = InputFiles(self._results).known(batch.tenant_id, task.request)
        model = task.request.model or self._settings.llm_model
        most = self._settings.price_table.most_cost(task.request, model, files)
        try:
            self._budgets.reserve(batch.key_id, batch.budget, task.task_id, most)
        except BudgetExhausted as exhausted:
            return task.model_copy(
                update={
                    "status": TaskStatus.FAILED,
                    "error": exhausted.detail,
                    "error_code": BUDGET_EXHAUSTED,
                    "completed_at": self._clock(),
                }
            )
        return task

    def _cancel_chunk(self, batch: Batch, chunk: int) -> None:
        if batch.mode == "provider":
            self._providers(batch).cancel(batch, chunk, self._items(batch, chunk))
            return
        cancelled = 0
        for index in batch.indexes(chunk):
            try:
                self._store.cancel(
                    batch_task_id(batch.batch_id, index), tenant_id=batch.tenant_id, now=self._clock()
                )
            except (TaskNotFound, TaskConflict):
                continue  # not fanned out yet (it will be created cancelled), or already terminal
            cancelled += 1
        logger.info("batch chunk cancelled", batch_id=batch.batch_id, chunk=chunk, cancelled=cancelled)

    def _retry_chunk(self, batch: Batch, chunk: int) -> None:
        """The chunk's items of the retry's statuses back to pending, each a new attempt (see
        BatchStore.retry_items), then their messages. A chunk that dies between the two is done
        again: it sends the messages of the items it moved that no worker has claimed yet (a
        copy costs a redelivery, never a call)."""
        statuses = set(batch.retry_statuses or ())
        since = batch.retry_requested_at or 0.0
        ids = [batch_task_id(batch.batch_id, index) for index in batch.indexes(chunk)]
        for attempt in range(COUNT_ATTEMPTS):
            tasks = sorted(self._store.get_many(ids).values(), key=lambda task: task.batch_index or 0)
            due = [t for t in tasks if t.status in statuses and (t.retried_at or 0.0) < since]
            moved = [t for t in tasks if t.status is TaskStatus.PENDING and _retried_unclaimed(t, since)]
            try:
                for start in range(0, len(due), RETRY_GROUP):
                    group = due[start : start + RETRY_GROUP]
                    self._batches.retry_items(batch.batch_id, group, now=self._clock())
                    moved += group  # a message only names its task (and its lane and tenant)
            except CountsRefused:  # a copy of this message moved some first: read them again
                time.sleep(0.05 * 2**attempt)
                continue
            self._lanes.send_many(moved)
            for task in moved:
                self._store.output.restarted(task.task_id)
            logger.info("batch chunk retried", batch_id=batch.batch_id, chunk=chunk, retried=len(moved))
            return
        raise BackendError(
            f"batch {batch.batch_id}: chunk {chunk} not retried after {COUNT_ATTEMPTS} attempts"
        )


def _retried_unclaimed(task: Task, since: float) -> bool:
    """Moved back to pending by the retry of `since`, and not claimed since."""
    return (
        task.retried_at is not None
        and task.retried_at >= since
        and task.attempts == task.attempts_before_retry
    )


# Writes an ended batch's outcomes to its files (the OpenAI surface's OpenAIBatchFiles.write).
FilesWriter = Callable[[Batch], BatchFiles]


class BatchEnds:
    """How a batch ends once every item has: at once, in the write that is its webhook's outbox;
    or, when its outcomes go to files (Batch.ends_in_files), once BatchFunction has written them
    (a `files` message: a file of 100,000 lines takes minutes, which neither a read nor the
    stream's counting may spend), in the write that records them."""

    def __init__(
        self, batches: BatchStore, fanout_queue: Queue, *, files: FilesWriter, clock: Clock = time.time
    ) -> None:
        self._batches = batches
        self._queue = fanout_queue
        self._files = files
        self._clock = clock

    def if_done(self, batch_id: str) -> Batch | None:
        """The batch ended now, or None (items still to end, ended already, or its files to
        write first)."""
        batch = self._batches.get(batch_id, now=self._clock())
        if batch is None or batch.status.is_terminal or not batch.all_ended:
            return None
        if batch.ends_in_files:
            # Sent again by each later look until it has ended: a copy writes the same files,
            # and only one of them ends the batch.
            self._queue.send(FanoutMessage(batch_id=batch_id, chunk=0, action="files", retry=batch.retries))
            return None
        return self._finish(batch, None)

    def write_files(self, batch: Batch, retry: int) -> None:
        """The `files` message: the outcomes of the end of `retry` written, and the batch ended
        with them; nothing when it has ended since, or was retried (that end sends its own)."""
        if batch.status.is_terminal or batch.retries != retry or not batch.all_ended:
            logger.info("batch files not written: ended or retried since", batch_id=batch.batch_id)
            return
        self._finish(batch, self._files(batch))

    def _finish(self, batch: Batch, files: BatchFiles | None) -> Batch | None:
        ended = self._batches.finish(batch, now=self._clock(), files=files)
        if ended is not None:
            logger.info("batch ended", batch_id=batch.batch_id, status=ended.status.value, total=ended.total)
        return ended


class _BatchGone(Exception):
    """The batch's item expired before its counts: nothing left to count them on."""


@dataclass(frozen=True)
class _Step:
    old: TaskStatus
    new: TaskStatus
    revision: int
    expires_at: int
    index: int
    custom_id: str | None


def _collapse(task_id: str, steps: list[_Step], counted: int | None) -> CountedChange | None:
    """The net change of a task's steps the counters do not include yet (None: they include
    all). A change with no net effect still counts: its mark records that its steps are in."""
    fresh = [step for step in steps if counted is None or step.revision > counted]
    if not fresh:
        return None
    return CountedChange(
        task_id=task_id,
        since=fresh[0].revision,
        revision=fresh[-1].revision,
        old=fresh[0].old,
        new=fresh[-1].new,
        expires_at=fresh[-1].expires_at,
        index=fresh[-1].index,
        custom_id=fresh[-1].custom_id,
    )


class BatchProgress:
    """What BatchFunction does with a batch of the table's stream records."""

    def __init__(
        self,
        batches: BatchStore,
        *,
        ends: BatchEnds,
        clock: Clock = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._batches = batches
        self._ends = ends
        self._clock = clock
        self._sleep = sleep  # the back-off after a transaction conflict

    def apply(self, changes: list[tuple[Task | None, Task]]) -> None:
        """`changes`: (old, new) images in stream order; tasks of no batch are passed over. An
        item inserted pending is counted so already (every item starts counted so); one inserted
        as anything else counts as moving from pending.
        Writes that kept the status count too: their revisions place the others in order."""
        steps: dict[str, dict[str, list[_Step]]] = defaultdict(lambda: defaultdict(list))
        for old, new in changes:
            if new.batch_id is None or (old is None and new.status is TaskStatus.PENDING):
                continue  # an item inserted pending is counted so already: its batch starts so
            before = old.status if old is not None else TaskStatus.PENDING
            steps[new.batch_id][new.task_id].append(
                _Step(before, new.status, new.revision, new.expires_at, new.batch_index or 0, new.custom_id)
            )
        for batch_id, by_task in steps.items():
            self._count(batch_id, by_task)
            self._ends.if_done(batch_id)

    def _count(self, batch_id: str, by_task: dict[str, list[_Step]]) -> None:
        def apply(changes: list[CountedChange]) -> None:
            try:
                self._batches.count_changes(batch_id, changes, now=self._clock())
            except CountsRefused as refused:
                if refused.batch_gone:
                    raise _BatchGone from refused
                raise

        try:
            left = count_once(
                by_task,
                _collapse,
                apply,
                self._batches.counted_revision,
                refused=CountsRefused,
                group=COUNT_GROUP,
                attempts=COUNT_ATTEMPTS,
                sleep=self._sleep,
            )
        except _BatchGone:
            logger.info("batch gone; its counts are left", batch_id=batch_id)
            return
        if left:
            raise BackendError(f"batch {batch_id}: counts not applied after {COUNT_ATTEMPTS} attempts")
