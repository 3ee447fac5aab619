"""Child processes of the local stack (the moto server, the mock LLM), started and awaited."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from llmtasks_local.tool_errors import EXIT_FAILED, ServiceDownError, ToolError

# prctl, looked up once here, in the stack's own process. die_with_parent runs in a child between
# fork and exec, where only the forking thread survives: an import there (or a dlopen) waits
# for good on a lock another thread of the stack held at the fork. It did: a warm-up's sandbox
# was left a fork of the stack, never exec'd, and `llmtasks up` never said Ready.
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """On Linux, the child gets `sig` if the stack itself is killed (kill -9 included). A
    `preexec_fn`: it imports nothing and loads nothing, it only calls prctl.

    Linux sends it when the spawning *thread* ends, so spawn from a thread that lives as long
    as the child should (the stack's main thread does; the sandboxes have a spawner thread)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, sig)


def status_kib(pid: int, field: str) -> int | None:
    """A memory figure of /proc/PID/status in KiB ("VmRSS": resident now, "VmHWM": its
    high-water mark); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def thread_waits_s(pid: int) -> dict[int, float]:
    """Each live thread's seconds spent runnable but waiting for a CPU (the second field of
    /proc/PID/task/TID/schedstat); empty once the process is gone or where the kernel keeps no
    schedstat."""
    waits: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return waits
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as schedstat:
                waits[int(tid)] = int(schedstat.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return waits


class RunqueueWait:
    """The seconds a process's threads have waited for a CPU, summed, its ended threads' last
    readings kept: time another process held the CPU it was ready to run on."""

    def __init__(self, pid: int, read: Callable[[int], dict[int, float]] = thread_waits_s) -> None:
        self._pid = pid
        self._read = read
        self._seen: dict[int, float] = {}

    def total_s(self) -> float:
        self._seen.update(self._read(self._pid))
        return sum(self._seen.values())


def cpu_seconds(pid: int, *, reaped_children: bool = False) -> float:
    """User + system CPU time a process has used (/proc/PID/stat; a zombie's too), with
    `reaped_children` that of its children that ended and were waited for; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    ticks = fields[13:15] if reaped_children else fields[11:13]
    return sum(int(t) for t in ticks) / os.sysconf("SC_CLK_TCK")


def listen_on(host: str, port: int, option: str, what: str) -> socket.socket:
    """A socket listening on host:`port` (0: a free port the kernel picks), for a child process
    to serve: bound here and inherited by the child, so no other process can take the port
    between a check and the child's own bind (a child that lost that race died unseen, and
    whatever took its port answered in its place)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError:
        listener.close()
        raise _port_in_use(host, port, option, what) from None
    listener.listen(128)
    return listener


def spawn_python(
    *args: str, listener: socket.socket, probe_path: str, quiet: bool = True
) -> subprocess.Popen[bytes]:
    """`python ARGS --fd N` in a child process that serves HTTP on the inherited `listener` (its
    file descriptor N), returned once it answers a request for `probe_path`. The listener is the
    child's from then on: this process closes its copy."""
    output = subprocess.DEVNULL if quiet else None
    fd = listener.fileno()
    # A session of its own: Ctrl-C in the terminal reaches only the stack, which then stops its
    # children after its pollers, instead of every process dying at once.
    try:
        child = subprocess.Popen(  # noqa: S603
            [sys.executable, *args, "--fd", str(fd)],
            stdout=output,
            stderr=output,
            pass_fds=(fd,),
            start_new_session=True,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - only calls prctl, before exec
        )
        host, port = listener.getsockname()[:2]
        # Connected while this process still holds the listener: queued, whatever the child does.
        probe = socket.create_connection((host, port))
    except BaseException:
        listener.close()
        raise
    listener.close()
    try:
        wait_for_answer(probe, host, port, probe_path, process=child)
    except BaseException:
        child.kill()
        raise
    return child


def wait_for_answer(
    probe: socket.socket,
    host: str,
    port: int,
    path: str,
    *,
    process: subprocess.Popen[bytes],
    timeout_s: float = 60,
) -> None:
    """Waits until `process`, which serves the listening socket on host:port, answers one HTTP
    request on `probe`, a connection queued on that socket. Only an answer tells that the child
    serves: the socket accepts connections from its bind on. A child that exits first closes it."""
    give_up = time.monotonic() + timeout_s
    with probe:
        with contextlib.suppress(ConnectionError):  # reset: the child died, as the loop finds
            probe.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
        probe.settimeout(0.2)
        while time.monotonic() < give_up:
            if process.poll() is not None:
                command = " ".join(str(arg) for arg in process.args[1:])  # type: ignore[index]
                raise ServiceDownError(
                    f"`{command}` exited with {process.returncode} before it answered",
                    where=f"{host}:{port}",
                    fix="run again with --verbose to see its output",
                )
            try:
                if probe.recv(1):
                    return
            except TimeoutError:
                continue
            except ConnectionError:
                pass
            time.sleep(0.1)  # reset or closed: the child is on its way out; its exit is read above
    raise ServiceDownError(
        f"no answer after {timeout_s:.0f} s", where=f"{host}:{port}", fix="run again with --verbose"
    )


def spawn_moto_server(
    listener: socket.socket,
    *,
    quiet: bool = True,
    state_dir: Path | None = None,
    lambda_url: str | None = None,
    say: Callable[[str], None] = print,
) -> subprocess.Popen[bytes]:
    """The embedded AWS endpoint, serving `listener`; with `state_dir`, it starts from the state
    kept there and journals every change to it (moto_state). What its start found there is
    passed to `say` (a crash recovered from, a torn record dropped); state it cannot read stops
    the start with that file named. Lambda's API calls go on to `lambda_url`."""
    from llmtasks_local.emulator.moto_server import CALLS_PATH

    server = [
        "-m",
        "llmtasks_local.emulator.moto_server",
        "-H",
        "127.0.0.1",
        "-p",
        str(listener.getsockname()[1]),
        *([] if lambda_url is None else ["--lambda-url", lambda_url]),
    ]
    if state_dir is None:
        return spawn_python(*server, listener=listener, probe_path=CALLS_PATH, quiet=quiet)
    with tempfile.TemporaryDirectory(prefix="llmtasks-moto-") as scratch:
        report_file = Path(scratch) / "report.json"
        state = ["--state-dir", str(state_dir), "--report-file", str(report_file)]
        try:
            child = spawn_python(*server, *state, listener=listener, probe_path=CALLS_PATH, quiet=quiet)
        except ServiceDownError:
            if report_file.exists():
                error = json.loads(report_file.read_text())["error"]
                raise ToolError(**error, exit_code=EXIT_FAILED) from None
            raise
        for note in json.loads(report_file.read_text())["notes"]:
            say(note)
        return child


def stop(child: subprocess.Popen[bytes], timeout_s: float = 10) -> None:
    child.terminate()
    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def check_port_free(host: str, port: int, option: str, what: str) -> None:
    """Refuses a port something already listens on, naming the option that changes it."""
    listen_on(host, port, option, what).close()


def _port_in_use(host: str, port: int, option: str, what: str) -> ToolError:
    holder = "another `llmtasks up`, it seems" if _is_llmtasks(host, port) else "another program"
    return ToolError(
        f"port {port} is in use by {holder}",
        where=f"{host}:{port}, {what}",
        fix=f"stop it, or choose another port with {option}",
    )


def _is_llmtasks(host: str, port: int) -> bool:
    """Whether what listens there is a part of a running stack (API, moto, mock LLM)."""
    import httpx

    from llmtasks_local.emulator.moto_server import CALLS_PATH

    for path in ("/health", CALLS_PATH, "/_mock/stats"):
        try:
            # Only an error's wording waits on this: a loaded machine's moto server took over 1 s
            # to answer, and was named "another program"; a program that takes the connection and
            # never answers (a stuck process, another protocol) held the error 10 s.
            reply = httpx.get(f"http://{host}:{port}{path}", timeout=3)
        except httpx.HTTPError:
            return False
        if reply.status_code == 200 and reply.headers.get("content-type", "").startswith("application/json"):
            return True
    return False


def check_answers(url: str) -> None:
    """Refuses an AWS endpoint (--endpoint-url) that does not accept a connection."""
    target = urlsplit(url)
    try:
        socket.create_connection((target.hostname or "127.0.0.1", target.port or 80), timeout=3).close()
    except OSError as error:
        raise ServiceDownError(
            f"the AWS endpoint {url} does not answer ({error.strerror or error})",
            where="--endpoint-url",
            fix="start it (a LocalStack, a moto server), or leave the option out for the embedded moto",
        ) from error
