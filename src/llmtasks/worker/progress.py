"""A streaming call's text so far, written to its task as it comes (readers see
`partial_result` and `progress`)."""

from __future__ import annotations

import asyncio

from llmtasks.aws.store import TaskStore
from llmtasks.domain.rules import Clock


class ProgressWriter:
    """Writes a streaming call's text so far to its task, at most once every `interval_s`: each
    write is one UpdateItem, billed by the item's size. Raises StaleWrite when the task is no
    longer this lease's (cancelled, taken over), which ends the call."""

    def __init__(
        self,
        store: TaskStore,
        task_id: str,
        *,
        lease_id: str,
        interval_s: float,
        max_bytes: int,
        clock: Clock,
    ) -> None:
        self._store = store
        self._task_id = task_id
        self._lease_id = lease_id
        self._interval_s = interval_s
        self._max_bytes = max_bytes
        self._clock = clock
        self._written_at = clock()  # the first write comes one interval into the call

    async def record(self, text: str, tokens: int) -> None:
        now = self._clock()
        if now - self._written_at < self._interval_s:
            return
        self._written_at = now
        # The head of a long reply: the item must stay under DynamoDB's 400 KB with the prompt.
        head = text.encode()[: self._max_bytes].decode(errors="ignore")
        await asyncio.to_thread(
            self._store.record_progress,
            self._task_id,
            lease_id=self._lease_id,
            partial_result=head,
            tokens=tokens,
            now=now,
        )
