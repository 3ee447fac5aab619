"""What a deployment's tasks, batches and queues look like right now: `llmtasks stats` prints it,
the local console (`llmtasks up`, /console) draws it. Both read the tables and queues the
functions use; there is no second store.

Every read is bounded, whatever the table holds (never a Scan: one of a big table stalled the
stack it watched): the counts of tasks by status, tenant and priority are the counters
BatchFunction keeps from the stream (aws/task_counts.py), one item; the timelines, the latency
and the dead-lettered tasks come from the newest SAMPLE tasks of the busiest TENANTS tenants
(their index, newest first, then the items by key, prompts and results left out); the batches
are the newest of those tasks' batches; the steps of the newest RUNS runs among the timelines,
their first RUN_STEPS each (their facts: kind, model, tokens, tool and who answered it).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.aws.batch_store import batches_by_id
from llmtasks.aws.run_steps import recorded_steps
from llmtasks.aws.task_counts import TaskCounts, TaskCountsView
from llmtasks.aws.task_items import newest_tasks
from llmtasks.domain.batches import BatchView
from llmtasks.domain.errors import BackendError
from llmtasks.domain.models import DEAD_LETTERED, TaskStatus, is_dead_lettered
from llmtasks.domain.steps import RunStep, is_tool_error
from llmtasks.ops.deployment import STREAM_CONSUMERS

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from llmtasks.ops.deployment import Deployment

T = TypeVar("T")
HOUR_S = 3600
BUCKET_S = 300  # the charts' resolution: five minutes
RECENT = 25  # tasks shown with their timeline
SAMPLE = 200  # the newest tasks read: the timelines, the latency, the dead-lettered
TENANTS = 20  # the busiest tenants, whose newest tasks those are
HEALTH_S = 900  # the window of the functions' errors and throttles: the alarms' 5 minutes, thrice
LAG_S = 300  # the window of a stream consumer's lag (its largest IteratorAge)
BATCHES = 10
RUNS = 5  # the newest runs among the timelines, whose steps they show
RUN_STEPS = 50  # the steps shown of each, its first
# What the overview reads of a task: never its prompt, result or webhook URL.
_TASK_FIELDS = [
    "pk",
    "task_id",
    "tenant_id",
    "status",
    "created_at",
    "started_at",
    "completed_at",
    "attempts",
    "max_retries",
    "error_code",
    "batch_id",
    "priority",
    "webhook_status",
    "webhook_attempts",
    "dead_letter_at",
    "lease_until",
    "expires_at",
    "request.model",
    "attempt_log",
    "webhook_log",
    "max_steps",
    "required_action",
]
_BATCH_FIELDS = [
    "pk",
    "batch_id",
    "owner_tenant",
    "status",
    "total",
    "pending",
    "processing",
    "completed",
    "failed",
    "cancelled",
    "manifest_ref",
    "chunk_size",
    "chunk_offsets",
    "created_at",
    "expires_at",
    "completed_at",
    "cancel_requested_at",
]


def percentiles(values: list[float]) -> dict[str, Any]:
    """p50, p95 and p99 (seconds, two decimals) and how many values they come from."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "n": 0}
    if len(values) == 1:
        only = round(values[0], 2)
        return {"p50": only, "p95": only, "p99": only, "n": 1}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(cuts[49], 2), "p95": round(cuts[94], 2), "p99": round(cuts[98], 2), "n": len(values)}


def queue_depths(sqs: SQSClient, deployment: Deployment) -> dict[str, int]:
    """Messages waiting or in flight in each queue and DLQ."""
    urls: dict[str, str] = {str(name): url for name, url in deployment.queue_urls.items()}
    urls |= {f"{name}_dlq": url for name, url in deployment.dlq_urls.items()}
    depths: dict[str, int] = {}
    for name, url in urls.items():
        attributes = sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        depths[name] = sum(int(value) for value in attributes.values())
    return depths


def _status(task: dict[str, Any], now: float) -> str:
    """As a client reads it, with a dead-lettered task told apart from the other failures."""
    status = TaskStatus(task["status"])
    if is_dead_lettered(status, task.get("dead_letter_at"), now):
        return DEAD_LETTERED
    return status.value


