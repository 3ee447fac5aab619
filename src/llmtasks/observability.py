"""The single logger, tracer and metrics every module uses (Powertools).

Log lines carry keys (`task_id`, `tenant_id`, ...), never the prompt, the result or a key.

Metrics are CloudWatch embedded metric format (EMF) records on stdout, namespace `llmtasks`,
each with the dimensions `service` and, where a task is concerned, `model` and `priority`
(failures also `error_code`). Each is written as it happens (Powertools' single_metric): one
invocation of the worker runs several tasks with different models, and a metric set flushed at
the end of it could hold only one set of dimensions.
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.metrics import MetricUnit, single_metric

SERVICE = "llmtasks"
NAMESPACE = "llmtasks"

logger = Logger(service=SERVICE)
tracer = Tracer(service=SERVICE)


class Metric:
    """The names the template's dashboard and alarms read."""

    SUBMITTED = "TasksSubmitted"
    COMPLETED = "TasksCompleted"
    FAILED = "TasksFailed"
    CANCELLED = "TasksCancelled"
    DEAD_LETTERED = "TasksDeadLettered"
    QUEUE_WAIT = "QueueWait"  # submit to first claim, seconds
    LLM_LATENCY = "LlmLatency"  # one call, milliseconds
    LLM_TOKENS = "LlmTokens"
    END_TO_END = "EndToEndLatency"  # submit to completion, seconds
    WEBHOOK_ATTEMPTS = "WebhookAttempts"
    WEBHOOK_FAILURES = "WebhookFailures"  # attempts that did not deliver


def emit(
    name: str, value: float = 1, unit: MetricUnit = MetricUnit.Count, /, **dimensions: str | None
) -> None:
    """One metric, written now as its own EMF record; dimensions given as None are left out."""
    with single_metric(
        name=name, unit=unit, value=value, namespace=NAMESPACE, default_dimensions={"service": SERVICE}
    ) as metric:
        for dimension, dimension_value in dimensions.items():
            if dimension_value is not None:
                metric.add_dimension(dimension, str(dimension_value))
