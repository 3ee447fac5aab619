"""The local endpoint's CloudWatch metrics: what Lambda itself measures of each function (AWS/Lambda
Invocations, Errors, Duration, and IteratorAge for stream event sources) and the functions' EMF
lines (namespace llmtasks: TasksCompleted, LlmLatency, ...), sent to the endpoint's CloudWatch
with PutMetricData, so `aws cloudwatch get-metric-statistics --endpoint-url ...` reads them as it
does in AWS.

Datapoints are folded per metric and dimensions into one StatisticValues datum (count, sum,
min, max) every FLUSH_S: one request a flush, whatever the traffic, and a few hundred datums an
hour in the endpoint. They live as long as the endpoint process (the state dir keeps the tables,
queues and buckets, not the metrics).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient

FLUSH_S = 5.0
LAMBDA = "AWS/Lambda"
MAX_DATUMS = 1000  # PutMetricData's limit a request

Dimensions = tuple[tuple[str, str], ...]


@dataclass
class _Folded:
    unit: str
    count: int = 0
    total: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)


class MetricsSink:
    def __init__(self, cloudwatch: CloudWatchClient) -> None:
        self._cloudwatch = cloudwatch
        self._lock = threading.Lock()
        self._folded: dict[tuple[str, str, Dimensions], _Folded] = {}

    def add(self, namespace: str, name: str, dimensions: Dimensions, value: float, unit: str) -> None:
        with self._lock:
            folded = self._folded.setdefault((namespace, name, dimensions), _Folded(unit))
            folded.add(value)

    def invoked(self, function_name: str, *, ok: bool, duration_ms: float) -> None:
        """Lambda's own metrics of one invocation."""
        dimensions = (("FunctionName", function_name),)
        self.add(LAMBDA, "Invocations", dimensions, 1, "Count")
        self.add(LAMBDA, "Errors", dimensions, 0 if ok else 1, "Count")
        self.add(LAMBDA, "Duration", dimensions, duration_ms, "Milliseconds")

    def iterator_age(self, function_name: str, age_ms: float) -> None:
        """A stream event source's invocation: how old its batch's last record was."""
        self.add(LAMBDA, "IteratorAge", (("FunctionName", function_name),), age_ms, "Milliseconds")

    def line(self, text: str) -> None:
        """A function's log line: an EMF object's metrics are added; any other line is not."""
        if '"_aws"' not in text:  # cheap: most lines are not EMF
            return
        try:
            record = json.loads(text)
        except ValueError:
            return
        for namespace, name, dimensions, values, unit in emf_datapoints(record):
            for value in values:
                self.add(namespace, name, dimensions, value, unit)

    def flush(self) -> None:
        with self._lock:
            folded, self._folded = self._folded, {}
        now = datetime.now(UTC)
        by_namespace: dict[str, list[Any]] = {}
        for (namespace, name, dimensions), points in folded.items():
            by_namespace.setdefault(namespace, []).append(
                {
                    "MetricName": name,
                    "Dimensions": [{"Name": key, "Value": value} for key, value in dimensions],
                    "Timestamp": now,
                    "Unit": points.unit,
                    "StatisticValues": {
                        "SampleCount": points.count,
                        "Sum": points.total,
                        "Minimum": points.low,
                        "Maximum": points.high,
                    },
                }
            )
        for namespace, datums in by_namespace.items():
            for start in range(0, len(datums), MAX_DATUMS):
                self._cloudwatch.put_metric_data(
                    Namespace=namespace, MetricData=datums[start : start + MAX_DATUMS]
                )

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(FLUSH_S):
            try:
                self.flush()
            except Exception as error:  # the endpoint stopping first; the next flush tries again
                if not stop.is_set():
                    print(f"[metrics] not sent: {error!r}", flush=True)


def emf_datapoints(record: dict[str, Any]) -> Iterable[tuple[str, str, Dimensions, Sequence[float], str]]:
    """Each metric of an embedded-metric-format object under each of its dimension sets, as
    CloudWatch reads them: the values from the object's member of the metric's name (a number or
    a list of numbers), the dimensions' values from its members of theirs."""
    directive = record.get("_aws")
    if not isinstance(directive, dict):
        return
    for group in directive.get("CloudWatchMetrics") or []:
        namespace = group.get("Namespace")
        if not isinstance(namespace, str):
            continue
        for metric in group.get("Metrics") or []:
            name = metric.get("Name")
            raw = record.get(name)
            values = raw if isinstance(raw, list) else [raw]
            numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            if not numbers:
                continue
            for keys in group.get("Dimensions") or [[]]:
                if all(isinstance(record.get(key), str) for key in keys):
                    dimensions = tuple((key, str(record[key])) for key in keys)
                    yield namespace, name, dimensions, numbers, str(metric.get("Unit") or "None")
