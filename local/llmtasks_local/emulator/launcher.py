"""`llmtasks up` in a child process on free ports, as a user starts it: for the end-to-end tests
and the benchmark, which both need the whole stack and a handle on its parts."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from llmtasks_local.emulator.moto_server import BACKEND_PATH, CALLS_PATH, CPU_PATH, WRITES_PATH
from llmtasks_local.emulator.processes import status_kib


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def peak_rss_kib(pid: int) -> int:
    """The high-water mark of a process's resident memory (Linux's VmHWM), in KiB."""
    peak = status_kib(pid, "VmHWM")
    if peak is None:
        raise LookupError(f"no VmHWM for process {pid}")
    return peak


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc): the stack's moto server and mock LLM."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


# How long a stack's start may go without printing a line, and in all, before it is taken for hung,
# and how long a stop may take. Caps only a hang reaches: a start on one core shared with other
# suites' stacks can print nothing for over a minute while it imports.
START_SILENCE_S = 180
START_MOST_S = 420
STOP_MOST_S = 120


@dataclass
class LaunchedStack:
    process: subprocess.Popen[bytes]
    api: str
    mock: str | None
    moto_port: int
    log: Path
    api_key: str | None  # the dev key `llmtasks up` printed; None with --no-auth
    cwd: Path
    console: str  # the console's URL `llmtasks up` printed, its token included

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.moto_port}"

    def client(self, api_key: str | None = None, **options: Any) -> httpx.Client:
        """A client that sends the dev key (or `api_key`). Its read timeout is past any reply's
        time: the first request to a function waits for its cold start, which on a loaded
        machine, behind the other functions' cold starts, has taken over 30 s (a restarted
        stack's first listing, with hundreds of tasks redelivered at once)."""
        key = api_key or self.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.api, headers=headers, **{"timeout": 120, **options})

    def run_cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """`llmtasks ARGS` as a user of this stack runs it: API URL and dev key from the
        environment, never an AWS account's credentials."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {"LLMTASKS_API_URL": self.api, "LLMTASKS_API_KEY": self.api_key or ""}
        return subprocess.run(  # noqa: S603
            [sys.executable, "-m", "llmtasks_local.cli", *args],
            cwd=self.cwd,
            capture_output=True,
            text=True,
            input=stdin,
            timeout=60,
            check=False,
            env=env,
        )

    def cli(self, *args: str) -> str:
        """An operator command (`llmtasks keys|dlq|stats ...`) against this stack's AWS endpoint;
        its output, once it has succeeded."""
        done = self.run_cli(*args, "--endpoint-url", self.endpoint)
        if done.returncode != 0:
            raise RuntimeError(f"llmtasks {' '.join(args)} failed: {done.stderr}")
        return done.stdout

    def configure_mock(self, *, reset: bool = True, **knobs: Any) -> None:
        """Changes the given knobs of the mock, and zeroes its counters unless told not to."""
        assert self.mock is not None
        httpx.put(f"{self.mock}/_mock/config", json=knobs).raise_for_status()
        if reset:
            httpx.post(f"{self.mock}/_mock/reset").raise_for_status()

    def mock_stats(self) -> dict[str, Any]:
        assert self.mock is not None
        stats: dict[str, Any] = httpx.get(f"{self.mock}/_mock/stats").json()
        return stats

    def aws_calls(self, *, reset: bool = False) -> dict[str, int]:
        """The AWS API calls the embedded moto server has served, by `service.Operation`."""
        reply = httpx.request("DELETE" if reset else "GET", self.endpoint + CALLS_PATH)
        reply.raise_for_status()
        calls: dict[str, int] = reply.json()
        return calls

    def aws_cpu_us(self) -> dict[str, int]:
        """The CPU the embedded moto server spent answering each `service.Operation`, in
        microseconds, since the counts were last zeroed (`aws_calls(reset=True)` zeroes both)."""
        reply = httpx.get(self.endpoint + CPU_PATH)
        reply.raise_for_status()
        cpu: dict[str, int] = reply.json()
        return cpu

    def aws_backend_cpu(self) -> dict[str, Any]:
        """Of `aws_cpu_us`, what moto's backends took, by operation (`backend_us`), and the
        journal's appends within them (`journal`: us, bytes, records), since the same zeroing."""
        reply = httpx.get(self.endpoint + BACKEND_PATH)
        reply.raise_for_status()
        account: dict[str, Any] = reply.json()
        return account

    def aws_writes(self) -> dict[str, dict[str, int]]:
        """The DynamoDB items written since the same zeroing, by table: `items`, their `bytes`
        and the write `units` DynamoDB would bill for them."""
        reply = httpx.get(self.endpoint + WRITES_PATH)
        reply.raise_for_status()
        writes: dict[str, dict[str, int]] = reply.json()
        return writes

    def cpu_account(self) -> dict[str, Any]:
        """The stack process's CPU seconds by part, and each function's sandboxes' (process and
        handler), so far (emulator/cpu_account.py), as its console answers them."""
        page, _, token = self.console.partition("?token=")
        reply = httpx.get(page.rstrip("/") + "/api/cpu", headers={"Authorization": f"Bearer {token}"})
        reply.raise_for_status()
        account: dict[str, Any] = reply.json()
        return account

    def crash(self) -> None:
        """SIGKILL to the stack and every process it started, at once, as a crash or an
        out-of-memory kill would: nothing gets to save."""
        for pid in [*descendants(self.process.pid), self.process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = STOP_MOST_S) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


