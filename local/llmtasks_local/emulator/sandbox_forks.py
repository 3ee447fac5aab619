"""Sandboxes forked from a process that has already imported their libraries: cold starts
without the imports every sandbox of a function site repeats.

A sandbox's cold start is mostly imports, most of them the same libraries in every sandbox
(boto3 and botocore, pydantic, Powertools, the standard library's asyncio, email, http...). A
burst that scales a function out, and a test suite that starts dozens of stacks, pay that once a
sandbox. A fork server pays it once a function site: a process started like a sandbox
(`python -S`, the function's environment, the site's packages on its path but none of the
function's own code), which imports the libraries every function of the site imported before
(the lists their sandboxes leave in the site, sandbox_main.preload_list: what all have in
common, so a forked sandbox holds nothing in memory its own function would not) and then forks
each new sandbox. The child takes
the sandbox's own environment, working directory, `sys.path` and `sys.argv`, and runs
sandbox_main as a spawned sandbox does. The function's code (the handler's module, the layers)
is imported in the child alone, so its init runs in every sandbox as Lambda runs it, and a hot
reload needs nothing here.

What a fork would share that a fresh process would not, the server refuses to share:
- the environment its imports read (`os.environ`'s reads while it preloaded, reported to the
  stack): a sandbox whose environment differs on one of those is forked from another server,
  or spawned;
- the interpreter's own start-up settings (the PYTHON* variables, the locale's): the same;
- threads: a preload that started one (fork copies only the forking thread) makes the server
  report itself unusable, and every sandbox is spawned.
One difference stays: the sandboxes of one server share its string-hash seed.

The stack and a server talk over a socketpair (SOCK_SEQPACKET: one JSON message a packet, file
descriptors beside it): the stack sends a sandbox's start (environment, directory, path, argv)
with its output pipe's write end; the server answers with the child's pid and a pidfd (signals
reach that process and no other, even once its pid is reused), and reports each exit with its
status and CPU (it reaps its children, so the stack cannot read them from /proc afterwards).

Long because the fork server and the forked child are two halves of one protocol (what is
preloaded, what the child resets), read side by side.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

# Variables that differ from sandbox to sandbox: never part of a server's environment.
PER_SANDBOX = frozenset(
    {
        "AWS_LAMBDA_LOG_STREAM_NAME",
        "AWS_LAMBDA_RUNTIME_API",
        "LLMTASKS_SANDBOX_CUT_FILE",
        "LLMTASKS_SANDBOX_CPU_FILE",
        "LLMTASKS_RECORD_AWS_CALLS",
        "LLMTASKS_LIST_LIBRARIES_IN",
    }
)
_LOCALE = ("LANG", "LC_ALL", "LC_CTYPE")
# The runtime client is each sandbox's own: its C extension reads the Runtime API's address
# (AWS_LAMBDA_RUNTIME_API) with getenv as it is imported, where no os.environ read shows it.
# The emulator's own modules are imported by the child too (sandbox_main): a few milliseconds.
_NEVER_PRELOADED = frozenset({"awslambdaric", "runtime_client", "llmtasks_local"})
_MESSAGE_BYTES = 1 << 20
_START_TIMEOUT_S = 30.0  # a preload past this is a server that does not work
_PR_SET_PDEATHSIG = 1


def lists_stamp(site: Path) -> tuple[tuple[str, int], ...]:
    """Each of the site's lists of libraries and when it last changed (nothing before the
    first): what the stack reads their common part again on."""
    from llmtasks_local.emulator.sandbox_main import PRELOAD_LISTS

    try:
        with os.scandir(site / PRELOAD_LISTS) as entries:
            return tuple(sorted((entry.name, entry.stat().st_mtime_ns) for entry in entries))
    except OSError:
        return ()


def startup_settings(environment: Mapping[str, str]) -> dict[str, str]:
    """What the interpreter reads from the environment as it starts (so a fork inherits it as
    the server read it): the PYTHON* variables but the path, and the locale's."""
    return {
        key: value
        for key, value in environment.items()
        if (key.startswith("PYTHON") and key != "PYTHONPATH") or key in _LOCALE
    }


# --- the stack's side ------------------------------------------------------------------------


class ForkedProcess:
    """A sandbox forked by a server, with what Sandbox uses of a Popen: pid, stdout, poll, wait,
    send_signal, kill, terminate. Its exit status comes from the server (which reaps it), with
    the CPU it used (`cpu_s`)."""

    def __init__(self, pid: int, pidfd: int, stdout: Any) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self.cpu_s = 0.0
        self._pidfd = pidfd
        self._exited = threading.Event()

    def _ended(self, returncode: int, cpu_s: float) -> None:
        self.returncode, self.cpu_s = returncode, cpu_s
        with contextlib.suppress(OSError):
            os.close(self._pidfd)
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self._exited.is_set():
            return
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ServerUnusable(Exception):
    """The server could not start, or started threads while it preloaded: spawn instead."""


