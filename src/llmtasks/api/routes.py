"""The HTTP API: routes (as Powertools routers) and the OpenAPI document; errors are problems.py's.

`commands` (writes) is served by SubmitFunction and `queries` (reads) by StatusFunction; the
template maps each path to one of them. Routes find their `TaskService` in the resolver's
context, put there by the handler, so tests hand in one built on moto.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer, SecurityScheme
from aws_lambda_powertools.event_handler.openapi.params import Header, Query
from aws_lambda_powertools.event_handler.openapi.types import (
    OpenAPIResponse,
)
from pydantic import BaseModel

from llmtasks import __version__
from llmtasks.api import openai as openai_api
from llmtasks.api.problems import (
    backend_unavailable,
    malformed_json,
    on_api_error,
    on_backend_error,
    on_not_found,
    on_unexpected,
    on_validation_error,
    openapi_problem,
    unexpected,
)
from llmtasks.aws.limits import Caller
from llmtasks.aws.limits import caller_of as caller_of_event
from llmtasks.domain.batches import Batch, BatchAccepted, BatchResults, BatchView, SubmitBatchRequest
from llmtasks.domain.errors import ApiError, BackendError, Unauthorized
from llmtasks.domain.messages import WebhookSecret
from llmtasks.domain.models import (
    Health,
    SubmitTaskRequest,
    Task,
    TaskAccepted,
    TaskList,
    TaskStatus,
    TaskView,
)
from llmtasks.observability import trace_header
from llmtasks.services.batches import BatchService
from llmtasks.services.tasks import TaskService

# How long a client should wait between polls of a task that is not terminal yet.
RETRY_AFTER_S = 2
MAX_WAIT_S = 25
MAX_LIST_LIMIT = 100
MAX_RESULTS_LIMIT = 1000
JSONL = "application/jsonl"
UPLOAD_PATH = "/v1/files"  # the one route whose body is not JSON (multipart/form-data)
# Routes anyone may call (template.yaml: Auth: Authorizer: NONE).
PUBLIC_ROUTES = frozenset({"GET /health", "GET /docs", "GET /openapi.json"})

# The API key comes in Authorization (template.yaml: the identity source of the Api's authorizer).
SECURITY_SCHEMES: dict[str, SecurityScheme] = {
    "bearer": HTTPBearer(bearerFormat="lt_<key id>_<secret>", description="Authorization: Bearer <API key>"),
}
SECURITY: list[dict[str, list[str]]] = [{"bearer": []}]


_AUTH: dict[int, OpenAPIResponse] = {
    **openai_api.GATEWAY_REFUSALS,
    429: openapi_problem(
        "This key's requests a second, or its tasks in flight, are at its limit (see Retry-After)"
    ),
}

_SECRET: dict[int, OpenAPIResponse] = {
    **_AUTH,
    200: {"description": "The signing secret", "content": {"application/json": {"model": WebhookSecret}}},
}
_BATCH: dict[int, OpenAPIResponse] = {
    **_AUTH,
    200: {
        "description": "The batch's status and counts",
        "content": {"application/json": {"model": BatchView}},
    },
    404: openapi_problem("Unknown, expired or another tenant's batch"),
}
_STATUS: dict[int, OpenAPIResponse] = {
    **_AUTH,
    200: {"description": "The task's status object", "content": {"application/json": {"model": TaskView}}},
    404: openapi_problem("Unknown, expired or another tenant's task"),
    422: openapi_problem("An invalid parameter"),
}


def _service(app: APIGatewayHttpResolver) -> TaskService:
    service: TaskService = app.context["service"]
    return service


def _batches(app: APIGatewayHttpResolver) -> BatchService:
    # Built by the handler's provider on the first batch request: most requests are tasks'.
    batches: BatchService = app.context["batches"]()
    return batches


def caller_of(app: APIGatewayHttpResolver) -> Caller:
    caller: Caller = app.context["caller"]
    return caller


def tenant_of(app: APIGatewayHttpResolver) -> str:
    return caller_of(app).tenant_id


def _admitted(event: dict[str, Any], service: TaskService) -> Caller:
    """The caller the Api's authorizer let through (API Gateway itself refused the others),
    counted against its key's requests a second."""
    caller = caller_of_event(event)
    if caller is None:
        # Only a route deployed without the authorizer gets here: refuse rather than guess.
        raise Unauthorized("This request did not pass the API's authorizer.")
    if service.limits is not None:
        service.limits.count_request(caller)
    return caller


