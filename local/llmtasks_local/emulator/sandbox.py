"""One Lambda execution environment: an OS process running the handler under awslambdaric.

As Lambda starts an execution environment, a sandbox starts a process with the function's own
environment (the template's variables and Lambda's reserved ones), which imports the handler
(the cold start: its init) and then asks the Runtime API for work. The stack serves that API,
one small HTTP server per sandbox (`/2018-06-01/runtime/invocation/next`, `.../response`,
`.../error`, `/2018-06-01/runtime/init/error`), so the handler code and the runtime client are
exactly what Lambda runs. What Lambda enforces from outside, this does from outside: a sandbox
past its Timeout or its MemorySize is killed, and what it would have done afterwards never
happens.

Long because one execution environment's life is here: its process, its Runtime API server and
the limits enforced from outside share the sandbox's state.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmtasks_local.emulator.cpu_account import ACCOUNT
from llmtasks_local.emulator.function_site import function_site
from llmtasks_local.emulator.log_groups import log_group, new_log_stream
from llmtasks_local.emulator.payload_limits import RESPONSE_BYTES, RESPONSE_TOO_LARGE
from llmtasks_local.emulator.processes import RunqueueWait, die_with_parent, status_kib
from llmtasks_local.emulator.sandbox_forks import (
    ForkedProcess,
    ForkServer,
    ServerUnusable,
    common_libraries,
    lists_stamp,
)
from llmtasks_local.emulator.sandbox_main import (
    CPU_FILE,
    CUT_FILE,
    CUT_SIGNAL,
    LIST_LIBRARIES_IN,
    PRELOAD_LISTS,
    RECORD_AWS_CALLS,
)
from llmtasks_local.sam.function_spec import PSEUDO_PARAMETERS, FunctionSpec

RUNTIME_API = "/2018-06-01/runtime"
# Lambda gives an on-demand init 10 s; one that runs over is tried again within the first
# invocation, under the function's Timeout. The same bound, both tries at once.
INIT_GRACE_S = 10.0
MEMORY_CHECK_S = 0.05  # how often a running sandbox's resident memory is read
# A deadline is moved on by the time the sandbox waited for a CPU since it was last looked at;
# a wait shorter than this ends it (else a busy sandbox on a loaded machine is read every tick).
LEAST_DEFERRAL_S = MEMORY_CHECK_S
_SIGNAL_WORDS: dict[int, str] = {
    signal.SIGKILL: "killed",
    signal.SIGTERM: "terminated",
    signal.SIGSEGV: "segmentation fault",
}


@dataclass(frozen=True)
class Invocation:
    payload: Any = None
    error: str | None = None  # "ErrorType: message": the handler raised, or the runtime ended
    timed_out: bool = False
    duration_s: float = 0.0
    init_s: float | None = None  # the cold start this invocation waited for, if any
    max_memory_mb: int = 0
    # The error object the runtime posted (errorType, errorMessage, stackTrace), when it did.
    error_object: dict[str, Any] | None = None
    # Its log lines, START to REPORT, when the caller asked for them (Invoke's LogType: Tail).
    log: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out

    def error_payload(self, request_id: str) -> dict[str, Any]:
        """What Lambda's Invoke returns for a failed invocation: the runtime's error object, or
        for a timeout or a runtime that ended, the object Lambda makes up itself."""
        if self.error_object is not None:
            return self.error_object
        if self.timed_out:
            return {
                "errorMessage": f"RequestId: {request_id} Error: {self.error}",
                "errorType": "Sandbox.Timedout",
            }
        kind, _, message = (self.error or "").partition(": ")
        return {"errorType": kind if message else "Runtime.ExitError", "errorMessage": message or kind}


@dataclass
class _Job:
    request_id: str
    event: Any
    deadline_ms: int  # epoch milliseconds, as Lambda-Runtime-Deadline-Ms says it
    done: Future[Any] = field(default_factory=Future)


class FunctionError(Exception):
    """The handler raised (or its runtime failed): Lambda's error object, as `errorType: errorMessage`,
    and the object itself (`error_object`)."""

    def __init__(self, text: str, error_object: dict[str, Any] | None = None) -> None:
        super().__init__(text)
        self.error_object = error_object


class SandboxDied(Exception):
    """The sandbox's process ended: an init error, an exit, a kill."""