def _timeline(task: dict[str, Any], status: str) -> dict[str, Any]:
    return {
        "task_id": task["task_id"],
        "tenant_id": task.get("tenant_id"),
        "status": status,
        "model": (task.get("request") or {}).get("model"),
        "priority": task.get("priority"),
        "batch_id": task.get("batch_id"),
        "submitted_at": task.get("created_at"),
        "claimed_at": task.get("started_at"),
        "attempts": task.get("attempts", 0),
        "attempt_log": task.get("attempt_log") or [],
        "ended_at": task.get("completed_at") if status != DEAD_LETTERED else task.get("lease_until"),
        "error_code": DEAD_LETTERED if status == DEAD_LETTERED else task.get("error_code"),
        "webhook_status": task.get("webhook_status"),
        "webhook_attempts": task.get("webhook_attempts", 0),
        "webhook_log": task.get("webhook_log") or [],
        "run": task.get("max_steps") is not None,
        # A run waiting for its client: the functions whose calls it waits for.
        "waiting_for": [
            call["function"]["name"] for call in (task.get("required_action") or {}).get("tool_calls", [])
        ]
        if status == TaskStatus.REQUIRES_ACTION.value
        else [],
    }


def step_facts(step: RunStep) -> dict[str, Any]:
    """A step as the timeline shows it: a model call's model, tokens, cost and the tools it asked
    for; a tool call's tool, who answered it and whether it failed."""
    facts: dict[str, Any] = {
        "step": step.step,
        "type": step.type,
        "started_at": step.started_at,
        "ended_at": step.ended_at,
    }
    done = step.completion
    if done is not None:
        return facts | {
            "model": done.model,
            "tokens": done.usage.total_tokens,
            "cost_usd": done.usage.cost_usd,
            "calls": [call.function.name for call in done.tool_calls or []],
        }
    name = step.tool_call.function.name if step.tool_call else None
    return facts | {"tool": name, "source": step.source, "error": is_tool_error(step)}


def scheduling(counts: TaskCountsView) -> dict[str, Any]:
    """What waits (backlog: pending) and what runs (in flight: processing), per tenant (the
    busiest first) and per priority."""

    def row(statuses: dict[str, int]) -> dict[str, int]:
        return {
            "backlog": statuses.get(TaskStatus.PENDING.value, 0),
            "in_flight": statuses.get(TaskStatus.PROCESSING.value, 0),
        }

    tenants = [(tenant, row(statuses)) for tenant, statuses in counts.by_tenant.items()]
    busiest = sorted(
        ((tenant, r) for tenant, r in tenants if r["backlog"] or r["in_flight"]),
        key=lambda pair: (-sum(pair[1].values()), pair[0]),
    )
    priorities = {p: {"backlog": 0, "in_flight": 0} for p in ("high", "normal", "low")}
    priorities |= {priority: row(statuses) for priority, statuses in counts.by_priority.items()}
    return {
        "tenants": [{"tenant_id": tenant, **r} for tenant, r in busiest],
        "priorities": priorities,
    }


def without_dead_letters(counts: TaskCountsView, dead: list[dict[str, Any]]) -> TaskCountsView:
    """The counts with these dead-lettered tasks (stored as processing, but run by nothing until
    a redrive) out of processing: what runs is what is in flight."""
    by_tenant = {tenant: dict(statuses) for tenant, statuses in counts.by_tenant.items()}
    by_priority = {priority: dict(statuses) for priority, statuses in counts.by_priority.items()}
    processing = TaskStatus.PROCESSING.value
    for task in dead:
        for group, key in (
            (by_tenant, str(task.get("tenant_id"))),
            (by_priority, str(task.get("priority") or "normal")),
        ):
            if group.get(key, {}).get(processing, 0) > 0:
                group[key][processing] -= 1
    return TaskCountsView(by_status=counts.by_status, by_tenant=by_tenant, by_priority=by_priority)


def busiest_tenants(counts: TaskCountsView, n: int) -> list[str]:
    """The `n` tenants with the most tasks waiting or running, then the most tasks."""

    def weight(tenant: str) -> tuple[int, int, str]:
        statuses = counts.by_tenant[tenant]
        active = statuses.get(TaskStatus.PENDING.value, 0) + statuses.get(TaskStatus.PROCESSING.value, 0)
        return (-active, -sum(statuses.values()), tenant)

    return sorted(counts.by_tenant, key=weight)[:n]