def _json(model: BaseModel, status: int, headers: dict[str, str] | None = None) -> Response[Any]:
    # The model itself, not its JSON: Powertools validates it against the route's declared type.
    return Response(status_code=status, content_type="application/json", body=model, headers=headers or {})


def _polled(view: BaseModel, *, ended: bool) -> Response[Any]:
    """A status object, telling a client that polls when to look again while it has not ended."""
    return _json(view, 200, {} if ended else {"Retry-After": str(RETRY_AFTER_S)})


def _accepted(accepted: BaseModel, location: str, *, replayed: bool) -> Response[Any]:
    """The 202 of a submit: where to poll, how soon, and whether an Idempotency-Key replayed it."""
    headers = {"Location": location, "Retry-After": str(RETRY_AFTER_S)}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return _json(accepted, 202, headers)


def _status_reply(task: Task) -> Response[TaskView]:
    return _polled(TaskView.of(task), ended=task.status.is_terminal)


def _batch_reply(batch: Batch) -> Response[BatchView]:
    return _polled(BatchView.of(batch), ended=batch.status.is_terminal)


_IDEMPOTENCY_KEY = Header(
    alias="idempotency-key",
    min_length=1,
    max_length=255,
    description="Sent again with the same body, it returns the same resource instead of a new one",
)


def add_commands(app: APIGatewayHttpResolver) -> None:
    """Routes that change state (SubmitFunction)."""

    @app.post(
        "/tasks",
        status_code=202,
        summary="Submit a task",
        security=SECURITY,
        responses={
            **_AUTH,
            202: {"description": "Accepted", "content": {"application/json": {"model": TaskAccepted}}},
            400: openapi_problem("The body is not valid JSON"),
            409: openapi_problem("A request with this Idempotency-Key is still being processed"),
            413: openapi_problem("The prompt is over the size limit"),
            422: openapi_problem(
                "A field is missing, unknown or invalid, or the Idempotency-Key was used with another body"
            ),
            503: openapi_problem("The task could not be queued; nothing was stored"),
        },
    )
    def submit_task(
        body: SubmitTaskRequest, idempotency_key: Annotated[str | None, _IDEMPOTENCY_KEY] = None
    ) -> Response[TaskAccepted]:
        trace = trace_header(app.current_event.headers)
        caller = caller_of(app)
        submission = _service(app).submit(
            caller.tenant_id, body, idempotency_key=idempotency_key, trace_header=trace, caller=caller
        )
        task = submission.task
        return _accepted(TaskAccepted.of(task), f"/tasks/{task.task_id}", replayed=submission.replayed)

    @app.post(
        "/tasks/<task_id>/cancel",
        summary="Cancel a pending or processing task",
        security=SECURITY,
        responses={**_STATUS, 409: openapi_problem("The task is already terminal")},
    )
    def cancel_task(task_id: str) -> Response[TaskView]:
        return _status_reply(_service(app).cancel(tenant_of(app), task_id))

    @app.post(
        "/batches",
        status_code=202,
        summary="Submit a batch: up to 10,000 task bodies run as one job",
        security=SECURITY,
        responses={
            **_AUTH,
            202: {"description": "Accepted", "content": {"application/json": {"model": BatchAccepted}}},
            400: openapi_problem("The body is not valid JSON"),
            409: openapi_problem("A request with this Idempotency-Key is still being processed"),
            413: openapi_problem("An item's prompt is over the size limit"),
            422: openapi_problem(
                "An item or field is invalid, or the Idempotency-Key was used with another body"
            ),
            503: openapi_problem("The batch could not be stored or queued"),
        },
    )
    def submit_batch(
        body: SubmitBatchRequest, idempotency_key: Annotated[str | None, _IDEMPOTENCY_KEY] = None
    ) -> Response[BatchAccepted]:
        trace = trace_header(app.current_event.headers)
        caller = caller_of(app)
        submission = _batches(app).submit(
            caller.tenant_id, body, idempotency_key=idempotency_key, trace_header=trace, caller=caller
        )
        batch = submission.batch
        return _accepted(BatchAccepted.of(batch), f"/batches/{batch.batch_id}", replayed=submission.replayed)

    @app.post(
        "/batches/<batch_id>/cancel",
        summary="Cancel a batch: pending items are cancelled, running ones finish or are discarded",
        security=SECURITY,
        responses={**_BATCH, 409: openapi_problem("The batch has ended already")},
    )
    def cancel_batch(batch_id: str) -> Response[BatchView]:
        return _batch_reply(_batches(app).cancel(tenant_of(app), batch_id))

    @app.post(
        "/webhooks/secret/rotate",
        summary="Replace the webhook signing secret; the old one keeps signing, beside it, for 24 h",
        security=SECURITY,
        responses=_SECRET,
    )
    def rotate_webhook_secret() -> WebhookSecret:
        return _service(app).rotate_webhook_secret(tenant_of(app))


