"""The local runtime's own costs (section sandboxes): each function's cold start alone and in a
burst, and the memory of the stack with the sandboxes a burst left warm.
"""

from __future__ import annotations

import re
import statistics
import time

from drive import open_loop, outcomes
from figures import Report
from harness import ROOT, resident_kib, sandbox_functions, stack_parts
from llmtasks_local.emulator.launcher import launch


def init_durations(log: str) -> dict[str, list[float]]:
    """Per function, the Init Duration (ms) of each cold start in the REPORT lines of `log`."""
    found: dict[str, list[float]] = {}
    for name, init_ms in re.findall(r"Function: (\w+)\t[^\n]*?Init Duration: ([\d.]+) ms", log):
        found.setdefault(name, []).append(float(init_ms))
    return found


def sandboxes(report: Report, tasks: int) -> None:
    """The local runtime's own costs. First each function's cold start alone (process start to
    its first request for work: REPORT's Init Duration), one request at a time on a fresh stack,
    as Lambda gives each new environment its own CPU; then `tasks` tasks of 2 s from 16 clients at
    once, whose sandboxes start together on this machine's cores; then the memory of the whole
    stack with the sandboxes that burst left warm."""
    section = "sandboxes"
    launched = launch("--report", cwd=ROOT)
    try:
        with launched.client() as client:
            # One request at a time: the authorizer, submit, worker and webhook relay, status,
            # then a batch's function.
            task_id = client.post("/tasks", json={"prompt": "cold"}).json()["task_id"]
            client.get(f"/tasks/{task_id}", params={"wait": 20})
            client.post("/batches", json={"items": [{"prompt": "cold item"}]})
            time.sleep(5)  # the batch's fan-out and the relays run after the replies
        alone = init_durations(launched.log.read_text())
        mark = len(launched.log.read_text())
        launched.configure_mock(latency_s=2.0)
        done = outcomes(
            launched, open_loop(launched, tasks, lambda i: {"prompt": f"sandbox {i}"}, lambda _i: {})
        )
        together = init_durations(launched.log.read_text()[mark:])
        by_function = sandbox_functions(launched)
        rss_kib = {function: sum(resident_kib(pid) for pid in pids) for function, pids in by_function.items()}
        total_kib = sum(resident_kib(pid) for pids in stack_parts(launched).values() for pid in pids)
    finally:
        launched.stop()
    for function in sorted(set(alone) | set(by_function)):
        pids, burst_starts = by_function.get(function, []), together.get(function, [])
        report.add(
            section,
            f"{function}: cold start alone (Init Duration)",
            f"{statistics.median(alone[function]):.0f} ms" if function in alone else "-",
            f"{len(burst_starts)} more in the burst, median {statistics.median(burst_starts):.0f} ms;"
            if burst_starts
            else "none in the burst;",
        )
        report.add(
            section,
            f"  {function}: warm sandboxes after the burst",
            str(len(pids)),
            f"{rss_kib.get(function, 0) / 1024 / max(1, len(pids)):.0f} MiB resident each",
        )
    count = sum(len(pids) for pids in by_function.values())
    report.add(
        section,
        f"RSS of the whole stack with {count} warm sandboxes (after {tasks} tasks of 2 s, 16 clients)",
        f"{total_kib / 1024:.0f} MiB",
        f"{sum(d.task['status'] != 'completed' for d in done)} tasks not completed",
    )
