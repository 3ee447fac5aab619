"""`llmtasks stats`: what a tenant's tasks and the deployment's queues look like right now."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import TYPE_CHECKING, Any

from llmtasks.models import TaskStatus

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from llmtasks.client import Client
    from llmtasks.deployment import Deployment

HOUR_S = 3600
MAX_TASKS = 2000  # pages read for the summary; the newest come first


def task_stats(client: Client, *, now: float) -> dict[str, Any]:
    """Tasks by status (the newest MAX_TASKS) and submit-to-done latency of the last hour."""
    by_status: Counter[str] = Counter({status.value: 0 for status in TaskStatus})
    latencies: list[float] = []
    cursor, seen = None, 0
    while seen < MAX_TASKS:
        page = client.list(limit=100, cursor=cursor)
        for task in page.data:
            by_status[task.status.value] += 1
            done = task.completed_at
            if task.status is TaskStatus.COMPLETED and done and now - done.timestamp() <= HOUR_S:
                latencies.append((done - task.created_at).total_seconds())
        seen += len(page.data)
        cursor = page.next_cursor
        if cursor is None:
            break
    return {"by_status": dict(by_status), "latency_s": percentiles(latencies)}


def percentiles(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"p50": None, "p95": None, "n": 0}
    if len(values) == 1:
        return {"p50": round(values[0], 2), "p95": round(values[0], 2), "n": 1}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(cuts[49], 2), "p95": round(cuts[94], 2), "n": len(values)}


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
