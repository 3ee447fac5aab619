"""Runs a function's handler the way Lambda does, in-process: sandboxes, contexts, timeouts.

Each sandbox loads the handler module afresh (its own globals, as in its own Lambda execution
environment) and runs one invocation at a time on its own thread; a function gets as many
sandboxes as its concurrency allows. The handler code is exactly what Lambda runs; only the
event and the context come from here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
import queue
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from llmtasks.local.aws_calls import current_function
from llmtasks.local.template import PSEUDO_PARAMETERS, FunctionSpec

_module_counter = itertools.count(1)


class LocalLambdaContext:
    """The attributes and method of Lambda's context object that handlers and Powertools use."""

    def __init__(self, spec: FunctionSpec, deadline: float, request_id: str | None = None) -> None:
        region, account = PSEUDO_PARAMETERS["AWS::Region"], PSEUDO_PARAMETERS["AWS::AccountId"]
        self.function_name = spec.logical_id
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:{region}:{account}:function:{spec.logical_id}"
        self.memory_limit_in_mb = spec.memory_mb
        self.aws_request_id = request_id or str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{spec.logical_id}"
        self.log_stream_name = f"local/{self.aws_request_id}"
        self._deadline = deadline

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))

    def cut_to(self, deadline: float) -> None:
        """A stop gives the invocation until `deadline` (monotonic) to finish: its remaining
        time says so, and so it takes no new work it could not finish (the worker's refill)."""
        self._deadline = min(self._deadline, deadline)


@dataclass(frozen=True)
class Invocation:
    payload: Any = None
    error: str | None = None  # the handler raised: Lambda reports a function error
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


# The sandboxes are threads of one process and share sys.modules: two first imports of the same
# packages at once can see each other's half-imported modules (Powertools' data_classes raised
# "cannot import name 'SQSEvent' from partially initialized module" when a restart with a backlog
# cold-started ten workers at once, and the failed invocations kept their messages for the
# visibility timeout). In Lambda each sandbox is a process of its own. Here a function's first
# cold starts take turns; once one has loaded, its packages are whole in sys.modules and later
# cold starts (a sandbox replaced after a timeout) do not wait, since a cold start's wait counts
# against its invocation's Timeout.
_first_cold_starts = threading.Lock()
_loaded_once: set[Path] = set()  # the handler files loaded once in this process


def load_handler(spec: FunctionSpec) -> Callable[..., Any]:
    """A fresh copy of the handler module, as a new Lambda execution environment would import it."""
    if spec.handler_file in _loaded_once:
        return _import_handler(spec)
    with _first_cold_starts:
        handler = _import_handler(spec)
        _loaded_once.add(spec.handler_file)
        return handler


def _import_handler(spec: FunctionSpec) -> Callable[..., Any]:
    path = spec.handler_file
    if not path.is_file():
        raise FileNotFoundError(f"{spec.logical_id}: no handler module at {path}")
    for layer in spec.layer_dirs:
        if str(layer) not in sys.path:
            sys.path.append(str(layer))  # after the function's own code, as in Lambda
    name = f"_llmtasks_local_{spec.logical_id}_{next(_module_counter)}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module: ModuleType = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    handler: Callable[..., Any] = getattr(module, spec.handler.rsplit(".", 1)[1])
    return handler


class _Sandbox:
    def __init__(self, spec: FunctionSpec) -> None:
        self.spec = spec
        self._jobs: queue.SimpleQueue[tuple[Any, LocalLambdaContext, Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._handler: Callable[..., Any] | None = None
        self._thread = threading.Thread(target=self._serve, name=f"sandbox-{spec.logical_id}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        current_function.set(self.spec.logical_id)  # whose AWS calls these are (aws_calls.py)
        while (job := self._jobs.get()) is not None:
            event, context, future = job
            try:
                if self._handler is None:  # the cold start happens inside the first invocation
                    self._handler = load_handler(self.spec)
                future.set_result(self._handler(event, context))
            except BaseException as exc:  # sys.exit in a handler too: Lambda reports it as an error
                future.set_exception(exc)

    def submit(self, event: Any, context: LocalLambdaContext) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((event, context, future))
        return future

    def retire(self) -> None:
        self._jobs.put(None)


class FunctionRuntime:
    """Invokes one function; at most `concurrency` invocations run at once."""

    def __init__(self, spec: FunctionSpec, *, concurrency: int = 10, report: bool = False) -> None:
        self.spec = spec
        self.concurrency = concurrency
        self.report = report  # print Lambda's REPORT line after each invocation
        self._idle: list[_Sandbox] = []
        self._count = 0
        self._available = threading.Condition()
        self._live: set[LocalLambdaContext] = set()  # the contexts of invocations in flight

    def _acquire(self) -> _Sandbox:
        with self._available:
            while not self._idle and self._count >= self.concurrency:
                self._available.wait()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        return _Sandbox(self.spec)

    def _release(self, sandbox: _Sandbox, *, healthy: bool) -> None:
        with self._available:
            if healthy:
                self._idle.append(sandbox)
            else:
                # A timed-out sandbox is thrown away, as Lambda does; its thread cannot be killed,
                # so it finishes in the background and then exits.
                self._count -= 1
                sandbox.retire()
            self._available.notify()

    def cut_to(self, deadline: float) -> None:
        """The invocations in flight have until `deadline` (monotonic): a stop's grace."""
        for context in list(self._live):
            context.cut_to(deadline)

    def close(self) -> None:
        """Ends the idle sandboxes' threads (a busy one ends after its invocation)."""
        with self._available:
            for sandbox in self._idle:
                sandbox.retire()
            self._count -= len(self._idle)
            self._idle.clear()

    def invoke(self, event: Any, *, request_id: str | None = None) -> Invocation:
        sandbox = self._acquire()
        started = time.monotonic()
        context = LocalLambdaContext(self.spec, started + self.spec.timeout_s, request_id)
        if self.report:
            print(f"START RequestId: {context.aws_request_id} Version: $LATEST", flush=True)
        future = sandbox.submit(event, context)
        self._live.add(context)
        try:
            payload = future.result(timeout=self.spec.timeout_s)
        except TimeoutError:
            self._release(sandbox, healthy=False)
            invocation = Invocation(timed_out=True, error="Task timed out")
        except BaseException as exc:  # re-raised from the sandbox thread; SystemExit included
            self._release(sandbox, healthy=True)
            invocation = Invocation(error="".join(traceback.format_exception_only(exc)).strip())
        else:
            self._release(sandbox, healthy=True)
            invocation = Invocation(payload=payload)
        self._live.discard(context)
        invocation = dataclasses.replace(invocation, duration_s=time.monotonic() - started)
        if self.report:
            print(f"END RequestId: {context.aws_request_id}", flush=True)
            self._print_report(context.aws_request_id, invocation.duration_s)
        return invocation

    def _print_report(self, request_id: str, duration_s: float) -> None:
        """The line Lambda writes to CloudWatch Logs after each invocation (and `sam local
        invoke` prints), with the function's name added: the stack serves them all."""
        milliseconds = duration_s * 1000
        print(
            f"REPORT RequestId: {request_id}\tFunction: {self.spec.logical_id}"
            f"\tDuration: {milliseconds:.2f} ms\tBilled Duration: {math.ceil(milliseconds)} ms"
            f"\tMemory Size: {self.spec.memory_mb} MB",
            flush=True,
        )
