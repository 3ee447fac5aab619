"""A batch's outcomes as they are read back: its items in submission order (each a result, or
pending with its custom_id while not fanned out yet), its refused input lines, and the tenant's
files they are written to. StatusFunction pages them (GET /batches/{id}/results); BatchFunction
writes an ended batch's to the OpenAI surface's output and error files.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Protocol

from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.store import TaskStore
from llmtasks.domain.batch_input import numbered_lines
from llmtasks.domain.batches import (
    MAX_INPUT_LINE_BYTES,
    Batch,
    BatchItem,
    BatchResult,
    RefusedLine,
    StoredFile,
)
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.domain.rules import Clock
from llmtasks.services.batch_inputs import refused_file_id

BATCH_NAMESPACE = uuid.UUID("0f5b7a4e-3c1d-4f7e-9a2b-6d8c5e4f3a21")
# A results page's text stays under what a Lambda reply holds (6 MB, with the JSON around it).
MAX_RESULTS_PAGE_BYTES = 4 * 1024 * 1024


def batch_task_id(batch_id: str, index: int) -> str:
    """A batch item's task id: derived from the batch's, so a chunk fanned out twice writes the
    same items."""
    return uuid.uuid5(BATCH_NAMESPACE, f"{batch_id}/{index}").hex


def read_chunk(results: ResultBlobs, batch: Batch, chunk: int) -> list[BatchItem]:
    start, end = batch.chunk_offsets[chunk], batch.chunk_offsets[chunk + 1]
    return [
        BatchItem.model_validate_json(line) for line in results.manifest_lines(batch.manifest_ref, start, end)
    ]


class FileSink(Protocol):
    """Where a file is written as it grows (the results bucket's ObjectWriter)."""

    size: int

    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


class BatchOutcomes:
    def __init__(self, store: TaskStore, results: ResultBlobs, *, clock: Clock = time.time) -> None:
        self._store = store
        self._results = results
        self._clock = clock

    def page(self, batch: Batch, start: int, limit: int) -> list[BatchResult]:
        """Up to `limit` items from index `start` on, in submission order, their text under
        MAX_RESULTS_PAGE_BYTES (at least one item)."""
        return [row for row, _ in self._page(batch, start, limit)]

    def _page(self, batch: Batch, start: int, limit: int) -> list[tuple[BatchResult, Task | None]]:
        """A page's rows, each with its task as read (None while not fanned out)."""
        indexes = range(start, min(batch.total, start + limit))
        ids = [batch_task_id(batch.batch_id, i) for i in indexes]
        tasks = self._store.get_many(ids)
        # Items not fanned out yet are pending; their custom_ids come from the manifest.
        custom_ids = self._custom_ids(
            batch, [i for i, task_id in zip(indexes, ids, strict=True) if task_id not in tasks]
        )
        now = self._clock()
        rows: list[tuple[BatchResult, Task | None]] = []
        size = 0
        for index, task_id in zip(indexes, ids, strict=True):
            task = tasks.get(task_id)
            if task is None:
                row = BatchResult(
                    index=index, custom_id=custom_ids.get(index), task_id=task_id, status=TaskStatus.PENDING
                )
            else:
                task = self._results.hydrate(task.as_read(now))
                row = BatchResult.of(task)
            size += len(row.result or "") + len(row.error or "")
            if rows and size > MAX_RESULTS_PAGE_BYTES:
                break
            rows.append((row, task))
        return rows

    def every(self, batch: Batch, *, page_size: int) -> Iterator[tuple[BatchResult, Task | None]]:
        """Every item with its task (None while not fanned out), in submission order, read a
        page at a time (never all in memory)."""
        start = 0
        while start < batch.total:
            rows = self._page(batch, start, page_size)
            yield from rows
            start += len(rows)

    def _custom_ids(self, batch: Batch, indexes: list[int]) -> dict[int, str | None]:
        found: dict[int, str | None] = {}
        for chunk in sorted({batch.chunk_of(i) for i in indexes}):
            for index, item in zip(
                batch.indexes(chunk), read_chunk(self._results, batch, chunk), strict=True
            ):
                found[index] = item.custom_id
        return found

    def refused(self, batch: Batch) -> Iterator[RefusedLine]:
        """A batch's refused input lines, in line order, as they stream from its file."""
        chunks = self._results.file_chunks(batch.tenant_id, refused_file_id(batch.batch_id))
        for _, raw in numbered_lines(chunks, MAX_INPUT_LINE_BYTES):
            if raw:
                yield RefusedLine.model_validate_json(raw)

    def file(self, tenant_id: str, file_id: str) -> StoredFile | None:
        """The tenant's file, or None (another tenant's files are none of its own)."""
        return self._results.file(tenant_id, file_id)

    def file_content(self, tenant_id: str, file_id: str) -> bytes:
        return self._results.file_content(tenant_id, file_id)

    def open_file(self, tenant_id: str, file_id: str, *, filename: str, purpose: str) -> FileSink:
        """A tenant's file written as it grows (it exists once closed)."""
        return self._results.file_writer(tenant_id, file_id, filename=filename, purpose=purpose)
