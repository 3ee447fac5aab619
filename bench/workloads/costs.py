"""AWS calls and cost per task (section cost): the calls, Lambda time and DynamoDB write units a
task costs, plain, with an Idempotency-Key and with a webhook, at list prices.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from drive import open_loop, outcomes
from figures import Report, verdict
from harness import COST_CLIENTS, PRICES, charged_to_tasks, lambda_reports, settled_calls, stack_running
from llmtasks_local.emulator.launcher import LaunchedStack
from llmtasks_local.sam.provision import local_name

DYNAMODB_READS = {"GetItem", "Query"}


class Receiver:
    """A webhook receiver on 127.0.0.1 that answers 204 and counts deliveries."""

    def __init__(self) -> None:
        self.count = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.count += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@dataclass
class Cost:
    calls: dict[str, float]  # per task
    lambda_usage: dict[str, tuple[float, float]]  # per task: invocations, GB-s
    writes: dict[str, dict[str, float]]  # per task: DynamoDB `items` written and their `units`, by table

    @property
    def api_calls(self) -> float:
        return sum(v for k, v in self.calls.items() if charged_to_tasks(k))

    def table_writes(self, logical_id: str, what: str = "items") -> float:
        return self.writes.get(what, {}).get(local_name(logical_id), 0.0)

    def per_million(self, http_requests: float) -> dict[str, float]:
        """USD per million tasks, by what is billed. DynamoDB's writes are the write units the
        endpoint counted item by item (a unit a KB of each item written, twice in a transaction).
        The listing index (by_tenant_with_status) holds the keys and the status, so a task's
        three status writes (created, claimed, completed) each write an entry; by_tenant, kept
        one release, holds keys only (its creation): four more write units per task. Reads count
        a unit each (items under 4 KB), eventually consistent at half."""
        units = sum(self.writes.get("units", {}).values())
        reads = sum(v for k, v in self.calls.items() if k.split(".")[1] in DYNAMODB_READS)
        sqs = sum(v for k, v in self.calls.items() if k.startswith("sqs.") and not k.endswith(".empty"))
        invocations = sum(i for i, _ in self.lambda_usage.values())
        gb_s = sum(g for _, g in self.lambda_usage.values())
        return {
            "Lambda requests": invocations * PRICES["lambda_request"] * 1e6,
            "Lambda GB-s": gb_s * PRICES["lambda_gb_s"] * 1e6,
            "HTTP API requests": http_requests * PRICES["http_api_request"] * 1e6,
            "SQS requests": sqs * PRICES["sqs_request"] * 1e6,
            "DynamoDB writes (+4 index entries per task)": (units + 4) * PRICES["dynamodb_wru"] * 1e6,
            "DynamoDB reads": reads * 0.5 * PRICES["dynamodb_rru"] * 1e6,
        }


def measure_cost(
    stack: LaunchedStack,
    tasks: int,
    body: Callable[[int], dict[str, Any]],
    headers: Callable[[int], dict[str, str]] = lambda _i: {},
) -> Cost:
    """The calls and Lambda time of `tasks` tasks, counted while nothing reads their status."""
    settled_calls(stack)
    stack.aws_calls(reset=True)
    log_mark = len(stack.log.read_text())
    # Four clients: sixteen would make each invocation wait for the machine's two cores, and
    # the billed durations would measure this machine rather than the code.
    submitted = open_loop(stack, tasks, body, headers, clients=COST_CLIENTS)
    while stack.mock_stats()["calls"] < tasks:
        time.sleep(0.2)
    calls = settled_calls(stack)
    writes = stack.aws_writes()
    usage = lambda_reports(stack.log.read_text()[log_mark:])
    done = outcomes(stack, submitted)  # read after the count: status polls are not the task's cost
    if any(d.task["status"] != "completed" for d in done):
        raise RuntimeError("a task of the cost run did not complete")
    return Cost(
        calls={k: v / tasks for k, v in calls.items()},
        lambda_usage={k: (n / tasks, gb_s / tasks) for k, (n, gb_s) in usage.items()},
        writes={what: {table: n / tasks for table, n in counts.items()} for what, counts in writes.items()},
    )


def webhook_floor_usd(plain: Cost, hooked: Cost) -> float:
    """Per million tasks: the plain task and what one delivery cannot do without, at list prices:
    the relay's send, a receive and a delete (each its own request: the floor of no batching),
    the reads of the task and of its tenant's signing secrets, and three writes (the outcome on
    the task, the endpoint place's take and release), with the functions' time as measured."""
    lambda_usd = sum(
        v for k, v in hooked.per_million(http_requests=1).items() if k.startswith("Lambda")
    ) - sum(v for k, v in plain.per_million(http_requests=1).items() if k.startswith("Lambda"))
    delivery = (
        3 * PRICES["sqs_request"] + 2 * 0.5 * PRICES["dynamodb_rru"] + 3 * PRICES["dynamodb_wru"]
    ) * 1e6
    return sum(plain.per_million(http_requests=1).values()) + delivery + lambda_usd


def costs(report: Report, tasks: int) -> None:
    receiver = Receiver()
    try:
        with stack_running() as stack:
            plain = measure_cost(stack, tasks, lambda i: {"prompt": f"cost {i} {uuid.uuid4().hex}"})
            stack.configure_mock()
            keyed = measure_cost(
                stack,
                tasks,
                lambda i: {"prompt": f"keyed {i} {uuid.uuid4().hex}"},
                lambda _i: {"Idempotency-Key": uuid.uuid4().hex},
            )
            stack.configure_mock()
            hooked = measure_cost(
                stack,
                tasks,
                lambda i: {"prompt": f"hooked {i} {uuid.uuid4().hex}", "webhook_url": receiver.url},
            )
            if receiver.count < tasks:
                raise RuntimeError(f"{receiver.count} webhooks of {tasks} arrived")
    finally:
        receiver.close()
    section = "AWS calls"
    report.add(
        section,
        "per task, success path (no key, no webhook)",
        f"{plain.api_calls:.2f}",
        f"target <= 5: {verdict(plain.api_calls <= 5)}",
    )
    for operation, count in sorted(plain.calls.items()):
        report.add(section, f"  {operation}", f"{count:.2f}")
    for added_by, cost in (("an Idempotency-Key", keyed), ("a webhook", hooked)):
        report.add(section, f"added by {added_by}", f"+{cost.api_calls - plain.api_calls:.2f}")
        for operation in sorted(set(cost.calls) | set(plain.calls)):
            extra = cost.calls.get(operation, 0) - plain.calls.get(operation, 0)
            if abs(extra) >= 0.01 and not operation.endswith(".empty"):
                report.add(section, f"  {operation}", f"{extra:+.2f}")
    places = hooked.table_writes("LimitsTable") - plain.table_writes("LimitsTable")
    report.add(
        section,
        "  of them LimitsTable writes, a delivery (its endpoint's places)",
        f"{places:.2f}",
        f"target <= 3: {verdict(places <= 3)}",
    )
    for name, (invocations, gb_s) in sorted(plain.lambda_usage.items()):
        report.add(section, f"  Lambda {name}: invocations, GB-s per task", f"{invocations:.2f}, {gb_s:.4f}")
    section = "cost"
    for label, cost in (("plain", plain), ("with key", keyed), ("with webhook", hooked)):
        parts = cost.per_million(http_requests=1)
        if label == "plain":
            for part, usd in parts.items():
                report.add(section, f"  {part}", f"${usd:.2f}")
        report.add(section, f"per million tasks, {label}", f"${sum(parts.values()):.2f}")
    floor = webhook_floor_usd(plain, hooked)
    ratio = sum(hooked.per_million(http_requests=1).values()) / floor
    report.add(
        section,
        "  with webhook against plain + one delivery's own calls",
        f"${floor:.2f}",
        f"ratio {ratio:.2f}, target <= 1.3: {verdict(ratio <= 1.3)}",
    )
    report.note(
        "Prices (USD, us-east-1 list, on demand): "
        + ", ".join(f"{k} {v:.3g}" for k, v in PRICES.items())
        + ". Lambda on arm64 at the template's MemorySize with the measured billed durations; the"
        " LLM call is in the worker's duration (a zero-latency mock here: a real call bills its whole"
        " wait). Empty receives of idle pollers and Lambda's stream reads are not charged to tasks."
        " DynamoDB writes are the write units of the items written (a unit a KB, twice in a"
        " transaction), counted by the endpoint."
    )
