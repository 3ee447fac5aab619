"""The seed's Celery + Redis design beside llmtasks (section celery): the same burst on both, on
a warmed stack and on one as `make up` starts it, and the stack at twice the load.
"""

from __future__ import annotations

from baseline import running_baseline  # bench/ is on sys.path: run.py runs as a script
from drive import CLIENTS, burst
from figures import Report, ms, verdict
from harness import stack_as_make_up_starts_it, stack_cpu, stack_running, worker_slots


def versus_celery(report: Report, burst_tasks: int) -> None:
    """The seed's design (Flask + Celery threads + Redis, bench/baseline.py) and the local stack,
    in the same run, against the same mock LLM, driven by the same client code: a burst of
    submits, on a stack as make up starts it and on one warmed up. (Long calls on both: the call
    slots section.)"""
    section = "vs Celery"
    concurrency, batch = worker_slots()
    slots = concurrency * batch
    with stack_as_make_up_starts_it() as cold:
        from_cold = burst(cold, burst_tasks)
    with stack_running() as stack:
        assert stack.mock is not None
        stack.aws_calls(reset=True)
        cpu_before = stack_cpu(stack)
        figures = {"llmtasks": burst(stack, burst_tasks)}
        cpu_after = stack_cpu(stack)
        calls, moto_us = stack.aws_calls(), stack.aws_cpu_us()
        # Twice the clients the stack saturates with: the throughput levels off or collapses.
        overloaded = burst(stack, burst_tasks, clients=2 * CLIENTS)
        with running_baseline(stack.mock + "/v1", threads=slots) as celery:
            figures["celery"] = burst(celery, burst_tasks)
    peak = figures["llmtasks"]["completed_s"]
    report.add(
        section,
        f"{burst_tasks} tasks from {2 * CLIENTS} clients (twice the load): completed a second",
        f"{overloaded['completed_s']:.1f}/s",
        f"{overloaded['completed_s'] / peak:.2f}x the 16 clients' (target >= 0.9x): "
        + verdict(overloaded["completed_s"] >= 0.9 * peak),
    )
    for part in cpu_after:
        report.add(
            section, f"llmtasks CPU per task, {part}", ms((cpu_after[part] - cpu_before[part]) / burst_tasks)
        )
    busiest = sorted(moto_us, key=lambda operation: -moto_us[operation])[:5]
    report.note(
        f"{section}: moto's CPU by operation in the llmtasks burst, ms a task (calls a task): "
        + ", ".join(
            f"{op} {moto_us[op] / 1000 / burst_tasks:.1f} ({calls.get(op, 0) / burst_tasks:.2f})"
            for op in busiest
        )
    )
    ours, theirs = figures["llmtasks"], figures["celery"]
    for key, label, unit in (
        ("submits_s", f"{burst_tasks} tasks, 0 s LLM, 16 clients: submits a second", "/s"),
        ("submit_p95", "a submit's p95 during that burst", " s"),
        ("completed_s", "tasks completed a second over the burst", "/s"),
    ):
        value = f"{ours[key]:.1f}{unit}" if unit == "/s" else ms(ours[key])
        other = f"{theirs[key]:.1f}{unit}" if unit == "/s" else ms(theirs[key])
        report.add(section, label, value, f"Celery {other}, ratio {ours[key] / theirs[key]:.2f}")
    report.add(
        section,
        "the same burst on a stack as make up starts it: completed a second",
        f"{from_cold['completed_s']:.1f}/s",
        f"Celery {theirs['completed_s']:.1f}/s, ratio {from_cold['completed_s'] / theirs['completed_s']:.2f}"
        f" (target >= 0.3): {verdict(from_cold['completed_s'] >= 0.3 * theirs['completed_s'])}",
    )
    report.add(
        section,
        "tasks not completed (llmtasks warmed / as make up starts it / Celery)",
        f"{int(ours['not_completed'])} / {int(from_cold['not_completed'])} / {int(theirs['not_completed'])}",
    )
