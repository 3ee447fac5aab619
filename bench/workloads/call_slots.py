"""Call slots kept busy on long calls (section slots): issue 21's workloads on llmtasks, on the
event source's batches alone and on the Celery baseline, and the worker's GB-s a call.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from baseline import running_baseline  # bench/ is on sys.path: run.py runs as a script
from drive import Target, open_loop, outcomes
from figures import Report, verdict
from harness import (
    PLAIN_MOCK,
    PRICES,
    lambda_reports,
    pids_cpu,
    stack_as_make_up_starts_it,
    stack_cpu,
    stack_running,
    worker_slots,
)
from llmtasks_local.emulator.launcher import LaunchedStack

# The workloads llmtasks exists for, as mock knobs: every call's time is the mock's draw.
SLOT_WORKLOADS = {
    "full": (
        ("300 x 20 s", 300, {"latency_s": 20.0}),
        ("500 x 2 s", 500, {"latency_s": 2.0}),
        (
            "500 x log-normal 2-120 s (median 12 s, sigma 1)",
            500,
            {"latency_s": 12.0, "latency_sigma": 1.0, "latency_min_s": 2.0, "latency_max_s": 120.0},
        ),
    ),
    "quick": (
        ("60 x 4 s", 60, {"latency_s": 4.0}),
        ("100 x 1 s", 100, {"latency_s": 1.0}),
        (
            "100 x log-normal 1-20 s (median 3 s, sigma 1)",
            100,
            {"latency_s": 3.0, "latency_sigma": 1.0, "latency_min_s": 1.0, "latency_max_s": 20.0},
        ),
    ),
}


@dataclass
class SlotRun:
    efficiency: float  # (the calls' drawn time / slots) / wall time, first submit to last completion
    wall_s: float
    submit_s: float  # first submit to the last submit's reply
    most_in_flight: int  # at the mock
    not_completed: int
    busiest: str  # the process that used the most CPU over the run, and how many cores of it


def slots_run(
    target: Target,
    stack: LaunchedStack,
    tasks: int,
    knobs: dict[str, Any],
    slots: int,
    cpu: Callable[[], dict[str, float]],
) -> SlotRun:
    """`tasks` calls with the mock's `knobs`, submitted at once by 16 clients to `target`; `cpu`
    reads the CPU of the target's processes by part, which tells what bounds the run."""
    stack.configure_mock(**{**PLAIN_MOCK, **knobs})  # the same seed: the same draws for each design
    cpu_before = cpu()
    started = time.time()
    submitted = open_loop(target, tasks, lambda i: {"prompt": f"slots {i} {uuid.uuid4().hex}"}, lambda _i: {})
    submit_s = max(at for at, _ in submitted) - started
    done = outcomes(target, submitted)
    wall = max(d.completed_at for d in done) - started
    stats = stack.mock_stats()
    used = {name: seconds - cpu_before[name] for name, seconds in cpu().items()}
    busiest = max(used, key=lambda name: used[name])
    return SlotRun(
        efficiency=stats["latency_total_s"] / slots / wall,
        wall_s=wall,
        submit_s=submit_s,
        most_in_flight=int(stats["max_in_flight"]),
        not_completed=sum(d.task["status"] != "completed" for d in done),
        busiest=f"{busiest} {used[busiest] / (time.time() - started):.2f} cores",
    )


def worker_gb_s_per_call(stack: LaunchedStack, calls: int, latency_s: float) -> float:
    """The worker's GB-s per call (REPORT lines' billed durations x MemorySize) for `calls` calls
    of `latency_s` submitted at once, once every invocation has returned."""
    stack.configure_mock(**{**PLAIN_MOCK, "latency_s": latency_s})
    # The last run's invocations return within a receive's wait after their last call: their
    # time must not be counted here.
    time.sleep(5)
    log_mark = len(stack.log.read_text())
    submitted = open_loop(stack, calls, lambda i: {"prompt": f"cost60 {i} {uuid.uuid4().hex}"}, lambda _i: {})
    outcomes(stack, submitted)
    # An invocation returns within a receive's wait after its last call; then its REPORT line.
    time.sleep(5)
    _, gb_s = lambda_reports(stack.log.read_text()[log_mark:]).get("WorkerFunction", (0, 0.0))
    return gb_s / calls


