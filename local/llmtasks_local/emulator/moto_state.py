"""The embedded endpoint's state, kept in a state dir so that nothing it acknowledged is lost.

Two kinds of file: a snapshot (state_format: tables, items, stream records, queues, messages,
objects, as AWS-level JSON) and the journal (journal.py) of every change made since. Each change
is journaled before it is applied and before the request that made it is answered. A start loads
the snapshot, replays the journal after it, and folds both into a new snapshot; so does a clean
stop, and a journal that has grown past COMPACT_AFTER_BYTES. A state dir of the release before
(a pickle of moto's backends, journal records pickled) is read once and rewritten so.

What is journaled, and why at these levels:
- DynamoDB and S3 writes, and the queue-level SQS calls (create, attributes, purge): the backend
  method and its arguments. Replayed on the same state they do the same thing (a write refused
  by its condition is refused again), and a table's stream records get the same numbers.
- SQS messages: their effects, not the requests. A message's id and receipt handles are random
  and its visibility is wall-clock time, so a replayed request would not do the same thing. A
  message put on a queue (sent, moved to its DLQ, redriven) is journaled whole; a delete names
  the ids it removes; a receive counts towards maxReceiveCount. Visibility is not journaled: after
  a start that follows a crash, every message in flight is visible at once (the invocations that
  held them are gone), as Lambda's would be once their timeout passed.

The journal's hooks (`install`) wrap moto's backend operations (the methods its responses call,
which state_format builds the state with too) and three methods of its SQS models. Unlike
moto_patches they are installed on any moto version that has those methods, the pinned one or
not: without them a crash would lose what the endpoint acknowledged. On a version that lacks
one, none is installed and the start says the state dir is kept at clean stops only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moto.core.exceptions import JsonRESTError
from moto.core.utils import unix_time_millis
from moto.dynamodb.models import DynamoDBBackend
from moto.s3.models import S3Backend
from moto.sqs.models import Message, Queue, SQSBackend

from llmtasks_local.emulator import journal as journal_files
from llmtasks_local.emulator import state_format, state_loading
from llmtasks_local.emulator.journal import LEGACY_SNAPSHOT, SNAPSHOT, Journal, JournalUnavailable
from llmtasks_local.moto_patches import queue_index, redrive
from llmtasks_local.moto_patches.atomic import sqs_lock, write_lock

COMPACT_AFTER_BYTES = 64 * 1024 * 1024

# The backend methods that change state, journaled as calls.
_CALLS: dict[str, tuple[type, tuple[str, ...]]] = {
    "dynamodb": (
        DynamoDBBackend,
        (
            "create_table",
            "delete_table",
            "update_table",
            "update_time_to_live",
            "put_item",
            "update_item",
            "delete_item",
            "transact_write_items",
            "tag_resource",
            "untag_resource",
        ),
    ),
    "s3": (
        S3Backend,
        (
            "create_bucket",
            "delete_bucket",
            "put_object",
            "delete_object",
            "delete_objects",
            "copy_object",
            "put_object_tagging",
            "put_bucket_versioning",
            "put_bucket_lifecycle",
            "put_bucket_lifecycle_configuration",
            "put_bucket_tagging",
            "put_bucket_policy",
            "put_bucket_encryption",
            "put_public_access_block",
        ),
    ),
    "sqs": (
        SQSBackend,
        ("create_queue", "delete_queue", "set_queue_attributes", "purge_queue", "tag_queue", "untag_queue"),
    ),
}
_s3_lock = threading.RLock()
_nested = threading.local()


class _Recording:
    journal: Journal | None = None  # None: nothing is journaled (no state dir, or a replay)
    grown = threading.Event()  # set when the journal has grown past COMPACT_AFTER_BYTES


_recording = _Recording()


class StateUnavailable(JsonRESTError):
    """What a client is told when a change cannot be journaled: 503, which the SDKs retry and
    the API answers with its own 503 problem+json."""

    code = 503

    def __init__(self, problem: str) -> None:
        super().__init__("ServiceUnavailable", f"the local state cannot be written: {problem}")


def _ordering_lock(service: str) -> Any:
    """The lock under which a service's changes are applied in journal order (the snapshot
    takes all three)."""
    return {"dynamodb": write_lock(), "sqs": sqs_lock(), "s3": _s3_lock}[service]


@contextlib.contextmanager
def _outermost() -> Iterator[bool]:
    """True for the outermost journaled change of a thread: a transaction's puts, or a
    message a send adds, are not journaled twice."""
    depth = getattr(_nested, "depth", 0)
    _nested.depth = depth + 1
    try:
        yield depth == 0
    finally:
        _nested.depth = depth


def _append(record: tuple[Any, ...]) -> None:
    journal = _recording.journal
    assert journal is not None
    try:
        journal.append(record)
    except JournalUnavailable as error:
        raise StateUnavailable(str(error)) from error
    if journal.bytes_since_rotation > COMPACT_AFTER_BYTES:
        _recording.grown.set()


def _journaled(
    method: Callable[..., Any], lock: Any, record_of: Callable[..., tuple[Any, ...] | None]
) -> Callable[..., Any]:
    """`method`, whose change is journaled (as `record_of` its arguments says it, or not at all
    when that is None) before it is applied, under `lock` so that the journal's order is the
    order in which changes were applied."""

    @functools.wraps(method)
    def journaled(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _outermost() as outermost:
            if _recording.journal is None or not outermost:
                return method(self, *args, **kwargs)
            with lock:
                record = record_of(self, *args, **kwargs)
                if record is not None:
                    _append(record)
                return method(self, *args, **kwargs)

    journaled.__llmtasks_journaled__ = True  # type: ignore[attr-defined]
    return journaled


def _call_of(service: str, name: str) -> Callable[..., tuple[Any, ...]]:
    def record(backend: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return ("call", service, backend.account_id, backend.region_name, name, args, kwargs)

    return record


def _put_of(queue: Queue, message: Message) -> tuple[Any, ...]:
    return ("put", queue.account_id, queue.region, queue.name, state_format.message_of(message))


def _delete_of(queue: Queue, receipt_handle: str) -> tuple[Any, ...] | None:
    message = (
        queue_index.find(queue, receipt_handle)
        if queue_index.installed()
        else next((m for m in queue._messages if m.had_receipt_handle(receipt_handle)), None)
    )
    return ("delete", [message.id]) if message is not None else None


def _receive_of(message: Message, *_: Any, **__: Any) -> tuple[Any, ...]:
    return ("received", message.id, int(unix_time_millis()))


def _removal_of(_queue: Queue, message: Message) -> tuple[Any, ...]:
    return ("delete", [message.id])


def install() -> None:
    """Idempotent; after moto_patches.atomic.install(), so its locked methods are the ones journaled."""
    hooks = [(backend_class, name) for backend_class, names in _CALLS.values() for name in names]
    hooks += [(Queue, "add_message"), (Queue, "delete_message"), (Message, "mark_received")]
    missing = [
        f"{owner.__name__}.{name}" for owner, name in hooks if not callable(getattr(owner, name, None))
    ]
    if missing:
        print(
            f"the journal cannot follow this moto ({', '.join(missing)} missing): the state dir is"
            " kept at clean stops only",
            file=sys.stderr,
            flush=True,
        )
        return
    for service, (backend_class, names) in _CALLS.items():
        for name in names:
            method = getattr(backend_class, name)
            if not getattr(method, "__llmtasks_journaled__", False):
                setattr(
                    backend_class, name, _journaled(method, _ordering_lock(service), _call_of(service, name))
                )
    for owner, name, record_of in (
        (Queue, "add_message", _put_of),
        (Queue, "delete_message", _delete_of),
        (Message, "mark_received", _receive_of),
        (redrive, "remove_message", _removal_of),
    ):
        method = getattr(owner, name)
        if not getattr(method, "__llmtasks_journaled__", False):
            setattr(owner, name, _journaled(method, sqs_lock(), record_of))


@contextlib.contextmanager
def _every_writer_stopped() -> Iterator[None]:
    with write_lock(), sqs_lock(), _s3_lock:
        yield


def _snapshot(seq: int, *, clean: bool) -> bytes:
    return state_format.dump(seq, clean=clean)


def _write_whole(path: Path, data: bytes) -> None:
    """`path` holds `data` or what it held before, whatever happens meanwhile."""
    partial = path.with_suffix(".partial")
    with partial.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    partial.replace(path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@dataclass
class Loaded:
    """What a start found in the state dir."""

    seq: int = 0
    clean: bool = True
    replayed: int = 0
    refused_again: int = 0
    released: int = 0  # messages received before a crash and not deleted, now visible
    torn: journal_files.TornTail | None = None


class DurableState:
    """The state dir of the embedded endpoint: loaded and folded at start, journaled while it
    runs, snapshotted at a clean stop and whenever the journal grows."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.snapshot_path = directory / SNAPSHOT
        self.legacy_path = directory / LEGACY_SNAPSHOT
        self.journal: Journal | None = None
        self._folding = threading.Lock()  # one fold at a time: each deletes the segments before it
        self._grown = threading.Event()
        self._closed = False

    def open(self) -> Loaded:
        """Loads the snapshot and replays the journal; after an unclean stop, messages in flight
        are made visible. Then folds both into a new snapshot and starts journaling."""
        loaded = Loaded()
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.snapshot_path.exists():
            loaded.seq, loaded.clean = state_loading.load_snapshot(self.snapshot_path)
        elif self.legacy_path.exists():  # migrated: the fold below writes SNAPSHOT, then drops it
            loaded.seq, loaded.clean = state_loading.load_legacy_snapshot(self.legacy_path)
        replay = journal_files.read(self.directory, after_seq=loaded.seq)
        loaded.torn = replay.torn
        loaded.replayed = len(replay.records)
        loaded.refused_again = state_loading.replay(replay.records)
        last_seq = replay.records[-1][0] if replay.records else loaded.seq
        if loaded.replayed or not loaded.clean:
            loaded.clean = False
            loaded.released = state_loading.release_in_flight()
        self.journal = Journal(self.directory, next_seq=last_seq + 1)
        self._fold(clean=False)
        _recording.journal, _recording.grown = self.journal, self._grown
        threading.Thread(target=self._compact_when_grown, name="journal-compact", daemon=True).start()
        return loaded

    def save(self, *, clean: bool) -> int:
        """A snapshot of everything journaled so far (a clean stop's says so); the bytes written."""
        return self._fold(clean=clean)

    def _fold(self, *, clean: bool) -> int:
        assert self.journal is not None
        with self._folding:
            with _every_writer_stopped():
                data = _snapshot(self.journal.seq, clean=clean)
                older = self.journal.rotate()
            _write_whole(self.snapshot_path, data)
            for path in (*older, self.legacy_path):
                path.unlink(missing_ok=True)
        return len(data)

    def _compact_when_grown(self) -> None:
        while self._grown.wait() and not self._closed:
            self._grown.clear()
            try:
                self._fold(clean=False)
            except OSError as error:  # the journal goes on; the next growth tries again
                print(f"the state dir's snapshot could not be written: {error}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Stops journaling (the endpoint's process ends without it; tests end it so)."""
        _recording.journal = None
        self._closed = True
        self._grown.set()
        if self.journal is not None:
            with self._folding:
                self.journal.close()

    def status(self) -> dict[str, Any]:
        problem = self.journal.problem if self.journal is not None else None
        return {"ok": problem is None, "problem": problem, "directory": str(self.directory)}