def llm_time(task: dict[str, Any]) -> float:
    """The time its attempts took, each from its claim to its end (the LLM's call, mostly),
    without the waits between them."""
    return float(sum(entry["ended_at"] - entry["started_at"] for entry in task.get("attempt_log") or []))


def read_bound() -> int:
    """The most items one overview reads: the counters' item, the index entries of the busiest
    tenants' newest tasks, the newest of those tasks, their newest batches, the newest runs'
    steps."""
    return 1 + max(TENANTS * RECENT, SAMPLE) + SAMPLE + 2 * BATCHES + RUNS * RUN_STEPS


_NO_ROWS: list[dict[str, Any]] = []
_NO_DEPTHS: dict[str, int] = {}
_NO_HEALTH: dict[str, Any] = {}
_NO_STEPS: dict[str, list[dict[str, Any]]] = {}


class _Budget:
    """Runs the overview's parts while its time lasts: a part begun after the deadline, or whose
    read failed, gives its empty value and is named in `incomplete` (with why), so a view that
    cannot be read whole in time answers with what it has and says so."""

    def __init__(self, deadline: float | None, clock: Callable[[], float]) -> None:
        self._deadline = deadline
        self._clock = clock
        self.incomplete: dict[str, str] = {}

    def run(self, name: str, part: Callable[[], T], empty: T) -> T:
        if self._deadline is not None and self._clock() >= self._deadline:
            self.incomplete[name] = "not read: out of time"
            return empty
        try:
            return part()
        except (BackendError, BotoCoreError, ClientError) as error:
            self.incomplete[name] = f"not read: {type(error).__name__}"
            return empty


