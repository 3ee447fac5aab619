"""Priority and fairness between tenants (section scheduling): a quiet tenant and an urgent task
behind another tenant's backlog, with fair queues and with plain FIFO delivery.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from drive import AsTenant, open_loop, outcomes, submit
from figures import Report, percentile, verdict
from harness import PLAIN_MOCK, stack_running, worker_slots
from llmtasks_local.emulator.launcher import LaunchedStack


@dataclass
class Scheduled:
    quiet_p95_s: float  # the quiet tenant's tasks, submit to completion
    urgent_s: float  # the flood's high-priority task
    usual_s: float  # the flood's normal task submitted beside it: what the urgent one would meet
    flood_tasks_per_s: float  # the flood's tasks over its first submit to its last completion
    all_tasks_per_s: float  # every tenant's tasks over the first submit to the last completion
    backlog_at_quiet: int  # the flood's tasks that ended after the quiet tenant and the urgent task came


def behind_a_backlog(stack: LaunchedStack, flood_tasks: int, quiet_tasks: int, latency_s: float) -> Scheduled:
    """Issue 23's scenario: tenant `flood` queues `flood_tasks`; once its calls fill the slots,
    tenant `quiet` submits `quiet_tasks` and `flood` one high-priority task and one normal one."""
    stack.configure_mock(**{**PLAIN_MOCK, "latency_s": latency_s})
    flood = AsTenant(stack, stack.cli("keys", "create", "--tenant", f"flood-{uuid.uuid4().hex[:6]}").strip())
    quiet = AsTenant(stack, stack.cli("keys", "create", "--tenant", f"quiet-{uuid.uuid4().hex[:6]}").strip())
    started = time.time()
    backlog = open_loop(
        flood, flood_tasks, lambda i: {"prompt": f"flood {i} {uuid.uuid4().hex}"}, lambda _i: {}
    )
    with flood.client(timeout=60) as client:
        urgent = (time.time(), submit(client, {"prompt": "urgent", "priority": "high"}))
        usual = (time.time(), submit(client, {"prompt": "usual"}))
    quiet_ids = open_loop(
        quiet, quiet_tasks, lambda i: {"prompt": f"quiet {i} {uuid.uuid4().hex}"}, lambda _i: {}
    )
    quiet_done = outcomes(quiet, quiet_ids)
    urgent_done, usual_done = outcomes(flood, [urgent, usual])
    flood_done = outcomes(flood, backlog)
    took = [d.completed_at - d.submitted_at for d in quiet_done]
    every = [*flood_done, *quiet_done, urgent_done, usual_done]
    return Scheduled(
        quiet_p95_s=percentile(took, 0.95),
        urgent_s=urgent_done.completed_at - urgent_done.submitted_at,
        usual_s=usual_done.completed_at - usual_done.submitted_at,
        flood_tasks_per_s=flood_tasks / (max(d.completed_at for d in flood_done) - started),
        all_tasks_per_s=len(every) / (max(d.completed_at for d in every) - started),
        backlog_at_quiet=sum(d.completed_at > urgent[0] for d in flood_done),
    )


def scheduling(report: Report, quick: bool) -> None:
    """A quiet tenant and an urgent task behind another tenant's backlog, on the template's
    defaults: SQS fair queues (the local endpoint's) against plain FIFO delivery, in one run."""
    flood_tasks, quiet_tasks, latency_s = (120, 10, 2.0) if quick else (600, 10, 10.0)
    runs: dict[str, Scheduled] = {}
    for design, env in (("fair queues", {}), ("FIFO", {"LLMTASKS_FAIR_QUEUES": "off"})):
        with stack_running(env=env) as stack:
            runs[design] = behind_a_backlog(stack, flood_tasks, quiet_tasks, latency_s)
    fair, fifo = runs["fair queues"], runs["FIFO"]
    section = "scheduling"
    label = f"behind {flood_tasks} x {latency_s:.0f} s of another tenant"
    report.add(
        section,
        f"{label}: quiet tenant's {quiet_tasks} tasks, p95",
        f"{fair.quiet_p95_s:.1f} s",
        f"FIFO {fifo.quiet_p95_s:.1f} s; target <= 20 s: {verdict(fair.quiet_p95_s <= 20)}",
    )
    report.add(
        section,
        f"{label}: a high-priority task",
        f"{fair.urgent_s:.1f} s",
        f"FIFO {fifo.urgent_s:.1f} s; a normal one beside it {fair.usual_s:.1f} s"
        f" (FIFO {fifo.usual_s:.1f} s); target <= 20 s: {verdict(fair.urgent_s <= 20)}",
    )
    ratio = fair.flood_tasks_per_s / fifo.flood_tasks_per_s
    report.add(
        section,
        "the flooding tenant's throughput",
        f"{fair.flood_tasks_per_s:.2f} tasks/s",
        f"FIFO {fifo.flood_tasks_per_s:.2f}; ratio {ratio:.3f}, target >= 0.95: {verdict(ratio >= 0.95)}",
    )
    report.add(
        section,
        "  every tenant's tasks together (slots wasted or not)",
        f"{fair.all_tasks_per_s:.2f} tasks/s",
        f"FIFO {fifo.all_tasks_per_s:.2f}; ratio {fair.all_tasks_per_s / fifo.all_tasks_per_s:.3f}",
    )
    report.note(
        f"scheduling: the template's defaults ({'x'.join(map(str, worker_slots()))} call slots,"
        " HighMaxConcurrency 2); the quiet tenant and the urgent task submit once the flood's calls run, with"
        f" {fair.backlog_at_quiet} (FIFO {fifo.backlog_at_quiet}) of its tasks not completed; FIFO is the"
        " same stack with the local endpoint's fair-queue delivery off (LLMTASKS_FAIR_QUEUES=off); the"
        f" quiet tenant's and the two later tasks take {quiet_tasks + 2} x {latency_s:.0f} s of slot time"
        " from the flood in the fair run (after its end in FIFO's), about 2% of its own"
    )
