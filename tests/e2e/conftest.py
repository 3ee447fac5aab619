"""The local stack as users start it (`llmtasks up`), in a subprocess on free ports."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmtasks.llm.mock import MockConfig
from tests.helpers import ROOT, free_port


@dataclass
class RunningStack:
    process: subprocess.Popen[bytes]
    api: str
    mock: str | None
    moto_port: int
    log: Path
    api_key: str | None  # the dev key `llmtasks up` printed; None with --no-auth

    def client(self, api_key: str | None = None) -> httpx.Client:
        """A client that sends the dev key (or `api_key`)."""
        key = api_key or self.api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.api, timeout=30, headers=headers)

    def run_cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """`llmtasks ARGS` as a user of this stack runs it: API URL and dev key from the
        environment, never an AWS account's credentials."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {"LLMTASKS_API_URL": self.api, "LLMTASKS_API_KEY": self.api_key or ""}
        return subprocess.run(
            [sys.executable, "-m", "llmtasks.cli", *args],
            cwd=ROOT,
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
        done = self.run_cli(*args, "--endpoint-url", f"http://127.0.0.1:{self.moto_port}")
        assert done.returncode == 0, done.stderr
        return done.stdout

    def configure_mock(self, *, reset: bool = True, **knobs: Any) -> None:
        """Changes the given knobs of the mock, and zeroes its counters unless told not to."""
        assert self.mock is not None
        httpx.put(f"{self.mock}/_mock/config", json=knobs).raise_for_status()
        if reset:
            httpx.post(f"{self.mock}/_mock/reset").raise_for_status()

    def mock_stats(self) -> dict[str, int]:
        assert self.mock is not None
        stats: dict[str, int] = httpx.get(f"{self.mock}/_mock/stats").json()
        return stats

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def start_stack(*extra: str, env: dict[str, str] | None = None) -> RunningStack:
    api_port, moto_port, mock_port = free_port(), free_port(), free_port()
    log = Path(tempfile.mkstemp(prefix="llmtasks-up-", suffix=".log")[1])
    # With AWS_ENDPOINT_URL set (e.g. a LocalStack), the stack uses it instead of its own moto.
    # Revoked keys stop working within a second here (60 s by default).
    # and no webhook host is ever looked up in DNS: fuzzed URLs must not reach past 127.0.0.1.
    given = {"AUTH_CACHE_S": "1", "WEBHOOK_RESOLVE_NAMES": "false", **(env or {})}
    env = {**{k: v for k, v in os.environ.items() if k != "LLM_BASE_URL"}, **given}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmtasks.cli",
            "up",
            "--port",
            str(api_port),
            "--moto-port",
            str(moto_port),
            "--mock-port",
            str(mock_port),
            "--mock-latency",
            "0",
            *extra,
        ],
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        give_up = time.monotonic() + 60
        while "Ready." not in log.read_text():
            if process.poll() is not None or time.monotonic() > give_up:
                raise RuntimeError(f"llmtasks up did not start:\n{log.read_text()}")
            time.sleep(0.1)
    except BaseException:
        # Never leave a stack behind a failed test: SIGTERM lets it stop its own children.
        process.terminate()
        process.wait(timeout=30)
        raise
    mock = None if "LLM_BASE_URL" in given else f"http://127.0.0.1:{mock_port}"
    key = re.search(r"API key\s+(lt_\S+)", log.read_text())
    return RunningStack(process, f"http://127.0.0.1:{api_port}", mock, moto_port, log, key and key.group(1))


def derived_template(directory: Path, replacements: dict[str, str]) -> Path:
    """template.yaml with some text replaced (each must occur) and code paths made absolute,
    written to `directory`: the same application, rewired for one suite."""
    text = (ROOT / "template.yaml").read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    text = text.replace("CodeUri: functions/", f"CodeUri: {ROOT}/functions/")
    path = directory / "template.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def stack() -> Iterator[RunningStack]:
    running = start_stack()
    yield running
    running.stop()


@pytest.fixture
def fresh_mock(stack: RunningStack) -> Iterator[RunningStack]:
    """The session's stack with the mock's knobs at their defaults and its counters zeroed; the
    knobs go back to their defaults afterwards too, for the tests that use `stack` as it is."""
    defaults = MockConfig().model_dump(exclude={"seed"})
    stack.configure_mock(**defaults)
    yield stack
    stack.configure_mock(**defaults)