def lambda_environment(
    spec: FunctionSpec, base: Mapping[str, str], runtime_api: str, log_stream: str
) -> dict[str, str]:
    """What a sandbox's process sees: `base` (the stack's own environment: its AWS endpoint and
    credentials, and the variables you start it with, beneath the template's), the function's
    Environment, and the variables Lambda itself sets (its log stream the one its lines go to)."""
    region = PSEUDO_PARAMETERS["AWS::Region"]
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site, _ = function_site(spec.code_dir, spec.layer_dirs)
    return {
        **base,
        **spec.environment,
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        "AWS_EXECUTION_ENV": f"AWS_Lambda_{python}",
        "AWS_LAMBDA_FUNCTION_NAME": spec.logical_id,
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_LOG_GROUP_NAME": log_group(spec.logical_id),
        "AWS_LAMBDA_LOG_STREAM_NAME": log_stream,
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
        "AWS_LAMBDA_RUNTIME_API": runtime_api,
        "LAMBDA_TASK_ROOT": str(spec.code_dir),
        "_HANDLER": spec.handler,
        # The function's code, then its layers (as /var/task, then /opt/python), then the
        # packages their requirements install and the runtime's own (function_site.py).
        "PYTHONPATH": os.pathsep.join(str(p) for p in (spec.code_dir, *spec.layer_dirs, site)),
        "PYTHONUNBUFFERED": "1",  # each log line reaches the stack as it is written
        # No bytecode written, as Lambda's read-only /var/task writes none: a .pyc a sandbox
        # wrote names its source by mtime (whole seconds) and size, so a handler saved twice in
        # one second at one size would run its first version after the hot reload.
        "PYTHONDONTWRITEBYTECODE": "1",
        "POWERTOOLS_TRACE_DISABLED": "true",  # no X-Ray daemon here; the Tracer would only warn
    }


