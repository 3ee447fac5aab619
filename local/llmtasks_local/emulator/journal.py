"""An append-only journal of what the local AWS endpoint changed, in segment files.

Each record is written with one `write` before the request that made it is answered, so what
the endpoint acknowledged is in the kernel's page cache when the reply leaves: it survives the
death of any process of the stack (SIGKILL, an out-of-memory kill). The disk is synced once a
second (Redis's `appendfsync everysec`): an operating-system crash or a power cut may lose the
last second.

A record is framed `length | crc32 | seq | payload` (big-endian 4, 4, 8 bytes), so a reader
tells a record cut short by a crash (the last one of the last segment: dropped, with a warning)
from a file damaged in the middle (refused: the start stops and says which file). Segments are
named by the sequence number of their first record; a snapshot says which number it includes,
and a start replays what comes after it. A record's payload is JSON (state_format.encode); a
segment written before that holds pickles, read once when such a state dir is migrated.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pickle
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmtasks_local.emulator import state_format
from llmtasks_local.tool_errors import EXIT_FAILED, ToolError

_HEADER = struct.Struct(">IIQ")
SNAPSHOT = "state.json"
# The snapshot of a state dir written before state_format: pickles of moto's backends, read
# once (and the journal after it), then replaced by SNAPSHOT.
LEGACY_SNAPSHOT = "moto.pickle"
_PICKLE = b"\x80"  # how a pickle of protocol 2 or later begins; JSON never does
SEGMENT_PREFIX = "journal-"
SEGMENT_SUFFIX = ".log"
SYNC_EVERY_S = 1.0


class StateError(Exception):
    """State on disk that cannot be read back: the start stops, naming the file."""

    def __init__(self, what: str, path: Path) -> None:
        super().__init__(f"{what} ({path})")
        self.what = what
        self.path = path


class JournalUnavailable(Exception):
    """A record could not be written (a full or read-only disk): the change is refused."""


def segment_name(first_seq: int) -> str:
    return f"{SEGMENT_PREFIX}{first_seq:020d}{SEGMENT_SUFFIX}"


def segments(directory: Path) -> list[Path]:
    """The journal's segment files in `directory`, oldest first."""
    return sorted(directory.glob(f"{SEGMENT_PREFIX}*{SEGMENT_SUFFIX}"))


def state_files(directory: Path) -> list[Path]:
    """The endpoint's files in a state dir: its snapshot (and an older one) and its journal."""
    return [directory / SNAPSHOT, directory / LEGACY_SNAPSHOT, *segments(directory)]


def _frame(seq: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(seq.to_bytes(8, "big")))
    return _HEADER.pack(len(payload), crc, seq) + payload


@dataclass(frozen=True)
class TornTail:
    """The end of a segment that a crash cut short: what was dropped."""

    path: Path
    offset: int
    dropped_bytes: int

    def __str__(self) -> str:
        return (
            f"{self.path}: dropped a record cut short at byte {self.offset} ({self.dropped_bytes} bytes),"
            " written when the stack was stopped; it was never acknowledged"
        )


@dataclass
class Replay:
    """What a start reads back from the journal."""

    records: list[tuple[int, Any]]
    torn: TornTail | None = None


def read(directory: Path, after_seq: int = 0) -> Replay:
    """The records of every segment with a sequence number above `after_seq`, in order.

    A last record cut short (at the end of the newest segment) is dropped and reported; any other
    damage raises StateError naming the file."""
    found = segments(directory)
    replay = Replay(records=[])
    expected: int | None = None
    for index, path in enumerate(found):
        try:
            data = path.read_bytes()
        except OSError as error:
            raise StateError(f"the journal cannot be read: {error.strerror}", path) from error
        offset = 0
        while offset < len(data):
            torn = _torn_or_record(data, offset)
            if torn is None:
                length, _, seq = _HEADER.unpack_from(data, offset)
                start = offset + _HEADER.size
                if expected is not None and seq != expected:
                    raise StateError(f"the journal skips from record {expected - 1} to {seq}", path)
                expected = seq + 1
                if seq > after_seq:
                    try:
                        record = _record(data[start : start + length])
                    except Exception as error:
                        raise StateError(
                            f"record {seq} of the journal cannot be read: {error}", path
                        ) from error
                    replay.records.append((seq, record))
                offset = start + length
                continue
            if index == len(found) - 1 and _is_last_write(data, offset):
                replay.torn = TornTail(path, offset, len(data) - offset)
                break
            raise StateError(f"the journal is damaged at byte {offset}", path)
    return replay


