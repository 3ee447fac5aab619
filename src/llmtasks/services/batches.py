"""Batches: many prompts as one job, with exact progress, one webhook and no double spend.

- `BatchService` (the HTTP API): a submit stores the items as a manifest in ResultsBucket, the
  batch item with every item counted as pending, and one fan-out message per chunk of items;
  it answers at once with the exact total. Reads, results in order, and cancel.
- `BatchFanout` (BatchFunction, from BatchFanoutQueue): one chunk's items become tasks on
  their lane's queue (BatchTaskQueue; HighTaskQueue if high priority), or are cancelled.
  A task's id follows from its batch and index, so a repeated
  chunk finds its own tasks and creates none twice: the LLM is called once per item.
- `BatchProgress` (BatchFunction, from the table's stream): each item's status changes move
  the batch's counters exactly once; when every item is terminal the batch ends, and that write
  (on the stream too) sends the one `batch.completed` webhook.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from aws_lambda_powertools.metrics import MetricUnit

from llmtasks.aws.batch_store import BatchExists, BatchStore, CountedChange, CountsRefused
from llmtasks.aws.idempotency import IdempotencyKeys, once_per_key
from llmtasks.aws.limits import Caller, KeyLimits
from llmtasks.aws.queues import Queue, TaskLanes
from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.store import TaskStore
from llmtasks.domain.batches import Batch, BatchItem, BatchResult, BatchStatus, SubmitBatchRequest
from llmtasks.domain.cursors import decode_cursor, encode_cursor
from llmtasks.domain.errors import (
    BackendError,
    BatchNotFound,
    RetryLater,
    ServiceUnavailable,
    TaskConflict,
    TaskNotFound,
)
from llmtasks.domain.messages import FanoutMessage
from llmtasks.domain.models import Task, TaskStatus, WebhookStatus
from llmtasks.domain.rules import check_limits, check_metadata, dimensions_of, is_task_id
from llmtasks.observability import Metric, emit, logger
from llmtasks.services.webhooks import Resolver, check_webhook_url, resolver_from_settings
from llmtasks.settings import Settings

Clock = Callable[[], float]
_BATCH_NAMESPACE = uuid.UUID("0f5b7a4e-3c1d-4f7e-9a2b-6d8c5e4f3a21")
# Tasks written between two SendMessageBatch calls: a message follows its item closely.
SEND_GROUP = 10
# Changes in one counting transaction (DynamoDB allows 100 actions; one is the batch's).
COUNT_GROUP = 50
COUNT_ATTEMPTS = 8
# A results page stops adding items past this many bytes of text (Lambda replies up to 6 MB).
MAX_RESULTS_PAGE_BYTES = 4 * 1024 * 1024


def new_batch_id(tenant_id: str, idempotency_key: str | None) -> str:
    """With an Idempotency-Key the id follows from it: a submit retried after a crash (when the
    key's record may be gone) finds the batch it began instead of starting a second one."""
    if idempotency_key is None:
        return uuid.uuid4().hex
    return uuid.uuid5(_BATCH_NAMESPACE, f"{tenant_id}\n{idempotency_key}").hex


def batch_task_id(batch_id: str, index: int) -> str:
    return uuid.uuid5(_BATCH_NAMESPACE, f"{batch_id}/{index}").hex


def _results_scope(batch_id: str) -> str:
    return f"results of {batch_id}"


def _results_start(cursor: str | None, batch: Batch) -> int:
    """Where a results page starts: the item index a cursor of this batch carries."""
    if cursor is None:
        return 0

    def valid(index: object) -> bool:
        return isinstance(index, int) and 0 <= index <= batch.total

    return int(decode_cursor(cursor, _results_scope(batch.batch_id), valid))


@dataclass(frozen=True)
class BatchSubmission:
    batch: Batch
    replayed: bool = False


class BatchService:
    """What the HTTP API does with batches, for one tenant at a time."""

    def __init__(
        self,
        settings: Settings,
        store: TaskStore,
        batches: BatchStore,
        fanout_queue: Queue,
        *,
        clock: Clock = time.time,
        resolve: Resolver | None = None,
        results: ResultBlobs,
        idempotency: IdempotencyKeys | None = None,
        limits: KeyLimits | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._batches = batches
        self._fanout = fanout_queue
        self._clock = clock
        self._resolve = resolve or resolver_from_settings(settings)
        self._results = results
        self._idempotency = idempotency
        self._limits = limits

    @property
    def blobs(self) -> ResultBlobs:
        """The results bucket's adapter (the OpenAI surface keeps its files there)."""
        return self._results

    def submit(
        self,
        tenant_id: str,
        body: SubmitBatchRequest,
        *,
        idempotency_key: str | None = None,
        trace_header: str | None = None,
        caller: Caller | None = None,
    ) -> BatchSubmission:
        """A new batch (its items count against the caller key's max_in_flight until it ends)."""
        self._check(body)
        batch_id = new_batch_id(tenant_id, idempotency_key)
        batch, replayed = once_per_key(
            self._idempotency,
            lambda: self._create(tenant_id, batch_id, body, trace_header, caller),
            Batch,
            tenant=tenant_id,
            key=None if idempotency_key is None else f"batch\n{idempotency_key}",  # never a task's
            body=body,
        )
        return BatchSubmission(batch, replayed=replayed)

    def _check(self, body: SubmitBatchRequest) -> None:
        for index, item in enumerate(body.items):
            check_limits(item, self._settings, where=f"items[{index}]")
        if body.metadata is not None:
            check_metadata(body.metadata, self._settings)
        if body.webhook_url is not None:
            check_webhook_url(
                body.webhook_url, allowed_hosts=self._settings.webhook_allowed_hosts, resolve=self._resolve
            )

    def _create(
        self,
        tenant_id: str,
        batch_id: str,
        body: SubmitBatchRequest,
        trace_header: str | None,
        caller: Caller | None,
    ) -> Batch:
        if caller is not None and self._limits is not None:
            self._limits.hold(caller, "b", batch_id, weight=len(body.items))
        now = self._clock()
        chunk_size = self._settings.batch_chunk_size
        lines = [item.model_dump_json(exclude_unset=True).encode() + b"\n" for item in body.items]
        offsets = [0]
        for start in range(0, len(lines), chunk_size):
            offsets.append(offsets[-1] + sum(len(line) for line in lines[start : start + chunk_size]))
        try:
            manifest = self._results.put_manifest(batch_id, lines)
            batch = Batch(
                batch_id=batch_id,
                tenant_id=tenant_id,
                status=BatchStatus.PENDING,
                total=len(lines),
                pending=len(lines),
                manifest_ref=manifest,
                chunk_size=chunk_size,
                chunk_offsets=offsets,
                metadata=body.metadata,
                webhook_url=body.webhook_url,
                webhook_events=body.webhook_events,
                webhook_format=body.webhook_format,
                webhook_status=WebhookStatus.PENDING if body.webhook_url else None,
                created_at=now,
                expires_at=int(now + self._settings.task_ttl_seconds),
                trace_header=trace_header,
                max_running=caller.max_running if caller is not None else None,
            )
            # The messages first, then the item, as for a task: a stored batch always has its
            # fan-out messages; messages whose batch never arrives are dropped after a grace.
            chunks = [FanoutMessage(batch_id=batch_id, chunk=c) for c in range(batch.chunks)]
            self._fanout.send_many(chunks, trace_header=trace_header)
            self._batches.create(batch)
        except BatchExists as exists:
            # The same Idempotency-Key after its record lapsed: the batch it began already.
            logger.info("batch exists", batch_id=batch_id)
            return exists.batch
        except BackendError as exc:
            logger.exception("batch submit failed", batch_id=batch_id)
            raise ServiceUnavailable("The batch could not be stored or queued. Retry.") from exc
        logger.info("batch submitted", batch_id=batch_id, tenant_id=tenant_id, total=batch.total)
        return batch

    def get(self, tenant_id: str, batch_id: str) -> Batch:
        if not is_task_id(batch_id):
            raise BatchNotFound(batch_id[:64])
        batch = self._batches.get(batch_id, now=self._clock())
        if batch is None or batch.tenant_id != tenant_id:
            raise BatchNotFound(batch_id)
        return batch

    def cancel(self, tenant_id: str, batch_id: str) -> Batch:
        """Pending items are cancelled in the background (one message per chunk); running ones
        finish or are discarded; the batch ends `cancelled` once every item is terminal."""
        current = self.get(tenant_id, batch_id)
        batch = self._batches.request_cancel(batch_id, tenant_id=tenant_id, now=self._clock())
        if batch is None:
            current = self.get(tenant_id, batch_id)
            if current.status is BatchStatus.CANCELLING:
                return current  # asked twice: the first request's sweep is on its way
            raise TaskConflict(f"Batch '{batch_id}' is already {current.read_status.value}.")
        self._fanout.send_many(
            [FanoutMessage(batch_id=batch_id, chunk=c, action="cancel") for c in range(current.chunks)]
        )
        logger.info("batch cancel requested", batch_id=batch_id, tenant_id=tenant_id)
        return batch

    def results(
        self, tenant_id: str, batch_id: str, *, limit: int, cursor: str | None = None
    ) -> tuple[list[BatchResult], str | None]:
        """Up to `limit` items from the cursor on, in submission order, and the next cursor."""
        batch = self.get(tenant_id, batch_id)
        start = _results_start(cursor, batch)
        indexes = range(start, min(batch.total, start + limit))
        ids = [batch_task_id(batch_id, i) for i in indexes]
        tasks = self._store.get_many(ids)
        # Items not fanned out yet are pending; their custom_ids come from the manifest.
        custom_ids = self._custom_ids(
            batch, [i for i, task_id in zip(indexes, ids, strict=True) if task_id not in tasks]
        )
        now = self._clock()
        rows: list[BatchResult] = []
        size = 0
        for index, task_id in zip(indexes, ids, strict=True):
            task = tasks.get(task_id)
            if task is None:
                row = BatchResult(
                    index=index, custom_id=custom_ids.get(index), task_id=task_id, status=TaskStatus.PENDING
                )
            else:
                row = BatchResult.of(self._results.hydrate(task.as_read(now)))
            size += len(row.result or "") + len(row.error or "")
            if rows and size > MAX_RESULTS_PAGE_BYTES:
                break
            rows.append(row)
        following = start + len(rows)
        return rows, encode_cursor(_results_scope(batch_id), following) if following < batch.total else None

    def _custom_ids(self, batch: Batch, indexes: list[int]) -> dict[int, str | None]:
        found: dict[int, str | None] = {}
        for chunk in sorted({batch.chunk_of(i) for i in indexes}):
            for index, item in zip(
                batch.indexes(chunk), read_chunk(self._results, batch, chunk), strict=True
            ):
                found[index] = item.custom_id
        return found


def read_chunk(results: ResultBlobs, batch: Batch, chunk: int) -> list[BatchItem]:
    start, end = batch.chunk_offsets[chunk], batch.chunk_offsets[chunk + 1]
    return [
        BatchItem.model_validate_json(line) for line in results.manifest_lines(batch.manifest_ref, start, end)
    ]


def item_task(batch: Batch, index: int, item: BatchItem, *, cancelled_at: float | None) -> Task:
    """The task of one batch item; created cancelled when the batch was cancelled before it."""
    return Task(
        task_id=batch_task_id(batch.batch_id, index),
        tenant_id=batch.tenant_id,
        status=TaskStatus.PENDING if cancelled_at is None else TaskStatus.CANCELLED,
        request=item.llm_request(),
        max_retries=item.max_retries,
        timeout_s=item.timeout_s,
        priority=item.priority,
        metadata=item.metadata,
        batch_id=batch.batch_id,
        batch_index=index,
        custom_id=item.custom_id,
        created_at=batch.created_at,
        expires_at=batch.expires_at,
        completed_at=cancelled_at,
        trace_header=batch.trace_header,
        max_running=batch.max_running,
    )


class BatchFanout:
    """What BatchFunction does with one BatchFanoutQueue message."""

    def __init__(
        self,
        settings: Settings,
        store: TaskStore,
        batches: BatchStore,
        lanes: TaskLanes,
        *,
        clock: Clock = time.time,
        results: ResultBlobs,
    ) -> None:
        self._settings = settings
        self._store = store
        self._batches = batches
        self._lanes = lanes
        self._clock = clock
        self._results = results

    def handle(self, message: FanoutMessage, *, sent_at: float) -> None:
        now = self._clock()
        batch = self._batches.get(message.batch_id, now=now)
        if batch is None:
            if now - sent_at < self._settings.unwritten_task_grace_s:
                # Submit writes the batch item just after its messages.
                raise RetryLater(2, "the batch's item is not written yet")
            logger.warning("no batch for this message; dropped", batch_id=message.batch_id)
            return
        if message.action == "cancel":
            self._cancel_chunk(batch, message.chunk)
            finish_if_done(self._batches, batch.batch_id, now=self._clock())
            return
        self._create_chunk(batch, message.chunk)

    def _create_chunk(self, batch: Batch, chunk: int) -> None:
        """Each task is written before its message (the reverse of a single submit): a worker
        never meets a message whose item is not there yet. A chunk that dies between the two is
        done again, and sends the messages of its tasks that no worker has claimed yet; a
        message sent twice so costs a redelivery, never a second call (the claim's lease)."""
        cancelling = batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
        cancelled_at = self._clock() if cancelling else None
        items = list(zip(batch.indexes(chunk), read_chunk(self._results, batch, chunk), strict=True))
        existing = self._store.get_many([batch_task_id(batch.batch_id, i) for i, _ in items])
        unclaimed = [
            task for task in existing.values() if task.status is TaskStatus.PENDING and not task.revision
        ]
        created = [item_task(batch, i, item, cancelled_at=cancelled_at) for i, item in items]
        created = [task for task in created if task.task_id not in existing]
        for start in range(0, len(created), SEND_GROUP):
            stored = [task for task in created[start : start + SEND_GROUP] if self._store.create(task)]
            if not cancelling:
                self._lanes.send_many(stored)
        if not cancelling:
            submitted = Counter(tuple(dimensions_of(task, self._settings).items()) for task in created)
            for dimensions, count in submitted.items():
                emit(Metric.SUBMITTED, count, MetricUnit.Count, **dict(dimensions))
        if unclaimed and not cancelling:
            self._lanes.send_many(unclaimed)
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

    def _cancel_chunk(self, batch: Batch, chunk: int) -> None:
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


def finish_if_done(batches: BatchStore, batch_id: str, *, now: float) -> Batch | None:
    """Ends the batch when every item is terminal; that write is the batch webhook's outbox."""
    batch = batches.get(batch_id, now=now)
    if batch is None or batch.status.is_terminal or batch.finished < batch.total:
        return None
    ended = batches.finish(batch, now=now)
    if ended is not None:
        logger.info("batch ended", batch_id=batch_id, status=ended.status.value, total=ended.total)
    return ended


@dataclass(frozen=True)
class _Step:
    old: TaskStatus
    new: TaskStatus
    revision: int
    expires_at: int


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
    )


class BatchProgress:
    """What BatchFunction does with a batch of the table's stream records."""

    def __init__(self, batches: BatchStore, *, clock: Clock = time.time) -> None:
        self._batches = batches
        self._clock = clock

    def apply(self, changes: list[tuple[Task | None, Task]]) -> None:
        """`changes`: (old, new) images in stream order. Items of batches only; a task inserted
        as anything but pending counts as moving from pending (every item starts counted so).
        Writes that kept the status count too: their revisions place the others in order."""
        steps: dict[str, dict[str, list[_Step]]] = defaultdict(lambda: defaultdict(list))
        for old, new in changes:
            if new.batch_id is None:
                continue
            before = old.status if old is not None else TaskStatus.PENDING
            steps[new.batch_id][new.task_id].append(_Step(before, new.status, new.revision, new.expires_at))
        for batch_id, by_task in steps.items():
            self._count(batch_id, by_task)
            finish_if_done(self._batches, batch_id, now=self._clock())

    def _count(self, batch_id: str, by_task: dict[str, list[_Step]]) -> None:
        counted: dict[str, int | None] = {}
        todo = dict(by_task)
        for attempt in range(COUNT_ATTEMPTS):
            collapsed = (_collapse(task_id, steps, counted.get(task_id)) for task_id, steps in todo.items())
            pending = [change for change in collapsed if change is not None]
            todo = {change.task_id: todo[change.task_id] for change in pending}
            if not pending:
                return
            for start in range(0, len(pending), COUNT_GROUP):
                group = pending[start : start + COUNT_GROUP]
                try:
                    self._batches.count_changes(batch_id, group)
                except CountsRefused as refused:
                    if refused.batch_gone:
                        logger.info("batch gone; its counts are left", batch_id=batch_id)
                        return
                    for task_id, revision in refused.counted.items():
                        counted[task_id] = (
                            revision if revision is not None else self._batches.counted_revision(task_id)
                        )
                    if refused.conflict:
                        time.sleep(0.05 * 2**attempt)
                    continue
                for change in group:
                    todo.pop(change.task_id, None)
        if todo:
            raise BackendError(f"batch {batch_id}: counts not applied after {COUNT_ATTEMPTS} attempts")
