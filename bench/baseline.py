"""Starts the seed's design (bench/baseline_app.py) on this machine: a redis-server (Debian's
package), a Celery worker with a threads pool of `threads` (100: as many LLM calls at once as
the template's 10 worker invocations x 10 records), and gunicorn serving the Flask app (two
processes of 16 threads: as many requests at once as the bench's clients)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(
    url: str, what: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 30
) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}):\n{log.read_text()[-2000:]}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout_s:.0f} s")


class Baseline:
    def __init__(self, url: str, redis_url: str, processes: dict[str, subprocess.Popen[bytes]]) -> None:
        self.api = url
        self.redis_url = redis_url
        self.processes = processes

    def client(self, api_key: str | None = None, **options: object) -> httpx.Client:
        """A client of the baseline's API (it has no keys), as the bench drives llmtasks."""
        return httpx.Client(base_url=self.api, **{"timeout": 30, **options})  # type: ignore[arg-type]

    def pids(self) -> dict[str, int]:
        return {name: process.pid for name, process in self.processes.items()}


@contextmanager
def running_baseline(
    llm_base_url: str, *, threads: int = 100, keys: tuple[str, ...] = ()
) -> Iterator[Baseline]:
    """The seed's design on free ports, its logs in a temp dir; everything stopped afterwards."""
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise RuntimeError("the baseline needs redis-server: apt-get install redis-server (make bench does)")
    work = Path(tempfile.mkdtemp(prefix="llmtasks-baseline-"))
    redis_port, web_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "BASELINE_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "LLM_BASE_URL": llm_base_url,
        "BASELINE_LLM_KEYS": ",".join(keys),
        "PYTHONPATH": str(HERE),
    }
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, command: list[str]) -> subprocess.Popen[bytes]:
        log = work / f"{name}.log"
        process = subprocess.Popen(
            command, env=env, cwd=HERE, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        processes[name] = process
        return process

    try:
        start(
            "redis",
            [
                redis_server,
                "--port",
                str(redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        )
        give_up = time.monotonic() + 10
        while (
            subprocess.run(
                ["redis-cli", "-p", str(redis_port), "ping"], capture_output=True, text=True, check=False
            ).stdout.strip()
            != "PONG"
        ):
            if time.monotonic() > give_up:
                raise RuntimeError(f"redis-server did not start:\n{(work / 'redis.log').read_text()}")
            time.sleep(0.05)
        worker = start(
            "celery",
            [
                str(BIN / "celery"),
                "-A",
                "baseline_app",
                "worker",
                "-P",
                "threads",
                "-c",
                str(threads),
                "--without-heartbeat",
                "--without-mingle",
                "--without-gossip",
                "-l",
                "warning",
            ],
        )
        # A free port is free when probed; another process on the machine may bind it before
        # gunicorn does (seen in a parallel test run): then gunicorn tries new ones.
        for tries_left in reversed(range(3)):
            web = start(
                "gunicorn",
                [
                    str(BIN / "gunicorn"),
                    "-w",
                    "2",
                    "--threads",
                    "16",
                    "-b",
                    f"127.0.0.1:{web_port}",
                    "baseline_app:web",
                ],
            )
            url = f"http://127.0.0.1:{web_port}"
            try:
                _wait_for(url + "/tasks/none", "gunicorn", web, work / "gunicorn.log")
                break
            except RuntimeError:
                if not tries_left or "Address already in use" not in (work / "gunicorn.log").read_text():
                    raise
                web_port = _free_port()
        if worker.poll() is not None:
            raise RuntimeError(f"the Celery worker exited:\n{(work / 'celery.log').read_text()[-2000:]}")
        yield Baseline(url, env["BASELINE_REDIS_URL"], processes)
    finally:
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(work, ignore_errors=True)
