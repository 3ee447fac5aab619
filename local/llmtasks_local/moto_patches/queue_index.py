"""An SQS queue's receives and deletes that find their messages without a scan of the queue.

moto keeps a queue's messages in one list, oldest first. A receive built the list of every
visible message (two clock reads a message) and took the first ten of it; a fair queue's
receive then ranked every one of them (fair_queues); a delete asked every message of the queue
twice whether it had ever been given the receipt handle, then rebuilt the list; the local
stack's journal and the fair queue's clock each asked once more: each cost linear in the queue,
and a large batch waits in its queue.

Here each queue has an index beside its list (QueueIndex), kept under the SQS lock every
operation on messages holds (moto_patches.atomic):

- the receipt handles each receive gave, to their messages: a delete finds its message at once
  and takes it off the list in place (list.remove compares by identity, in C);
- how many messages each MessageGroupId holds, and the delayed ones by when their delay ends:
  a fair queue's receive knows how many messages of each rank can be visible, and stops looking
  for them once it has found as many (`Receivable.ranked`, fair_queues);
- and a receive reads the visible messages as moto's loop asks for them (`Receivable`): it looks
  no further than the ten it takes, and the in-flight messages before them.

The list stays moto's own, and so does every answer. Whatever changes the list behind the
index's back (a purge, moto's move of a message to its dead-letter queue, a journal's replay)
leaves it with another identity or length than the index last saw: the index is then made again
from the list. A handle the index does not know (given before it was made) is looked for as moto
looks for it. tests/unit/test_fast_paths.py compares the answers with moto's own.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

from moto.sqs.exceptions import ReceiptHandleIsInvalid
from moto.sqs.models import Message, Queue, SQSBackend

from llmtasks_local import moto_patches

Rank = TypeVar("Rank", bound=Hashable)

_moto_delete = Queue.delete_message
_moto_messages = Queue.__dict__["messages"]
# Handles of messages no longer in the queue may be kept up to this many times the queue's own
# messages (and this many more) before the index is made again without them.
_STALE_HANDLES = 2
_SPARE_HANDLES = 1024


class QueueIndex:
    """What one queue's list of messages holds, kept as the list changes (see the module)."""

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages  # the list indexed (moto replaces it on a purge)
        self.size = len(messages)  # its length when the index last agreed with it
        self.handles: dict[str, Message] = {}
        self.groups: Counter[str | None] = Counter()  # messages by MessageGroupId (None: none)
        self._delayed: list[tuple[float, int, str | None]] = []  # (delayed until, ms; tiebreak; group)
        self.delayed_groups: Counter[str | None] = Counter()
        self._order = itertools.count()
        for message in messages:
            self.add(message)

    def agrees_with(self, queue: Queue) -> bool:
        return queue._messages is self.messages and len(self.messages) == self.size

    def add(self, message: Message) -> None:
        """`message`, just put at the end of the list."""
        for handle in message.all_receipt_handles:
            if handle is not None:
                self.handles[handle] = message
        self.groups[message.group_id] += 1
        if message.delayed_until > time.time() * 1000:
            heapq.heappush(self._delayed, (message.delayed_until, next(self._order), message.group_id))
            self.delayed_groups[message.group_id] += 1
        self.size = len(self.messages)

    def removed(self, message: Message) -> None:
        """`message`, just taken off the list."""
        for handle in message.all_receipt_handles:
            if handle is not None:
                self.handles.pop(handle, None)
        self.groups[message.group_id] -= 1
        if not self.groups[message.group_id]:
            del self.groups[message.group_id]
        self.size = len(self.messages)

    def undelayed(self, now_ms: float) -> Counter[str | None]:
        """The messages of each group whose delay (if any) has ended: in flight or visible."""
        while self._delayed and self._delayed[0][0] <= now_ms:
            _, _, group = heapq.heappop(self._delayed)
            self.delayed_groups[group] -= 1
        return self.groups - self.delayed_groups


# Indexes by queue, weakly: nothing of them goes into the local stack's snapshots of moto.
_indexes: weakref.WeakKeyDictionary[Queue, QueueIndex] = weakref.WeakKeyDictionary()


def index_of(queue: Queue) -> QueueIndex:
    """The queue's index, made again from its list if the list changed behind its back."""
    index = _indexes.get(queue)
    if index is None or not index.agrees_with(queue) or len(index.handles) > _too_many(queue):
        index = _indexes[queue] = QueueIndex(queue._messages)
    return index


def _too_many(queue: Queue) -> int:
    return _STALE_HANDLES * len(queue._messages) + _SPARE_HANDLES


def find(queue: Queue, receipt_handle: str) -> Message | None:
    """The message of the queue that was given `receipt_handle`, as moto's scan would find it."""
    message = index_of(queue).handles.get(receipt_handle)
    if message is not None:
        return message if message in queue._messages else None  # moved off it since (C: identity)
    return next((m for m in queue._messages if m.had_receipt_handle(receipt_handle)), None)


class _Switch:
    """Whether the index is used (uninstall() turns it off, leaving the wrappers around it), and
    whether install() has put it in place."""

    on = True
    installed = False


_switch = _Switch()


def installed() -> bool:
    """Whether the index is in place and used (not on stock moto)."""
    return _switch.installed and _switch.on


