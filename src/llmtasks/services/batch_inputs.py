"""A batch made from an uploaded file: BatchFunction reads the file in one streaming pass.

Each line becomes an item of the batch's manifest (in the same JSON as a POST /batches item) or
a refusal in its refused-lines file, named by line number; then the fan-out messages go out
for the manifest's chunks, and the batch moves from `validating` to `pending` with its items
counted, exactly. A file with no item, or more items than a batch holds, or than its key may
have in flight, fails the batch instead, with the reason. Neither the file nor the manifest is
ever whole in memory: the reader holds one line and the writer one S3 part.

A read that dies part way is done again from the start (the message comes back): the manifest
and refused-lines objects are written whole again, the same bytes; messages sent twice find
their tasks made (see BatchFanout)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from llmtasks.aws.batch_store import BatchStore
from llmtasks.aws.limits import KeyLimits
from llmtasks.aws.queues import Queue
from llmtasks.aws.results import ObjectWriter, ResultBlobs
from llmtasks.domain.batch_input import LineParser, llmtasks_line, read_items
from llmtasks.domain.batches import (
    LLMTASKS_FORMAT,
    MAX_BATCH_ITEMS,
    MAX_INPUT_LINE_BYTES,
    REFUSED_SAMPLE,
    Batch,
    BatchInput,
    RefusedLine,
)
from llmtasks.domain.messages import FanoutMessage
from llmtasks.domain.rules import Clock
from llmtasks.observability import logger
from llmtasks.settings import FanoutSettings


def refused_file_id(batch_id: str) -> str:
    """The file of a batch's refused input lines (JSON Lines: line, custom_id, error)."""
    return f"file-{batch_id}-refused"


class BatchInputReader:
    """What BatchFunction does with a batch's `read` message."""

    def __init__(
        self,
        settings: FanoutSettings,
        batches: BatchStore,
        results: ResultBlobs,
        fanout_queue: Queue,
        *,
        parsers: Mapping[str, LineParser] | None = None,
        limits: KeyLimits | None = None,
        clock: Clock = time.time,
    ) -> None:
        self._settings = settings
        self._batches = batches
        self._results = results
        self._fanout = fanout_queue
        # The OpenAI surface's line formats come from the API's composition (its request models).
        self._parsers = {LLMTASKS_FORMAT: llmtasks_line, **(parsers or {})}
        self._limits = limits
        self._clock = clock

    def read(self, batch: Batch) -> None:
        read = batch.input
        assert read is not None, "a read message names a batch made from a file"
        parse = self._parsers.get(read.format)
        if parse is None:
            self._refuse(batch, read, [f"the input format '{read.format}' is not one this service reads"])
            return
        manifest = self._results.manifest_writer(batch.batch_id)
        refused_lines = self._results.file_writer(
            batch.tenant_id, refused_file_id(batch.batch_id), filename="refused.jsonl", purpose="batch_output"
        )
        try:
            total, offsets, refused, sample = self._split(batch, parse, manifest, refused_lines)
            refused_lines.close()
        except BaseException:
            manifest.abort()
            refused_lines.abort()
            raise
        read = read.model_copy(update={"refused": refused, "refused_sample": sample})
        errors = self._whole_file_errors(batch, total, refused)
        if errors:
            manifest.abort()
            self._refuse(batch, read, errors)
            return
        manifest.close()
        # The messages first, as for a submit: each finds the batch validating a moment, and
        # waits (RetryLater) until the write below; a batch cancelled meanwhile drops them.
        self._fanout.send_many(
            [FanoutMessage(batch_id=batch.batch_id, chunk=c) for c in range(len(offsets) - 1)]
        )
        counted = self._batches.input_read(batch.batch_id, total=total, chunk_offsets=offsets, read=read)
        logger.info(
            "batch input read",
            batch_id=batch.batch_id,
            items=total,
            refused=refused,
            bytes=manifest.size,
            cancelled_meanwhile=counted is None,
        )

    def _split(
        self, batch: Batch, parse: LineParser, manifest: ObjectWriter, refused_lines: ObjectWriter
    ) -> tuple[int, list[int], int, list[RefusedLine]]:
        """The file's lines into the manifest (items) and the refused lines' file; the items
        counted (past MAX_BATCH_ITEMS too: only counted), where each chunk starts, the refused."""
        read = batch.input
        assert read is not None
        total, refused, offsets = 0, 0, [0]
        sample: list[RefusedLine] = []
        lines = read_items(
            self._results.file_chunks(batch.tenant_id, read.file_id),
            parse,
            self._settings.size_limits,
            priority=read.priority,
            max_line_bytes=MAX_INPUT_LINE_BYTES,
        )
        for line in lines:
            if line.item is None:
                refused += 1
                refusal = RefusedLine(line=line.number, custom_id=line.custom_id, error=line.refused or "")
                refused_lines.write(refusal.model_dump_json().encode() + b"\n")
                if len(sample) < REFUSED_SAMPLE:
                    sample.append(refusal)
                continue
            total += 1
            if total <= MAX_BATCH_ITEMS:
                manifest.write(line.item.model_dump_json(exclude_unset=True).encode() + b"\n")
                if total % batch.chunk_size == 0:
                    offsets.append(manifest.size)
        if offsets[-1] != manifest.size:
            offsets.append(manifest.size)
        return total, offsets, refused, sample

    def _whole_file_errors(self, batch: Batch, total: int, refused: int) -> list[str]:
        if total > MAX_BATCH_ITEMS:
            return [f"the file has {total} items; a batch holds at most {MAX_BATCH_ITEMS}"]
        if total == 0:
            return [
                f"no line of the file is an item ({refused} refused: see GET /batches/{{id}}/refused)"
                if refused
                else "the file has no line"
            ]
        cap = batch.max_in_flight
        weighed = (
            self._limits is None
            or cap is None
            or batch.key_id is None
            or self._limits.reweigh(batch.key_id, cap, batch.batch_id, weight=total)
        )
        return [] if weighed else [f"its {total} items are more than its API key may have in flight ({cap})"]

    def _refuse(self, batch: Batch, read: BatchInput, errors: list[str]) -> None:
        refused = self._batches.input_refused(
            batch.batch_id, read=read.model_copy(update={"errors": errors}), now=self._clock()
        )
        logger.info(
            "batch input refused", batch_id=batch.batch_id, errors=errors, cancelled_meanwhile=refused is None
        )
