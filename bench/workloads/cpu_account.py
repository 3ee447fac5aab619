"""Where a task's CPU goes (section cpu): each part of the stack in a burst, beside its floor
measured in the same run (moto's backend, the journal's bytes, the handlers in-process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from drive import burst
from figures import Report, verdict
from handlers_in_process import FUNCTIONS
from harness import ROOT, moto_session, stack_cpu, stack_running
from llmtasks_local.emulator.launcher import LaunchedStack

FLOOR_TASKS = 300  # the handlers' floor (handlers_in_process): tasks run through them in-process


def journal_floor_s(records: int, written: int) -> float:
    """The journal's floor: its bytes written, as many writes of the same average size to a
    file, with neither encoding nor framing (what the journal does beyond that is its cost)."""
    record = b"x" * (written // max(1, records))
    descriptor, path = tempfile.mkstemp(prefix="llmtasks-bench-journal-")
    try:
        started = time.process_time()
        for _ in range(records):
            os.write(descriptor, record)
        return time.process_time() - started
    finally:
        os.close(descriptor)
        os.unlink(path)


def since(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {part: after[part] - before.get(part, 0.0) for part in after}


def handlers_in_process(stack: LaunchedStack, tasks: int) -> dict[str, float]:
    """CPU seconds a task of each function's handler run in a process of the bench's own
    (bench/handlers_in_process.py), on the events a burst gives it, against `stack`'s endpoint
    and mock: the handlers' floor, without a sandbox, the Runtime API or the gateway around them,
    and without two dozen processes taking turns on the cores."""
    session = moto_session()
    lambda_api = session.client("lambda", endpoint_url=stack.endpoint)
    sqs = session.client("sqs", endpoint_url=stack.endpoint)
    environment: dict[str, str] = {}
    for function in FUNCTIONS:  # the stack's own variables of each, as its Lambda API gives them
        environment |= lambda_api.get_function_configuration(FunctionName=function)["Environment"][
            "Variables"
        ]
    queue_url = sqs.create_queue(
        QueueName=f"bench-floor-{uuid.uuid4().hex[:8]}", Attributes={"VisibilityTimeout": "900"}
    )["QueueUrl"]
    config = {"endpoint": stack.endpoint, "tasks": tasks, "environment": environment, "queue_url": queue_url}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "handlers_in_process.py"), json.dumps(config)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    figures = json.loads(done.stdout)
    return {function: seconds / figures["tasks"] for function, seconds in figures["cpu_s"].items()}


def cpu_account(report: Report, tasks: int) -> None:
    """A burst of `tasks` (the LLM answering at once, 16 clients) on a warm stack with a state dir,
    as `llmtasks up` runs by default, and the CPU each part took a task, beside its floor
    measured in the same run: moto's backend doing the calls' work (timed inside the server,
    /_llmtasks/calls/backend) for the server; the journal's bytes written for the journal; each
    handler's own code run in a process of the bench's own on the same events, its boto3 calls
    included (handlers_in_process) for the sandboxes, beside the same code timed in its sandbox
    during the burst. The stack's parts are its threads' CPU clocks by what each thread does
    (emulator/cpu_account.py); they have no floor of their own here."""
    section = "CPU account"
    state_dir = Path(tempfile.mkdtemp(prefix="llmtasks-bench-cpu-")) / "state"
    with stack_running("--state-dir", str(state_dir)) as stack:
        stack.aws_calls(reset=True)
        processes, account, clients = stack_cpu(stack), stack.cpu_account(), time.process_time()
        figures = burst(stack, tasks)
        clients = time.process_time() - clients
        after = stack.cpu_account()  # one read: the stack's and the sandboxes' parts of one moment
        processes, account = (
            since(stack_cpu(stack), processes),
            {
                "stack": since(after["stack"], account["stack"]),
                "sandboxes": {
                    function: since(spent, account["sandboxes"].get(function, {}))
                    for function, spent in after["sandboxes"].items()
                },
            },
        )
        served_us, backend = stack.aws_cpu_us(), stack.aws_backend_cpu()
        calls = stack.aws_calls()
        # After every figure of the burst is read: these tasks are the bench's, not the burst's.
        in_process = handlers_in_process(stack, FLOOR_TASKS)

    def per_task(seconds: float) -> str:
        return f"{seconds / tasks * 1000:.2f} ms"

    def beside(seconds: float, floor_s: float, what: str) -> str:
        return f"floor {per_task(floor_s)} ({what}), ratio {seconds / floor_s:.2f}" if floor_s > 0 else ""

    journal = backend["journal"]
    journal_s, journal_floor = (
        journal.get("us", 0) / 1e6,
        journal_floor_s(journal.get("records", 0), journal.get("bytes", 0)),
    )
    backend_s = sum(backend["backend_us"].values()) / 1e6 - journal_s
    served_s = sum(served_us.values()) / 1e6
    handlers_s = sum(in_process.values()) * tasks
    total = sum(processes.values())
    cold_starts_s = sum(figures.get("init_s", 0.0) for figures in account["sandboxes"].values())
    floors = backend_s + journal_floor + handlers_s
    report.add(
        section,
        f"{tasks} tasks, 0 s LLM, 16 clients: CPU a task, every process",
        per_task(total),
        f"target <= 45 ms: {verdict(total / tasks <= 0.045)}; the floors' sum {per_task(floors)},"
        f" ratio {total / floors:.2f}; {figures['completed_s']:.1f} tasks/s",
    )
    # The burst scales each function out past what the warm-up started (16 clients keep 16
    # submits and 16 long-polls in flight; the worker's pollers grow five a second): Lambda's
    # cold starts, a cost of a stack's first minutes rather than of each task.
    report.add(
        section,
        "  the same, the burst's cold starts aside",
        per_task(total - cold_starts_s),
        f"cold starts {per_task(cold_starts_s)};"
        f" ratio to the floors' sum {(total - cold_starts_s) / floors:.2f}",
    )
    moto_floor = backend_s + journal_floor
    report.add(
        section,
        "moto, all",
        per_task(processes["moto"]),
        beside(processes["moto"], moto_floor, "backend and journal's bytes"),
    )
    report.add(section, "  serving HTTP (werkzeug, sockets, threads)", per_task(processes["moto"] - served_s))
    report.add(section, "  parsing requests, writing replies", per_task(served_s - backend_s - journal_s))
    report.add(section, "  the backend's work (journal aside)", per_task(backend_s), "the floor")
    report.add(
        section,
        f"  the journal ({journal.get('bytes', 0) / tasks / 1024:.1f} KiB a task,"
        f" {journal.get('records', 0) / tasks:.1f} records)",
        per_task(journal_s),
        beside(journal_s, journal_floor, "its bytes written"),
    )
    busiest = sorted(served_us, key=lambda operation: -served_us[operation])[:6]
    for operation in busiest:
        served, work = served_us[operation] / 1e6, backend["backend_us"].get(operation, 0) / 1e6
        report.add(
            section,
            f"  {operation} ({calls.get(operation, 0) / tasks:.2f} a task)",
            per_task(served),
            beside(served, work, "its backend work, journal included"),
        )
    report.add(
        section,
        "sandboxes, all",
        per_task(processes["sandboxes"]),
        beside(processes["sandboxes"], handlers_s, "the handlers in-process"),
    )
    for function, figures in sorted(account["sandboxes"].items()):
        process_s, init_s, handler_s = (figures.get(key, 0.0) for key in ("process_s", "init_s", "handler_s"))
        if process_s >= 0.0005 * tasks:  # what the warm-up started and the burst did not use: left out
            report.add(
                section,
                f"  {function}",
                per_task(process_s),
                beside(process_s, in_process.get(function, 0.0) * tasks, "its handler in-process"),
            )
            report.add(section, "    of it, its handler in its sandboxes", per_task(handler_s))
            if init_s:
                report.add(section, "    of it, cold starts during the burst", per_task(init_s))
            transport_s = process_s - init_s - handler_s
            report.add(section, "    of it, transport (Runtime API, runtime client)", per_task(transport_s))
    report.add(
        section, "stack process, all", per_task(processes["stack"]), "no floor measured: routing and relaying"
    )
    for part, seconds in sorted(account["stack"].items(), key=lambda item: -item[1]):
        if seconds >= 0.0005 * tasks:
            report.add(section, f"  {part}", per_task(seconds))
    report.add(section, "mock LLM", per_task(processes["mock LLM"]))
    report.add(section, "the bench's 16 clients (not in the sum)", per_task(clients))
