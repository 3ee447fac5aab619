"""Batches: many prompts as one job, with exact progress, one webhook and no double spend.

`BatchService` (the HTTP API): a submit stores the items as a manifest in ResultsBucket, the
batch item with every item counted as pending, and one fan-out message per chunk of items; it
answers at once with the exact total. Reads, results in order, and cancel. What BatchFunction
does with them (fan-out, counting) is in batch_items.py.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from llmtasks.aws.batch_store import BatchExists, BatchStore
from llmtasks.aws.idempotency import IdempotencyKeys, once_per_key
from llmtasks.aws.limits import KeyLimits
from llmtasks.aws.queues import Queue
from llmtasks.aws.results import ResultBlobs, manifest_key
from llmtasks.aws.store import TaskStore
from llmtasks.domain.batches import (
    LLMTASKS_FORMAT,
    MAX_BATCH_ITEMS,
    MAX_INPUT_FILE_BYTES,
    Batch,
    BatchEventPage,
    BatchInput,
    BatchResult,
    BatchStatus,
    BatchUpload,
    RetryBatchRequest,
    StoredFile,
    SubmitBatchRequest,
    new_file_id,
)
from llmtasks.domain.caller import Caller
from llmtasks.domain.cursors import results_cursor, results_index
from llmtasks.domain.errors import (
    BatchNotFound,
    FileNotFound,
    InvalidInput,
    PayloadTooLarge,
    TaskConflict,
)
from llmtasks.domain.input_files import INPUT_PURPOSES, pdf_pages, sniff_mime
from llmtasks.domain.messages import FanoutMessage
from llmtasks.domain.models import TaskStatus, WebhookStatus, _at
from llmtasks.domain.provider_batches import item_refusal, provider_refusal
from llmtasks.domain.rules import check_limits, check_metadata, is_task_id
from llmtasks.domain.usage import BatchSpend
from llmtasks.observability import logger
from llmtasks.services.batch_events import BatchEventReader
from llmtasks.services.batch_inputs import refused_file_id
from llmtasks.services.batch_outcomes import BATCH_NAMESPACE, BatchOutcomes
from llmtasks.services.file_uploads import FileUploads
from llmtasks.services.input_files import InputFiles
from llmtasks.services.submits import Held, SubmitSequence
from llmtasks.services.webhook_urls import Resolver, check_webhook_url, resolver_from_settings
from llmtasks.settings import SubmitSettings

Clock = Callable[[], float]
# A file answered in a reply at most (a Lambda reply holds 6 MB); larger ones by a presigned GET.
MAX_INLINE_FILE_BYTES = 4 * 1024 * 1024
UPLOAD_URL_TTL_S = 3600
DOWNLOAD_URL_TTL_S = 3600
FILE_HEAD_BYTES = 64 * 1024


def new_batch_id(tenant_id: str, idempotency_key: str | None) -> str:
    """With an Idempotency-Key the id follows from it: a submit retried after a crash (when the
    key's record may be gone) finds the batch it began instead of starting a second one."""
    if idempotency_key is None:
        return uuid.uuid4().hex
    return uuid.uuid5(BATCH_NAMESPACE, f"{tenant_id}\n{idempotency_key}").hex


def _results_start(cursor: str | None, batch: Batch) -> int:
    """Where a results page starts: the item index a cursor carries (past the end: the end)."""
    return 0 if cursor is None else min(results_index(cursor), batch.total)


@dataclass(frozen=True)
class BatchSubmission:
    batch: Batch
    replayed: bool = False


class BatchService:
    """What the HTTP API does with batches, for one tenant at a time."""

    def __init__(
        self,
        settings: SubmitSettings,
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
        self._submits = SubmitSequence(idempotency, limits)
        self._events = BatchEventReader(batches, self.get)
        self.outcomes = BatchOutcomes(store, results, clock=clock)

    # The OpenAI surface's files (uploaded inputs, a batch's output and errors), kept per tenant
    # in the results bucket beside the results.

    def put_file(self, tenant_id: str, file_id: str, data: bytes, *, filename: str, purpose: str) -> None:
        """Stores a file; an image's or document's media type (sniffed) and a PDF's pages kept
        with it, for the tasks that name it."""
        described: dict[str, str] = {}
        if purpose in INPUT_PURPOSES:
            mime = sniff_mime(data[:1024])
            pages = pdf_pages(data) if mime == "application/pdf" else None
            described = {"mime_type": mime} if mime else {}
            described |= {"pages": str(pages)} if pages else {}
        self._results.put_file(tenant_id, file_id, data, filename=filename, purpose=purpose, **described)

    def file(self, tenant_id: str, file_id: str) -> StoredFile | None:
        """The tenant's file, or None (another tenant's files are none of its own)."""
        return self.outcomes.file(tenant_id, file_id)

    @property
    def uploads(self) -> FileUploads:
        """OpenAI's Uploads API: files sent in parts (see file_uploads.py)."""
        return FileUploads(self._results, clock=self._clock)

    def create_upload(self, tenant_id: str) -> BatchUpload:
        """Where the tenant PUTs a batch's input file (JSON Lines) before POST /batches names it:
        straight into the bucket, so no byte of it passes through the API. An upload never made
        leaves nothing; its URL expires."""
        file_id = new_file_id()
        url = self._results.presign_upload(tenant_id, file_id, expires_s=UPLOAD_URL_TTL_S)
        return BatchUpload(
            file_id=file_id,
            upload_url=url,
            expires_at=_at(self._clock() + UPLOAD_URL_TTL_S),
            max_bytes=MAX_INPUT_FILE_BYTES,
            max_items=MAX_BATCH_ITEMS,
        )

    def refused_lines(self, tenant_id: str, batch_id: str) -> tuple[bytes | None, str | None]:
        """The batch's refused input lines (JSON Lines): their bytes when small enough to answer
        with, else a presigned URL to them; FileNotFound for a batch made without a file."""
        batch = self.get(tenant_id, batch_id)
        if batch.input is None or batch.status is BatchStatus.VALIDATING:
            raise FileNotFound(refused_file_id(batch_id))
        return self.file_or_link(tenant_id, refused_file_id(batch_id))

    def file_or_link(self, tenant_id: str, file_id: str) -> tuple[bytes | None, str | None]:
        """A tenant's file: its bytes up to MAX_INLINE_FILE_BYTES (a Lambda reply holds 6 MB),
        else a presigned GET of it (a redirect's Location); FileNotFound when it has none."""
        stored = self.file(tenant_id, file_id)
        if stored is None:
            raise FileNotFound(file_id)
        if stored.size <= MAX_INLINE_FILE_BYTES:
            return self.outcomes.file_content(tenant_id, file_id), None
        url = self._results.presign_download(
            tenant_id, file_id, expires_s=DOWNLOAD_URL_TTL_S, filename=stored.filename
        )
        return None, url

    def submit(
        self,
        tenant_id: str,
        body: SubmitBatchRequest,
        *,
        idempotency_key: str | None = None,
        trace_header: str | None = None,
        caller: Caller | None = None,
        input_format: str = LLMTASKS_FORMAT,
    ) -> BatchSubmission:
        """A new batch (its items count against the caller key's max_in_flight until it ends).
        From `body.input_file_id`: validating until BatchFunction has read the file (its lines
        of `input_format`: llmtasks' items, or OpenAI's request lines of that endpoint)."""
        self._check(tenant_id, body)
        batch_id = new_batch_id(tenant_id, idempotency_key)
        batch, replayed = self._submits.run(
            lambda: self._create(tenant_id, batch_id, body, trace_header, caller, input_format),
            Batch,
            what="batch",
            tenant=tenant_id,
            key=None if idempotency_key is None else f"batch\n{idempotency_key}",  # never a task's
            body=body,
            caller=caller,
            # A file's items are weighed once read (BatchInputReader): 1 until then.
            held=Held("b", batch_id, weight=len(body.items) if body.items is not None else 1),
        )
        return BatchSubmission(batch, replayed=replayed)

    def _check(self, tenant_id: str, body: SubmitBatchRequest) -> None:
        if body.mode == "provider":
            refusal = provider_refusal(self._settings.llm_provider)
            if refusal is not None:
                raise InvalidInput(refusal, field="mode")
        if body.input_file_id is not None:
            self._check_file(tenant_id, body.input_file_id)
        files = InputFiles(self._results)
        for index, item in enumerate(body.items or []):
            check_limits(item, self._settings.size_limits, where=f"items[{index}]")
            files.check(tenant_id, item.llm_request(), where=f"items[{index}]")
            # After the files are found (an unknown one is a 404, whatever the mode): a known one
            # is still no line of a provider's job.
            refusal = item_refusal(item.llm_request()) if body.mode == "provider" else None
            if refusal is not None:
                raise InvalidInput(f"items[{index}] {refusal}", field=f"items[{index}]")
        if body.metadata is not None:
            check_metadata(body.metadata, self._settings.size_limits)
        if body.webhook_url is not None:
            check_webhook_url(
                body.webhook_url, allowed_hosts=self._settings.webhook_allowed_hosts, resolve=self._resolve
            )

    def _check_file(self, tenant_id: str, file_id: str) -> None:
        """What can be told of an input file without reading it: that it is the tenant's, its
        size, and that it begins as JSON Lines of objects. Its lines are checked as it is read."""
        stored = self.file(tenant_id, file_id)
        if stored is None:
            raise FileNotFound(file_id)
        if stored.size > MAX_INPUT_FILE_BYTES:
            raise PayloadTooLarge(
                f"The file is {stored.size} bytes; a batch's input file holds at most {MAX_INPUT_FILE_BYTES}."
            )
        head = self._results.file_head(tenant_id, file_id, FILE_HEAD_BYTES) if stored.size else b""
        first = head.lstrip()
        if not first.startswith(b"{"):
            raise InvalidInput(
                "The file is not JSON Lines of items: its first line is not a JSON object.",
                field="input_file_id",
            )
        line, ended, _ = first.partition(b"\n")
        if ended:
            try:
                json.loads(line)
            except ValueError:
                raise InvalidInput(
                    "The file is not JSON Lines: its first line is not JSON.", field="input_file_id"
                ) from None

    def _create(
        self,
        tenant_id: str,
        batch_id: str,
        body: SubmitBatchRequest,
        trace_header: str | None,
        caller: Caller | None,
        input_format: str,
    ) -> Batch:
        now = self._clock()
        provider = body.mode == "provider"
        chunk_size = self._settings.provider_batch_chunk_size if provider else self._settings.batch_chunk_size
        lines = [item.model_dump_json(exclude_unset=True).encode() + b"\n" for item in body.items or []]
        offsets = [0]
        for start in range(0, len(lines), chunk_size):
            offsets.append(offsets[-1] + sum(len(line) for line in lines[start : start + chunk_size]))
        from_file = body.input_file_id is not None
        try:
            # A file's manifest is written as the file is read (BatchInputReader).
            manifest = manifest_key(batch_id) if from_file else self._results.put_manifest(batch_id, lines)
            batch = Batch(
                batch_id=batch_id,
                tenant_id=tenant_id,
                status=BatchStatus.VALIDATING if from_file else BatchStatus.PENDING,
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
                tpm=caller.tpm if caller is not None else None,
                key_id=caller.key_id if caller is not None else None,
                budget=caller.budget if caller is not None else None,
                max_in_flight=caller.max_in_flight if caller is not None else None,
                mode=body.mode,
                provider_counts={} if provider else None,
                input=BatchInput(file_id=body.input_file_id, format=input_format, priority=body.priority)
                if body.input_file_id is not None
                else None,
            )
            # The messages first, then the item, as for a task: a stored batch always has its
            # fan-out messages; messages whose batch never arrives are dropped after a grace.
            chunks = [FanoutMessage(batch_id=batch_id, chunk=c) for c in range(batch.chunks)]
            if from_file:
                chunks = [FanoutMessage(batch_id=batch_id, chunk=0, action="read")]
            self._fanout.send_many(chunks, trace_header=trace_header)
            self._batches.create(batch)
        except BatchExists as exists:
            # The same Idempotency-Key after its record lapsed: the batch it began already.
            logger.info("batch exists", batch_id=batch_id)
            return exists.batch
        logger.info("batch submitted", batch_id=batch_id, tenant_id=tenant_id, total=batch.total)
        return batch

    def get(self, tenant_id: str, batch_id: str, *, consistent: bool = True) -> Batch:
        if not is_task_id(batch_id):
            raise BatchNotFound(batch_id[:64])
        batch = self._batches.get(batch_id, now=self._clock(), consistent=consistent)
        if batch is None or batch.tenant_id != tenant_id:
            raise BatchNotFound(batch_id)
        return batch

    def spend(self, batch_id: str) -> BatchSpend:
        """What the batch's items' billed calls used and cost, and the items its budget refused."""
        return self._batches.spend(batch_id)

    def events(self, tenant_id: str, batch_id: str, *, after: int, wait_s: float) -> BatchEventPage:
        """The tenant's batch's events after `after`; with `wait_s`, held until one exists or
        the batch ends, or `wait_s` has passed (see BatchEventReader.read)."""
        return self._events.read(tenant_id, batch_id, after=after, wait_s=wait_s)

    def retry(
        self, tenant_id: str, batch_id: str, body: RetryBatchRequest, *, idempotency_key: str | None = None
    ) -> tuple[Batch, bool]:
        """The ended batch's items of `body.statuses` run again in the background (one message
        per chunk), as new attempts of the same tasks; the batch is pending until they end, then
        ends again with a webhook of its own. Once per Idempotency-Key; whether this replayed."""

        def first_time() -> Batch:
            current = self.get(tenant_id, batch_id)
            statuses = [TaskStatus(status) for status in body.statuses]
            if not current.status.is_terminal:
                raise TaskConflict(
                    f"Batch '{batch_id}' is {current.read_status.value}: retry it once it has ended."
                )
            if not sum(getattr(current, status.value) for status in statuses):
                raise TaskConflict(f"Batch '{batch_id}' has no {' or '.join(body.statuses)} items to retry.")
            # The messages first: should the batch's write not follow, they find it not retried and
            # are dropped; the other order could leave a batch waiting on a retry never sent.
            self._fanout.send_many(
                [
                    FanoutMessage(batch_id=batch_id, chunk=chunk, action="retry", retry=current.retries + 1)
                    for chunk in range(current.chunks)
                ]
            )
            batch = self._batches.request_retry(current, statuses, now=self._clock())
            if batch is None:
                raise TaskConflict(f"Batch '{batch_id}' changed meanwhile: another retry came first.")
            logger.info(
                "batch retry requested", batch_id=batch_id, retry=batch.retries, retrying=batch.retrying
            )
            return batch

        key = None if idempotency_key is None else f"batch retry\n{batch_id}\n{idempotency_key}"
        return once_per_key(
            self._submits.idempotency, first_time, Batch, tenant=tenant_id, key=key, body=body
        )

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
        # The chunks as cancelled (not as read before): a file read meanwhile counted its items;
        # one message even for none (a file not read yet), which ends the batch.
        self._fanout.send_many(
            [FanoutMessage(batch_id=batch_id, chunk=c, action="cancel") for c in range(max(batch.chunks, 1))]
        )
        logger.info("batch cancel requested", batch_id=batch_id, tenant_id=tenant_id)
        return batch

    def results(
        self, tenant_id: str, batch_id: str, *, limit: int, cursor: str | None = None
    ) -> tuple[list[BatchResult], str | None]:
        """Up to `limit` items from the cursor on, in submission order, and the next cursor."""
        batch = self.get(tenant_id, batch_id)
        start = _results_start(cursor, batch)
        rows = self.outcomes.page(batch, start, limit)
        following = start + len(rows)
        return rows, results_cursor(following) if following < batch.total else None
