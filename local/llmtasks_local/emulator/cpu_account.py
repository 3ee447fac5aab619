"""Where the stack's CPU goes, by part: what the bench sets beside each part's floor.

Each thread of the stack process is named for what it does (`sqs-WorkerFunction-0` polls a
queue, `http-api` serves the API), and each thread has a CPU clock of its own, so the account of
the live threads is a sum by name that costs nothing until it is read. A thread that ends takes
its clock with it: the threads that come and go under load (the Runtime API's connections) are
charged as they end (`charge_ending`), and whatever of the process's CPU no thread accounts for
is shown as such rather than spread.

Each sandbox is a process of its own: its CPU is read from /proc, and its runtime client says
how much of it went to its init (the cold start's imports) and to the handler (sandbox_main's
CPU file); the rest is the transport, the Runtime API's round trips and the runtime client
around the handler. A sandbox that ends
is charged to its function with what it had used.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import defaultdict
from pathlib import Path
from typing import Any

from llmtasks_local.emulator.processes import cpu_seconds

# Thread names' prefixes (the threads' own names, set where each is started) and their parts.
PARTS: tuple[tuple[str, str], ...] = (
    ("http-api", "HTTP API"),
    # Starlette's run_in_threadpool: the HTTP API's (and the Lambda API's) synchronous invokes.
    ("AnyIO worker thread", "HTTP API invokes"),
    ("lambda-api", "Lambda API"),
    ("event-invoc", "Lambda API"),  # the asynchronous invocations' queue and its pool
    ("runtime-api-", "Runtime API"),
    ("sqs-", "SQS pollers"),
    ("stream-", "stream pollers"),
    ("sandbox-log-", "sandboxes' output"),
    ("metrics", "CloudWatch sinks"),
    ("logs", "CloudWatch sinks"),
    ("ttl", "TTL"),
    ("sandbox-spawner", "sandbox starts"),
    ("warm", "sandbox starts"),
    ("code-watch", "watchers"),  # hot reload, and idle sandboxes retired
    ("state-watch", "watchers"),  # whether the state dir takes changes
    ("MainThread", "main"),
)
UNACCOUNTED = "threads that ended"


def part_of(thread_name: str) -> str:
    return next((part for prefix, part in PARTS if thread_name.startswith(prefix)), "other threads")


Seconds = defaultdict[str, float]


def _added(into: Seconds, figures: dict[str, float]) -> None:
    for key, seconds in figures.items():
        into[key] += seconds


def read_sandbox_cpu(pid: int, path: Path, process_s: float | None = None) -> dict[str, float]:
    """A sandbox's CPU seconds: in all (`process_s`: read from /proc unless given), before its
    first invocation (`init_s`, 0 until that began) and in its handler (`handler_s`), as it
    wrote them to `path` (sandbox_main)."""
    figures = {"process_s": cpu_seconds(pid) if process_s is None else process_s}
    try:
        init_us, handler_us = path.read_text().split()
    except (OSError, ValueError):
        return figures  # no invocation yet
    figures["init_s"], figures["handler_s"] = int(init_us) / 1e6, int(handler_us) / 1e6
    return figures


class CpuAccount:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended_threads: Seconds = defaultdict(float)
        self._charged: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # charged as they end
        self._sandboxes: dict[int, tuple[str, Path]] = {}  # live ones: pid -> function, CPU file
        self._ended_sandboxes: defaultdict[str, Seconds] = defaultdict(lambda: defaultdict(float))

    def charge_ending(self) -> None:
        """Called by a thread as it ends: its CPU stays in the account."""
        thread = threading.current_thread()
        with self._lock:
            self._ended_threads[part_of(thread.name)] += time.thread_time()
            self._charged.add(thread)

    def sandbox_started(self, pid: int, function: str, cpu_file: Path) -> None:
        with self._lock:
            self._sandboxes[pid] = (function, cpu_file)

    def sandbox_ended(self, pid: int, process_s: float | None = None) -> None:
        """Called once the process has exited and before it is reaped (a zombie's /proc still
        holds its CPU), or with the CPU it used (`process_s`: a forked sandbox's server reaps it)."""
        with self._lock:
            started = self._sandboxes.pop(pid, None)
            if started is not None:
                function, cpu_file = started
                _added(self._ended_sandboxes[function], read_sandbox_cpu(pid, cpu_file, process_s))

    def read(self) -> dict[str, Any]:
        """{"stack": CPU seconds by part, "sandboxes": {function: {"process_s", "init_s",
        "handler_s"}}, "live_sandboxes": {function: [pid, ...]}}, the sandboxes' figures summed
        over those of each function, ended ones too; the live ones' processes by function (a
        forked sandbox's command line is its fork server's, which names no function)."""
        with self._lock:
            stack: Seconds = defaultdict(float, self._ended_threads)
            charged = set(self._charged)
            live = dict(self._sandboxes)
            sandboxes: defaultdict[str, Seconds] = defaultdict(lambda: defaultdict(float))
            for function, ended in self._ended_sandboxes.items():
                _added(sandboxes[function], ended)
        clock_of = getattr(time, "pthread_getcpuclockid", None)  # not on macOS: all unaccounted
        for thread in threading.enumerate():
            if clock_of is None or thread.ident is None or thread in charged:
                continue
            try:
                stack[part_of(thread.name)] += time.clock_gettime(clock_of(thread.ident))
            except OSError:
                continue  # ended meanwhile
        stack[UNACCOUNTED] = max(0.0, time.process_time() - sum(stack.values()))
        live_sandboxes: defaultdict[str, list[int]] = defaultdict(list)
        for pid, (function, cpu_file) in live.items():
            _added(sandboxes[function], read_sandbox_cpu(pid, cpu_file))
            live_sandboxes[function].append(pid)
        return {
            "stack": dict(stack),
            "sandboxes": {function: dict(figures) for function, figures in sandboxes.items()},
            "live_sandboxes": {function: sorted(pids) for function, pids in live_sandboxes.items()},
        }


ACCOUNT = CpuAccount()  # the stack process's: its threads and sandboxes are the process's
