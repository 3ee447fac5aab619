"""`GET /tasks/{id}/output?after=N&wait=S`: the chunks of a task's output after N, at once, or
held up to S seconds until one exists or the task ends (see domain/output.py).

A waiting reply polls the output's head only (half a read unit, eventually consistent); it reads
the task's own item three times at most: when there is no head yet (whose task is it?), when the
head says the task ended (for its result's last chunk, or its error), and when the wait runs out
with no news (a task can end without its head saying so: a dead-lettered one, or a worker that
died between its two writes).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.task_output import TaskOutput
from llmtasks.domain.errors import TaskNotFound
from llmtasks.domain.models import Task
from llmtasks.domain.output import (
    MAX_PAGE_BYTES,
    MAX_PAGE_CHUNKS,
    PARTIAL_RESULT_BYTES,
    OutputChunk,
    OutputHead,
    TaskOutputPage,
    last_chunk,
)
from llmtasks.domain.rules import Clock, is_task_id

# How often a waiting reply reads the head. Chunks come at most one progress interval apart (2 s;
# further when the model's text comes slower), and the head says when the next may be due: the
# reply reads it every 0.3 s until then (a task can end between writes), every tenth of a second
# from just before the due time until a second after it, then every 0.3 s again. With no head yet
# (the task is queued), the reads back off from 0.05 s to 0.3 s.
SLOW_POLL_S = 0.3
FAST_POLL_S = 0.1
FIRST_POLL_S = 0.05
EARLY_S = 0.05  # before the next chunk's due time, when the fast reads begin
LATE_S = 1.0  # after it, when they end (a call that writes nothing new waits at the slow pace)


class OutputReader:
    def __init__(
        self, output: TaskOutput, results: ResultBlobs, owned: Callable[[str, str], Task], clock: Clock
    ) -> None:
        self._output = output
        self._results = results
        self._owned = owned  # the tenant's task as read, or TaskNotFound
        self._clock = clock

    def read(
        self, tenant_id: str, task_id: str, *, after: int, wait_s: float, past_end_ok: bool = False
    ) -> TaskOutputPage:
        """An `after` past the last chunk is an empty page (final once the task has ended), as a
        cursor past the end reads anywhere; with `past_end_ok` it reads as the last chunk instead
        (the OpenAI surface's events are numbered beyond the chunks)."""
        if not is_task_id(task_id):
            raise TaskNotFound(task_id[:64])
        give_up = time.monotonic() + wait_s
        task: Task | None = None
        for polls in itertools.count():
            head = self._output.head(task_id)
            if head is not None and head.tenant_id != tenant_id:
                raise TaskNotFound(task_id)
            if head is None and task is None:
                task = self._owned(tenant_id, task_id)  # a 404 for another tenant's, or none
            if (head is not None and head.ended) or (task is not None and task.status.is_terminal):
                return self._last_page(tenant_id, task_id, head, after, past_end_ok=past_end_ok)
            last = head.last_sequence if head else 0
            if after > last and past_end_ok:
                after = last
            if last > after:
                return self._page(task_id, head, after, None)
            left = give_up - time.monotonic()
            if left <= 0:
                # No news for the whole wait: the task may have ended without its head saying so.
                task = self._owned(tenant_id, task_id)
                if task.status.is_terminal:
                    return self._last_page(tenant_id, task_id, head, after, task, past_end_ok=past_end_ok)
                return TaskOutputPage(task_id=task_id, chunks=[], after=after, final=False)
            time.sleep(min(self._pause(head, polls), left))
        raise AssertionError("unreachable: the loop returns")

    def so_far(self, task: Task) -> Task:
        """`task`, while it runs, with how far its attempt has streamed: its text so far
        (`partial_result`: its chunks joined, their first PARTIAL_RESULT_BYTES) and its tokens and
        when (`progress`), from its output's head and chunks; a run's usage so far (its model
        calls', summed as each is recorded: the task's own item has it at a wait or the end).
        As it was before its first chunk."""
        head = self._output.head(task.task_id)
        if head is not None and not head.ended and head.usage is not None:
            task = task.model_copy(update={"usage": head.usage})
        if head is None or head.ended or head.attempt != max(1, task.attempts):
            return task
        parts: list[str] = []
        size, first = 0, head.first_sequence or 1
        while first <= head.last_sequence and size < PARTIAL_RESULT_BYTES:
            last = min(head.last_sequence, first + MAX_PAGE_CHUNKS - 1)
            chunks = self._output.chunks(task.task_id, first, last)
            for chunk in chunks:
                if chunk.attempt == head.attempt:  # a head written before it kept the first chunk
                    parts.append(chunk.text)
                    size += len(chunk.text.encode())
            if not chunks or chunks[-1].sequence < last:
                break  # one expired (the task with it, soon)
            first = last + 1
        text = "".join(parts).encode()[:PARTIAL_RESULT_BYTES].decode(errors="ignore")
        return task.model_copy(
            update={
                "partial_result": text or None,
                "progress_tokens": head.tokens,
                "progress_at": head.written_at,
            }
        )

    def _pause(self, head: OutputHead | None, polls: int) -> float:
        """The wait before the next read of the head (see SLOW_POLL_S)."""
        if head is None or head.next_at is None:
            return min(SLOW_POLL_S, FIRST_POLL_S * 2.0**polls)
        due_in = head.next_at - self._clock()
        if due_in > EARLY_S:
            return min(SLOW_POLL_S, due_in - EARLY_S)
        return FAST_POLL_S if due_in > -LATE_S else SLOW_POLL_S

    def _last_page(
        self,
        tenant_id: str,
        task_id: str,
        head: OutputHead | None,
        after: int,
        task: Task | None = None,
        *,
        past_end_ok: bool = False,
    ) -> TaskOutputPage:
        """A page of an ended task: its stored chunks after `after`, then its last chunk, then
        final. The task is read again here: the head says it ended, not with what result."""
        task = self._results.hydrate(task if task is not None else self._owned(tenant_id, task_id))
        ending = last_chunk(task, head)
        end = ending.sequence if ending else (head.last_sequence if head else 0)
        if after > end and past_end_ok:
            after = end
        return self._page(task_id, head, after, task, ending)

    def _page(
        self,
        task_id: str,
        head: OutputHead | None,
        after: int,
        ended: Task | None,
        ending: OutputChunk | None = None,
    ) -> TaskOutputPage:
        """The stored chunks after `after` that fit a page; with `ended` (the task, once it
        ended) and every stored chunk in, its last chunk too, and the page is final."""
        stored = head.last_sequence if head else 0
        chunks = self._output.chunks(task_id, after + 1, min(stored, after + MAX_PAGE_CHUNKS))
        chunks = _fitting(chunks)
        reached = chunks[-1].sequence if chunks else after
        complete = reached >= stored
        if ended is None or not complete:
            return TaskOutputPage(task_id=task_id, chunks=chunks, after=reached, final=False)
        if ending is not None and ending.sequence > after:
            if len(_fitting([*chunks, ending])) <= len(chunks):  # no room: it comes on a page of its own
                return TaskOutputPage(task_id=task_id, chunks=chunks, after=reached, final=False)
            chunks.append(ending)
            reached = ending.sequence
        return TaskOutputPage(
            task_id=task_id,
            chunks=chunks,
            after=reached,
            final=True,
            status=ended.status,
            error=ended.error,
            error_code=ended.error_code,
        )


def _fitting(chunks: list[OutputChunk]) -> list[OutputChunk]:
    """The first chunks a page holds: at most MAX_PAGE_CHUNKS, whose text fits MAX_PAGE_BYTES
    (the first always)."""
    size = 0
    for i, chunk in enumerate(chunks[:MAX_PAGE_CHUNKS]):
        size += len(chunk.text.encode())
        if i and size > MAX_PAGE_BYTES:
            return chunks[:i]
    return chunks[:MAX_PAGE_CHUNKS]
