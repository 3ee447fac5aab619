"""What a user waits for before anything runs: the CLI's start-up (section cli), the daily loop of
`llmtasks up`, a first task and a handler edit (loop), and each handler's import time against
boto3's (cold).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from figures import Report, verdict
from harness import ROOT
from llmtasks_local.emulator.launcher import launch
from llmtasks_local.sam.template import Template

# What the Lambda runtime sets and libraries read at import (the X-Ray SDK skips its sampling
# clients inside Lambda, where Lambda samples).
LAMBDA_ENVIRONMENT = {
    "LAMBDA_TASK_ROOT": str(ROOT),
    "AWS_LAMBDA_FUNCTION_NAME": "bench",
    "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",  # Lambda sets both; botocore reads this one
    "PYTHONDONTWRITEBYTECODE": "1",
}


class PlaceholderRefs(dict[Any, str]):
    """Every !Ref and !GetAtt of the template, read as the name of what it refers to: a handler's
    import checks that its resources are named, not that they exist."""

    def __missing__(self, key: Any) -> str:
        return key if isinstance(key, str) else ".".join(key)

    def __contains__(self, key: object) -> bool:
        return True

    def get(self, key: Any, default: Any = None) -> str:
        return self[key]


def import_ms(code: str, runs: int = 3, environment: dict[str, str] | None = None) -> float:
    """Median over fresh interpreters of the time `python -X importtime` gives `code`'s imports."""
    totals = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, **LAMBDA_ENVIRONMENT, **(environment or {})},
        )
        top_level = 0
        for line in done.stderr.splitlines():
            found = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
            if found and not found.group(2).startswith(" "):
                top_level += int(found.group(1))
        totals.append(top_level / 1000)
    return statistics.median(totals)


def cold_start(report: Report) -> None:
    boto3_ms = import_ms("import boto3")
    section = "cold start"
    report.add(section, "import boto3", f"{boto3_ms:.0f} ms")
    # Each handler imported in its function's environment (its cold start checks its resources).
    for spec in sorted(
        Template.load(ROOT / "template.yaml").functions(PlaceholderRefs(), PlaceholderRefs()).values(),
        key=lambda f: str(f.code_dir),
    ):
        app = spec.handler_file
        handler_ms = import_ms(f"import runpy; runpy.run_path({str(app)!r})", environment=spec.environment)
        ratio = handler_ms / boto3_ms
        report.add(
            section,
            f"import functions/{app.parent.name}/app.py",
            f"{handler_ms:.0f} ms",
            f"{ratio:.2f}x boto3 (target <= 1.5x): {verdict(ratio <= 1.5)}",
        )


def wall_ms(command: list[str], runs: int = 10) -> float:
    """The fastest of `runs` runs of a command, in ms: its own start-up, the machine's noise
    taken out as far as a minimum takes it."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, cwd=ROOT, capture_output=True, check=True)
        times.append((time.perf_counter() - started) * 1000)
    return min(times)


def cli_start(report: Report) -> None:
    """The CLI's own start-up (issue: three packages): what a user waits for before a command
    does anything. `status --help` imports what `status` does (the command's module and the
    SDK) and stops before its request."""
    section = "cli start-up"
    cli = str(Path(sys.executable).parent / "llmtasks")
    bare = wall_ms([sys.executable, "-c", "pass"])
    report.add(section, "python -c pass (the interpreter's floor)", f"{bare:.0f} ms")
    for args, target in ((["--version"], 150), (["--help"], 150), (["status", "--help"], 300)):
        took = wall_ms([cli, *args])
        report.add(
            section,
            f"llmtasks {' '.join(args)}: fastest of 10",
            f"{took:.0f} ms",
            f"target <= {target} ms: {verdict(took <= target)}",
        )


def daily_loop(report: Report) -> None:
    """What a user waits for each day (issue 36): `llmtasks up` (the venv made) to Ready, the
    first task after Ready (a 0 s mock; the worker's batching window is part of it), a second
    one, and a saved handler edit until the new code answers. Eager is what `make up` starts;
    lazy is every sandbox started by its first invocation."""
    section = "daily loop"
    window = float(Template.load(ROOT / "template.yaml").parameters["WorkerBatchingWindowSeconds"])
    for mode in ("eager", "lazy"):
        with tempfile.TemporaryDirectory(prefix="llmtasks-loop-") as directory:
            code = Path(directory) / "status"
            shutil.copytree(ROOT / "functions" / "status", code)
            template = Path(directory) / "template.yaml"
            text = (
                (ROOT / "template.yaml")
                .read_text()
                .replace("CodeUri: functions/status/", f"CodeUri: {code}/")
            )
            text = text.replace("CodeUri: functions/", f"CodeUri: {ROOT}/functions/")
            template.write_text(text.replace("ContentUri: src/", f"ContentUri: {ROOT}/src/"))
            started = time.monotonic()
            stack = launch("--warm-containers", mode, "--template", str(template), cwd=ROOT)
            ready_s = time.monotonic() - started
            try:
                with stack.client() as client:
                    first_s, second_s = (task_seconds(client, f"loop {mode} {i}") for i in range(2))
                    reload_s = edit_seconds(client, code / "app.py")
            finally:
                stack.stop()
        report.add(
            section,
            f"--warm-containers {mode}: llmtasks up to Ready",
            f"{ready_s:.1f} s",
            "target <= 8 s" + (f": {verdict(ready_s <= 8)}" if mode == "eager" else ""),
        )
        report.add(
            section,
            "  first task after Ready (submit to completed, a 0 s mock)",
            f"{first_s:.2f} s",
            f"target <= {window + 0.5:.1f} s (the {window:.0f} s batching window + 0.5 s)"
            + (f": {verdict(first_s <= window + 0.5)}" if mode == "eager" else ""),
        )
        report.add(section, "  the second task", f"{second_s:.2f} s")
        report.add(
            section,
            "  a saved handler edit until the new code answers",
            f"{reload_s:.2f} s",
            "target <= 1 s" + (f": {verdict(reload_s <= 1)}" if mode == "eager" else ""),
        )


def task_seconds(client: httpx.Client, prompt: str) -> float:
    """From the submit to the reply that shows the task completed (long polls, answered as it ends)."""
    started = time.monotonic()
    task_id = client.post("/tasks", json={"prompt": prompt}).json()["task_id"]
    while client.get(f"/tasks/{task_id}", params={"wait": 20}).json()["status"] != "completed":
        pass
    return time.monotonic() - started


def edit_seconds(client: httpx.Client, app: Path) -> float:
    """From a saved edit of StatusFunction's handler to the first reply of the new code."""
    assert "x-edited" not in client.get("/health").headers
    started = time.monotonic()
    with app.open("a") as handler:
        handler.write(
            "\n_served = lambda_handler\n"
            "def lambda_handler(event, context):\n"
            "    reply = _served(event, context)\n"
            "    reply.setdefault('headers', {})['x-edited'] = '1'\n"
            "    return reply\n"
        )
    while "x-edited" not in client.get("/health").headers:
        time.sleep(0.02)
    return time.monotonic() - started
