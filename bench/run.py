"""The llmtasks benchmark: overhead against the boto3 floor, scale, goodput under a provider rate
limit, AWS calls and cost per task, durable state, key limits, the seed's Celery design side by
side, call slots kept busy on long calls, scheduling between tenants, and cold-start import time.

Run from the project root: `make bench` (or `.venv/bin/python bench/run.py`). It starts its own
local stacks (`llmtasks up` on free ports, 127.0.0.1 only), prints each figure with its ratio and
target, and writes the table to bench/RESULTS.md. Figures, not assertions: these machines are
shared and noisy, so targets are ratios measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import boto3
import httpx
from baseline import running_baseline  # bench/ is on sys.path: this file runs as a script
from handlers_in_process import FUNCTIONS

from llmtasks.aws.dynamo import serialize
from llmtasks.domain.models import LLMRequest, Task, TaskStatus
from llmtasks_local.emulator.launcher import LaunchedStack, descendants, launch, peak_rss_kib
from llmtasks_local.emulator.processes import cpu_seconds, status_kib
from llmtasks_local.sam.provision import local_name
from llmtasks_local.sam.template import Template

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = 16
COST_CLIENTS = 4
WARM_UP_TASKS = 300
FLOOR_TASKS = 300  # the handlers' floor (handlers_in_process): tasks run through them in-process
TERMINAL = {"completed", "failed", "cancelled"}

# Public on-demand list prices, us-east-1, as of 2026 (USD). Lambda on arm64, as the template runs.
PRICES = {
    "lambda_gb_s": 0.0000133334,
    "lambda_request": 0.20 / 1e6,
    "http_api_request": 1.00 / 1e6,
    "sqs_request": 0.40 / 1e6,
    "dynamodb_wru": 0.625 / 1e6,
    "dynamodb_rru": 0.125 / 1e6,
}
DYNAMODB_READS = {"GetItem", "Query"}
SECTIONS = (
    "cli",
    "loop",
    "cold",
    "sandboxes",
    "overhead",
    "scale",
    "paced",
    "cost",
    "state",
    "limits",
    "budgets",
    "celery",
    "cpu",
    "slots",
    "scheduling",
    "webhooks",
    "streaming",
    "batch_files",
    "batch_output",
    "queues",
    "listing",
    "progress",
)


@dataclass
class Report:
    """Rows of (section, figure, value, ratio or target), printed as they come."""

    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, figure: str, value: str, versus: str = "") -> None:
        self.rows.append((section, figure, value, versus))
        print(f"  {section:<18} {figure:<52} {value:>14}  {versus}", flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"  note: {text}", flush=True)

    def markdown(self, title: str) -> str:
        lines = [f"# {title}", "", "| section | figure | value | ratio / target |", "|---|---|---:|---|"]
        lines += [f"| {s} | {f} | {v} | {r} |" for s, f, v, r in self.rows]
        if self.notes:
            lines += ["", *(f"- {n}" for n in self.notes)]
        return "\n".join(lines) + "\n"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# --- the floor: the AWS calls one task needs, made directly --------------------------------------


def boto3_floor(endpoint: str, tasks: int) -> list[float]:
    """Per task: put, send, receive, claim, complete, delete, in sequence on one client."""
    session = boto3.session.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    dynamodb = session.client("dynamodb", endpoint_url=endpoint)
    sqs = session.client("sqs", endpoint_url=endpoint)
    table = f"bench-floor-{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    queue = sqs.create_queue(QueueName=table)["QueueUrl"]
    durations = []
    for i in range(tasks):
        key = {"pk": {"S": f"task#{i}"}}
        started = time.perf_counter()
        dynamodb.put_item(
            TableName=table,
            Item={**key, "status": {"S": "pending"}, "prompt": {"S": f"bench {i}"}},
            ConditionExpression="attribute_not_exists(pk)",
        )
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"task_id": str(i)}))
        message = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"][
            0
        ]
        dynamodb.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET #s = :processing",
            ConditionExpression="#s = :pending",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":processing": {"S": "processing"}, ":pending": {"S": "pending"}},
            ReturnValues="ALL_NEW",
        )
        dynamodb.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET #s = :completed, #r = :result",
            ConditionExpression="#s = :processing",
            ExpressionAttributeNames={"#s": "status", "#r": "result"},
            ExpressionAttributeValues={
                ":completed": {"S": "completed"},
                ":processing": {"S": "processing"},
                ":result": {"S": "answer"},
            },
        )
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
        durations.append(time.perf_counter() - started)
    return durations


# --- driving the stack over HTTP ------------------------------------------------------------------


@dataclass
class Done:
    submitted_at: float  # epoch s, taken by the client just before its POST
    task: dict[str, Any]

    @property
    def completed_at(self) -> float:
        """When the task reached its terminal state, by the stack's clock (this machine's); a
        task read as terminal without that time (none should be) counts as ending when read."""
        stamp = self.task.get("completed_at")
        return datetime.fromisoformat(stamp).timestamp() if stamp else time.time()


class Target(Protocol):
    """What the bench's clients drive: the local stack, or the Celery baseline (bench/baseline.py)."""

    def client(self, api_key: str | None = None, **options: Any) -> httpx.Client: ...