class _Spawner:
    """Starts every sandbox process from one long-lived thread. Linux ends a child whose parent
    dies (PR_SET_PDEATHSIG: a killed stack leaves no sandbox behind), but it counts the parent
    as the *thread* that forked, and the threads that ask for sandboxes come and go."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Callable[[], subprocess.Popen[bytes]], Future[Any]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def spawn(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="sandbox-spawner", daemon=True)
                self._thread.start()
        future: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((start, future))
        return future.result()

    def _serve(self) -> None:
        while True:
            start, future = self._requests.get()
            try:
                future.set_result(start())
            except BaseException as exc:
                future.set_exception(exc)


_spawner = _Spawner()
_die_with_killed = functools.partial(die_with_parent, signal.SIGKILL)  # as Lambda ends an environment


class _ForkServers:
    """This process's fork servers (sandbox_forks.py), by function site, shared by every
    function and stack of the process: a sandbox is forked from one whose preload matches its
    environment, started on the second sandbox of a site. Where forks cannot be made as
    exactly (no pidfds: not Linux; a preload that started a thread), sandboxes are spawned."""

    SERVERS_PER_SITE = 4  # environments that differ in what the preloaded libraries read

    def __init__(self, *, spawn_first: bool = True) -> None:
        self._lock = threading.Lock()
        self._servers: dict[Path, list[ForkServer]] = {}
        self._unusable: set[Path] = set()
        # A process's first sandbox of a site is spawned: a server (its preload costs about 1.5
        # cold starts) pays from the third sandbox on, and `llmtasks invoke` starts one.
        self._spawn_first = spawn_first
        self._spawned: set[Path] = set()
        self._common: dict[Path, tuple[tuple[tuple[str, int], ...], tuple[str, ...]]] = {}  # by site

    def start(
        self, site: Path, environment: Mapping[str, str], cwd: Path, argv: list[str]
    ) -> ForkedProcess | None:
        """A sandbox process forked from a server of `site`, or None: spawn it."""
        if not _CAN_FORK:
            return None
        with self._lock:
            server = self._server(site, environment)
        if server is None:
            return None
        # sys.path as `python -S -m` makes it: the working directory, then PYTHONPATH's folders
        # (the server adds the standard library's).
        path = [str(cwd), *environment["PYTHONPATH"].split(os.pathsep)]
        try:
            return server.start(environment, cwd, argv, path)
        except (ServerUnusable, OSError):  # it ended meanwhile: this sandbox is spawned
            return None

    def _common_libraries(self, site: Path) -> tuple[str, ...]:
        """What the site's functions' lists have in common, read again when one changed (a list
        grows with modules its function alone imports, mostly: the common part, and the
        servers, stay)."""
        stamp = lists_stamp(site)
        read = self._common.get(site)
        if read is None or read[0] != stamp:
            read = (stamp, tuple(common_libraries(site / PRELOAD_LISTS)))
            self._common[site] = read
        return read[1]

    def _server(self, site: Path, environment: Mapping[str, str]) -> ForkServer | None:
        """The server to fork this sandbox from, started if none serves it; None: spawn it."""
        if site in self._unusable:
            return None
        if self._spawn_first and site not in self._spawned:
            self._spawned.add(site)
            return None
        preload = self._common_libraries(site)
        servers = []
        for known in self._servers.get(site, []):
            if known.alive and known.preload != preload:
                known.retire()  # the functions' common libraries changed since it preloaded
            if known.alive:
                servers.append(known)
        self._servers[site] = servers
        server = next((server for server in servers if server.serves(environment)), None)
        if server is not None or len(servers) >= self.SERVERS_PER_SITE:
            return server
        try:
            server = ForkServer(site, environment, preload, _spawner.spawn, _die_with_killed)
        except (ServerUnusable, OSError):
            self._unusable.add(site)
            return None
        servers.append(server)
        # One whose preload read a variable this sandbox's environment sets otherwise (or one of
        # its own, as the Runtime API's address) serves none like it: spawned.
        return server if server.serves(environment) else None


_CAN_FORK = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")
_fork_servers = _ForkServers()


class _RuntimeApi(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        super().__init__(("127.0.0.1", 0), _RuntimeApiHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A sandbox killed mid-request (a timeout, its memory, a stop) drops its connection:
        nothing to report."""

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """A connection's thread, named for the CPU account, which it is charged to as it ends."""
        threading.current_thread().name = f"runtime-api-{self.sandbox.spec.logical_id}-connection"
        try:
            super().process_request_thread(request, client_address)
        finally:
            ACCOUNT.charge_ending()


