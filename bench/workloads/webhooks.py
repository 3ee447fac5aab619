"""Webhook isolation (section webhooks): a healthy endpoint's deliveries alone and behind an
endpoint that never answers, with the template's defaults and without its cap.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from drive import AsTenant, open_loop, outcomes
from figures import Report, verdict
from harness import PLAIN_MOCK, lambda_reports, stack_running
from llmtasks_local.emulator.launcher import LaunchedStack


class TimedReceiver:
    """A webhook receiver on 127.0.0.1 that notes when each task's delivery arrives; with
    `hang`, it takes each request and never answers (until closed), as a broken endpoint does."""

    def __init__(self, *, hang: bool = False) -> None:
        self.arrived: dict[str, float] = {}
        self.ended: dict[str, float] = {}  # each task's completed_at, as its event says
        self.requests = 0
        self._closed = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests += 1
                if hang:
                    receiver._closed.wait()
                    return
                data = json.loads(body).get("data") or {}
                receiver.arrived.setdefault(str(data.get("task_id")), time.time())
                if data.get("completed_at"):
                    ended = datetime.fromisoformat(str(data["completed_at"])).timestamp()
                    receiver.ended.setdefault(str(data.get("task_id")), ended)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self.server.shutdown()


def healthy_deliveries_s(
    stack: LaunchedStack, healthy: TimedReceiver, tasks: int
) -> tuple[list[float], list[float]]:
    """`tasks` tasks whose webhook is the healthy receiver's: each one's submit to its delivery,
    and its end (the task's completed_at) to its delivery, the webhook's own path."""
    submitted = open_loop(
        stack,
        tasks,
        lambda i: {"prompt": f"hooked {i} {uuid.uuid4().hex}", "webhook_url": healthy.url},
        lambda _i: {},
    )
    give_up = time.monotonic() + 600
    while not all(task_id in healthy.arrived for _, task_id in submitted):
        if time.monotonic() > give_up:
            raise RuntimeError(f"{len(healthy.arrived)} of {tasks} healthy deliveries arrived in 600 s")
        time.sleep(0.05)
    return (
        [healthy.arrived[task_id] - at for at, task_id in submitted],
        [healthy.arrived[task_id] - healthy.ended[task_id] for _, task_id in submitted],
    )


@dataclass
class Isolation:
    alone_s: float  # the healthy endpoint's slowest delivery from its submit, nothing hanging
    behind_s: float  # the same, behind the hanging endpoint's deliveries
    alone_hook_s: float  # the slowest from its task's end to its delivery, nothing hanging
    behind_hook_s: float  # the same, behind the hanging endpoint's deliveries
    gb_s_per_hung: float  # WebhookFunction's GB-s while those ran, per hung delivery
    invocations: int
    hanging_requests: int  # requests that reached the hanging endpoint


def isolation(stack: LaunchedStack, hung: int, healthy_tasks: int) -> Isolation:
    stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 0.1})
    healthy, hanging = TimedReceiver(), TimedReceiver(hang=True)
    try:
        healthy_deliveries_s(stack, healthy, healthy_tasks)  # WebhookFunction's cold starts, not measured
        alone, alone_hook = healthy_deliveries_s(stack, healthy, healthy_tasks)
        before = lambda_reports(stack.log.read_text()).get("WebhookFunction", (0, 0.0))
        # Another tenant's tasks, all ended (their events queued) before the healthy ones come:
        # what is measured is the webhooks' wait, not the worker's backlog.
        other = AsTenant(
            stack, stack.cli("keys", "create", "--tenant", f"hung-{uuid.uuid4().hex[:6]}").strip()
        )
        outcomes(
            other,
            open_loop(
                other,
                hung,
                lambda i: {"prompt": f"hung {i} {uuid.uuid4().hex}", "webhook_url": hanging.url},
                lambda _i: {},
            ),
        )
        give_up = time.monotonic() + 120
        while hanging.requests < 2 and time.monotonic() < give_up:
            time.sleep(0.05)  # the hanging endpoint holds deliveries before the healthy tasks come
        behind, behind_hook = healthy_deliveries_s(stack, healthy, healthy_tasks)
        after = lambda_reports(stack.log.read_text()).get("WebhookFunction", (0, 0.0))
        return Isolation(
            max(alone),
            max(behind),
            max(alone_hook),
            max(behind_hook),
            (after[1] - before[1]) / hung,
            after[0] - before[0],
            hanging.requests,
        )
    finally:
        hanging.close()
        healthy.close()


def webhooks(report: Report, quick: bool) -> None:
    """Issue 39's scenario: a healthy endpoint's deliveries alone, then behind `hung` deliveries
    to an endpoint that takes each request and never answers; with the template's defaults
    (WebhookQueue a fair queue grouped by endpoint, two open deliveries an endpoint) and, in the
    same run, as before them (no cap, the endpoint's FIFO delivery)."""
    hung, healthy_tasks = (30, 10) if quick else (100, 10)
    runs: dict[str, Isolation] = {}
    designs = {
        "isolated": ((), {}),
        "before": (
            ("--parameter-overrides", "WebhookEndpointConcurrency=0"),
            {"LLMTASKS_FAIR_QUEUES": "off"},
        ),
    }
    for design, (extra, env) in designs.items():
        with stack_running(*extra, env=env) as stack:
            runs[design] = isolation(stack, hung, healthy_tasks)
    section = "webhooks"
    for design, run in runs.items():
        ratio = run.behind_s / run.alone_s
        report.add(
            section,
            f"{design}: a healthy endpoint's slowest of {healthy_tasks} deliveries, alone",
            f"{run.alone_s:.1f} s",
        )
        report.add(
            section,
            f"  behind {hung} to an endpoint that never answers",
            f"{run.behind_s:.1f} s",
            f"ratio {ratio:.1f}; target <= 1.5: {verdict(ratio <= 1.5)}",
        )
        hook_ratio = run.behind_hook_s / run.alone_hook_s
        report.add(
            section,
            "  the same from each task's end (the webhook's own path): alone, behind",
            f"{run.alone_hook_s:.2f} s, {run.behind_hook_s:.2f} s",
            f"ratio {hook_ratio:.1f}; target <= 1.5: {verdict(hook_ratio <= 1.5)}",
        )
        report.add(
            section,
            "  WebhookFunction GB-s while those ran, per hung delivery",
            f"{run.gb_s_per_hung:.4f}",
            f"{run.invocations} invocations; {run.hanging_requests} requests reached the hanging endpoint",
        )
    report.note(
        "webhooks: isolated is the template's defaults (WebhookQueue grouped by endpoint, a fair queue;"
        " WebhookEndpointConcurrency 2); before is the same stack with no cap"
        " (WebhookEndpointConcurrency=0) and the endpoint's FIFO delivery (LLMTASKS_FAIR_QUEUES=off);"
        " a delivery may take 15 s (WEBHOOK_TIMEOUT_S), the Deliveries source runs 5 invocations of"
        " up to 10 events. From the submit, a delivery's time holds the task's own run, whose"
        " worker batching window (1 s) may or may not have to run out; from the task's end"
        " (completed_at, as the event carries it) it is the relay and the delivery alone"
    )