def run_clients(
    count: int,
    work: Callable[[int, httpx.Client], None],
    stack: Target,
    clients: int = CLIENTS,
    api_key: str | None = None,
) -> None:
    """`work(i, client)` for i in range(count), spread over `clients` threads with a client each
    (of `api_key`, else the stack's development key)."""
    next_index = iter(range(count))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            with stack.client(api_key, timeout=60) as client:
                while not errors:
                    with lock:
                        i = next(next_index, None)
                    if i is None:
                        return
                    work(i, client)
        except BaseException as exc:  # the first failure stops every client and is raised
            errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def submit(client: httpx.Client, body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    reply = client.post("/tasks", json=body, headers=headers or {})
    if reply.status_code != 202:
        raise RuntimeError(f"submit answered {reply.status_code}: {reply.text}")
    return str(reply.json()["task_id"])


def wait_done(client: httpx.Client, task_id: str) -> dict[str, Any]:
    while True:
        reply = client.get(f"/tasks/{task_id}", params={"wait": 20})
        reply.raise_for_status()
        task: dict[str, Any] = reply.json()
        if task["status"] in TERMINAL:
            return task


def closed_loop(stack: LaunchedStack, tasks: int, clients: int = CLIENTS) -> list[Done]:
    """Each client submits a task, waits for its outcome, and submits the next."""
    done: list[Done] = []

    def one(i: int, client: httpx.Client) -> None:
        submitted_at = time.time()
        task_id = submit(client, {"prompt": f"bench {i} {uuid.uuid4().hex}"})
        done.append(Done(submitted_at, wait_done(client, task_id)))

    run_clients(tasks, one, stack, clients)
    return done


def open_loop(
    stack: Target,
    tasks: int,
    body: Callable[[int], dict[str, Any]],
    headers: Callable[[int], dict[str, str]],
    clients: int = CLIENTS,
) -> list[tuple[float, str]]:
    """All tasks submitted as fast as `clients` clients can; (submitted_at, task_id) of each."""
    submitted: list[tuple[float, str]] = []

    def one(i: int, client: httpx.Client) -> None:
        submitted_at = time.time()
        submitted.append((submitted_at, submit(client, body(i), headers(i))))

    run_clients(tasks, one, stack, clients)
    return submitted


def outcomes(stack: Target, submitted: list[tuple[float, str]]) -> list[Done]:
    """Each submitted task once it ended, in the order of `submitted` (whichever ended first)."""
    done: list[Done | None] = [None] * len(submitted)

    def one(i: int, client: httpx.Client) -> None:
        submitted_at, task_id = submitted[i]
        done[i] = Done(submitted_at, wait_done(client, task_id))

    run_clients(len(submitted), one, stack)
    return [d for d in done if d is not None]


def resident_kib(pid: int) -> int:
    return status_kib(pid, "VmRSS") or 0


def stack_parts(stack: LaunchedStack) -> dict[str, list[int]]:
    """The stack's processes by part: `llmtasks up` itself (the HTTP gateway, the pollers), the
    functions' sandboxes (a process each), moto and the mock LLM."""
    pid = stack.process.pid
    parts: dict[str, list[int]] = {"stack": [pid], "sandboxes": [], "moto": [], "mock LLM": []}
    # Every thread's children: the sandboxes are started from a thread of their own.
    for child in descendants(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile
        if "sandbox_main" in command or "sandbox_forks" in command:  # spawned, or forked (and their server)
            parts["sandboxes"].append(int(child))
        else:
            parts["moto" if "moto_server" in command else "mock LLM"].append(int(child))
    return parts


def stack_cpu(stack: LaunchedStack) -> dict[str, float]:
    """CPU seconds by part so far (the sandboxes that ended too: the stack waits for them)."""
    parts = stack_parts(stack)
    cpu = {part: sum(cpu_seconds(pid) for pid in pids) for part, pids in parts.items()}
    cpu["sandboxes"] += cpu_seconds(stack.process.pid, reaped_children=True)
    return cpu


def pids_cpu(pids: dict[str, int]) -> Callable[[], dict[str, float]]:
    return lambda: {name: cpu_seconds(pid) for name, pid in pids.items()}


@contextmanager
def stack_running(*extra: str, env: dict[str, str] | None = None) -> Iterator[LaunchedStack]:
    """A fresh stack, warmed up: every sandbox the clients will use has had its cold start,
    which is Lambda's cost, not the application's, and would otherwise land in the first figures.
    The warm-up is a burst of the measured kind (WARM_UP_TASKS from 16 clients, then their
    outcomes): under that load each invocation takes longer and the functions scale out further
    than under a lighter one. (With 64 tasks, a 600-task burst still started eleven submit and
    seven worker sandboxes, whose imports were a third of the sandboxes' CPU it measured.)"""
    stack = launch("--report", *extra, env=env, cwd=ROOT)
    try:
        outcomes(stack, open_loop(stack, WARM_UP_TASKS, lambda i: {"prompt": f"warm-up {i}"}, lambda _i: {}))
        stack.configure_mock()
        yield stack
    finally:
        stack.stop()


@contextmanager
def stack_as_make_up_starts_it() -> Iterator[LaunchedStack]:
    """A fresh stack as a user starts it (make up: one warm sandbox a function, no more): a
    workload's first wave pays the functions' scale-out, a cold start a sandbox."""
    stack = launch("--report", "--warm-containers", "eager", cwd=ROOT)
    try:
        yield stack
    finally:
        stack.stop()


# --- overhead and scale ---------------------------------------------------------------------------


def overhead(
    report: Report,
    tasks: int,
    floor_p50: float | None,
    *,
    window_s: int | None = None,
    stored_first: int = 0,
    clients: int = CLIENTS,
) -> float:
    """Closed-loop overhead of `tasks` tasks; `window_s` overrides the worker's batching window
    (the template's default otherwise). With `stored_first`, TasksTable holds that many more
    tasks of the same tenant before the timed ones run: whatever in the path grew with the
    number of stored tasks would show in the timed figures."""
    overrides = (
        () if window_s is None else ("--parameter-overrides", f"WorkerBatchingWindowSeconds={window_s}")
    )
    with stack_running(*overrides) as stack:
        if stored_first:
            store_completed_tasks(stack, stored_first)
        cpu_before = stack_cpu(stack)
        started = time.time()
        done = closed_loop(stack, tasks, clients)
        wall = max(d.completed_at for d in done) - started
        cpu = {name: seconds - cpu_before[name] for name, seconds in stack_cpu(stack).items()}
        parts = stack_parts(stack)
        rss = {name: sum(peak_rss_kib(pid) for pid in pids) for name, pids in parts.items()}
    failed = [d for d in done if d.task["status"] != "completed"]
    if failed:
        reasons = Counter(f"{d.task['status']}/{d.task.get('error_code')}" for d in failed)
        report.note(f"{tasks + stored_first} tasks, window {window_s}: not completed: {dict(reasons)}")
    # The mock answers at once (latency 0), so the LLM's share is its HTTP round trip, counted here.
    per_task = [d.completed_at - d.submitted_at for d in done if d.task["status"] == "completed"]
    window = "default" if window_s is None else f"{window_s} s"
    section = f"{tasks + stored_first}, window {window}" + (f", {clients} client" if clients == 1 else "")
    if stored_first:
        report.note(f"{section}: {tasks} tasks timed with {stored_first} more already stored in TasksTable")
    p50 = percentile(per_task, 0.5)
    ratio = (
        f"{p50 / floor_p50:.2f}x floor (target <= 2x): {verdict(p50 <= 2 * floor_p50)}" if floor_p50 else ""
    )
    report.add(section, "overhead p50 (completed - submitted)", ms(p50), ratio)
    report.add(section, "overhead p95", ms(percentile(per_task, 0.95)))
    report.add(section, "overhead p99", ms(percentile(per_task, 0.99)))
    report.add(section, f"throughput ({clients} clients, closed loop)", f"{tasks / wall:.1f} tasks/s")
    report.add(section, "tasks not completed", str(len(failed)))
    for part, seconds in cpu.items():
        report.add(section, f"CPU per task, {part}", ms(seconds / tasks))
    for part, kib in rss.items():
        label = f"peak RSS, {part}" + (f" ({len(parts[part])}, summed)" if part == "sandboxes" else "")
        report.add(section, label, f"{kib / 1024:.0f} MiB")
    return p50


def store_completed_tasks(stack: LaunchedStack, count: int) -> None:
    """`count` completed tasks of the dev tenant, written straight to TasksTable as the worker
    leaves them (25 to a BatchWriteItem): through the API they would take minutes here."""
    dynamodb = moto_session().client("dynamodb", endpoint_url=stack.endpoint)
    table = next(t for t in dynamodb.list_tables()["TableNames"] if "TasksTable" in t)
    now = time.time()
    tasks = (
        Task(
            task_id=uuid.uuid4().hex,
            tenant_id="dev",
            status=TaskStatus.COMPLETED,
            request=LLMRequest(prompt=f"stored {i}"),
            created_at=now - 1,
            started_at=now - 0.5,
            completed_at=now,
            expires_at=int(now + 86400),
            attempts=1,
            result=f"stored answer {i}",
        )
        for i in range(count)
    )
    items: list[Any] = [
        {"PutRequest": {"Item": serialize({"pk": f"task#{t.task_id}", **t.model_dump(exclude_none=True)})}}
        for t in tasks
    ]
    for start in range(0, count, 25):
        dynamodb.batch_write_item(RequestItems={table: items[start : start + 25]})


def moto_session() -> boto3.session.Session:
    return boto3.session.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


# --- durable local state -------------------------------------------------------------------------


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


# --- AWS calls and cost per task ------------------------------------------------------------------


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


def charged_to_tasks(operation: str) -> bool:
    """Not an idle poller's empty receive, nor a stream read Lambda makes for its trigger (free)."""
    return not operation.endswith(".empty") and not operation.startswith("dynamodbstreams")


def settled_calls(stack: LaunchedStack, quiet_s: float = 2.0, limit_s: float = 120) -> dict[str, int]:
    """The call count once nothing but idle polling has changed it for `quiet_s`."""

    def busy(calls: dict[str, int]) -> dict[str, int]:
        return {k: v for k, v in calls.items() if charged_to_tasks(k)}

    last, since = busy(stack.aws_calls()), time.monotonic()
    give_up = time.monotonic() + limit_s
    while time.monotonic() - since < quiet_s and time.monotonic() < give_up:
        time.sleep(0.25)
        now = busy(stack.aws_calls())
        if now != last:
            last, since = now, time.monotonic()
    return stack.aws_calls()


def lambda_reports(log: str) -> dict[str, tuple[int, float]]:
    """Per function: invocations and GB-s, from the REPORT lines in `log`."""
    totals: dict[str, tuple[int, float]] = {}
    for name, billed, memory in re.findall(
        r"Function: (\w+)\tDuration: [\d.]+ ms\tBilled Duration: (\d+) ms\tMemory Size: (\d+) MB", log
    ):
        count, gb_s = totals.get(name, (0, 0.0))
        totals[name] = (count + 1, gb_s + int(billed) / 1000 * int(memory) / 1024)
    return totals


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


# --- goodput under a rate limit -------------------------------------------------------------------


def worker_slots() -> tuple[int, int]:
    """The worker's MaximumConcurrency and its call slots per invocation, as template.yaml sets
    them (WorkerCallSlots; BatchSize where that is 0)."""
    template = Template.load(ROOT / "template.yaml")
    events = template.body["Resources"]["WorkerFunction"]["Properties"]["Events"]
    source = next(e["Properties"] for e in events.values() if e["Type"] == "SQS")
    concurrency = template.resolve(source["ScalingConfig"]["MaximumConcurrency"], {}, {})
    per_invocation = int(template.body["Parameters"]["WorkerCallSlots"]["Default"]) or int(
        source["BatchSize"]
    )
    return int(concurrency), per_invocation


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


# --- cold start -----------------------------------------------------------------------------------


# What the Lambda runtime sets and libraries read at import (the X-Ray SDK skips its sampling
# clients inside Lambda, where Lambda samples).
LAMBDA_ENVIRONMENT = {
    "LAMBDA_TASK_ROOT": str(ROOT),
    "AWS_LAMBDA_FUNCTION_NAME": "bench",
    "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",  # Lambda sets both; botocore reads this one
    "PYTHONDONTWRITEBYTECODE": "1",
}


def key_limits(report: Report, submits: int) -> None:
    """Per-key limits: what counting them adds to a submit, and whether one key's flood slows
    another key's submits. Key B submits `submits` tasks at 4 a second (under its limit), alone
    and then while key A (same limit) floods GET /tasks from 4 threads and is refused with 429s."""
    section = "limits"

    def paced_submits(stack: LaunchedStack, key: str) -> list[float]:
        seconds = []
        with stack.client(key) as client:
            for i in range(submits):
                started = time.monotonic()
                submit(client, {"prompt": f"limits {i} {uuid.uuid4().hex}"})
                seconds.append(time.monotonic() - started)
                time.sleep(max(0.0, 0.25 - seconds[-1]))
        return seconds

    with stack_running() as stack:
        unlimited = stack.cli("keys", "create", "--tenant", "free").strip()
        flooder = stack.cli(
            "keys", "create", "--tenant", "flood", "--rps", "10", "--max-in-flight", "100"
        ).strip()
        quiet = stack.cli(
            "keys", "create", "--tenant", "quiet", "--rps", "10", "--max-in-flight", "100"
        ).strip()
        free = paced_submits(stack, unlimited)
        alone = paced_submits(stack, quiet)
        statuses: Counter[int] = Counter()
        stop = threading.Event()

        def flood() -> None:
            with stack.client(flooder) as client:
                while not stop.is_set():
                    statuses[client.get("/tasks").status_code] += 1

        threads = [threading.Thread(target=flood) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            flooded = paced_submits(stack, quiet)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    p50 = percentile(free, 0.5)
    report.add(section, f"submit p50, a key without limits ({submits} at 4/s)", ms(p50))
    report.add(
        section,
        "submit p50, a key with rps and max-in-flight",
        ms(percentile(alone, 0.5)),
        f"{percentile(alone, 0.5) / p50:.2f}x",
    )
    report.add(
        section,
        "the same key's submit p50 while another key floods",
        ms(percentile(flooded, 0.5)),
        f"{percentile(flooded, 0.5) / percentile(alone, 0.5):.2f}x alone",
    )
    report.add(
        section, "the same, p95", ms(percentile(flooded, 0.95)), f"alone {ms(percentile(alone, 0.95))}"
    )
    refused = statuses[429] / max(1, sum(statuses.values()))
    report.add(
        section,
        "the flooding key: requests answered / refused (429)",
        f"{statuses[200]} / {statuses[429]}",
        f"{refused:.0%} refused",
    )
    report.note(
        "limits: every key's submits are counted in LimitsTable (one conditional write a request, two"
        " with max-in-flight); a flood is refused by the function, so on this 2-core machine its"
        " requests share the CPU with the other key's: in AWS each runs in its own sandbox"
    )


def budgets(report: Report, submits: int, flood: int) -> None:
    """Issue 41's figures: what reserving under a key's budget adds to a submit (the same run,
    budget on against off, alternating), and `flood` submits from 50 clients at once against a
    month's budget that fits exactly 300 of them: how many are accepted, and the spend reserved."""
    from llmtasks.domain.models import LLMRequest
    from llmtasks.settings import default_price_table

    section = "budgets"
    prompt = "budget {:06d}"  # every prompt the same length: every task the same most cost
    most = default_price_table().most_cost(LLMRequest(prompt=prompt.format(0)), "gpt-4o-mini")
    fits = 300
    with stack_running() as stack:
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 0})
        free = stack.cli("keys", "create", "--tenant", "free").strip()
        roomy = stack.cli("keys", "create", "--tenant", "budgeted", "--budget-usd-month", "1000000").strip()
        tight = stack.cli(
            "keys", "create", "--tenant", "tight", "--budget-usd-month", str(most * fits)
        ).strip()
        off: list[float] = []
        on: list[float] = []
        with stack.client(free) as without, stack.client(roomy) as within:
            for i in range(submits):
                for client, seconds in ((without, off), (within, on)):
                    started = time.monotonic()
                    submit(client, {"prompt": prompt.format(i)})
                    seconds.append(time.monotonic() - started)
        statuses: Counter[int] = Counter()
        lock = threading.Lock()

        def one(i: int, client: httpx.Client) -> None:
            code = client.post("/tasks", json={"prompt": prompt.format(i)}).status_code
            with lock:
                statuses[code] += 1

        # Calls that outlast the flood: no task ends, so no reservation is settled meanwhile and
        # exactly the tasks whose most cost fits are accepted
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 300})
        started = time.monotonic()
        run_clients(flood, one, stack, clients=50, api_key=tight)
        flood_s = time.monotonic() - started
    ratio = percentile(on, 0.5) / percentile(off, 0.5)
    report.add(
        section, f"submit p50, no budget ({submits}, alternating with the next)", ms(percentile(off, 0.5))
    )
    report.add(
        section,
        "submit p50, a key with a month's budget",
        ms(percentile(on, 0.5)),
        f"ratio {ratio:.2f}, target <= 1.2: {verdict(ratio <= 1.2)}",
    )
    report.add(section, "  p95, without / with", f"{ms(percentile(off, 0.95))} / {ms(percentile(on, 0.95))}")
    accepted = statuses[202]
    report.add(
        section,
        f"{flood} submits from 50 clients at once, a budget that fits {fits}: accepted / refused (429)",
        f"{accepted} / {statuses[429]}",
        f"exact: {verdict(accepted == fits and statuses[429] == flood - fits)}",
    )
    report.add(
        section,
        "  spend reserved / budget (USD)",
        f"{most * accepted} / {most * fits}",
        f"never over: {verdict(most * accepted <= most * fits)}",
    )
    report.add(section, "  the flood took", f"{flood_s:.1f} s")
    report.note(
        f"budgets: a task of a {len(prompt.format(0))}-byte prompt and no max_tokens reserves {most} USD"
        " (the prompt a token a byte plus the chat format's, and gpt-4o-mini's 16,384 output tokens);"
        " a refusal past the budget reads the key's in-flight reservations' tasks once to settle"
        " those that ended, so the refused submits cost more than the accepted ones"
    )