def add_queries(app: APIGatewayHttpResolver) -> None:
    """Routes that only read (StatusFunction)."""

    @app.get(
        "/tasks",
        summary="The tenant's tasks, newest first",
        security=SECURITY,
        responses={
            **_AUTH,
            200: {"description": "A page of tasks", "content": {"application/json": {"model": TaskList}}},
            422: openapi_problem(
                "An invalid parameter (an unknown status, a limit out of range, a foreign cursor)"
            ),
        },
    )
    def list_tasks(
        status: Annotated[TaskStatus | None, Query(description="Only tasks in this status")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description="Tasks per page")] = 20,
        cursor: Annotated[
            str | None, Query(max_length=2048, description="next_cursor of the previous page")
        ] = None,
    ) -> Response[TaskList]:
        tasks, next_cursor = _service(app).list_tasks(
            tenant_of(app), status=status, limit=limit, cursor=cursor
        )
        views = [TaskView.of(task).model_copy(update={"result": None}) for task in tasks]
        return _json(TaskList(data=views, next_cursor=next_cursor), 200)

    @app.get(
        "/tasks/<task_id>",
        summary="A task's status and, once completed, its result",
        security=SECURITY,
        responses=_STATUS,
    )
    def get_task(
        task_id: str,
        wait: Annotated[
            int, Query(ge=0, le=MAX_WAIT_S, description="Hold the reply up to N s until the task is terminal")
        ] = 0,
    ) -> Response[TaskView]:
        return _status_reply(_service(app).get(tenant_of(app), task_id, wait_s=wait))

    @app.get(
        "/batches/<batch_id>",
        summary="A batch's status and exact counts by item status",
        security=SECURITY,
        responses=_BATCH,
    )
    def get_batch(batch_id: str) -> Response[BatchView]:
        return _batch_reply(_batches(app).get(tenant_of(app), batch_id))

    @app.get(
        "/batches/<batch_id>/results",
        summary="A batch's items in submission order, with their results or errors",
        security=SECURITY,
        responses={
            **_AUTH,
            200: {
                "description": "A page of items (JSON), or with format=jsonl one JSON object a line",
                "content": {
                    "application/json": {"model": BatchResults},
                    JSONL: {"schema": {"type": "string"}},
                },
            },
            404: openapi_problem("Unknown, expired or another tenant's batch"),
            422: openapi_problem("An invalid parameter"),
        },
    )
    def batch_results(
        batch_id: str,
        limit: Annotated[int, Query(ge=1, le=MAX_RESULTS_LIMIT, description="Items per page")] = 100,
        cursor: Annotated[
            str | None, Query(max_length=2048, description="next_cursor of the previous page")
        ] = None,
        format: Annotated[
            Literal["json", "jsonl"], Query(description="jsonl: one JSON object a line")
        ] = "json",
    ) -> Response[Any]:
        rows, next_cursor = _batches(app).results(tenant_of(app), batch_id, limit=limit, cursor=cursor)
        if format == "json":
            return _json(BatchResults(data=rows, next_cursor=next_cursor), 200)
        headers = {}
        if next_cursor is not None:
            # RFC 8288: the next page, as a client following links would read it.
            query = urlencode({"format": "jsonl", "limit": limit, "cursor": next_cursor})
            headers["Link"] = f'</batches/{batch_id}/results?{query}>; rel="next"'
        body = "".join(row.model_dump_json() + "\n" for row in rows)
        return Response(status_code=200, content_type=JSONL, body=body, headers=headers)

    @app.get(
        "/webhooks/secret",
        summary="The tenant's webhook signing secret (Standard Webhooks)",
        security=SECURITY,
        responses=_SECRET,
    )
    def get_webhook_secret() -> WebhookSecret:
        return _service(app).webhook_secret(tenant_of(app))

    @app.get("/health", summary="Liveness")
    def health() -> Health:
        return Health(version=__version__)


