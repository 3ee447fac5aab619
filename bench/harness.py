"""The bench's shared harness: the report and its figures' formats, the local stacks it starts
(warmed up, or as `make up` starts them), their processes' CPU and memory, the AWS calls and
Lambda time they count, the list prices a cost is figured at, and the template's call slots.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3

from drive import open_loop, outcomes
from llmtasks.aws.dynamo import serialize
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.models import Task, TaskStatus
from llmtasks_local.emulator.launcher import LaunchedStack, descendants, launch
from llmtasks_local.emulator.processes import cpu_seconds, status_kib
from llmtasks_local.sam.template import Template

ROOT = Path(__file__).resolve().parent.parent


COST_CLIENTS = 4


WARM_UP_TASKS = 300


# Public on-demand list prices, us-east-1 (USD). Lambda on arm64, as the template runs.
PRICES = {
    "lambda_gb_s": 0.0000133334,
    "lambda_request": 0.20 / 1e6,
    "http_api_request": 1.00 / 1e6,
    "sqs_request": 0.40 / 1e6,
    "dynamodb_wru": 0.625 / 1e6,
    "dynamodb_rru": 0.125 / 1e6,
}


PLAIN_MOCK: dict[str, Any] = {
    "latency_s": 0.0,
    "latency_sigma": 0.0,
    "latency_min_s": 0.0,
    "latency_max_s": None,
    "seed": 21,
}


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
    than under a lighter one, so a lighter warm-up leaves cold starts in the measured burst."""
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


def moto_session() -> boto3.session.Session:
    return boto3.session.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


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


def sandbox_functions(stack: LaunchedStack) -> dict[str, list[int]]:
    """The live sandbox processes by function, as the stack's CPU account lists them (a forked
    sandbox's command line is its fork server's: it names no function)."""
    live: dict[str, list[int]] = stack.cpu_account()["live_sandboxes"]
    return live
