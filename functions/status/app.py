"""StatusFunction: the HTTP routes that read (tasks, batches, /webhooks/secret, /health, /docs)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from llmtasks.api.app import build_app, handle
from llmtasks.observability import logger, tracer
from llmtasks.services.batches import BatchService
from llmtasks.services.tasks import TaskService
from llmtasks.wiring import api as wiring

app = build_app(queries=True, docs=True)

# What this function needs, checked as Lambda imports it: a missing variable fails the cold start.
wiring.cold_start()


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP, clear_state=True)
@tracer.capture_lambda_handler
def lambda_handler(
    event: dict[str, Any],
    context: LambdaContext,
    service: TaskService | None = None,
    batches: BatchService | None = None,
) -> dict[str, Any]:
    return handle(
        app,
        event,
        context,
        service or wiring.task_service(),
        (lambda: batches) if batches else wiring.batch_service,
        wiring.webhook_controls,  # never called: the webhook routes here only read
    )