def build_app(*, commands: bool = False, queries: bool = False, docs: bool = False) -> APIGatewayHttpResolver:
    """A resolver with the chosen routes; `docs` adds /docs and /openapi.json describing all of them.
    The /v1 routes (openai_api) answer errors in OpenAI's shape, the others in problem+json."""
    app = APIGatewayHttpResolver(enable_validation=True)
    if commands or docs:
        add_commands(app)
        openai_api.add_commands(app, _service, _batches, caller_of, SECURITY)
    if queries or docs:
        add_queries(app)
        openai_api.add_queries(app, _service, _batches, tenant_of, SECURITY)

    def shaped(native: Callable[[Any], Response[Any]], openai: Callable[[Any], Response[Any]]) -> Any:
        def answer(exc: Any) -> Response[Any]:
            return openai(exc) if openai_api.is_openai_path(app.current_event.path) else native(exc)

        return answer

    app.exception_handler(ApiError)(shaped(on_api_error, openai_api.from_api_error))
    app.exception_handler(RequestValidationError)(
        shaped(on_validation_error, openai_api.from_validation_error)
    )
    app.exception_handler(BackendError)(
        shaped(on_backend_error, lambda exc: openai_api.from_api_error(backend_unavailable(exc)))
    )
    app.not_found(shaped(on_not_found, lambda _: openai_api.error(404, "No such route.", code="not_found")))
    app.exception_handler(Exception)(
        shaped(
            on_unexpected,
            lambda exc: unexpected(exc, openai_api.error(500, "Something went wrong on our side.")),
        )
    )
    if docs:
        description = "Long LLM calls, asynchronously: submit, then poll or receive a signed webhook."
        app.enable_swagger(
            path="/docs",
            title="llmtasks",
            version=__version__,
            description=description,
            security_schemes=SECURITY_SCHEMES,
        )

        @app.get("/openapi.json", include_in_schema=False)
        def openapi_json() -> Response[str]:
            schema = app.get_openapi_json_schema(
                title="llmtasks",
                version=__version__,
                description=description,
                security_schemes=SECURITY_SCHEMES,
            )
            return Response(status_code=200, content_type="application/json", body=schema)

    return app


def handle(
    app: APIGatewayHttpResolver,
    event: dict[str, Any],
    context: Any,
    service: TaskService,
    batches: Callable[[], BatchService],
) -> dict[str, Any]:
    """One HTTP invocation: the routes read `service` and `batches` (a provider, called by the
    batch routes alone) from the resolver's context."""
    headers = event.get("headers") or {}
    openai_shaped = openai_api.is_openai_path(event.get("rawPath") or "")
    if event.get("body") and event.get("isBase64Encoded"):
        # API Gateway base64-encodes bodies it does not take for text; JSON must be UTF-8.
        try:
            event = {**event, "body": base64.b64decode(event["body"]).decode(), "isBase64Encoded": False}
        except (ValueError, UnicodeDecodeError):
            return _lambda_reply(
                openai_api.error(400, "The request body is not valid UTF-8.", code="invalid_json")
                if openai_shaped
                else malformed_json()
            )
    if (
        (event.get("body") or headers.get("content-type"))
        and "json" not in headers.get("content-type", "")
        and event.get("rawPath") != UPLOAD_PATH
    ):
        # Bodies are JSON whatever the client labels them: `curl -d '{...}'` sends a form type
        # (an upload's multipart body is the one that is not). An empty body labelled otherwise
        # is a JSON body missing, not an unsupported content type.
        event = {**event, "headers": {**headers, "content-type": "application/json"}}
    if service.idempotency is not None:
        service.idempotency.register_lambda_context(context)
    caller = Caller(tenant_id="")  # the public routes read no tenant
    if event.get("routeKey") not in PUBLIC_ROUTES:
        try:
            caller = _admitted(event, service)
        except (ApiError, BackendError) as exc:
            # Before any route runs, so a refused caller learns nothing about its body.
            refused = backend_unavailable(exc) if isinstance(exc, BackendError) else exc
            return _lambda_reply(
                openai_api.from_api_error(refused) if openai_shaped else on_api_error(refused)
            )
    app.append_context(service=service, batches=batches, caller=caller)  # type: ignore[no-untyped-call]
    return app.resolve(event, context)


def _lambda_reply(response: Response[Any]) -> dict[str, Any]:
    body = response.body if isinstance(response.body, str) else json.dumps(response.body)
    return {"statusCode": response.status_code, "headers": dict(response.headers), "body": body}