class _RuntimeApiHandler(http.server.BaseHTTPRequestHandler):
    """The Lambda Runtime API, as the runtime client of one sandbox calls it."""

    protocol_version = "HTTP/1.1"  # the runtime client keeps its connection
    disable_nagle_algorithm = True  # small replies: without it each waits for a delayed ACK
    server: _RuntimeApi

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes = b"{}", headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self) -> None:
        if self.path != f"{RUNTIME_API}/invocation/next":
            self._reply(404)
            return
        job = self.server.sandbox._next_job()
        if job is None:  # retired: the process is being stopped
            self._reply(410, headers={"Connection": "close"})
            return
        arn = "arn:aws:lambda:{}:{}:function:{}".format(
            PSEUDO_PARAMETERS["AWS::Region"],
            PSEUDO_PARAMETERS["AWS::AccountId"],
            self.server.sandbox.spec.logical_id,
        )
        self._reply(
            200,
            json.dumps(job.event).encode(),
            {
                "Lambda-Runtime-Aws-Request-Id": job.request_id,
                "Lambda-Runtime-Deadline-Ms": str(job.deadline_ms),
                "Lambda-Runtime-Invoked-Function-Arn": arn,
                "Lambda-Runtime-Trace-Id": f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]};Sampled=0",
            },
        )

    def do_POST(self) -> None:
        body = self._body()
        parts = self.path.removeprefix(RUNTIME_API).strip("/").split("/")
        sandbox = self.server.sandbox
        if parts == ["init", "error"]:
            sandbox._init_failed(_error_text(body))
        elif len(parts) == 3 and parts[0] == "invocation" and parts[2] in ("response", "error"):
            if parts[2] == "response" and len(body) > RESPONSE_BYTES:
                # Lambda's answer to a response over its limit: the invocation fails, and the
                # runtime client is told so (awslambdaric raises, and its process ends: the next
                # invocation gets a new sandbox, as it does in Lambda after Runtime.ExitError).
                sandbox._stopped = True
                error = json.dumps(RESPONSE_TOO_LARGE).encode()
                sandbox._finished(parts[1], error=_error_text(error), error_object=dict(RESPONSE_TOO_LARGE))
                self._reply(413, error)
                return
            if parts[2] == "response":
                sandbox._finished(parts[1], payload=json.loads(body) if body else None)
            else:
                sandbox._finished(parts[1], error=_error_text(body), error_object=_error_object(body))
        else:
            self._reply(404)
            return
        self._reply(202, b'{"status":"OK"}')


def _error_object(body: bytes) -> dict[str, Any] | None:
    try:
        error = json.loads(body)
    except ValueError:
        return None
    return error if isinstance(error, dict) else None


def _error_text(body: bytes) -> str:
    """Lambda's error object as one line: `errorType: errorMessage`."""
    try:
        error = json.loads(body)
        return f"{error.get('errorType') or 'Error'}: {error.get('errorMessage') or ''}".rstrip(": ")
    except (ValueError, AttributeError):
        return body.decode(errors="replace")


class LambdaDeadline:
    """A Timeout as Lambda counts it, on an environment with CPU of its own: the time a sandbox
    waited for a CPU that this machine's other processes held (its threads' runqueue waits) does
    not count, so a loaded machine does not time out a function AWS would have let finish. A
    sandbox that sleeps or waits on I/O waits for no CPU: its deadline is the wall clock's."""

    def __init__(self, runqueue: RunqueueWait, seconds: float) -> None:
        self._runqueue = runqueue
        self._at = time.monotonic() + seconds
        self._waited = runqueue.total_s()

    def left_s(self) -> float:
        return self._at - time.monotonic()

    def passed(self) -> bool:
        """Whether it has passed, once moved on by the waits since it was last looked at."""
        if self.left_s() > 0:
            return False
        waited = self._runqueue.total_s()
        deferral, self._waited = waited - self._waited, waited
        if deferral < LEAST_DEFERRAL_S:
            return True
        self._at += deferral
        return False


