"""A state dir read back: its snapshot (state_format, or the pickle of the release before) and
the journal's records after it, applied to moto's backends in order (moto_state.DurableState
opens the dir with these)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from moto.sqs.models import Message, Queue

from llmtasks_local import moto_backends
from llmtasks_local.emulator import state_format
from llmtasks_local.emulator.journal import StateError

LEGACY_SNAPSHOT_FORMAT = 2  # the pickle of moto's backends, with its journal's seq


def load_snapshot(path: Path) -> tuple[int, bool]:
    try:
        data = state_format.decode(path.read_bytes())
        if not isinstance(data, dict) or data.get("format") != state_format.FORMAT:
            raise ValueError("not a state snapshot")
        if data.get("version") != state_format.VERSION:
            version = data.get("version")
            raise ValueError(f"format version {version}, this release reads {state_format.VERSION}")
        return state_format.load(data)
    except Exception as error:
        raise StateError(f"the snapshot cannot be read: {error!r}", path) from error


def load_legacy_snapshot(path: Path) -> tuple[int, bool]:
    """A snapshot the release before wrote (pickled backends), loaded as it loaded it."""
    try:
        data = pickle.loads(path.read_bytes())  # noqa: S301 - the stack's own file, in its own state dir
    except Exception as error:
        raise StateError(f"the snapshot cannot be read: {error!r}", path) from error
    if not isinstance(data, dict):
        raise StateError("the snapshot is not one this version wrote", path)
    if data.get("format") != LEGACY_SNAPSHOT_FORMAT:  # written before the journal: a clean stop's
        data = {"seq": 0, "clean": True, "backends": data}
    moto_backends.install(data["backends"])
    return int(data["seq"]), bool(data["clean"])


class _Messages:
    """Every message of every queue by id, for replaying the journal's message records."""

    def __init__(self) -> None:
        self.where: dict[str, tuple[Queue, Message]] = {}
        for queue in _queues():
            for message in queue._messages:
                self.where[message.id] = (queue, message)

    def put(self, queue: Queue, saved: Message | dict[str, Any]) -> None:
        # a dict: as state_format keeps it; a Message: a journal of the release before
        message = state_format.message_from(saved) if isinstance(saved, dict) else saved
        self.where[message.id] = (queue, message)  # a move: off the queue it was on
        queue._messages.append(message)

    def delete(self, ids: list[str]) -> None:
        for message_id in ids:
            self.where.pop(message_id, None)

    def received(self, message_id: str, at_ms: int) -> None:
        if message_id in self.where:
            message = self.where[message_id][1]
            message.approximate_receive_count += 1
            message.approximate_first_receive_timestamp = message.approximate_first_receive_timestamp or at_ms

    def settle(self) -> None:
        """Each queue keeps the messages that are still where the journal last put them."""
        for queue in _queues():
            queue._messages = [m for m in queue._messages if self.where.get(m.id, (None, None)) == (queue, m)]


def _queues() -> Iterator[Queue]:
    for regions in moto_backends.backends("sqs").values():
        for backend in regions.values():
            yield from backend.queues.values()


def replay(records: list[tuple[int, Any]]) -> int:
    """Applies the journal's records; returns how many were refused again (a write whose
    condition failed when it was served fails the same way)."""
    messages = _Messages()
    refused = 0
    for _, record in records:
        kind = record[0]
        if kind == "call":
            _, service, account, region, name, args, kwargs = record
            backend = moto_backends.backends(service)[account][region]
            try:
                args = [_resolved(backend, value) for value in args]
                kwargs = {key: _resolved(backend, value) for key, value in kwargs.items()}
                getattr(backend, name)(*args, **kwargs)
            except Exception:
                refused += 1
        elif kind == "put":
            _, account, region, queue_name, message = record
            messages.put(moto_backends.backends("sqs")[account][region].queues[queue_name], message)
        elif kind == "delete":
            messages.delete(record[1])
        elif kind == "received":
            messages.received(record[1], record[2])
    messages.settle()
    return refused


def _resolved(backend: Any, value: Any) -> Any:
    return value.resolve(backend) if isinstance(value, state_format.S3ObjectRef) else value


def release_in_flight() -> int:
    """Messages received by invocations of a run that crashed are visible again at once (those
    invocations are gone); returns how many had been received and not deleted."""
    received = 0
    for queue in _queues():
        for message in queue._messages:
            received += message.approximate_receive_count > 0
            message.visible_at = 0.0
        queue._pending_messages = set()
    return received