def _record(payload: bytes) -> Any:
    if payload.startswith(_PICKLE):  # written before state_format: migrated at this start
        return pickle.loads(payload)  # noqa: S301 - the stack's own file, in its own state dir
    return state_format.decode(payload)


def _torn_or_record(data: bytes, offset: int) -> str | None:
    """None when a whole record with a matching checksum starts at `offset`; else why not."""
    if len(data) - offset < _HEADER.size:
        return "a header cut short"
    length, crc, seq = _HEADER.unpack_from(data, offset)
    start = offset + _HEADER.size
    if len(data) - start < length:
        return "a record cut short"
    if zlib.crc32(data[start : start + length], zlib.crc32(seq.to_bytes(8, "big"))) != crc:
        return "a checksum that does not match"
    return None


def _is_last_write(data: bytes, offset: int) -> bool:
    """A crash tears the last write only: the damaged record runs to the end of the file (or
    past it), and nothing follows it."""
    if len(data) - offset < _HEADER.size:
        return True
    length: int = _HEADER.unpack_from(data, offset)[0]
    return offset + _HEADER.size + length >= len(data)


class Journal:
    """The writer: appends records to the newest segment, syncs it once a second, and starts a
    new segment at each snapshot (`rotate`).

    A write that fails (ENOSPC, EROFS, EIO) is undone (the segment is cut back to its last whole
    record) and raises JournalUnavailable; the next append tries again, so the journal recovers
    by itself once there is room. `problem` says what the last failure was, or None."""

    def __init__(self, directory: Path, next_seq: int) -> None:
        self.directory = directory
        self.seq = next_seq - 1
        self.problem: str | None = None
        self.bytes_since_rotation = 0
        self._lock = threading.Lock()
        self._fd = -1
        self._good_length = 0
        self._dirty = False
        self._closed = threading.Event()
        self._open_segment()
        self._syncer = threading.Thread(target=self._sync_every_second, name="journal-sync", daemon=True)
        self._syncer.start()

    @property
    def path(self) -> Path:
        return self.directory / segment_name(self._first_seq)

    def _open_segment(self) -> None:
        self._first_seq = self.seq + 1
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._good_length = os.fstat(self._fd).st_size

    def append(self, record: Any) -> int:
        """Writes `record`; returns its sequence number once it is in the file."""
        try:
            payload = state_format.encode(record)
        except (TypeError, ValueError) as error:
            raise JournalUnavailable(f"a change that cannot be kept: {error}") from error
        with self._lock:
            seq = self.seq + 1
            frame = _frame(seq, payload)
            try:
                if self._good_length != os.fstat(self._fd).st_size:
                    os.ftruncate(self._fd, self._good_length)  # a failed write's remains
                written = os.write(self._fd, frame)
                if written != len(frame):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError as error:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._good_length)
                self.problem = f"{error.strerror or error} ({self.path})"
                raise JournalUnavailable(self.problem) from error
            self.problem = None
            self.seq = seq
            self._good_length += len(frame)
            self.bytes_since_rotation += len(frame)
            self._dirty = True
            return seq

    def rotate(self) -> list[Path]:
        """Starts a new segment after the last record (unless the current one is empty);
        returns the older ones. Call it with every writer stopped (under the locks a snapshot
        holds)."""
        with self._lock:
            self._sync()
            if self.seq + 1 != self._first_seq:
                os.close(self._fd)
                self._open_segment()
            self.bytes_since_rotation = 0
            return [path for path in segments(self.directory) if path != self.path]

    def _sync(self) -> None:
        if self._dirty:
            self._dirty = False
            with contextlib.suppress(OSError):
                os.fsync(self._fd)

    def _sync_every_second(self) -> None:
        while not self._closed.wait(SYNC_EVERY_S):
            with self._lock:
                self._sync()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._sync()
            os.close(self._fd)
            self._fd = -1


def read_kept(path: Path, what: str) -> Any:
    """A small JSON file the stack keeps beside the journal (None when there is none); one it
    cannot read stops the start, with the file named."""
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ToolError(
            f"{what} cannot be read: {error}",
            where=str(path),
            fix="start empty with --reset, or move the file aside to keep it",
            exit_code=EXIT_FAILED,
        ) from error


def write_kept(path: Path, value: Any) -> None:
    """`value` as the JSON of `path`, written whole beside it and then moved in place: a crash
    leaves the old file or the new one, never half of one."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(value))
    partial.replace(path)
