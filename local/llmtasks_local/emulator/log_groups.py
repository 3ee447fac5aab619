"""The local endpoint's CloudWatch Logs: each function's lines in the log group
`/aws/lambda/<name>`, one log stream per sandbox named as Lambda names them
(`2026/12/02/[$LATEST]<32 hex digits>`), its START, END and REPORT lines included, so
`aws logs tail --follow`, `filter-log-events` and `get-log-events` against the endpoint read them
as in AWS. The stack's own terminal output is unchanged.

Lines are sent with PutLogEvents every FLUSH_S, a request per stream with new lines: batched, so
the endpoint spends little of its CPU on them. They live as long as the endpoint process, as its
metrics do (the state dir does not keep them).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_logs import CloudWatchLogsClient

FLUSH_S = 2.0  # `aws logs tail --follow` polls every few seconds; each flush is a request a stream
MAX_EVENTS = 1000  # a request's events (PutLogEvents takes up to 10,000 and 1 MB)


def log_group(function_name: str) -> str:
    return f"/aws/lambda/{function_name}"


def new_log_stream(now: float) -> str:
    """A sandbox's log stream name, as Lambda gives each execution environment one."""
    day = datetime.fromtimestamp(now, UTC).strftime("%Y/%m/%d")
    return f"{day}/[$LATEST]{uuid.uuid4().hex}"


class LogsSink:
    def __init__(self, logs: CloudWatchLogsClient, clock: Callable[[], float] = time.time) -> None:
        self._logs = logs
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], list[tuple[int, str]]] = {}
        self._created: set[str] = set()  # groups and streams made on the endpoint

    def line(self, group: str, stream: str, text: str) -> None:
        stamp = int(self._clock() * 1000)
        with self._lock:
            self._pending.setdefault((group, stream), []).append((stamp, text))

    def create_groups(self, groups: Iterable[str]) -> None:
        """Makes these log groups now, before any line of theirs: `aws logs tail --follow` of a
        function that has not run yet waits for its lines instead of failing, as it does in AWS
        for a template that declares its functions' log groups. (Lambda itself makes a group at
        its function's first lines; here those are sent only at the next flush.)"""
        for group in groups:
            self._ensure_group(group)

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for (group, stream), events in pending.items():
            self._ensure(group, stream)
            for start in range(0, len(events), MAX_EVENTS):
                chunk = events[start : start + MAX_EVENTS]
                self._logs.put_log_events(
                    logGroupName=group,
                    logStreamName=stream,
                    logEvents=[{"timestamp": stamp, "message": text} for stamp, text in chunk],
                )

    def _ensure_group(self, group: str) -> None:
        if group not in self._created:
            # An endpoint the stack did not start may have it
            with contextlib.suppress(self._logs.exceptions.ResourceAlreadyExistsException):
                self._logs.create_log_group(logGroupName=group)
            self._created.add(group)

    def _ensure(self, group: str, stream: str) -> None:
        self._ensure_group(group)
        if f"{group}\n{stream}" not in self._created:
            self._logs.create_log_stream(logGroupName=group, logStreamName=stream)
            self._created.add(f"{group}\n{stream}")

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(FLUSH_S):
            try:
                self.flush()
            except Exception as error:  # the endpoint stopping first; lines of that flush are lost
                if not stop.is_set():
                    print(f"[logs] not sent: {error!r}", flush=True)