def burst(target: Target, tasks: int, clients: int = CLIENTS) -> dict[str, float]:
    """`tasks` submits from `clients` clients as fast as they go (open loop, the LLM answering at
    once): submits a second (until the last submit's reply), a submit's p95, and tasks completed
    a second from the first submit."""
    timed: list[tuple[float, float, str]] = []  # (sent at, took, task id), one append a submit
    started = time.time()

    def one(i: int, client: httpx.Client) -> None:
        at = time.time()
        task_id = submit(client, {"prompt": f"burst {i} {uuid.uuid4().hex}"})
        timed.append((at, time.time() - at, task_id))

    run_clients(tasks, one, target, clients)
    submitting_s = max(at + took for at, took, _ in timed) - started
    seconds = [took for _, took, _ in timed]
    submitted = [(at, task_id) for at, _, task_id in timed]
    done = outcomes(target, submitted)
    return {
        "submits_s": tasks / submitting_s,
        "submit_p95": percentile(seconds, 0.95),
        "completed_s": tasks / (max(d.completed_at for d in done) - started),
        "not_completed": sum(d.task["status"] != "completed" for d in done),
    }


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


# --- where a task's CPU goes, each part beside its floor (issue 38) -----------------------------


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


# --- call slots kept busy (issue 21) --------------------------------------------------------------

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
PLAIN_MOCK: dict[str, Any] = {
    "latency_s": 0.0,
    "latency_sigma": 0.0,
    "latency_min_s": 0.0,
    "latency_max_s": None,
    "seed": 21,
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


# --- scheduling: priority and fairness between tenants --------------------------------------------


@dataclass
class AsTenant:
    """The stack as one tenant's clients reach it: with that tenant's API key."""

    stack: LaunchedStack
    key: str

    def client(self, api_key: str | None = None, **options: Any) -> httpx.Client:
        return self.stack.client(self.key, **options)


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


# --- webhooks: one endpoint that hangs beside a healthy one -----------------------------------


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


# --- streaming: output deltas ----------------------------------------------------------------------


@dataclass
class Following:
    """What one design of waiting reader measured over its tasks."""

    lags_s: list[float]  # each chunk: from its write to the reply that carried it (output readers)
    task_reads: int  # GetItem calls of the readers, less the worker's own
    minutes: float  # reader-minutes of waiting
    batch_gets: int = 0


def follow_output(stack: LaunchedStack, task_id: str, lags: list[float]) -> None:
    after = 0
    with stack.client() as client:
        while True:
            page = client.get(f"/tasks/{task_id}/output", params={"after": after, "wait": 20}).json()
            now = time.time()
            lags += [now - datetime.fromisoformat(c["written_at"]).timestamp() for c in page["chunks"]]
            after = page["after"]
            if page["final"]:
                return


def poll_task(stack: LaunchedStack, task_id: str) -> None:
    with stack.client() as client:
        while client.get(f"/tasks/{task_id}", params={"wait": 20}).json()["status"] not in TERMINAL:
            pass


def waiting_readers(
    stack: LaunchedStack, readers: int, prompt: str, read: Callable[[LaunchedStack, str, list[float]], None]
) -> Following:
    """`readers` tasks submitted at once, each followed by a reader of its own to its end."""
    settled_calls(stack)
    stack.aws_calls(reset=True)
    with stack.client() as client:
        ids = [submit(client, {"prompt": f"{prompt} {i} {uuid.uuid4().hex}"}) for i in range(readers)]
    lags: list[float] = []
    started = time.monotonic()
    threads = [threading.Thread(target=read, args=(stack, task_id, lags)) for task_id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    minutes = readers * (time.monotonic() - started) / 60
    calls = stack.aws_calls()
    # The worker reads each task's output head once, at its first chunk; the rest are readers'.
    return Following(
        lags, calls.get("dynamodb.GetItem", 0) - readers, minutes, calls.get("dynamodb.BatchGetItem", 0)
    )


def streaming(report: Report, quick: bool) -> None:
    """Issue 42's figures: how soon a reader waiting on GET /tasks/{id}/output gets a chunk after
    it is written, and what a waiting reader costs in DynamoDB read units a minute, against
    polling the task with GET /tasks/{id}?wait= (same stack, same tasks' shape, same run)."""
    # Ten at once: twenty streams and their readers on two cores measured the machine (a p95 of
    # 0.69 s, each stream's progress writes 5 s apart instead of 2).
    readers, call_s = (5, 12) if quick else (10, 40)
    prompt = "p" * 6000  # a long prompt: the task item a ?wait= poll reads is its size
    with stack_running() as stack:
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": call_s, "reply_chars": 4000})
        chunks = waiting_readers(stack, readers, prompt, follow_output)
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": call_s, "reply_chars": 4000})
        polls = waiting_readers(stack, readers, prompt, lambda st, task_id, _lags: poll_task(st, task_id))
    section = "streaming"
    lags = sorted(chunks.lags_s)
    p95 = percentile(lags, 0.95)
    report.add(
        section,
        f"a chunk's write to a waiting reader's reply, p50 ({len(lags)} chunks, {readers} readers)",
        ms(percentile(lags, 0.5)),
    )
    report.add(section, "  p95", ms(p95), f"target < 500 ms: {verdict(p95 < 0.5)}")
    # Read units: a head read is eventually consistent and under 4 KB (half a unit); a task read
    # is consistent, a unit per 4 KB of the item (the 6 KB prompt, up to 4 KB of text: 3 units);
    # a chunk is read consistently once (a unit). Of the output readers' GetItems, three per task
    # read the task itself (at its first read while pending, and twice at its end).
    task_units = math.ceil((len(prompt) + 4000 + 1000) / 4096)
    task_reads = 3 * readers
    output_units = (chunks.task_reads - task_reads) * 0.5 + task_reads * task_units + len(lags)
    poll_units = polls.task_reads * task_units
    per_minute = output_units / chunks.minutes
    poll_per_minute = poll_units / polls.minutes
    report.add(
        section, "read units a waiting reader costs a minute: GET /tasks/{id}/output", f"{per_minute:.0f}"
    )
    report.add(
        section,
        "  polling GET /tasks/{id}?wait=20 instead",
        f"{poll_per_minute:.0f}",
        f"ratio {per_minute / poll_per_minute:.2f}",
    )
    report.note(
        f"streaming: {readers} tasks of a {call_s} s streamed call (4,000 characters, written at most"
        f" every 2 s as the mock's pieces come) and a 6 KB prompt, each followed by one reader to its"
        f" end; the read units are computed from the GetItem calls counted by the local endpoint"
        f" ({chunks.task_reads} for the output readers, {polls.task_reads} for the pollers) at"
        f" {task_units} units a task read, half a unit a head read, a unit a chunk"
    )


def progress_writes(report: Report, quick: bool) -> None:
    """Issue 66's figure: what one long streamed answer writes to TasksTable, from its submit to
    its end (the task, its output's chunks and head), against the answer's own size: the items'
    bytes and the write units DynamoDB bills for them, each write counted by the endpoint; and the
    same answer to a prompt as long as it (an update is billed by its item's whole size)."""
    chars, call_s = (20_000, 6) if quick else (100_000, 20)
    section = "progress"
    table = local_name("TasksTable")
    for prompt, label in (
        ("one long answer", "a short prompt"),
        ("x " * (chars // 2), f"a {chars:,}-character prompt"),
    ):
        with stack_running() as stack:
            # Words of 100 characters, the call's time spread over them: the worker's progress
            # writes (every 2 s) each find about a tenth of the answer more.
            stack.configure_mock(
                **{**PLAIN_MOCK, "latency_s": call_s, "reply_chars": chars, "pad_word_chars": 100}
            )
            settled_calls(stack)
            stack.aws_calls(reset=True)
            with stack.client() as client:
                task_id = submit(client, {"prompt": prompt})
                task = wait_done(client, task_id)
            settled_calls(stack)
            writes = stack.aws_writes()
        if task["status"] != "completed" or len(task["result"]) != chars:
            raise RuntimeError(f"the long answer did not complete whole: {task['status']}")
        written, units, items = (writes[what].get(table, 0) for what in ("bytes", "units", "items"))
        if prompt == "one long answer":
            ratio = written / chars
            report.add(
                section,
                f"one {chars:,}-character answer over {call_s} s, {label}: bytes written to TasksTable",
                f"{written / 1000:.0f} KB",
                f"{ratio:.2f}x the answer (target <= 2x): {verdict(ratio <= 2)}",
            )
        else:
            report.add(
                section,
                f"  the same answer to {label}: bytes written to TasksTable",
                f"{written / 1000:.0f} KB",
                f"{written / (2 * chars):.2f}x the answer and the prompt",
            )
        report.add(section, "  items written; write units billed", f"{items}; {units}")
    report.note(
        "progress: the items' sizes after each write (DynamoDB bills an update by the larger of"
        " the item before and after), counted by the local endpoint for every TasksTable write from"
        " the submit to the end: the task's own writes, its output's chunks and their head. The"
        " answer is written twice whatever the design: as the output's chunks (resumable readers)"
        " and as the task's result (one GetItem for GET /tasks/{id})"
    )


def listing_pages(report: Report, quick: bool) -> None:
    """Issue 66's figure: a page of GET /tasks?status=... with 100 tasks stored and with 10,000,
    on one stack (its sandboxes warmed by the first page of each kind, no other task stored), and
    moto's CPU a Query at each size."""
    sizes = (100, 2000) if quick else (100, 10_000)
    pages = 20
    section = "listing"
    with stack_as_make_up_starts_it() as stack, stack.client() as client:
        stored = 0
        timed: dict[tuple[int, str], float] = {}
        query_cpu: dict[int, float] = {}
        for size in sizes:
            store_completed_tasks(stack, size - stored)
            stored = size
            stack.aws_calls(reset=True)
            for status in ("completed", "pending"):
                client.get("/tasks", params={"status": status, "limit": 100}).raise_for_status()  # warm
                took = []
                for _ in range(pages):
                    started = time.perf_counter()
                    reply = client.get("/tasks", params={"status": status, "limit": 100})
                    took.append(time.perf_counter() - started)
                    reply.raise_for_status()
                timed[(size, status)] = statistics.median(took)
            calls, cpu = stack.aws_calls(), stack.aws_cpu_us()
            query_cpu[size] = cpu.get("dynamodb.Query", 0) / max(1, calls.get("dynamodb.Query", 0)) / 1e6
    small, large = sizes
    for status, what in (("completed", "a page of 100 completed"), ("pending", "no pending among them")):
        ratio = timed[(large, status)] / timed[(small, status)]
        report.add(
            section, f"GET /tasks?status={status}, {small} tasks stored: p50", ms(timed[(small, status)])
        )
        report.add(
            section,
            f"  {large:,} stored ({what}): p50",
            ms(timed[(large, status)]),
            f"{ratio:.2f}x (target <= 2x): {verdict(ratio <= 2)}",
        )
    report.add(
        section,
        f"  moto's CPU a Query, {small} and {large:,} stored",
        f"{ms(query_cpu[small])} / {ms(query_cpu[large])}",
    )


def queue_receives(report: Report, quick: bool) -> None:
    """Issue 66's figure: a receive of ten messages and their delete (ReceiveMessage, then
    DeleteMessageBatch) from a queue of 1,000 and of 20,000, against the stack's moto server as
    a worker makes them: a fair queue, one tenant's messages (MessageGroupId). Then the same with
    100 of that tenant's in flight (it is noisy) and a second tenant's ten sent after the rest."""
    sizes = (1000, 5000) if quick else (1000, 20_000)
    rounds = 30
    section = "queues"
    stack = launch("--report", cwd=ROOT)
    try:
        sqs = moto_session().client("sqs", endpoint_url=stack.endpoint)
        for size in sizes:
            timed = {}
            for scenario in ("alone", "in flight"):
                url = sqs.create_queue(QueueName=f"bench-{size}-{scenario.replace(' ', '-')}")["QueueUrl"]
                for start in range(0, size, 10):
                    sqs.send_message_batch(
                        QueueUrl=url,
                        Entries=[
                            {"Id": str(i), "MessageBody": f"task {start + i}", "MessageGroupId": "flood"}
                            for i in range(10)
                        ],
                    )
                if scenario == "in flight":
                    for _ in range(10):
                        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=900)
                    sqs.send_message_batch(
                        QueueUrl=url,
                        Entries=[
                            {"Id": str(i), "MessageBody": "quiet", "MessageGroupId": "quiet"}
                            for i in range(10)
                        ],
                    )
                took = []
                for _ in range(rounds):
                    started = time.perf_counter()
                    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=900)[
                        "Messages"
                    ]
                    sqs.delete_message_batch(
                        QueueUrl=url,
                        Entries=[
                            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
                        ],
                    )
                    took.append(time.perf_counter() - started)
                timed[scenario] = statistics.median(took)
                sqs.delete_queue(QueueUrl=url)
            report.add(section, f"receive 10 and delete them, a queue of {size:,}: p50", ms(timed["alone"]))
            report.add(
                section, "  the same, 100 in flight and a quiet tenant's 10 behind", ms(timed["in flight"])
            )
            if size == sizes[0]:
                base = timed
            else:
                for scenario in ("alone", "in flight"):
                    ratio = timed[scenario] / base[scenario]
                    report.add(
                        section,
                        f"  {size:,} against {sizes[0]:,} ({scenario})",
                        f"{ratio:.2f}x",
                        f"target <= 2x: {verdict(ratio <= 2)}",
                    )
    finally:
        stack.stop()


class PlaceholderRefs(dict[Any, str]):
    """Every !Ref and !GetAtt of the template, read as the name of what it refers to: a handler's
    import checks that its resources are named, not that they exist."""

    def __missing__(self, key: Any) -> str:
        return key if isinstance(key, str) else ".".join(key)

    def __contains__(self, key: object) -> bool:
        return True

    def get(self, key: Any, default: Any = None) -> str:
        return self[key]


def import_ms(code: str, runs: int = 3, environment: dict[str, str] | None = None) -> float:
    """Median over fresh interpreters of the time `python -X importtime` gives `code`'s imports."""
    totals = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, **LAMBDA_ENVIRONMENT, **(environment or {})},
        )
        top_level = 0
        for line in done.stderr.splitlines():
            found = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
            if found and not found.group(2).startswith(" "):
                top_level += int(found.group(1))
        totals.append(top_level / 1000)
    return statistics.median(totals)


