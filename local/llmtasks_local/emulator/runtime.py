"""Invokes a function the way Lambda does: a pool of sandboxes, each an OS process.

A function gets as many sandboxes as its concurrency allows, started when an invocation finds
none idle (a cold start), reused while warm, retired when idle too long or when its code
changes. Each runs the handler under awslambdaric (local/sandbox.py); the handler code is
exactly what Lambda runs, and only the event comes from here.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from llmtasks_local.emulator.function_site import function_site
from llmtasks_local.emulator.log_groups import LogsSink, log_group, new_log_stream
from llmtasks_local.emulator.metrics import MetricsSink
from llmtasks_local.emulator.sandbox import FunctionError, Invocation, Sandbox, SandboxDied
from llmtasks_local.sam.function_spec import FunctionSpec

__all__ = ["FunctionRuntime", "Invocation"]

# Lambda keeps an idle environment for minutes (not documented; 5 to 15 are seen); here 10.
IDLE_RETIRE_S = 600.0


class ColdStartSlots:
    """Lambda gives each new environment CPU of its own; here every cold start shares this
    machine's cores. A burst that would start dozens of sandboxes at once (16 clients' first
    requests reach three functions) made each import take seconds; so at most one cold start a
    core runs at once, and an invocation waiting for one takes a sandbox that turns idle meanwhile
    instead. A function's first sandbox never queues at all.

    Synchronous invocations (a client waits on them, and API Gateway gives up at 30 s) and event
    sources' each have a share of the slots (rounded up for the first) that the other kind cannot
    take while they wait: after a restart, the worker's scale-out (a dozen starts) held a status
    request's second sandbox past the client's 30 s; and 16 clients long-polling a cold stack's
    tasks started 15 StatusFunction sandboxes in 3 s while the worker's scale-out, whose calls
    lose a slot-second for each second a sandbox is missing, waited for them all. Beyond its
    share a kind takes any slot the other does not wait for."""

    def __init__(self, size: int) -> None:
        self._free = size
        # By kind, synchronous (True) or an event source's (False).
        self._share = {True: size - size // 2, False: size // 2}
        self._holding = {True: 0, False: 0}
        self._waiting = {True: 0, False: 0}
        self._lock = threading.Lock()

    def try_take(self, *, synchronous: bool) -> bool:
        with self._lock:
            if not self._free:
                return False
            other = not synchronous
            if self._waiting[other] and self._free <= self._share[other] - self._holding[other]:
                return False  # the free slots are what the waiting kind still lacks of its share
            self._holding[synchronous] += 1
            self._free -= 1
            return True

    def waits(self, *, synchronous: bool, waiting: bool) -> None:
        """An invocation of the kind begins (True) or stops (False) waiting for a slot."""
        with self._lock:
            self._waiting[synchronous] += 1 if waiting else -1

    def give_back(self, *, synchronous: bool) -> None:
        with self._lock:
            self._free += 1
            self._holding[synchronous] -= 1


COLD_START_SLOTS = max(2, os.cpu_count() or 2)
_cold_starts = ColdStartSlots(COLD_START_SLOTS)
_COLD_START_WAIT_S = 0.05
# How long a closing runtime waits for its sandboxes' last lines (a killed process's pipe drains
# in milliseconds; the bound is for a reader stuck on a machine under load).
CLOSE_DRAIN_S = 5.0


def print_line(line: str) -> None:
    """A sandbox's line on the stack's stdout, in one write: print() writes the text and its
    newline apart, and another sandbox's reader could write between them."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class FunctionRuntime:
    """Invokes one function; at most `concurrency` invocations (and sandboxes) at once."""

    def __init__(
        self,
        spec: FunctionSpec,
        *,
        concurrency: int = 10,
        report: bool = False,
        environment: Mapping[str, str] | None = None,
        on_line: Callable[[str], None] = print_line,
        record_aws_calls: Path | None = None,
        idle_retire_s: float = IDLE_RETIRE_S,
        metrics: MetricsSink | None = None,
        logs: LogsSink | None = None,
    ) -> None:
        self.spec = spec
        self._metrics = metrics  # Lambda's own metrics of each invocation, if the stack keeps them
        self._logs = logs  # each sandbox's lines in its function's log group, if the stack keeps them
        self._log_group = log_group(spec.logical_id)
        self.concurrency = concurrency
        self.report = report  # print Lambda's START, END and REPORT lines for each invocation
        # The stack's environment beneath each sandbox's own (None: this process's, read at each
        # cold start, so what the stack sets before its first invocation reaches the sandboxes).
        self._environment = environment
        self._on_line = on_line if metrics is None else _tee(on_line, metrics.line)
        _, missing = function_site(spec.code_dir, spec.layer_dirs)
        if missing:  # said once, at start: each cold start fails on it as Lambda's init would
            print(
                f"{spec.logical_id}: its requirements name {', '.join(missing)}, which this venv has "
                "not installed: its sandboxes cannot import them (pip install them into the venv)",
                file=sys.stderr,
                flush=True,
            )
        self._record_aws_calls = record_aws_calls
        self._idle_retire_s = idle_retire_s
        self._idle: list[tuple[Sandbox, float]] = []  # with when each went idle (monotonic)
        self._busy: set[Sandbox] = set()
        self._count = 0
        self._warming = 0  # sandboxes `prewarm` is starting
        self._generation = 0
        self._closed = False
        self._available = threading.Condition()
        self._cut_ms: int | None = None
        # The lines of the invocations whose log was asked for (Invoke's LogType: Tail), by the
        # log stream of the sandbox running each: a sandbox runs one invocation at a time.
        self._tails: dict[str, list[str]] = {}

    # --- sandboxes ------------------------------------------------------------------------

    def _acquire(self, *, synchronous: bool) -> tuple[Sandbox, bool, bool]:
        """An idle sandbox, or a new one once there is room: (the sandbox, whether it is a cold
        start, whether that start holds one of `_cold_starts`). A sandbox being warmed ahead
        (`prewarm`) is waited for rather than started twice."""
        waiting_for_slot = False
        try:
            with self._available:
                while True:
                    while self._idle:
                        sandbox, _ = self._idle.pop()
                        if sandbox.alive:
                            self._busy.add(sandbox)
                            return sandbox, False, False
                        self._count -= 1  # ended while idle (its process exited): replaced below
                    if self._warming:
                        self._available.wait()  # it turns idle, or its start fails, and notifies
                        continue
                    if self._count < self.concurrency:
                        throttled = self._count > 0  # a function's first sandbox does not queue
                        if not throttled or _cold_starts.try_take(synchronous=synchronous):
                            self._count += 1
                            break
                        if not waiting_for_slot:
                            waiting_for_slot = True
                            _cold_starts.waits(synchronous=synchronous, waiting=True)
                        self._available.wait(_COLD_START_WAIT_S)  # another function's start may end
                        continue
                    self._available.wait()
        finally:
            if waiting_for_slot:
                _cold_starts.waits(synchronous=synchronous, waiting=False)
        try:
            sandbox = self._new_sandbox()
        except BaseException:
            if throttled:
                _cold_starts.give_back(synchronous=synchronous)
            self._forget(None)
            raise
        with self._available:
            self._busy.add(sandbox)
        return sandbox, True, throttled

    def _new_sandbox(self) -> Sandbox:
        """A sandbox process of this function, of the current code's generation (its init runs)."""
        on_line, stream = self._on_line, new_log_stream(time.time())
        on_line = _tee(on_line, functools.partial(self._tail, stream))
        if self._logs is not None:
            on_line = _tee(on_line, functools.partial(self._logs.line, self._log_group, stream))
        sandbox = Sandbox(
            self.spec,
            os.environ if self._environment is None else self._environment,
            on_line,
            log_stream=stream,
            record_aws_calls=self._record_aws_calls,
        )
        sandbox.generation = self._generation
        return sandbox

    def _forget(self, sandbox: Sandbox | None) -> None:
        """A sandbox leaves the pool (None: one that failed to start), making room for another."""
        with self._available:
            self._count -= 1
            if sandbox is not None:
                self._busy.discard(sandbox)
            self._available.notify()
        if sandbox is not None:
            sandbox.retire()

    def _release(self, sandbox: Sandbox) -> None:
        with self._available:
            self._busy.discard(sandbox)
            if sandbox.alive and not self._closed and sandbox.generation == self._generation:
                self._idle.append((sandbox, time.monotonic()))
                self._available.notify()
                return
        self._forget(sandbox)

    def prewarm(self) -> float | None:
        """Starts a sandbox before any invocation asks for one and keeps it idle, as SAM CLI's
        `--warm-containers EAGER` does: its init seconds, or None when the function has a
        sandbox already or the start failed (the first invocation then cold-starts as usual)."""
        with self._available:
            if self._closed or self._count > 0:
                return None
            self._count += 1
            self._warming += 1
        sandbox: Sandbox | None = None
        try:
            while not _cold_starts.try_take(synchronous=False):  # a core a start, as any scale-out
                time.sleep(_COLD_START_WAIT_S)
            try:
                sandbox = self._new_sandbox()
                sandbox.wait_ready()
            finally:
                _cold_starts.give_back(synchronous=False)
        except BaseException as failed:
            self._forget(sandbox)
            if isinstance(failed, SandboxDied | OSError):
                return None
            raise
        else:
            with self._available:
                self._busy.add(sandbox)
            self._release(sandbox)  # idle before the warm-up ends: no waiter starts a second one
            return sandbox.init_s
        finally:
            with self._available:
                self._warming -= 1
                self._available.notify_all()  # every invocation that waited on this warm-up

    def retire_idle(self, *, older_than_s: float | None = None) -> int:
        """Retires idle sandboxes (those idle longer than `older_than_s`, or all); how many."""
        now = time.monotonic()
        with self._available:
            keep: list[tuple[Sandbox, float]] = []
            leaving: list[Sandbox] = []
            for sandbox, since in self._idle:
                stale = older_than_s is None or now - since > older_than_s or not sandbox.alive
                if stale:
                    leaving.append(sandbox)
                else:
                    keep.append((sandbox, since))
            self._idle = keep
            self._count -= len(leaving)
            self._available.notify_all()
        for sandbox in leaving:
            sandbox.retire()
        return len(leaving)

    def reap(self) -> None:
        """Retires the sandboxes idle past `idle_retire_s` (the stack calls it now and then)."""
        self.retire_idle(older_than_s=self._idle_retire_s)

    def reload(self) -> None:
        """The function's code changed: idle sandboxes end now, busy ones after their
        invocation; the next invocation cold-starts on the new code."""
        with self._available:
            self._generation += 1
        self.retire_idle()

    def cut_to(self, deadline: float) -> None:
        """The invocations in flight have until `deadline` (monotonic): a stop's grace."""
        deadline_ms = int((time.time() + deadline - time.monotonic()) * 1000)
        with self._available:
            self._cut_ms = deadline_ms
            busy = list(self._busy)
        for sandbox in busy:
            sandbox.cut_to(deadline_ms)

    def close(self) -> None:
        """Ends every sandbox: the idle ones, and the busy ones (whose invocations end with an
        error: a stop's grace is over when it closes the runtimes). Returns once each has ended
        and its output is read to the last line (CLOSE_DRAIN_S at most): an invocation ends when
        its response is posted, and the lines it wrote just before may still be in the pipe."""
        with self._available:
            self._closed = True
            busy = list(self._busy)
            leaving = [sandbox for sandbox, _ in self._idle] + busy
        self.retire_idle()
        for sandbox in busy:
            sandbox.kill()
        give_up = time.monotonic() + CLOSE_DRAIN_S
        for sandbox in leaving:
            sandbox.wait_ended(max(0.0, give_up - time.monotonic()))

    def __enter__(self) -> FunctionRuntime:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def sandboxes(self) -> list[Sandbox]:
        with self._available:
            return [sandbox for sandbox, _ in self._idle] + list(self._busy)

    # --- invocations ----------------------------------------------------------------------

    def invoke(
        self, event: Any, *, request_id: str | None = None, synchronous: bool = False, log: bool = False
    ) -> Invocation:
        """One invocation; `synchronous` when a caller waits on it (API Gateway, RequestResponse),
        whose cold start goes ahead of the event sources'; with `log`, its lines come back in it
        (those the sandbox wrote before its reply: a line still in the pipe then is not)."""
        request_id = request_id or str(uuid.uuid4())
        sandbox, cold, throttled = self._acquire(synchronous=synchronous)
        if log:
            self._tails[sandbox.log_stream] = []
        self._say(sandbox, f"START RequestId: {request_id} Version: $LATEST")
        init_s: float | None = None
        started = time.monotonic()
        try:
            if cold:
                try:
                    sandbox.wait_ready()
                finally:
                    if throttled:
                        _cold_starts.give_back(synchronous=synchronous)
                init_s = sandbox.init_s
                started = time.monotonic()
                if self._cut_ms is not None:
                    sandbox.cut_to(self._cut_ms)
            payload = sandbox.run(event, request_id, self.spec.timeout_s)
        except TimeoutError:
            invocation = Invocation(
                error=f"Task timed out after {self.spec.timeout_s:.2f} seconds", timed_out=True
            )
        except FunctionError as exc:
            invocation = Invocation(error=str(exc), error_object=exc.error_object)
        except SandboxDied as exc:
            invocation = Invocation(error=str(exc))
        else:
            invocation = Invocation(payload=payload)
        finally:
            self._release(sandbox)
        invocation = dataclasses.replace(
            invocation,
            duration_s=time.monotonic() - started,
            init_s=init_s,
            max_memory_mb=math.ceil(sandbox.peak_mb),
        )
        if self._metrics is not None:
            self._metrics.invoked(
                self.spec.logical_id, ok=invocation.ok, duration_ms=invocation.duration_s * 1000
            )
        self._say(sandbox, f"END RequestId: {request_id}")
        self._say(sandbox, self._report_line(request_id, invocation))
        if log:
            invocation = dataclasses.replace(invocation, log=tuple(self._tails.pop(sandbox.log_stream, ())))
        return invocation

    def _tail(self, stream: str, line: str) -> None:
        tail = self._tails.get(stream)
        if tail is not None:
            tail.append(line)

    def _say(self, sandbox: Sandbox, line: str) -> None:
        """One of Lambda's own lines about an invocation (START, END, REPORT): always in the
        sandbox's log stream, as Lambda writes them; on the stack's output with --report."""
        if self.report:
            print(line, flush=True)
        self._tail(sandbox.log_stream, line)
        if self._logs is not None:
            self._logs.line(self._log_group, sandbox.log_stream, line)

    def _report_line(self, request_id: str, invocation: Invocation) -> str:
        """The line Lambda writes to CloudWatch Logs after each invocation (and `sam local
        invoke` prints), with the function's name added: the stack serves them all."""
        milliseconds = invocation.duration_s * 1000
        line = (
            f"REPORT RequestId: {request_id}\tFunction: {self.spec.logical_id}"
            f"\tDuration: {milliseconds:.2f} ms\tBilled Duration: {math.ceil(milliseconds)} ms"
            f"\tMemory Size: {self.spec.memory_mb} MB\tMax Memory Used: {invocation.max_memory_mb} MB"
        )
        if invocation.init_s is not None:
            line += f"\tInit Duration: {invocation.init_s * 1000:.2f} ms"
        if invocation.timed_out:
            line += "\tStatus: timeout"
        elif invocation.error and invocation.error.startswith("Runtime.OutOfMemory"):
            line += "\tStatus: error\tError Type: Runtime.OutOfMemory"
        return line


def _tee(on_line: Callable[[str], None], also: Callable[[str], None]) -> Callable[[str], None]:
    """`on_line`, each line given to `also` first (a log stream, the metrics of EMF lines, an
    invocation's tail: each keeps the line whole, as CloudWatch Logs does)."""

    def each(line: str) -> None:
        also(line)
        on_line(line)

    return each


def print_to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
