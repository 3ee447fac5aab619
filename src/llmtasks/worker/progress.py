"""A streaming call's text so far, written as it comes: to its task (readers of the task see
`partial_result` and `progress`) and as numbered chunks of its output (readers follow those from
any point with `GET /tasks/{id}/output`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from llmtasks.aws.store import TaskStore
from llmtasks.domain.models import Task
from llmtasks.domain.output import OutputChunk, pieces
from llmtasks.domain.rules import Clock


class ProgressWriter:
    """Writes a streaming call's text so far, at most once every `interval_s`: the task's item
    (one UpdateItem, billed by the item's size; it raises StaleWrite when the task is no longer
    this lease's, cancelled or taken over, which ends the call), then the text added since the
    last write as the output's next chunks (a PutItem each and one UpdateItem of the head)."""

    def __init__(
        self,
        store: TaskStore,
        task: Task,
        *,
        lease_id: str,
        interval_s: float,
        max_bytes: int,
        clock: Clock,
    ) -> None:
        self._store = store
        self._task = task
        self._lease_id = lease_id
        self._interval_s = interval_s
        self._max_bytes = max_bytes
        self._clock = clock
        self._written_at = clock()  # the first write comes one interval into the call
        self._sequence: int | None = None  # the output's last chunk, read at this attempt's first
        self.offset = 0  # characters of this attempt's text in chunks
        self.tokens = 0  # and its tokens

    async def record(self, text: str, tokens: int) -> None:
        now = self._clock()
        if now - self._written_at < self._interval_s:
            return
        self._written_at = now
        # The head of a long reply: the item must stay under DynamoDB's 400 KB with the prompt.
        head = text.encode()[: self._max_bytes].decode(errors="ignore")
        await asyncio.to_thread(
            self._store.record_progress,
            self._task.task_id,
            lease_id=self._lease_id,
            partial_result=head,
            tokens=tokens,
            now=now,
        )
        await asyncio.to_thread(self._append, text, tokens, now + self._interval_s)

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
            ):
                return  # the task ended meanwhile: the lease check of the next write stops the call
            self.offset, self.tokens = offset, chunk_tokens