def call_slots(report: Report, quick: bool) -> None:
    """Issue 21's workloads on three designs in one run: llmtasks as the template sets it (each
    invocation keeps its slots full from the queue), the event source's batches alone
    (WorkerCallSlots=0), and the seed's Celery design with as many threads as call slots."""
    concurrency, per_invocation = worker_slots()
    slots = concurrency * per_invocation
    workloads = SLOT_WORKLOADS["quick" if quick else "full"]
    cost_calls, cost_latency = (40, 10.0) if quick else (200, 60.0)
    designs = {"llmtasks": (), "event batches only": ("--parameter-overrides", "WorkerCallSlots=0")}
    runs: dict[str, dict[str, SlotRun]] = {"llmtasks": {}, "event batches only": {}, "celery": {}}
    gb_s: dict[str, float] = {}
    # The first workload once more on a stack as a user starts it
    first_label, first_tasks, first_knobs = workloads[0]
    with stack_as_make_up_starts_it() as cold:
        from_cold = slots_run(cold, cold, first_tasks, first_knobs, slots, lambda: stack_cpu(cold))
    for design, options in designs.items():
        with stack_running(*options) as stack:
            for label, tasks, knobs in workloads:
                runs[design][label] = slots_run(stack, stack, tasks, knobs, slots, lambda: stack_cpu(stack))
            gb_s[design] = worker_gb_s_per_call(stack, cost_calls, cost_latency)
            if design == "llmtasks":
                assert stack.mock is not None
                with running_baseline(stack.mock + "/v1", threads=slots) as celery:
                    for label, tasks, knobs in workloads:
                        cpu = pids_cpu(celery.pids())
                        runs["celery"][label] = slots_run(celery, stack, tasks, knobs, slots, cpu)
    section = "call slots"
    for label, _tasks, _knobs in workloads:
        ours, batches, theirs = (runs[d][label] for d in ("llmtasks", "event batches only", "celery"))
        report.add(
            section,
            f"{label}, {slots} slots: efficiency",
            f"{ours.efficiency:.2f}",
            f"Celery {theirs.efficiency:.2f}, ratio {ours.efficiency / theirs.efficiency:.2f};"
            f" event batches only {batches.efficiency:.2f}",
        )
        report.add(
            section,
            "  wall / time to submit (llmtasks, batches only, Celery)",
            f"{ours.wall_s:.0f} / {ours.submit_s:.0f} s",
            f"{batches.wall_s:.0f} / {batches.submit_s:.0f} s; {theirs.wall_s:.0f} / {theirs.submit_s:.0f} s",
        )
        report.add(
            section,
            "  the busiest process over the run",
            ours.busiest,
            f"{batches.busiest}; Celery {theirs.busiest}",
        )
        report.add(
            section,
            "  most calls in flight; tasks not completed",
            f"{ours.most_in_flight}; {ours.not_completed}",
            f"{batches.most_in_flight}; {batches.not_completed}; Celery {theirs.most_in_flight};"
            f" {theirs.not_completed}",
        )
    report.add(
        section,
        f"{first_label} on a stack as make up starts it: efficiency",
        f"{from_cold.efficiency:.2f}",
        f"Celery {runs['celery'][first_label].efficiency:.2f} (target >= 0.9): "
        + verdict(from_cold.efficiency >= 0.9)
        + f"; wall {from_cold.wall_s:.0f} s, {from_cold.not_completed} not completed",
    )
    # The reference: ten calls sharing every second of one invocation of the template's MemorySize.
    memory_gb = 512 / 1024
    full_batch = cost_latency * memory_gb / 10
    for design, per_call in gb_s.items():
        per_1000 = per_call * 1000 * (60.0 / cost_latency)
        report.add(
            section,
            f"worker GB-s per 1,000 calls of 60 s ({design})",
            f"{per_1000:.0f} GB-s = ${per_1000 * PRICES['lambda_gb_s']:.3f}",
            f"{per_call / full_batch:.2f}x a full batch of ten (target <= 1.5x for llmtasks)",
        )
    report.note(
        f"call slots: {concurrency} invocations x {per_invocation} calls; efficiency counts the mock's drawn"
        " call times (the same seed for each design); the cost run is"
        f" {cost_calls} calls of {cost_latency:.0f} s submitted at once, scaled to 1,000 calls of 60 s"
    )
