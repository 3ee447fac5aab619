"""Goodput under a provider rate limit (section paced): tasks completed a second against the
mock's limit, with the stack paced to it.
"""

from __future__ import annotations

import time
from collections import Counter

from drive import open_loop, outcomes
from figures import Report, verdict
from harness import stack_running


def goodput(report: Report, tasks: int, limit_rps: float) -> None:
    with stack_running("--parameter-overrides", f"LlmRequestsPerSecond={limit_rps:g}") as stack:
        stack.configure_mock(max_rps=limit_rps)
        started = time.time()
        submitted = open_loop(stack, tasks, lambda i: {"prompt": f"paced {i}"}, lambda _i: {})
        done = outcomes(stack, submitted)
        stats = stack.mock_stats()
    completed = [d for d in done if d.task["status"] == "completed"]
    wall = max(d.completed_at for d in done) - started
    rate = len(completed) / wall
    failed = len(done) - len(completed)
    section = "rate limit"
    report.add(section, f"{tasks} tasks, provider limit {limit_rps:g}/s: completed per s", f"{rate:.2f}")
    report.add(
        section,
        "goodput / limit",
        f"{rate / limit_rps:.2f}",
        f"target >= 0.9 with 0 failed: {verdict(rate / limit_rps >= 0.9 and failed == 0)}",
    )
    report.add(section, "failed tasks", str(failed))
    report.add(section, "429s received", str(stats["rps_limited"]))
    errors = Counter(d.task.get("error_code") for d in done if d.task["status"] != "completed")
    if errors:
        report.note(f"rate-limit run: failed by error code {dict(errors)}")