class Sandbox:
    """One execution environment of `spec`: its process, its Runtime API, one invocation at a
    time. `on_line` receives each line the process writes (stdout and stderr, as CloudWatch
    Logs would)."""

    def __init__(
        self,
        spec: FunctionSpec,
        base_environment: Mapping[str, str],
        on_line: Callable[[str], None],
        *,
        log_stream: str | None = None,
        record_aws_calls: Path | None = None,
    ) -> None:
        self.spec = spec
        self.generation = 0  # the code it runs: a reload retires sandboxes of older generations
        # Its CloudWatch Logs stream (log_groups.py), named as Lambda names an environment's.
        self.log_stream = log_stream or new_log_stream(time.time())
        self._peak_mb = 0.0  # the highest resident memory seen while it ran (after it ended too)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._current: _Job | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()  # the process asked for its first invocation: init done
        self._ended = threading.Event()
        self._stopped = False  # killed or retired: never handed another invocation
        self._end_reason: str | None = None
        self._oom = False
        self._api = _RuntimeApi(self)
        threading.Thread(
            target=self._api.serve_forever, name=f"runtime-api-{spec.logical_id}", daemon=True
        ).start()
        self._cut_file = Path(tempfile.mkstemp(prefix="llmtasks-cut-")[1])
        self._cpu_file = Path(tempfile.mkstemp(prefix="llmtasks-sandbox-cpu-")[1])
        runtime_api = f"127.0.0.1:{self._api.server_address[1]}"
        environment = lambda_environment(spec, base_environment, runtime_api, self.log_stream)
        environment[CUT_FILE] = str(self._cut_file)
        environment[CPU_FILE] = str(self._cpu_file)
        site, _ = function_site(spec.code_dir, spec.layer_dirs)
        environment[LIST_LIBRARIES_IN] = str(site)
        if record_aws_calls is not None:
            environment[RECORD_AWS_CALLS] = str(record_aws_calls)
        self.started = time.monotonic()
        self.init_s: float | None = None
        # The function's name last: `ps` shows whose sandbox it is (a spawned one's).
        arguments = [spec.handler, spec.logical_id]
        self.process: subprocess.Popen[bytes] | ForkedProcess = _fork_servers.start(
            site,
            environment,
            spec.code_dir,
            [str(site / "llmtasks_local/emulator/sandbox_main.py"), *arguments],
        ) or _spawner.spawn(
            lambda: subprocess.Popen(  # noqa: S603
                # -S: none of the venv's site-packages, only the function's site on PYTHONPATH
                # (function_site.py).
                [sys.executable, "-S", "-m", "llmtasks_local.emulator.sandbox_main", *arguments],
                cwd=spec.code_dir,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_killed,  # noqa: PLW1509 - only calls prctl, before exec
            )
        )
        ACCOUNT.sandbox_started(self.process.pid, spec.logical_id, self._cpu_file)
        self._runqueue = RunqueueWait(self.process.pid)
        self._on_line = on_line
        threading.Thread(target=self._read_output, name=f"sandbox-log-{spec.logical_id}", daemon=True).start()

    # --- the Runtime API's side -----------------------------------------------------------

    def _next_job(self) -> _Job | None:
        if not self._ready.is_set():
            self.init_s = time.monotonic() - self.started
            self._ready.set()
        with self._lock:
            self._current = None
        job = self._jobs.get()
        with self._lock:
            self._current = job
        return job

    def _finished(
        self,
        request_id: str,
        *,
        payload: Any = None,
        error: str | None = None,
        error_object: dict[str, Any] | None = None,
    ) -> None:
        with self._lock:
            job = self._current if self._current and self._current.request_id == request_id else None
            if job is None or job.done.done():
                return  # an answer for an invocation already ended (timed out): it lands nowhere
            if error is None:
                job.done.set_result(payload)
            else:
                job.done.set_exception(FunctionError(error, error_object))

    def _init_failed(self, error: str) -> None:
        self._end_reason = error

    def _read_output(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            # awslambdaric joins a traceback's lines with \r (one CloudWatch event); a terminal
            # wants them on lines of their own.
            for line in raw.decode(errors="replace").rstrip("\n").split("\r"):
                self._on_line(line)
        if isinstance(self.process, ForkedProcess):
            code = self.process.wait()  # its server reaped it, and said what CPU it used
            ACCOUNT.sandbox_ended(self.process.pid, process_s=self.process.cpu_s)
        else:
            # Its output ended with it: charged to the account before the wait reaps it.
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT)
            ACCOUNT.sandbox_ended(self.process.pid)
            code = self.process.wait()
        # Before `_ended` is set: a stopping stack waits on it and then exits, and these reader
        # threads with it (daemons), which left two files in the temp dir for each sandbox.
        self._cut_file.unlink(missing_ok=True)
        self._cpu_file.unlink(missing_ok=True)
        if self._end_reason is None:
            if self._oom:
                self._end_reason = "Runtime.OutOfMemory: Runtime exited with error: signal: killed"
            else:
                # Lambda's words: "signal: killed", "exit status 1"
                how = f"signal: {_SIGNAL_WORDS.get(-code, -code)}" if code < 0 else f"exit status {code}"
                self._end_reason = f"Runtime.ExitError: Runtime exited with error: {how}"
        self._ended.set()
        with self._lock:
            job, self._current = self._current, None
            if job is not None and not job.done.done():
                job.done.set_exception(SandboxDied(self._end_reason))
        self._jobs.put(None)  # a Runtime API thread waiting for work lets go
        self._api.shutdown()
        self._api.server_close()

    # --- the stack's side -----------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return not self._stopped and not self._ended.is_set()

    @property
    def peak_mb(self) -> float:
        # What REPORT's Max Memory Used says: the process's high-water mark while it runs.
        return max(self._peak_mb, (status_kib(self.process.pid, "VmHWM") or 0) / 1024)

    def wait_ready(self) -> None:
        """Waits for the cold start (raises SandboxDied if the process ended, or took longer
        than Lambda allows an init)."""
        give_up = LambdaDeadline(self._runqueue, INIT_GRACE_S + self.spec.timeout_s)
        while not self._ready.wait(MEMORY_CHECK_S):
            if self._ended.is_set():
                raise SandboxDied(self._end_reason or "Runtime.ExitError: Runtime exited during init")
            self._check_memory()
            if give_up.passed():
                self.kill()
                raise SandboxDied("Runtime.InitTimeout: init did not complete in time")

    def run(self, event: Any, request_id: str, timeout_s: float) -> Any:
        """One invocation: its payload; raises FunctionError, SandboxDied or TimeoutError."""
        deadline = LambdaDeadline(self._runqueue, timeout_s)
        job = _Job(request_id, event, int((time.time() + timeout_s) * 1000))
        self._jobs.put(job)
        while True:
            left = deadline.left_s()
            if left <= 0 and deadline.passed():
                self.kill()  # Lambda stops the environment: nothing the handler does next lands
                raise TimeoutError
            try:
                return job.done.result(timeout=min(max(left, 0.0), MEMORY_CHECK_S))
            except TimeoutError:
                if self._ended.is_set() and not job.done.done():
                    # It ended before it took the job (it died idle, just as it was handed one).
                    raise SandboxDied(self._end_reason or "Runtime exited") from None
                self._check_memory()

    def _check_memory(self) -> None:
        resident = (status_kib(self.process.pid, "VmRSS") or 0) / 1024
        self._peak_mb = max(self._peak_mb, resident)
        if resident > self.spec.memory_mb:
            self._oom = True
            self.kill()

    def cut_to(self, deadline_ms: int) -> None:
        """A stopping stack gives the invocation in flight until `deadline_ms` (epoch). (Before
        its init, the process has no handler for the signal yet: there is nothing to cut.)"""
        if self.alive and self._ready.is_set():
            self._cut_file.write_text(str(deadline_ms))
            self.process.send_signal(CUT_SIGNAL)

    def wait_ended(self, timeout_s: float) -> bool:
        """Whether the process ended and its output was read to the end within `timeout_s`."""
        return self._ended.wait(timeout_s)

    def kill(self) -> None:
        self._stopped = True
        if self.process.poll() is None:
            self.process.kill()

    def retire(self) -> None:
        """Ends an idle sandbox, as Lambda shuts an environment down: SIGTERM (the runtime
        client sets no handler for it, so the process ends at once; its output reader reaps it)."""
        self._stopped = True
        if self.process.poll() is None:
            self.process.terminate()
