"""Runs (section runs): the worker's billed Lambda time per minute the provider thinks, a plain
call (the worker waits on it) against the provider's background mode (the worker starts it, is
released, and looks at it later); and what a run's journal costs a step, in DynamoDB writes and
at list prices.
"""

from __future__ import annotations

import re
import time
from typing import Any

from drive import open_loop, outcomes
from figures import Report
from harness import PRICES, settled_calls, stack_running
from llmtasks_local.emulator.launcher import LaunchedStack
from llmtasks_local.sam.provision import local_name
from workloads.costs import Receiver

WORKER_BILLED = re.compile(r"Function: WorkerFunction\t.*?\tBilled Duration: (\d+) ms\tMemory Size: (\d+) MB")


def _billed(log: str) -> tuple[float, float]:
    """WorkerFunction's billed seconds and GB-s in `log`'s REPORT lines."""
    seconds = gb_s = 0.0
    for billed, memory in WORKER_BILLED.findall(log):
        seconds += int(billed) / 1000
        gb_s += int(billed) / 1000 * int(memory) / 1024
    return seconds, gb_s


def _worker_time(stack: LaunchedStack, tasks: int, body: dict[str, Any]) -> tuple[float, float, float]:
    """The worker's billed seconds and GB-s for `tasks` tasks of `body`, and their wall time."""
    mark = len(stack.log.read_text())
    started = time.monotonic()
    done = outcomes(stack, open_loop(stack, tasks, lambda i: {**body, "metadata": {"i": i}}, lambda _i: {}))
    wall = time.monotonic() - started
    if any(d.task["status"] != "completed" for d in done):
        raise RuntimeError("a task of the runs section did not complete")
    seconds, gb_s = _billed(stack.log.read_text()[mark:])
    return seconds, gb_s, wall


def runs(report: Report, quick: bool) -> None:
    section = "runs"
    think_s, tasks, steps, agent_runs = (10, 4, 4, 3) if quick else (30, 10, 8, 10)
    provider_minutes = tasks * think_s / 60
    receiver = Receiver()  # a function endpoint that answers at once (its body empty)
    try:
        with stack_running() as stack:
            stack.configure_mock(latency_s=think_s)
            plain = _worker_time(stack, tasks, {"prompt": "think"})
            waited = _worker_time(stack, tasks, {"prompt": "think", "provider_background": True})
            looks = stack.mock_stats()["background_polls"]
            stack.configure_mock()
            settled_calls(stack)
            stack.aws_calls(reset=True)
            tool = {
                "type": "function",
                "name": "lookup",
                "parameters": {"type": "object"},
                "url": receiver.url,
            }
            done = outcomes(
                stack,
                open_loop(
                    stack,
                    agent_runs,
                    lambda i: {"prompt": f"run {i} [mock:agent-steps={steps}]", "tools": [tool]},
                    lambda _i: {},
                ),
            )
            if any(d.task["status"] != "completed" for d in done):
                raise RuntimeError("a run of the runs section did not complete")
            calls = settled_calls(stack)
            writes = stack.aws_writes()
    finally:
        receiver.close()
    for label, (seconds, gb_s, wall) in (("plain call", plain), ("background mode", waited)):
        report.add(
            section,
            f"{label}: worker seconds billed per minute the provider thinks",
            f"{seconds / provider_minutes:.2f} s",
            f"{tasks} calls of {think_s} s; {gb_s / provider_minutes:.3f} GB-s; wall {wall:.0f} s",
        )
    ratio = (plain[0] / provider_minutes) / max(waited[0] / provider_minutes, 1e-9)
    report.add(
        section, "plain / background, billed seconds", f"{ratio:.1f}x", f"{looks} looks at the provider"
    )
    # A run of `steps` tool calls is 2 * steps + 1 steps: a model call, then a tool call, each turn.
    taken = agent_runs * (2 * steps + 1)
    table = local_name("TasksTable")
    items = writes.get("items", {}).get(table, 0) / taken
    units = writes.get("units", {}).get(table, 0) / taken
    reads = sum(
        v
        for k, v in calls.items()
        if k.startswith("dynamodb.") and k.split(".")[1] in ("GetItem", "Query", "BatchGetItem")
    )
    report.add(
        section,
        f"journal: TasksTable items / write units a step ({agent_runs} runs of {2 * steps + 1} steps)",
        f"{items:.2f} / {units:.2f}",
        "the step's item, the output's event chunk and head, the task's usage",
    )
    usd = (units * PRICES["dynamodb_wru"] + reads / taken * 0.5 * PRICES["dynamodb_rru"]) * 1e6
    report.add(
        section, "journal: DynamoDB cost per million steps", f"${usd:.2f}", "writes and reads, list prices"
    )
    report.note(
        "Runs: the mock thinks the given seconds per call; a plain call holds its worker invocation the"
        " whole time, a background one only to start it and for each look (5 s after the start, each"
        " look 1.5x later, or at once when the mock's signed webhook wakes the run). The journal's"
        " figures count every TasksTable write of a run (the task's own writes included) over its steps."
    )
