"""`GET /batches/{id}/events?after=N&wait=S`: the batch's events after N (items whose status
moved, the counts after them; see BatchStore.count_changes), at once, or held up to S seconds
until one exists or the batch ends, so that a progress view follows a batch without reading
every item, or the whole batch, again.

A waiting reply polls the batch's item (eventually consistent: its last event's number and its
status), and reads the events themselves once they exist.
"""

from __future__ import annotations

import time
from typing import Protocol

from llmtasks.aws.batch_store import BatchStore
from llmtasks.domain.batches import MAX_PAGE_EVENTS, Batch, BatchEventPage

# How often a waiting reply reads the batch. Its events come as BatchFunction counts the table's
# stream, which Lambda hands over in batches: a read a second keeps a view within a second of
# them. An eventually consistent read of the batch's item (under 4 KB) is half a read unit: 30
# a minute per waiting reader, what the SDK's wait_batch spent before on a consistent read of
# the whole batch every 2 s, for news twice as fresh and none of the batch sent again.
POLL_S = 1.0


class Owned(Protocol):
    """The tenant's batch as read, or BatchNotFound (BatchService.get)."""

    def __call__(self, tenant_id: str, batch_id: str, *, consistent: bool = True) -> Batch: ...


class BatchEventReader:
    def __init__(self, batches: BatchStore, owned: Owned) -> None:
        self._batches = batches
        self._owned = owned

    def read(self, tenant_id: str, batch_id: str, *, after: int, wait_s: float) -> BatchEventPage:
        give_up = time.monotonic() + wait_s
        while True:
            # An `after` past the last event is an empty page (final once the batch has ended),
            # as a cursor past the end reads anywhere.
            batch = self._owned(tenant_id, batch_id, consistent=False)
            left = give_up - time.monotonic()
            if batch.events > after or batch.status.is_terminal or left <= 0:
                return self._page(batch, after)
            time.sleep(min(POLL_S, left))

    def _page(self, batch: Batch, after: int) -> BatchEventPage:
        events = self._batches.events(batch.batch_id, after + 1, min(batch.events, after + MAX_PAGE_EVENTS))
        reached = events[-1].sequence if events else after
        return BatchEventPage(
            batch_id=batch.batch_id,
            events=events,
            after=reached,
            # Once a batch has ended its counts no longer move: no event follows its last.
            final=batch.status.is_terminal and reached >= batch.events,
            status=batch.read_status,
        )