def cold_start(report: Report) -> None:
    boto3_ms = import_ms("import boto3")
    section = "cold start"
    report.add(section, "import boto3", f"{boto3_ms:.0f} ms")
    # Each handler imported in its function's environment (its cold start checks its resources).
    for spec in sorted(
        Template.load(ROOT / "template.yaml").functions(PlaceholderRefs(), PlaceholderRefs()).values(),
        key=lambda f: str(f.code_dir),
    ):
        app = spec.handler_file
        handler_ms = import_ms(f"import runpy; runpy.run_path({str(app)!r})", environment=spec.environment)
        ratio = handler_ms / boto3_ms
        report.add(
            section,
            f"import functions/{app.parent.name}/app.py",
            f"{handler_ms:.0f} ms",
            f"{ratio:.2f}x boto3 (target <= 1.5x): {verdict(ratio <= 1.5)}",
        )


def wall_ms(command: list[str], runs: int = 10) -> float:
    """The fastest of `runs` runs of a command, in ms: its own start-up, the machine's noise
    taken out as far as a minimum takes it."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, cwd=ROOT, capture_output=True, check=True)
        times.append((time.perf_counter() - started) * 1000)
    return min(times)


def cli_start(report: Report) -> None:
    """The CLI's own start-up (issue: three packages): what a user waits for before a command
    does anything. `status --help` imports what `status` does (the command's module and the
    SDK) and stops before its request."""
    section = "cli start-up"
    cli = str(Path(sys.executable).parent / "llmtasks")
    bare = wall_ms([sys.executable, "-c", "pass"])
    report.add(section, "python -c pass (the interpreter's floor)", f"{bare:.0f} ms")
    for args, target in ((["--version"], 150), (["--help"], 150), (["status", "--help"], 300)):
        took = wall_ms([cli, *args])
        report.add(
            section,
            f"llmtasks {' '.join(args)}: fastest of 10",
            f"{took:.0f} ms",
            f"target <= {target} ms: {verdict(took <= target)}",
        )


def daily_loop(report: Report) -> None:
    """What a user waits for each day (issue 36): `llmtasks up` (the venv made) to Ready, the
    first task after Ready (a 0 s mock; the worker's batching window is part of it), a second
    one, and a saved handler edit until the new code answers. Eager is what `make up` starts;
    lazy is every sandbox started by its first invocation."""
    section = "daily loop"
    window = float(Template.load(ROOT / "template.yaml").parameters["WorkerBatchingWindowSeconds"])
    for mode in ("eager", "lazy"):
        with tempfile.TemporaryDirectory(prefix="llmtasks-loop-") as directory:
            code = Path(directory) / "status"
            shutil.copytree(ROOT / "functions" / "status", code)
            template = Path(directory) / "template.yaml"
            text = (
                (ROOT / "template.yaml")
                .read_text()
                .replace("CodeUri: functions/status/", f"CodeUri: {code}/")
            )
            text = text.replace("CodeUri: functions/", f"CodeUri: {ROOT}/functions/")
            template.write_text(text.replace("ContentUri: src/", f"ContentUri: {ROOT}/src/"))
            started = time.monotonic()
            stack = launch("--warm-containers", mode, "--template", str(template), cwd=ROOT)
            ready_s = time.monotonic() - started
            try:
                with stack.client() as client:
                    first_s, second_s = (task_seconds(client, f"loop {mode} {i}") for i in range(2))
                    reload_s = edit_seconds(client, code / "app.py")
            finally:
                stack.stop()
        report.add(
            section,
            f"--warm-containers {mode}: llmtasks up to Ready",
            f"{ready_s:.1f} s",
            "target <= 8 s" + (f": {verdict(ready_s <= 8)}" if mode == "eager" else ""),
        )
        report.add(
            section,
            "  first task after Ready (submit to completed, a 0 s mock)",
            f"{first_s:.2f} s",
            f"target <= {window + 0.5:.1f} s (the {window:.0f} s batching window + 0.5 s)"
            + (f": {verdict(first_s <= window + 0.5)}" if mode == "eager" else ""),
        )
        report.add(section, "  the second task", f"{second_s:.2f} s")
        report.add(
            section,
            "  a saved handler edit until the new code answers",
            f"{reload_s:.2f} s",
            "target <= 1 s" + (f": {verdict(reload_s <= 1)}" if mode == "eager" else ""),
        )


def task_seconds(client: httpx.Client, prompt: str) -> float:
    """From the submit to the reply that shows the task completed (long polls, answered as it ends)."""
    started = time.monotonic()
    task_id = client.post("/tasks", json={"prompt": prompt}).json()["task_id"]
    while client.get(f"/tasks/{task_id}", params={"wait": 20}).json()["status"] != "completed":
        pass
    return time.monotonic() - started


def edit_seconds(client: httpx.Client, app: Path) -> float:
    """From a saved edit of StatusFunction's handler to the first reply of the new code."""
    assert "x-edited" not in client.get("/health").headers
    started = time.monotonic()
    with app.open("a") as handler:
        handler.write(
            "\n_served = lambda_handler\n"
            "def lambda_handler(event, context):\n"
            "    reply = _served(event, context)\n"
            "    reply.setdefault('headers', {})['x-edited'] = '1'\n"
            "    return reply\n"
        )
    while "x-edited" not in client.get("/health").headers:
        time.sleep(0.02)
    return time.monotonic() - started


# What one call costs in AWS, for the fan-out's projection: typical in-region latencies, not
# measured here (DynamoDB single-digit ms, SQS and S3 tens of ms).
AWS_CALL_MS = {"dynamodb": 6.0, "sqs": 15.0, "s3": 25.0}


def batch_file_lines(items: int, line_bytes: int) -> bytes:
    pad = "p" * (line_bytes - 60)
    return b"".join(
        json.dumps({"prompt": f"{i:06d} {pad}", "custom_id": f"row-{i}"}).encode() + b"\n"
        for i in range(items)
    )


def queue_drained(stack: LaunchedStack, name: str) -> bool:
    sqs = moto_session().client("sqs", endpoint_url=stack.endpoint)
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    counts = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return counts["ApproximateNumberOfMessages"] == counts["ApproximateNumberOfMessagesNotVisible"] == "0"


@dataclass
class FileBatch:
    bytes: int
    upload_s: float
    read_s: float  # from POST /batches to pending (the file read, its chunks' messages sent)
    fanout_s: float  # from POST /batches to every chunk fanned out (BatchFanoutQueue drained)
    total: int
    peak_rss_kib: int  # the BatchFunction sandboxes' peak resident memory
    calls: dict[str, int]
    tasks_table_units: int  # the write units TasksTable was billed from the submit to the fan-out's end


def file_batch(items: int, line_bytes: int) -> FileBatch:
    """One batch of `items` lines from an uploaded file on a fresh stack, its calls against the
    mock's 300 s calls (the items wait in their queue: only the fan-out works)."""
    data = batch_file_lines(items, line_bytes)
    with stack_running() as stack:
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 300})
        with stack.client() as client:
            upload = client.post("/batches/uploads").json()
            started = time.monotonic()
            httpx.put(upload["upload_url"], content=data, timeout=300).raise_for_status()
            upload_s = time.monotonic() - started
            stack.aws_calls(reset=True)
            started = time.monotonic()
            batch_id = submit_batch_file(client, upload["file_id"])
            while (batch := client.get(f"/batches/{batch_id}").json())["status"] == "validating":
                time.sleep(0.1)
            read_s = time.monotonic() - started
            while not queue_drained(stack, local_name("BatchFanoutQueue")):
                time.sleep(0.25)
            fanout_s = time.monotonic() - started
            calls = stack.aws_calls()
            units = stack.aws_writes()["units"].get(local_name("TasksTable"), 0)
        peaks = [status_kib(pid, "VmHWM") or 0 for pid in sandbox_functions(stack).get("BatchFunction", [])]
    return FileBatch(
        len(data), upload_s, read_s, fanout_s, batch["total"], max(peaks, default=0), calls, units
    )