class ForkServer:
    """One server process, and the sandboxes it forked."""

    def __init__(
        self,
        site: Path,
        environment: Mapping[str, str],
        preload: tuple[str, ...],
        spawn: Callable[[Callable[[], subprocess.Popen[bytes]]], subprocess.Popen[bytes]],
        preexec_fn: Callable[[], None] | None,
    ) -> None:
        self.startup = startup_settings(environment)
        self.preload = preload
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server_environment = {
            **{key: value for key, value in environment.items() if key not in PER_SANDBOX},
            "PYTHONPATH": str(site),  # the site alone: none of the functions' own code is preloaded
        }
        try:
            self.process = spawn(
                lambda: subprocess.Popen(  # noqa: S603
                    [sys.executable, "-S", "-m", __name__, str(theirs.fileno())],
                    cwd=site,
                    env=server_environment,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    preexec_fn=preexec_fn,  # noqa: PLW1509 - the caller's: only calls prctl
                )
            )
        finally:
            theirs.close()
        self._socket = ours
        self._socket.settimeout(_START_TIMEOUT_S)
        try:
            self._socket.send(json.dumps(list(preload)).encode())
            hello = json.loads(self._socket.recv(_MESSAGE_BYTES) or b"null")
        except (OSError, ValueError):
            hello = None
        if not isinstance(hello, dict) or not hello.get("forkable"):
            self.close()
            raise ServerUnusable(str(hello))
        self.read_at_import: dict[str, str | None] = hello["read"]
        self.preloaded: int = hello["preloaded"]
        self._socket.settimeout(None)
        self._starting = threading.Lock()  # one start in flight: the next answer is its
        self._pending: tuple[Future[ForkedProcess], int] | None = None  # its answer, its output
        self._children_lock = threading.Lock()
        self._children: dict[int, ForkedProcess] = {}
        self._closed = False
        threading.Thread(target=self._read, name="sandbox-spawner-forks", daemon=True).start()

    @property
    def alive(self) -> bool:
        """Whether it takes starts: not ended, not retired."""
        return not self._closed

    def retire(self) -> None:
        """Takes no more starts; the server ends once the sandboxes it forked have. A start in
        flight ends first: the shutdown would fail its send."""
        with self._starting:
            self._closed = True
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_WR)

    def serves(self, environment: Mapping[str, str]) -> bool:
        """Whether a sandbox with this environment would have imported what the server did, as
        the server did: the same start-up settings, the same values of what its imports read."""
        return (
            self.alive
            and startup_settings(environment) == self.startup
            and all(environment.get(key) == value for key, value in self.read_at_import.items())
        )

    def start(
        self, environment: Mapping[str, str], cwd: Path, argv: list[str], path: list[str]
    ) -> ForkedProcess:
        """A sandbox process forked with this environment, directory, sys.path and sys.argv; its
        output (stdout and stderr) is the returned process's `stdout`."""
        read_end, write_end = os.pipe()
        try:
            with self._starting:
                if self._closed:
                    raise ServerUnusable("the server ended")
                started: Future[ForkedProcess] = Future()
                self._pending = (started, read_end)
                message = {"env": dict(environment), "cwd": str(cwd), "argv": argv, "path": path}
                socket.send_fds(self._socket, [json.dumps(message).encode()], [write_end])
                os.close(write_end)
                write_end = -1
                return started.result(timeout=_START_TIMEOUT_S)
        except BaseException:
            self._pending = None
            for fd in (read_end, write_end):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            raise

    def _read(self) -> None:
        """The server's answers: a start's pid and pidfd, and each exit."""
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._socket, _MESSAGE_BYTES, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                break
            self._answered(json.loads(data), fds)
        # The server ended: its children were killed with it (their parent-death signal).
        self._closed = True
        with self._children_lock:
            children, self._children = list(self._children.values()), {}
        pending, self._pending = self._pending, None
        if pending is not None and not pending[0].done():
            pending[0].set_exception(ServerUnusable("the server ended"))
        for child in children:
            child._ended(-signal.SIGKILL, 0.0)

    def _answered(self, said: dict[str, Any], fds: list[int]) -> None:
        if "started" in said:
            pending, self._pending = self._pending, None
            if pending is None or not fds:  # the start gave up waiting: the child is no one's
                for fd in fds:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    os.close(fd)
                return
            started, read_end = pending
            child = ForkedProcess(said["started"], fds[0], os.fdopen(read_end, "rb"))
            # Registered before the server can report its exit (it answers a start first).
            with self._children_lock:
                self._children[child.pid] = child
            started.set_result(child)
        elif "failed" in said:
            pending, self._pending = self._pending, None
            if pending is not None:
                pending[0].set_exception(ServerUnusable(said["failed"]))
        elif "exited" in said:
            with self._children_lock:
                ended = self._children.pop(said["exited"], None)
            if ended is not None:
                ended._ended(said["status"], said["cpu_s"])

    def close(self) -> None:
        """Ends the server (its sandboxes end with it)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._socket.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


# --- the server's side ---------------------------------------------------------------------


def _record_reads(into: dict[str, str | None]) -> Callable[[], None]:
    """Records each os.environ key read (and its value) until the returned undo is called."""
    environ_type = type(os.environ)
    getitem, contains = environ_type.__getitem__, environ_type.__contains__

    def recording_getitem(self: Any, key: str) -> str:
        try:
            value = getitem(self, key)
        except KeyError:
            into.setdefault(key, None)
            raise
        into.setdefault(key, value)
        return value

    def recording_contains(self: Any, key: object) -> bool:
        found = contains(self, key)
        if isinstance(key, str):
            into.setdefault(key, os.environ.get(key) if found else None)
        return found

    environ_type.__getitem__ = recording_getitem  # type: ignore[method-assign]
    environ_type.__contains__ = recording_contains  # type: ignore[method-assign]

    def undo() -> None:
        environ_type.__getitem__ = getitem  # type: ignore[method-assign]
        environ_type.__contains__ = contains  # type: ignore[method-assign]

    return undo


def common_libraries(lists: Path) -> list[str]:
    """The modules every function's list (sandbox_main.preload_list) names, in the first list's
    order: a sandbox forked with them has imported nothing its own function would not have
    (its memory is its own), and the libraries functions share are most of each one's imports.
    Lists of functions whose code is gone (a test's, an old clone's) are left out."""
    common: list[str] | None = None
    for path in sorted(lists.glob("*.json")):
        try:
            listed = json.loads(path.read_text())
            if not os.path.isdir(listed["code_dir"]):
                continue
            modules = listed["modules"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if common is None:
            common = [name for name in modules if name.partition(".")[0] not in _NEVER_PRELOADED]
        else:
            keep = set(modules)
            common = [name for name in common if name in keep]
    return common or []


def _preload(names: list[str]) -> tuple[int, dict[str, str | None]]:
    """Imports these modules (an import that fails is left to the sandbox, which fails the same
    way): how many it imported, and what the imports read of the environment."""
    import importlib

    read: dict[str, str | None] = {}
    undo = _record_reads(read)
    imported = 0
    try:
        for name in names:
            try:
                importlib.import_module(name)
                imported += 1
            except BaseException:  # noqa: S112 - the sandbox meets it again, and says so
                continue
    finally:
        undo()
    return imported, read


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _exit_code(code: object) -> int:
    """What the interpreter exits with for `raise SystemExit(code)`."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _become_sandbox(
    control: socket.socket, wakeup: tuple[int, int], output: int, start: dict[str, Any]
) -> None:
    """In the forked child: become the sandbox process `start` describes, run it, and exit as
    its interpreter would have. Never returns."""
    code = 1
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # ends with the server, as with the stack
        control.close()
        for fd in wakeup:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as the interpreter starts
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(start["env"])
        os.chdir(start["cwd"])
        sys.path[:] = start["path"]
        sys.argv[:] = start["argv"]
        from llmtasks_local.emulator import sandbox_main

        sandbox_main.main()
        code = 0
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter's exit: threads joined
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(control_fd: int) -> None:
    """The server's loop: preload what the stack's first message names, say so, then fork a
    sandbox for each start the stack sends and report each exit. Once the stack sends no more
    (it shut its end), it ends when its last child has."""
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the stack's to handle, then ours
    path_tail = sys.path[2:]  # after the working directory and PYTHONPATH (the site): the standard library
    preloaded, read = _preload(json.loads(control.recv(_MESSAGE_BYTES) or b"[]"))
    forkable = _threads() == 1
    control.send(json.dumps({"forkable": forkable, "preloaded": preloaded, "read": read}).encode())
    if not forkable:
        return
    wakeup = os.pipe()
    os.set_blocking(wakeup[1], False)
    signal.set_wakeup_fd(wakeup[1], warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children = 0
    taking = True
    while taking or children:
        watched: list[Any] = [control, wakeup[0]] if taking else [wakeup[0]]
        readable, _, _ = select.select(watched, [], [])
        if wakeup[0] in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wakeup[0], 512)
            children -= _reap(control)
        if control not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(control, _MESSAGE_BYTES, 1)
        except OSError:
            return  # the stack is gone: the children end with this process
        if not data:
            taking = False  # retired: the children finish what they run
            continue
        start = json.loads(data)
        start["path"] = [*start["path"], *path_tail]
        try:
            pid = os.fork()
        except OSError as error:
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"failed": str(error)}).encode())
            continue
        if pid == 0:
            _become_sandbox(control, wakeup, fds[0], start)
        children += 1
        for fd in fds:
            os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as error:  # a kernel without pidfds (before Linux 5.3)
            os.kill(pid, signal.SIGKILL)
            control.send(json.dumps({"failed": f"pidfd_open: {error}"}).encode())
            continue
        socket.send_fds(control, [json.dumps({"started": pid}).encode()], [pidfd])
        os.close(pidfd)


def _reap(control: socket.socket) -> int:
    """Reports each child that ended: how many."""
    reaped = 0
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1
        said = {
            "exited": pid,
            "status": os.waitstatus_to_exitcode(status),
            "cpu_s": usage.ru_utime + usage.ru_stime,
        }
        with contextlib.suppress(OSError):  # the stack may be gone
            control.send(json.dumps(said).encode())


def main() -> None:
    serve(int(sys.argv[1]))


if __name__ == "__main__":
    main()