def overview(
    dynamodb: DynamoDBClient,
    sqs: SQSClient,
    deployment: Deployment,
    *,
    now: float,
    cloudwatch: CloudWatchClient | None = None,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Tasks by status (dead-lettered ones among the newest told apart from the others in
    processing); queue wait, LLM time (the attempts' own durations) and end-to-end time of the
    newest tasks over the last hour, as percentiles and per five minutes; the newest tasks with
    their timelines; queue and DLQ depths; backlog and in flight per tenant and per priority;
    the newest batches with their counts; with `cloudwatch`, each function's health
    (`function_health`). The console and `llmtasks stats` show this one view. It reads at most
    one counter item, `read_bound()` items in all, whatever the table holds. With `deadline`
    (on `clock`), the parts not begun by then are left out, and named in `incomplete`."""
    budget = _Budget(deadline, clock)
    counts = budget.run(
        "tasks", lambda: TaskCounts(deployment.tasks_table, dynamodb).read(), TaskCountsView({}, {}, {})
    )

    def sample() -> list[dict[str, Any]]:
        tenants = busiest_tenants(counts, TENANTS)
        # Each tenant's newest RECENT at least, so the newest RECENT of all are among them.
        per_tenant = max(RECENT, SAMPLE // max(1, len(tenants)))
        return newest_tasks(
            dynamodb, deployment.tasks_table, tenants, _TASK_FIELDS, per_tenant=per_tenant, limit=SAMPLE
        )

    sampled = budget.run("recent", sample, list(_NO_ROWS))
    tasks = [task for task in sampled if task["expires_at"] > now]
    statuses = [_status(task, now) for task in tasks]
    by_status: Counter[str] = Counter({status.value: 0 for status in TaskStatus} | {DEAD_LETTERED: 0})
    by_status.update(counts.by_status)
    dead = statuses.count(DEAD_LETTERED)
    by_status[DEAD_LETTERED] += dead
    by_status[TaskStatus.PROCESSING.value] -= dead
    since = now - HOUR_S
    buckets = int(HOUR_S / BUCKET_S)
    measured: dict[str, list[list[float]]] = {
        name: [[] for _ in range(buckets)] for name in ("queue_wait_s", "llm_s", "end_to_end_s")
    }

    def add(name: str, at: float | None, value: float) -> None:
        if at is not None and since <= at <= now:
            measured[name][min(buckets - 1, math.floor((at - since) / BUCKET_S))].append(max(0.0, value))

    for task, status in zip(tasks, statuses, strict=True):
        created, started, ended = task["created_at"], task.get("started_at"), task.get("completed_at")
        if started is not None:
            add("queue_wait_s", started, started - created)
        if status == TaskStatus.COMPLETED.value and ended is not None:
            add("llm_s", ended, llm_time(task))
            add("end_to_end_s", ended, ended - created)
    latency = {name: percentiles([v for bucket in rows for v in bucket]) for name, rows in measured.items()}
    series = [
        {"at": since + i * BUCKET_S, **{name: percentiles(rows[i]) for name, rows in measured.items()}}
        for i in range(buckets)
    ]
    newest_all = list(zip(tasks, statuses, strict=True))
    newest = newest_all[:RECENT]
    batch_ids = list(dict.fromkeys(task["batch_id"] for task in tasks if task.get("batch_id")))

    def newest_batches() -> list[dict[str, Any]]:
        stored = batches_by_id(dynamodb, deployment.tasks_table, batch_ids[: BATCHES * 2], _BATCH_FIELDS)
        live = sorted((b for b in stored if not b.is_expired(now)), key=lambda b: -b.created_at)
        views = [BatchView.of(batch) for batch in live[:BATCHES]]
        return [
            {**view.model_dump(mode="json"), "finished": view.finished, "ended": view.status.is_terminal}
            for view in views
        ]

    runs = [task["task_id"] for task, _ in newest if task.get("max_steps") is not None][:RUNS]

    def run_steps() -> dict[str, list[dict[str, Any]]]:
        table = deployment.tasks_table
        return {
            run: [step_facts(step) for step in recorded_steps(dynamodb, table, run, limit=RUN_STEPS)]
            for run in runs
        }

    steps = budget.run("steps", run_steps, dict(_NO_STEPS)) if runs else {}
    view = {
        "generated_at": now,
        "tasks": {
            "by_status": dict(by_status),
            "total": sum(counts.by_status.values()),
            "sampled": len(tasks),
        },
        "latency": latency,
        "series": series,
        "recent": [
            _timeline(task, status) | {"steps": steps.get(task["task_id"])} for task, status in newest
        ],
        "queues": budget.run("queues", lambda: queue_depths(sqs, deployment), dict(_NO_DEPTHS)),
        "scheduling": scheduling(
            without_dead_letters(counts, [t for t, st in newest_all if st == DEAD_LETTERED])
        ),
        "batches": budget.run("batches", newest_batches, list(_NO_ROWS)),
    }
    if cloudwatch is not None:
        view["functions"] = budget.run(
            "functions", lambda: function_health(cloudwatch, deployment, now=now), dict(_NO_HEALTH)
        )
    view["incomplete"] = budget.incomplete
    return view


def function_health(cloudwatch: CloudWatchClient, deployment: Deployment, *, now: float) -> dict[str, Any]:
    """Each function's errors and throttles over the last HEALTH_S, and each stream consumer's
    lag (its largest IteratorAge in the newest LAG_S period, in seconds; None without one),
    from CloudWatch's AWS/Lambda metrics: the local endpoint's or the deployed account's, one
    GetMetricData request."""
    queries: list[Any] = []
    for index, (logical_id, name) in enumerate(deployment.functions.items()):
        wanted = [("errors", "Errors", "Sum", HEALTH_S), ("throttles", "Throttles", "Sum", HEALTH_S)]
        if logical_id in STREAM_CONSUMERS:
            wanted.append(("lag", "IteratorAge", "Maximum", LAG_S))
        for key, metric, stat, window in wanted:
            queries.append(
                {
                    "Id": f"{key}{index}",
                    "Label": f"{logical_id} {key}",
                    "MetricStat": {
                        "Metric": {
                            "Namespace": "AWS/Lambda",
                            "MetricName": metric,
                            "Dimensions": [{"Name": "FunctionName", "Value": name}],
                        },
                        "Period": window,
                        "Stat": stat,
                    },
                }
            )
    if not queries:
        return {}
    reply = cloudwatch.get_metric_data(
        MetricDataQueries=queries,
        StartTime=datetime.fromtimestamp(now - HEALTH_S, UTC),
        EndTime=datetime.fromtimestamp(now + 60, UTC),
    )
    health: dict[str, Any] = {}
    for result in reply["MetricDataResults"]:
        logical_id, key = str(result["Label"]).split(" ")
        values = result.get("Values") or []
        entry = health.setdefault(logical_id, {"errors": 0, "throttles": 0})
        if key == "lag":
            # The newest period's (GetMetricData lists the newest first)
            entry["lag_s"] = round(values[0] / 1000, 1) if values else None
        else:
            entry[key] = int(sum(values))
    return health
