"""Child processes of the local stack (the moto server, the mock LLM), started and awaited."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from llmtasks.tool_errors import EXIT_FAILED, ServiceDownError, ToolError


def wait_for_port(
    host: str, port: int, *, timeout_s: float = 30, process: subprocess.Popen[bytes] | None = None
) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if process is not None and process.poll() is not None:
            command = " ".join(str(arg) for arg in process.args[1:])  # type: ignore[index]
            raise ServiceDownError(
                f"`{command}` exited with {process.returncode} before it listened",
                where=f"{host}:{port}",
                fix="run again with --verbose to see its output",
            )
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise ServiceDownError(
        f"nothing listens after {timeout_s:.0f} s", where=f"{host}:{port}", fix="run again with --verbose"
    )


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """On Linux, the child gets `sig` if the stack itself is killed (kill -9 included).

    Linux sends it when the spawning *thread* ends, so spawn from a thread that lives as long
    as the child should (the stack's main thread does; the sandboxes have a spawner thread)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, sig)


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


def spawn_python(*args: str, ready_port: int, quiet: bool = True) -> subprocess.Popen[bytes]:
    """`python ARGS` in a child process, returned once it listens on 127.0.0.1:`ready_port`."""
    output = subprocess.DEVNULL if quiet else None
    # A session of its own: Ctrl-C in the terminal reaches only the stack, which then stops its
    # children after its pollers, instead of every process dying at once.
    child = subprocess.Popen(  # noqa: S603
        [sys.executable, *args],
        stdout=output,
        stderr=output,
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509 - only calls prctl, before exec
    )
    try:
        wait_for_port("127.0.0.1", ready_port, process=child)
    except BaseException:
        child.kill()
        raise
    return child


def spawn_moto_server(
    port: int, *, quiet: bool = True, state_dir: Path | None = None, say: Callable[[str], None] = print
) -> subprocess.Popen[bytes]:
    """The embedded AWS endpoint; with `state_dir`, it starts from the state kept there and
    journals every change to it (moto_state). What its start found there is passed to `say`
    (a crash recovered from, a torn record dropped); state it cannot read stops the start with
    that file named."""
    server = ["-m", "llmtasks.local.moto_server", "-H", "127.0.0.1", "-p", str(port)]
    if state_dir is None:
        return spawn_python(*server, ready_port=port, quiet=quiet)
    with tempfile.TemporaryDirectory(prefix="llmtasks-moto-") as scratch:
        report_file = Path(scratch) / "report.json"
        state = ["--state-dir", str(state_dir), "--report-file", str(report_file)]
        try:
            child = spawn_python(*server, *state, ready_port=port, quiet=quiet)
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
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
            return
        except OSError:
            pass
    holder = "another `llmtasks up`, it seems" if _is_llmtasks(host, port) else "another program"
    raise ToolError(
        f"port {port} is in use by {holder}",
        where=f"{host}:{port}, {what}",
        fix=f"stop it, or choose another port with {option}",
    )


def _is_llmtasks(host: str, port: int) -> bool:
    """Whether what listens there is a part of a running stack (API, moto, mock LLM)."""
    import httpx

    from llmtasks.local.moto_server import CALLS_PATH

    for path in ("/health", CALLS_PATH, "/_mock/stats"):
        try:
            reply = httpx.get(f"http://{host}:{port}{path}", timeout=1)
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
