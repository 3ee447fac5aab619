"""A streaming call's text so far, written as it comes: the text added since the last write as
the next numbered chunks of its output, and how far it got on their head (readers follow the
chunks from any point with `GET /tasks/{id}/output`; `GET /tasks/{id}` joins the attempt's chunks
as `partial_result` and reads `progress` from the head). The task's own item is not written: an
update is billed by the item's whole size, a long prompt included."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from llmtasks.aws.store import TaskStore
from llmtasks.domain.errors import StaleWrite
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.domain.output import OutputChunk, pieces
from llmtasks.domain.rules import Clock

# The head tells a call of its cancel, but writing it is a cancel's best effort: should that
# write fail, the call learns of the cancel from the task itself, read this often (a read of the
# whole item, where each progress write was a write of it).
TASK_CHECK_S = 30.0


class ProgressWriter:
    """Writes a streaming call's progress, at most once every `interval_s`: the text added since
    the last write as the output's next chunks (a PutItem each), then the head with the tokens so
    far (one UpdateItem of a small item). Each write carries only the new text: a call's writes
    add up to its text once, not to the square of it, whatever its prompt. StaleWrite when the
    head says the task ended (a cancel writes it) or a later attempt writes it, or (read every
    TASK_CHECK_S) the task is no longer this lease's, which ends the call. While the call runs
    its lease holds (it outlives the invocation), so no other delivery can take the task over: a
    cancel is the one way to lose it."""

    def __init__(
        self,
        store: TaskStore,
        task: Task,
        *,
        lease_id: str,
        interval_s: float,
        clock: Clock,
    ) -> None:
        self._store = store
        self._task = task
        self._lease_id = lease_id
        self._interval_s = interval_s
        self._clock = clock
        self._written_at = clock()  # the first write comes one interval into the call
        self._checked_at = self._written_at  # the task as its claim found it
        self._sequence: int | None = None  # the output's last chunk, read at this attempt's first
        self._first: int | None = None  # this attempt's first chunk
        self.offset = 0  # characters of this attempt's text in chunks
        self.tokens = 0  # and its tokens

    async def record(self, text: str, tokens: int) -> None:
        now = self._clock()
        if now - self._written_at < self._interval_s:
            return
        self._written_at = now
        if now - self._checked_at >= TASK_CHECK_S:
            self._checked_at = now
            await asyncio.to_thread(self._check_lease, now)
        await asyncio.to_thread(self._append, text, tokens, now + self._interval_s)

    def _check_lease(self, now: float) -> None:
        task = self._store.get(self._task.task_id, now=now)
        if task is None or task.status is not TaskStatus.PROCESSING or task.lease_id != self._lease_id:
            raise StaleWrite(self._task.task_id)

    def _append(self, text: str, tokens: int, next_at: float) -> None:
        added = text[self.offset :]
        if not added:
            return
        output = self._store.output
        task = self._task
        if self._sequence is None:
            # Consistent: an earlier attempt's last chunk must not be written over.
            head = output.head(task.task_id, consistent=True)
            self._sequence = head.last_sequence if head else 0
            self._first = self._sequence + 1
        parts = pieces(added)
        for i, part in enumerate(parts):
            last_part = i == len(parts) - 1
            self._sequence += 1
            chunk = OutputChunk(
                sequence=self._sequence,
                text=part,
                tokens=max(0, tokens - self.tokens) if last_part else 0,
                attempt=max(1, task.attempts),
                written_at=datetime.fromtimestamp(self._clock(), UTC),
            )
            offset, chunk_tokens = self.offset + len(part), self.tokens + chunk.tokens
            if not output.append(
                task.task_id,
                chunk,
                tenant_id=task.tenant_id,
                offset=offset,
                tokens=chunk_tokens,
                expires_at=task.expires_at,
                next_at=next_at,
                first_sequence=self._first or chunk.sequence,
            ):
                raise StaleWrite(task.task_id)  # the task ended meanwhile: the call stops
            self.offset, self.tokens = offset, chunk_tokens