def submit_batch_file(client: httpx.Client, file_id: str) -> str:
    reply = client.post("/batches", json={"input_file_id": file_id})
    reply.raise_for_status()
    return str(reply.json()["batch_id"])


def projected_fanout_s(calls: dict[str, int], concurrency: int) -> float:
    """The fan-out's time in AWS from the calls it made here: each call at AWS_CALL_MS, the
    chunks spread over BatchFunction's `concurrency` (the fan-out source's MaximumConcurrency)."""
    spent_ms = 0.0
    for operation, count in calls.items():
        service = operation.split(".")[0].lower()
        if charged_to_tasks(operation) and service in AWS_CALL_MS:
            spent_ms += count * AWS_CALL_MS[service]
    return spent_ms / 1000 / concurrency


def batch_files(report: Report, quick: bool) -> None:
    """Issue 45's figures: a batch from a file (2,000 and 20,000 lines of ~2 KB: 4 and 40 MB),
    its read and fan-out, the fan-out function's peak memory at each size, the same file
    downloaded through its presigned redirect, and an Uploads API join of it."""
    section = "batch files"
    sizes = (200, 2000) if quick else (2000, 20000)
    line_bytes = 2000
    runs = {items: file_batch(items, line_bytes) for items in sizes}
    concurrency = 2  # template.yaml: the Fanout source's MaximumConcurrency
    for items, run in runs.items():
        label = f"{items:,} lines, {run.bytes / 1e6:.0f} MB"
        report.add(section, f"{label}: PUT to the presigned URL", f"{run.upload_s:.2f} s")
        report.add(
            section,
            f"  read (validating -> pending), total {run.total:,}",
            f"{run.read_s:.1f} s",
            f"exact: {verdict(run.total == items)}",
        )
        report.add(
            section,
            "  fanned out (every task made and queued)",
            f"{run.fanout_s:.1f} s",
            f"{items / run.fanout_s:.0f} items/s here",
        )
        projected = projected_fanout_s(run.calls, concurrency)
        report.add(
            section,
            "  projected for AWS from its calls",
            f"{projected:.0f} s",
            f"{items / projected:.0f} items/s",
        )
        report.add(
            section,
            "  TasksTable write units an item (made, counted; the 100 calls that run claim theirs)",
            f"{run.tasks_table_units / items:.2f}",
        )
        report.add(section, "  BatchFunction peak RSS", f"{run.peak_rss_kib / 1024:.0f} MiB")
    small, large = (runs[items] for items in sizes)
    growth = large.peak_rss_kib / max(small.peak_rss_kib, 1)
    report.add(
        section, "peak RSS at 10x the file", f"{growth:.2f}x", f"flat (<= 1.2): {verdict(growth <= 1.2)}"
    )
    data = batch_file_lines(sizes[1], line_bytes)
    with stack_running() as stack, stack.client() as client:
        begun = client.post(
            "/v1/uploads",
            json={
                "bytes": len(data),
                "filename": "big.jsonl",
                "mime_type": "application/jsonl",
                "purpose": "batch",
            },
        ).json()
        part_size = 4 * 1024 * 1024
        started = time.monotonic()
        parts = [
            client.post(
                f"/v1/uploads/{begun['id']}/parts", files={"data": ("p", data[i : i + part_size])}
            ).json()["id"]
            for i in range(0, len(data), part_size)
        ]
        parts_s = time.monotonic() - started
        started = time.monotonic()
        joined = client.post(
            f"/v1/uploads/{begun['id']}/complete", json={"part_ids": parts}, timeout=120
        ).json()
        join_s = time.monotonic() - started
        started = time.monotonic()
        content = client.get(f"/v1/files/{joined['file']['id']}/content", follow_redirects=True, timeout=300)
        download_s = time.monotonic() - started
    report.add(section, f"Uploads API: {len(parts)} parts of 4 MiB sent", f"{parts_s:.1f} s")
    report.add(
        section,
        "  complete (the parts joined, in SubmitFunction)",
        f"{join_s:.1f} s",
        "API Gateway's 30 s: " + verdict(join_s < 30),
    )
    report.add(
        section,
        f"{len(data) / 1e6:.0f} MB file downloaded (307 to a presigned GET)",
        f"{download_s:.2f} s",
        f"bytes exact: {verdict(content.content == data)}",
    )
    report.note(
        "batch files: the items' calls wait on a mock answering in 300 s, so only the fan-out works;"
        f" the AWS projection counts each call of the fan-out at {AWS_CALL_MS} ms and spreads them"
        f" over BatchFunction's {concurrency} concurrent fan-out invocations"
    )


