"""Durable local state (section state): what the journal costs a burst, and a start after a crash
and after a clean stop with many tasks and messages stored.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from drive import burst
from figures import Report, verdict
from harness import ROOT, moto_session, stack_running, store_completed_tasks
from llmtasks_local.emulator.launcher import launch


def durable_state(report: Report, tasks: int, stored: int) -> None:
    """What the journal costs: the same burst without a state dir and with one (each change
    journaled before its reply), side by side; and how long a start takes after a crash with
    `stored` tasks in TasksTable and a `stored`-message queue, and after a clean stop."""
    section = "state"
    rates = {}
    state_dir = Path(tempfile.mkdtemp(prefix="llmtasks-bench-state-")) / "state"
    for label, extra in (("no state dir", ()), ("journal", ("--state-dir", str(state_dir)))):
        with stack_running(*extra) as stack:
            rates[label] = burst(stack, tasks)
        report.add(section, f"burst of {tasks}, {label}: submits", f"{rates[label]['submits_s']:.1f}/s")
        report.add(
            section, f"burst of {tasks}, {label}: completed", f"{rates[label]['completed_s']:.1f} tasks/s"
        )
    for key, figure in (("submits_s", "submits"), ("completed_s", "completed")):
        ratio = rates["journal"][key] / rates["no state dir"][key]
        report.add(
            section,
            f"journal / no state dir, {figure}",
            f"{ratio:.2f}x",
            f"target >= 0.9: {verdict(ratio >= 0.9)}",
        )
    stack = launch("--state-dir", str(state_dir), cwd=ROOT)
    try:
        store_completed_tasks(stack, stored)
        sqs = moto_session().client("sqs", endpoint_url=stack.endpoint)
        backlog = sqs.create_queue(QueueName="bench-backlog")["QueueUrl"]
        for start in range(0, stored, 10):
            sqs.send_message_batch(
                QueueUrl=backlog,
                Entries=[{"Id": str(i), "MessageBody": f"waiting {start + i}"} for i in range(10)],
            )
        journal_mib = sum(p.stat().st_size for p in state_dir.glob("journal-*")) / 2**20
        stack.crash()
        began = time.monotonic()
        stack = launch("--state-dir", str(state_dir), cwd=ROOT)
        after_crash = time.monotonic() - began
        sqs = moto_session().client("sqs", endpoint_url=stack.endpoint)  # its ports are new ones
        backlog = sqs.get_queue_url(QueueName="bench-backlog")["QueueUrl"]
        count = sqs.get_queue_attributes(QueueUrl=backlog, AttributeNames=["ApproximateNumberOfMessages"])
        kept = int(count["Attributes"]["ApproximateNumberOfMessages"])
    finally:
        stack.stop()
    began = time.monotonic()
    launch("--state-dir", str(state_dir), cwd=ROOT).stop()
    after_clean_stop = time.monotonic() - began
    what = f"{stored} stored tasks and a {stored}-message queue"
    report.add(
        section,
        f"start after a crash, {what} ({journal_mib:.0f} MiB journal)",
        f"{after_crash:.1f} s",
        f"target <= 10 s: {verdict(after_crash <= 10)}",
    )
    report.add(section, "messages found after the crash", f"{kept} of {stored}")
    report.add(section, f"start after a clean stop, {what} (and the clean stop)", f"{after_clean_stop:.1f} s")
