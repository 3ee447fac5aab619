"""The stack's own output, compact by default as `sam local` shows it: one line a log record
(time, function, request id, level, message and the ids it is about), the EMF metric lines
left out. `llmtasks up --log-format json` keeps the functions' raw JSON lines instead.

The handlers run in the stack's process and write to its stdout (the Powertools logger through
its stream handler, the EMF metrics through print), so the stack puts this filter in front of
stdout before it loads them.
"""

from __future__ import annotations

import io
import json
import threading
from typing import Any, TextIO

# The keys a line about a task carries (observability.task_keys), shown after its message.
SHOWN_KEYS = ("task_id", "batch_id", "tenant_id", "error_code")


def compact(line: str) -> str | None:
    """One raw line as the compact view shows it; None for a line it leaves out."""
    try:
        record: Any = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict):
        return line
    if "_aws" in record:  # an EMF metric: CloudWatch reads it, a person does not
        return None
    if "level" not in record or "message" not in record:
        return line
    # Powertools' timestamp: "2026-11-30 11:34:19,984+0000" -> "11:34:19.984"
    clock = str(record.get("timestamp", ""))[11:23].replace(",", ".")
    function = record.get("function_name") or "-"
    request = str(record.get("function_request_id") or "-")[:8]
    ids = "".join(f"  {key}={record[key]}" for key in SHOWN_KEYS if record.get(key))
    failure = str(record.get("exception") or "").strip().splitlines()
    reason = f"  | {failure[-1]}" if failure else ""
    return f"{clock} {function:18} {request:8} {record['level']:7} {record['message']}{ids}{reason}"


class CompactStdout(io.TextIOBase):
    """A stdout that passes whole lines through `compact`. Threads write at once (one invocation
    a thread), and print() writes a line's text and its newline in two calls, so each thread
    gathers its own line."""

    def __init__(self, target: TextIO) -> None:
        self._target = target
        self._pending = threading.local()
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        *lines, rest = (getattr(self._pending, "text", "") + text).split("\n")
        self._pending.text = rest
        shown = [view for view in map(compact, lines) if view is not None]
        if shown:
            with self._lock:
                self._target.write("".join(view + "\n" for view in shown))
                self._target.flush()
        return len(text)

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._target.flush()

    def isatty(self) -> bool:
        return self._target.isatty()