@dataclass
class OutputFile:
    lines: int
    run_s: float  # from batches.create to every request ended (finalizing, or completed)
    finalizing_s: float  # from first seen finalizing to completed: its files written
    bytes: int
    download_s: float
    exact: bool  # every custom_id once, each answered
    peak_rss_kib: int


def openai_output_file(items: int, reply_chars: int) -> OutputFile:
    """An OpenAI batch of `items` requests run to its end on a fresh stack (the mock answering at
    once with `reply_chars` characters), its output file written by BatchFunction as it ends,
    then downloaded through the presigned redirect."""
    lines = b"".join(
        json.dumps(
            {
                "custom_id": f"row-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]},
            }
        ).encode()
        + b"\n"
        for i in range(items)
    )
    with stack_running() as stack:
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 0, "reply_chars": reply_chars})
        with stack.client() as client:
            upload = client.post("/batches/uploads").json()
            httpx.put(upload["upload_url"], content=lines, timeout=300).raise_for_status()
            create = {
                "input_file_id": upload["file_id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            }
            started = time.monotonic()
            openai_id = client.post("/v1/batches", json=create).json()["id"]
            finalizing_at = None
            while (batch := client.get(f"/v1/batches/{openai_id}").json())["status"] != "completed":
                if batch["status"] == "finalizing" and finalizing_at is None:
                    finalizing_at = time.monotonic()
                time.sleep(0.25)
            ended_at = time.monotonic()
            started_download = time.monotonic()
            content = client.get(
                f"/v1/files/{batch['output_file_id']}/content", follow_redirects=True, timeout=300
            ).content
            download_s = time.monotonic() - started_download
        peaks = [status_kib(pid, "VmHWM") or 0 for pid in sandbox_functions(stack).get("BatchFunction", [])]
    answered = [json.loads(line) for line in content.splitlines()]
    exact = sorted(line["custom_id"] for line in answered) == sorted(
        f"row-{i}" for i in range(items)
    ) and all(line["response"]["status_code"] == 200 for line in answered)
    run_s = (finalizing_at or ended_at) - started
    return OutputFile(
        items,
        run_s,
        ended_at - (finalizing_at or ended_at),
        len(content),
        download_s,
        exact,
        max(peaks, default=0),
    )


def batch_output(report: Report, quick: bool) -> None:
    """Issue 45's output figure: an OpenAI batch of 20,000 requests run to its end (its answers of
    ~2 KB), its output file written by BatchFunction as it ends, and downloaded."""
    section = "batch output"
    output = openai_output_file(500 if quick else 20000, 2000)
    report.add(
        section,
        f"OpenAI batch of {output.lines:,} requests: run to its last answer",
        f"{output.run_s:.0f} s",
        f"{output.lines / output.run_s:.0f} requests/s",
    )
    report.add(
        section,
        "  finalizing (BatchFunction writes its output file, then it ends)",
        f"{output.finalizing_s:.1f} s",
        f"{output.lines / max(output.finalizing_s, 0.01):.0f} lines/s",
    )
    report.add(
        section,
        f"  its {output.bytes / 1e6:.0f} MB output file downloaded (307 to a presigned GET)",
        f"{output.download_s:.2f} s",
        f"every custom_id once, answered: {verdict(output.exact)}",
    )
    report.add(
        section,
        "  BatchFunction peak RSS (fan-out, counting, the file)",
        f"{output.peak_rss_kib / 1024:.0f} MiB",
    )
    report.note(
        "batch output: the mock answers at once; the run's time is the local stack's (moto) for"
        " as many tasks; finalizing is from the first read that saw it finalizing (reads 0.25 s apart)"
    )


def sandbox_functions(stack: LaunchedStack) -> dict[str, list[int]]:
    """The live sandbox processes by function, as the stack's CPU account lists them (a forked
    sandbox's command line is its fork server's: it names no function)."""
    live: dict[str, list[int]] = stack.cpu_account()["live_sandboxes"]
    return live


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


# --- the run --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Small sizes: a smoke run of every section.")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"Comma-separated sections (default all: {','.join(SECTIONS)}).",
    )
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    sizes = (
        {
            "single": 20,
            "small": 100,
            "large": 300,
            "floor": 100,
            "cost": 50,
            "paced": 100,
            "burst": 100,
            "stored": 1000,
            "limits": 20,
            "budgets": 400,
            "sandboxes": 100,
        }
        if args.quick
        else {
            "single": 200,
            "small": 1000,
            "large": 10000,
            "floor": 1000,
            "cost": 200,
            "paced": 600,
            "burst": 1000,
            "stored": 10000,
            "limits": 60,
            "budgets": 1000,
            "sandboxes": 300,
        }
    )
    report = Report()
    began = time.monotonic()
    print(
        f"llmtasks benchmark on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()})"
    )
    if "cli" in chosen:
        cli_start(report)
    if "loop" in chosen:
        daily_loop(report)
    if "cold" in chosen:
        cold_start(report)
    if "sandboxes" in chosen:
        sandboxes(report, sizes["sandboxes"])
    if "overhead" in chosen:
        with stack_running() as stack:  # the floor runs against the same moto server as the stack's
            floor = boto3_floor(stack.endpoint, sizes["floor"])
        floor_p50 = percentile(floor, 0.5)
        report.add("floor", f"6 boto3 calls per task, sequential, {sizes['floor']} tasks: p50", ms(floor_p50))
        report.add("floor", "p95", ms(percentile(floor, 0.95)))
        # The latency configuration (no batching window) at both sizes, then the template's
        # default window, whose wait is the price of fuller batches (fewer billed seconds).
        # Like for like with the floor: one client, so nothing waits for the machine's two cores.
        overhead(report, sizes["single"], floor_p50, window_s=0, clients=1)
        small = overhead(report, sizes["small"], floor_p50, window_s=0)
        if "scale" in chosen:
            large = overhead(
                report, sizes["small"], floor_p50, window_s=0, stored_first=sizes["large"] - sizes["small"]
            )
            ratio = large / small
            report.add(
                "scale",
                f"overhead p50 at {sizes['large']} / at {sizes['small']}",
                f"{ratio:.2f}",
                f"target <= 1.2: {verdict(ratio <= 1.2)}",
            )
        overhead(report, sizes["small"], floor_p50)
    if "paced" in chosen:
        goodput(report, sizes["paced"], limit_rps=20)
        # Half the limit, side by side: whether the pace or this machine bounds the first figure.
        goodput(report, sizes["paced"] // 2, limit_rps=10)
    if "cost" in chosen:
        costs(report, sizes["cost"])
    if "state" in chosen:
        durable_state(report, sizes["burst"], sizes["stored"])
    if "limits" in chosen:
        key_limits(report, sizes["limits"])
    if "budgets" in chosen:
        budgets(report, sizes["limits"], sizes["budgets"])
    if "celery" in chosen:
        versus_celery(report, sizes["burst"])
    if "cpu" in chosen:
        cpu_account(report, sizes["burst"])
    if "slots" in chosen:
        call_slots(report, args.quick)
    if "scheduling" in chosen:
        scheduling(report, args.quick)
    if "webhooks" in chosen:
        webhooks(report, args.quick)
    if "streaming" in chosen:
        streaming(report, args.quick)
    if "batch_files" in chosen:
        batch_files(report, args.quick)
    if "batch_output" in chosen:
        batch_output(report, args.quick)
    if "queues" in chosen:
        queue_receives(report, args.quick)
    if "listing" in chosen:
        listing_pages(report, args.quick)
    if "progress" in chosen:
        progress_writes(report, args.quick)
    elapsed = time.monotonic() - began
    report.note(f"whole run: {elapsed:.0f} s on {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}")
    args.out.write_text(
        report.markdown("llmtasks benchmark results" + (" (quick run)" if args.quick else ""))
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
