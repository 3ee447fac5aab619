"""The HTTP API's routes, their shared parts: the API key's security scheme, the services a route
finds in the resolver's context (put there by the handler, so tests hand in ones built on moto),
the replies and the OpenAPI responses the routes share. The routes themselves are in commands.py
(writes, served by SubmitFunction) and queries.py (reads, StatusFunction); the template maps each
path to one of them. Errors are problems.py's.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer, SecurityScheme
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel

from llmtasks.api import openai as openai_api
from llmtasks.api.problems import openapi_problem
from llmtasks.domain.batches import Batch, BatchView
from llmtasks.domain.caller import Caller
from llmtasks.domain.messages import WebhookSecret
from llmtasks.domain.models import Task, TaskView
from llmtasks.domain.usage import BatchSpend
from llmtasks.services.batches import BatchService
from llmtasks.services.tasks import TaskService
from llmtasks.services.webhook_controls import WebhookControls

# How long a client should wait between polls of a task that is not terminal yet.
RETRY_AFTER_S = 2


def takes_multipart(path: str) -> bool:
    """The routes whose body is not JSON but multipart/form-data: a file, an upload's part."""
    return path == "/v1/files" or (path.startswith("/v1/uploads/") and path.endswith("/parts"))


# Routes anyone may call (template.yaml: Auth: Authorizer: NONE); the provider's webhook is
# verified by its signature instead.
PUBLIC_ROUTES = frozenset({"GET /health", "GET /docs", "GET /openapi.json", "POST /provider-webhooks/openai"})


# The API key comes in Authorization (template.yaml: the identity source of the Api's authorizer).
SECURITY_SCHEMES: dict[str, SecurityScheme] = {
    "bearer": HTTPBearer(bearerFormat="lt_<key id>_<secret>", description="Authorization: Bearer <API key>"),
}


SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


AUTH_RESPONSES: dict[int, OpenAPIResponse] = {
    **openai_api.GATEWAY_REFUSALS,
    429: openapi_problem(
        "This key's requests a second, or its tasks in flight, are at its limit; or (type"
        " .../budget_exhausted) its budget has no room for the task's most cost (see Retry-After)"
    ),
}


SECRET_RESPONSES: dict[int, OpenAPIResponse] = {
    **AUTH_RESPONSES,
    200: {"description": "The signing secret", "content": {"application/json": {"model": WebhookSecret}}},
}


BATCH_RESPONSES: dict[int, OpenAPIResponse] = {
    **AUTH_RESPONSES,
    200: {
        "description": "The batch's status and counts",
        "content": {"application/json": {"model": BatchView}},
    },
    404: openapi_problem("Unknown, expired or another tenant's batch"),
}


STATUS_RESPONSES: dict[int, OpenAPIResponse] = {
    **AUTH_RESPONSES,
    200: {"description": "The task's status object", "content": {"application/json": {"model": TaskView}}},
    404: openapi_problem("Unknown, expired or another tenant's task"),
    422: openapi_problem("An invalid parameter"),
}


def service_of(app: APIGatewayHttpResolver) -> TaskService:
    service: TaskService = app.context["service"]
    return service


def batches_of(app: APIGatewayHttpResolver) -> BatchService:
    # Built by the handler's provider on the first batch request: most requests are tasks'.
    batches: BatchService = app.context["batches"]()
    return batches


def webhooks_of(app: APIGatewayHttpResolver) -> WebhookControls:
    webhooks: WebhookControls = app.context["webhooks"]()
    return webhooks


def caller_of(app: APIGatewayHttpResolver) -> Caller:
    caller: Caller = app.context["caller"]
    return caller


def tenant_of(app: APIGatewayHttpResolver) -> str:
    return caller_of(app).tenant_id


def json_reply(model: BaseModel, status: int, headers: dict[str, str] | None = None) -> Response[Any]:
    # The model itself, not its JSON: Powertools validates it against the route's declared type.
    return Response(status_code=status, content_type="application/json", body=model, headers=headers or {})


def _polled(view: BaseModel, *, ended: bool) -> Response[Any]:
    """A status object, telling a client that polls when to look again while it has not ended."""
    return json_reply(view, 200, {} if ended else {"Retry-After": str(RETRY_AFTER_S)})


def status_reply(task: Task) -> Response[TaskView]:
    return _polled(TaskView.of(task), ended=task.status.is_terminal)


def batch_reply(batch: Batch, spend: BatchSpend | None = None) -> Response[BatchView]:
    return _polled(BatchView.of(batch, spend), ended=batch.status.is_terminal)
