"""The single logger, tracer and metrics every module uses (Powertools).

Log lines carry keys (`task_id`, `tenant_id`, ...), never the prompt, the result or a key.

Traces: one X-Ray trace follows a task from its submit request to its LLM call and its webhook.
The submit's trace header is kept on the task and sent with each message about it (SQS's
AWSTraceHeader system attribute, from which Lambda continues the trace in the function the
queue triggers); the lines that say what happened to the task carry its `trace_id`. The LLM
call is a subsegment; DynamoDB, SQS and S3 calls are subsegments through the Tracer's botocore
patch.

Metrics are CloudWatch embedded metric format (EMF) records on stdout, namespace `llmtasks`,
each under two dimension sets: `service` alone (what the alarms and the dashboard's totals
read) and, where a task is concerned, `service`, `model`, `priority` (failures also
`error_code`). Each is written as it happens, by a Powertools EMF provider of its own: one
invocation of the worker runs several tasks with different models, and the shared metric set
flushed at the end of it could hold only one set of dimensions.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider
from aws_lambda_powertools.tracing.base import BaseProvider, BaseSegment

if TYPE_CHECKING:
    from llmtasks.domain.models import Task

SERVICE = "llmtasks"
NAMESPACE = "llmtasks"


class _UntracedSegment(BaseSegment):
    def close(self, end_time: int | None = None) -> None: ...
    def add_subsegment(self, subsegment: Any) -> None: ...
    def remove_subsegment(self, subsegment: Any) -> None: ...
    def put_annotation(self, key: str, value: Any) -> None: ...
    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None: ...
    def add_exception(self, exception: BaseException, stack: Any, remote: bool = False) -> None: ...


class UntracedProvider(BaseProvider):
    """The Tracer's provider where tracing is off (POWERTOOLS_TRACE_DISABLED, as the local stack
    sets it, SAM's emulator, outside Lambda): Powertools builds X-Ray's recorder even then, and
    the recorder's sampling connector loads botocore's models for two X-Ray clients at import,
    a large part of a function's cold start. Where tracing is on (in
    Lambda, with the template's `Tracing: Active`), the Tracer keeps X-Ray's own."""

    @contextmanager
    def in_subsegment(self, name: str | None = None, **kwargs: Any) -> Iterator[BaseSegment]:
        yield _UntracedSegment()

    @asynccontextmanager
    async def in_subsegment_async(self, name: str | None = None, **kwargs: Any) -> Any:
        yield _UntracedSegment()

    def put_annotation(self, key: str, value: Any) -> None: ...
    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None: ...
    def patch(self, modules: Sequence[str]) -> None: ...
    def patch_all(self) -> None: ...


logger = Logger(service=SERVICE)
# Powertools' own test of whether tracing is off (its env var, an emulator's, outside Lambda).
tracer = Tracer(service=SERVICE, provider=UntracedProvider() if Tracer._is_tracer_disabled() else None)


def trace_header(request_headers: Mapping[str, str] | None = None) -> str | None:
    """This invocation's X-Ray trace header: Lambda's own (`_X_AMZN_TRACE_ID`), else the one
    API Gateway put on the request (the local stack puts one there as well)."""
    own = os.environ.get("_X_AMZN_TRACE_ID")
    if own:
        return own
    headers = {name.lower(): value for name, value in (request_headers or {}).items()}
    return headers.get("x-amzn-trace-id")


def trace_id(header: str | None) -> str | None:
    """The trace's id (its Root) in a header such as `Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1`."""
    for part in (header or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == "Root" and value:
            return value
    return None


def task_keys(task: Task) -> dict[str, Any]:
    """The keys of every log line about a task: its id, tenant, batch and trace."""
    keys: dict[str, Any] = {"task_id": task.task_id, "tenant_id": task.tenant_id}
    if task.batch_id:
        keys["batch_id"] = task.batch_id
    if trace := trace_id(task.trace_header):
        keys["trace_id"] = trace
    return keys


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
    LLM_COST = "LlmCostUsd"  # one billed call, USD from the price table, by model and tenant
    END_TO_END = "EndToEndLatency"  # submit to completion, seconds
    WEBHOOK_ATTEMPTS = "WebhookAttempts"
    WEBHOOK_FAILURES = "WebhookFailures"  # attempts that did not deliver
    WEBHOOK_DEFERRALS = "WebhookDeferrals"  # events put off: their endpoint had every place taken
    # Webhook URLs disabled: they failed for WebhookEndpointDisableAfterSeconds with no success.
    WEBHOOK_ENDPOINTS_DISABLED = "WebhookEndpointsDisabled"
    RUN_STEPS = "RunSteps"  # a run's steps, by kind (model_call, tool_call)
    TOOL_CALLS = "ToolCalls"  # a run's tool calls, by source (endpoint, client, unknown)
    TOOL_CALL_ERRORS = "ToolCallErrors"  # those that failed, by source


def emit(
    name: str, value: float = 1, unit: MetricUnit = MetricUnit.Count, /, **dimensions: str | None
) -> None:
    """One metric, written now as its own EMF record; dimensions given as None are left out."""
    _record(name, value, unit, dimensions, {})


def emit_noted(name: str, noted: Mapping[str, str], /, **dimensions: str | None) -> None:
    """One count, as `emit` writes it, with `noted` in the record and not in its dimensions:
    searchable in Logs Insights, with no metric of its own for each value (a name a tenant
    chooses, say)."""
    _record(name, 1, MetricUnit.Count, dimensions, noted)


def _record(
    name: str, value: float, unit: MetricUnit, dimensions: Mapping[str, str | None], noted: Mapping[str, str]
) -> None:
    record = AmazonCloudWatchEMFProvider(namespace=NAMESPACE, service=SERVICE)
    record.add_metric(name=name, unit=unit, value=value)
    detail = {key: str(value) for key, value in dimensions.items() if value is not None}
    if detail:
        record.add_dimensions(service=SERVICE, **detail)
    for key, text in noted.items():
        record.add_metadata(key=key, value=text)
    record.flush_metrics()
