"""Child processes of the local stack (the moto server, the mock LLM), started and awaited."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def wait_for_port(
    host: str, port: int, *, timeout_s: float = 30, process: subprocess.Popen[bytes] | None = None
) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"{process.args!r} exited with {process.returncode} before listening on {port}"
            )
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s:.0f} s")


def _die_with_parent() -> None:
    """On Linux, the child gets SIGTERM if the stack itself is killed (kill -9 included).

    Linux sends it when the spawning *thread* ends, so spawn from a thread that lives as long
    as the child should (the stack's main thread does)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


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
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl, before exec
    )
    try:
        wait_for_port("127.0.0.1", ready_port, process=child)
    except BaseException:
        child.kill()
        raise
    return child


def spawn_moto_server(
    port: int, *, quiet: bool = True, state_file: Path | None = None
) -> subprocess.Popen[bytes]:
    """The embedded AWS endpoint; with `state_file`, it starts from that snapshot (if there is
    one) and saves to it when asked (moto_server.STATE_PATH)."""
    state = ["--state", str(state_file)] if state_file is not None else []
    return spawn_python(
        "-m",
        "llmtasks.local.moto_server",
        "-H",
        "127.0.0.1",
        "-p",
        str(port),
        *state,
        ready_port=port,
        quiet=quiet,
    )


def stop(child: subprocess.Popen[bytes], timeout_s: float = 10) -> None:
    child.terminate()
    try:
        child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