# Starts that lost a port to another process between free_port() and the bind, tried again.
PORT_RACE_RETRIES = 3
# What `llmtasks up` says when a port is taken: its own check (local/processes.check_port_free),
# or a bind that lost the race after it.
PORT_TAKEN = re.compile(r"port \d+ is in use by|address already in use", re.IGNORECASE)


class _PortTaken(RuntimeError):
    """A port free_port() found was taken before the stack bound it."""


def launch(*extra: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> LaunchedStack:
    """`llmtasks up EXTRA` with the API, moto and the mock on free ports, once it is ready. A
    port found free can be taken by another process before the stack binds it (tests start
    stacks side by side): such a start is tried again on new ports."""
    for attempt in range(PORT_RACE_RETRIES + 1):
        try:
            return _launch(extra, env, cwd)
        except _PortTaken:
            if attempt == PORT_RACE_RETRIES:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _launch(extra: tuple[str, ...], env: dict[str, str] | None, cwd: Path | None) -> LaunchedStack:
    api_port, moto_port, mock_port = free_port(), free_port(), free_port()
    log = Path(tempfile.mkstemp(prefix="llmtasks-up-", suffix=".log")[1])
    given = env or {}
    # With AWS_ENDPOINT_URL set (e.g. a LocalStack), the stack uses it instead of its own moto.
    child_env = {**{k: v for k, v in os.environ.items() if k != "LLM_BASE_URL"}, **given}
    process = subprocess.Popen(  # noqa: S603
        [
            sys.executable,
            "-m",
            "llmtasks_local.cli",
            "up",
            "--port",
            str(api_port),
            "--moto-port",
            str(moto_port),
            "--mock-port",
            str(mock_port),
            "--mock-latency",
            "0",
            # A stack of its own, empty: unless told where to keep state, it keeps none (the
            # default state dir is the project's, shared by every stack started from it).
            *([] if "--state-dir" in extra else ["--no-state"]),
            # Stops quickly unless a test is about the grace period.
            *([] if "--grace" in extra else ["--grace", "2"]),
            # The tests and the benchmark read the functions' raw JSON lines.
            *([] if "--log-format" in extra else ["--log-format", "json"]),
            *extra,
        ],
        cwd=cwd,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=child_env,
    )
    try:
        # A start that goes on printing (each eager sandbox's cold start is a line) is not hung:
        # the wait gives up after START_SILENCE_S without a new line, or START_MOST_S in all
        # (on a loaded machine each eager cold start is slow).
        began = time.monotonic()
        heard, seen = began, 0
        while "Ready." not in (printed := log.read_text()):
            now = time.monotonic()
            if len(printed) != seen:
                heard, seen = now, len(printed)
            if process.poll() is not None or now - heard > START_SILENCE_S or now - began > START_MOST_S:
                printed = log.read_text()
                if process.poll() is not None and PORT_TAKEN.search(printed):
                    raise _PortTaken(printed)
                raise RuntimeError(f"llmtasks up did not start:\n{printed}")
            time.sleep(0.1)
    except BaseException:
        # Never leave a stack behind: SIGTERM lets it stop its own children.
        process.terminate()
        process.wait(timeout=30)
        raise
    mock = None if "LLM_BASE_URL" in given else f"http://127.0.0.1:{mock_port}"
    printed = log.read_text()
    key = re.search(r"API key\s+(lt_\S+)", printed)
    console = re.search(r"console\s+(http\S+)", printed)
    if console is None:
        raise RuntimeError(f"llmtasks up printed no console URL:\n{printed}")
    return LaunchedStack(
        process,
        f"http://127.0.0.1:{api_port}",
        mock,
        moto_port,
        log,
        key and key.group(1),
        cwd or Path.cwd(),
        console.group(1),
    )