def delete_message(queue: Queue, receipt_handle: str) -> None:
    """moto's Queue.delete_message, its message found through the index: deleted already is
    no error; a handle no message of the queue had is ReceiptHandleIsInvalid."""
    if not _switch.on:
        return _moto_delete(queue, receipt_handle)
    if receipt_handle in queue.deleted_messages:
        return None
    index = index_of(queue)
    message = index.handles.get(receipt_handle)
    if message is None or message not in queue._messages:
        message = next((m for m in queue._messages if m.had_receipt_handle(receipt_handle)), None)
    if message is None:
        raise ReceiptHandleIsInvalid()
    queue._messages.remove(message)
    queue.pending_messages.discard(message)
    queue.deleted_messages.update(message.all_receipt_handles)  # type: ignore[arg-type]
    index.removed(message)
    return None


def removed(queue: Queue, message: Message) -> None:
    """`message` was just taken off the queue's list without a receipt handle (a redrive)."""
    index = _indexes.get(queue)
    if index is not None and queue._messages is index.messages and len(index.messages) == index.size - 1:
        index.removed(message)


def _add_message(add: Callable[[Queue, Message], None]) -> Callable[[Queue, Message], None]:
    @functools.wraps(add)
    def added(queue: Queue, message: Message) -> None:
        index = _indexes.get(queue)
        agreed = index is not None and index.agrees_with(queue)
        add(queue, message)
        if index is not None and agreed and len(queue._messages) == index.size + 1:
            index.add(message)  # else it was not added (a FIFO duplicate), or the index is remade

    return added


# The queue a receive of this thread is reading (a receive may send, and so receive, inside it).
_receiving = threading.local()


def receiving(queue: Queue) -> bool:
    """Whether a receive of this thread is reading `queue` now."""
    return getattr(_receiving, "queue", None) is queue


def _receive_message(receive: Callable[..., list[Message]]) -> Callable[..., list[Message]]:
    @functools.wraps(receive)
    def received(backend: SQSBackend, queue_name: str, *args: Any, **kwargs: Any) -> list[Message]:
        outer = getattr(_receiving, "queue", None)
        _receiving.queue = backend.get_queue(queue_name)
        try:
            return receive(backend, queue_name, *args, **kwargs)
        finally:
            _receiving.queue = outer

    return received


def _mark_received(mark: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(mark)
    def marked(message: Message, *args: Any, **kwargs: Any) -> None:
        mark(message, *args, **kwargs)
        queue = getattr(_receiving, "queue", None)
        if _switch.on and queue is not None and message.receipt_handle is not None:
            index_of(queue).handles[message.receipt_handle] = message

    return marked


class Receivable:
    """A queue's visible messages, oldest first, read from its list as they are asked for (a
    receive's `queue.messages`); true while there is one."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.index = index_of(queue)

    def __iter__(self) -> Iterator[Message]:
        now_ms = time.time() * 1000
        for message in self.queue._messages:
            if message.visible_at < now_ms and not now_ms < message.delayed_until:
                yield message

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def ranked(self, rank_of: Callable[[Message], Rank], candidates: dict[Rank, int]) -> Ranked[Rank]:
        return Ranked(self, rank_of, candidates)


class Ranked(Generic[Rank]):
    """`visible` in the order of a stable sort by `rank_of`, lowest first, read as it is asked
    for. `candidates` says how many messages of each rank can be visible (at most: the index's
    counts less those in flight), so the messages of the lowest rank are handed out as they are
    found, those of the others kept aside until no lower one can follow, and the search for a
    rank ends once as many as it can have were found."""

    def __init__(
        self, visible: Receivable, rank_of: Callable[[Message], Rank], candidates: dict[Rank, int]
    ) -> None:
        self._visible = visible
        self._rank_of = rank_of
        self._candidates = {rank: n for rank, n in candidates.items() if n > 0}

    def __iter__(self) -> Iterator[Message]:
        visible = iter(self._visible)
        aside: defaultdict[Rank, list[Message]] = defaultdict(list)
        for rank in sorted(self._candidates):  # type: ignore[type-var]
            left = self._candidates[rank] - len(aside.get(rank, ()))
            yield from aside.pop(rank, ())
            while left > 0:
                message = next(visible, None)
                if message is None:
                    break
                found = self._rank_of(message)
                if found == rank:
                    yield message
                    left -= 1
                elif found < rank:  # type: ignore[operator]  # the counts were behind: at once
                    yield message
                else:
                    aside[found].append(message)
        for rank in sorted(aside):  # type: ignore[type-var]
            yield from aside[rank]
        yield from visible

    def __bool__(self) -> bool:
        return bool(self._visible)

    def __len__(self) -> int:
        return len(self._visible)


def _messages(queue: Queue) -> Any:
    """moto's visible messages: a list, or, for the queue a receive is reading, a Receivable."""
    if _switch.on and receiving(queue):
        return Receivable(queue)
    return _moto_messages.fget(queue)


def install() -> None:
    """Idempotent; before moto serves, and before what wraps these methods (the journal, the
    fair queue's clock) wraps them."""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
    _switch.on = True
    if _switch.installed:
        return
    _switch.installed = True
    Queue.delete_message = delete_message  # type: ignore[method-assign,assignment]
    Queue.add_message = _add_message(Queue.add_message)  # type: ignore[method-assign,assignment]
    Message.mark_received = _mark_received(Message.mark_received)  # type: ignore[method-assign]
    SQSBackend.receive_message = _receive_message(SQSBackend.receive_message)  # type: ignore[method-assign]
    Queue.messages = property(_messages)  # type: ignore[method-assign,assignment]


def uninstall() -> None:
    """moto's own code under the wrappers (for the tests that compare the two): a delete scans,
    a receive lists every visible message."""
    _switch.on = False
    _indexes.clear()
