"""The HTTP API: routes (as Powertools routers) and the OpenAPI document; errors are problems.py's.

`commands` (writes) is served by SubmitFunction and `queries` (reads) by StatusFunction; the
template maps each path to one of them. Routes find their `TaskService` in the resolver's
context, put there by the handler, so tests hand in one built on moto.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer, SecurityScheme
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.openapi.types import (
    OpenAPIResponse,
)
from pydantic import BaseModel

from llmtasks import __version__
from llmtasks.api import openai as openai_api
from llmtasks.api.files import file_reply
from llmtasks.api.problems import (
    openapi_problem,
)
from llmtasks.domain.batches import (
    Batch,
    BatchAccepted,
    BatchEventPage,
    BatchResults,
    BatchUpload,
    BatchView,
    RetryBatchRequest,
    SubmitBatchRequest,
)
from llmtasks.domain.caller import Caller
from llmtasks.domain.cursors import RESULTS_CURSOR_PATTERN, TASKS_CURSOR_PATTERN
from llmtasks.domain.messages import WebhookSecret
from llmtasks.domain.models import (
    WEBHOOK_ATTEMPTS_CURSOR_PATTERN,
    EnableWebhookEndpoint,
    Health,
    SubmitTaskRequest,
    Task,
    TaskAccepted,
    TaskList,
    TaskStatus,
    TaskView,
    WebhookAttemptList,
    WebhookEndpoint,
    WebhookReplay,
)
from llmtasks.domain.output import TaskOutputPage
from llmtasks.domain.usage import BatchSpend, Day, GroupBy, UsageReport
from llmtasks.observability import trace_header
from llmtasks.services.batches import BatchService
from llmtasks.services.tasks import TaskService
from llmtasks.services.webhook_controls import WebhookControls

# How long a client should wait between polls of a task that is not terminal yet.
RETRY_AFTER_S = 2
MAX_WAIT_S = 25
# A chunk is a progress write (one each 2 s): a task has a few thousand in its longest call; a
# batch has an event per count of its items, at most two per item.
MAX_OUTPUT_SEQUENCE = 10_000_000
MAX_LIST_LIMIT = 100
MAX_RESULTS_LIMIT = 1000
JSONL = "application/jsonl"


def takes_multipart(path: str) -> bool:
    """The routes whose body is not JSON but multipart/form-data: a file, an upload's part."""
    return path == "/v1/files" or (path.startswith("/v1/uploads/") and path.endswith("/parts"))


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
        "This key's requests a second, or its tasks in flight, are at its limit; or (type"
        " .../budget_exhausted) its budget has no room for the task's most cost (see Retry-After)"
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


_ATTEMPTS: dict[int, OpenAPIResponse] = {
    **_AUTH,
    200: {
        "description": "A page of the webhook's attempts, newest first",
        "content": {"application/json": {"model": WebhookAttemptList}},
    },
    422: openapi_problem("An invalid parameter (a limit out of range, a cursor off its pattern)"),
}
_REPLAY: dict[int, OpenAPIResponse] = {
    **_AUTH,
    202: {
        "description": "The event is queued for one attempt now, with its own webhook-id",
        "content": {"application/json": {"model": WebhookReplay}},
    },
    409: openapi_problem(
        "No event to replay: no webhook_url, not ended yet, an event its webhook_events leave out,"
        " a URL the SSRF guard refuses now, or a disabled URL"
    ),
}


def _attempts_page(log_of: Task | Batch, limit: int, cursor: str | None) -> Response[WebhookAttemptList]:
    return _json(WebhookAttemptList.page(log_of.webhook_log, limit=limit, cursor=cursor), 200)


AttemptsLimit = Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description="Attempts per page")]
AttemptsCursor = Annotated[
    str | None,
    Query(pattern=WEBHOOK_ATTEMPTS_CURSOR_PATTERN, description="next_cursor of the previous page (opaque)"),
]


def _status_reply(task: Task) -> Response[TaskView]:
    return _polled(TaskView.of(task), ended=task.status.is_terminal)


def _batch_reply(batch: Batch, spend: BatchSpend | None = None) -> Response[BatchView]:
    return _polled(BatchView.of(batch, spend), ended=batch.status.is_terminal)


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
        body: SubmitTaskRequest, idempotency_key: Annotated[str | None, openai_api.IDEMPOTENCY_KEY] = None
    ) -> Response[TaskAccepted]:
        trace = trace_header(app.current_event.headers)
        caller = caller_of(app)
        submission = service_of(app).submit(
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
        return _status_reply(service_of(app).cancel(tenant_of(app), task_id))

    @app.post(
        "/batches",
        status_code=202,
        summary="Submit a batch: up to 100,000 task bodies run as one job (inline, or an uploaded file)",
        security=SECURITY,
        responses={
            **_AUTH,
            202: {"description": "Accepted", "content": {"application/json": {"model": BatchAccepted}}},
            400: openapi_problem("The body is not valid JSON"),
            404: openapi_problem("No input file of this id (never uploaded, expired, or another tenant's)"),
            409: openapi_problem("A request with this Idempotency-Key is still being processed"),
            413: openapi_problem("An item's prompt is over the size limit, or the input file over 256 MiB"),
            422: openapi_problem(
                "An item or field is invalid, the input file does not begin as JSON Lines, or the"
                " Idempotency-Key was used with another body"
            ),
            503: openapi_problem("The batch could not be stored or queued"),
        },
    )
    def submit_batch(
        body: SubmitBatchRequest, idempotency_key: Annotated[str | None, openai_api.IDEMPOTENCY_KEY] = None
    ) -> Response[BatchAccepted]:
        trace = trace_header(app.current_event.headers)
        caller = caller_of(app)
        submission = batches_of(app).submit(
            caller.tenant_id, body, idempotency_key=idempotency_key, trace_header=trace, caller=caller
        )
        batch = submission.batch
        return _accepted(BatchAccepted.of(batch), f"/batches/{batch.batch_id}", replayed=submission.replayed)

    @app.post(
        "/batches/uploads",
        status_code=201,
        summary="Where to upload a batch's input file (JSON Lines of items, up to 256 MiB)",
        description="Answers a presigned URL: PUT the file there (its bytes go straight to storage,"
        " never through the API, so no request limit applies), then POST /batches with"
        " `input_file_id`. A URL never used expires and leaves nothing.",
        security=SECURITY,
        responses={
            **_AUTH,
            201: {
                "description": "The upload's URL and file id",
                "content": {"application/json": {"model": BatchUpload}},
            },
        },
    )
    def create_batch_upload() -> Response[BatchUpload]:
        return _json(batches_of(app).create_upload(tenant_of(app)), 201)

    @app.post(
        "/batches/<batch_id>/cancel",
        summary="Cancel a batch: pending items are cancelled, running ones finish or are discarded",
        security=SECURITY,
        responses={**_BATCH, 409: openapi_problem("The batch has ended already")},
    )
    def cancel_batch(batch_id: str) -> Response[BatchView]:
        return _batch_reply(batches_of(app).cancel(tenant_of(app), batch_id))

    @app.post(
        "/batches/<batch_id>/retry",
        status_code=202,
        summary="Run an ended batch's failed (or cancelled) items again, in the same batch",
        security=SECURITY,
        responses={
            **_AUTH,
            202: {
                "description": "The retry is under way: the batch, pending until the items end",
                "content": {"application/json": {"model": BatchView}},
            },
            400: openapi_problem("The body is not valid JSON"),
            404: openapi_problem("Unknown, expired or another tenant's batch"),
            409: openapi_problem("The batch has not ended, or has no items of those statuses"),
            422: openapi_problem("An invalid body (an unknown status)"),
            503: openapi_problem("The retry could not be queued; nothing changed"),
        },
    )
    def retry_batch(
        batch_id: str,
        body: RetryBatchRequest | None = None,
        idempotency_key: Annotated[str | None, openai_api.IDEMPOTENCY_KEY] = None,
    ) -> Response[BatchView]:
        batch, replayed = batches_of(app).retry(
            tenant_of(app), batch_id, body or RetryBatchRequest(), idempotency_key=idempotency_key
        )
        return _accepted(BatchView.of(batch), f"/batches/{batch_id}", replayed=replayed)

    @app.post(
        "/tasks/<task_id>/webhook/replay",
        status_code=202,
        summary="Send a task's webhook event again now (same webhook-id, fresh signature)",
        security=SECURITY,
        responses={**_REPLAY, 404: openapi_problem("Unknown, expired or another tenant's task")},
    )
    def replay_task_webhook(task_id: str) -> Response[WebhookReplay]:
        task = service_of(app).owned(tenant_of(app), task_id)
        return _json(webhooks_of(app).replay_task(task), 202)

    @app.post(
        "/batches/<batch_id>/webhook/replay",
        status_code=202,
        summary="Send a batch's webhook event again now (same webhook-id, fresh signature)",
        security=SECURITY,
        responses={**_REPLAY, 404: openapi_problem("Unknown, expired or another tenant's batch")},
    )
    def replay_batch_webhook(batch_id: str) -> Response[WebhookReplay]:
        batch = batches_of(app).get(tenant_of(app), batch_id)
        return _json(webhooks_of(app).replay_batch(batch), 202)

    @app.post(
        "/webhooks/endpoints/enable",
        summary="Attempt deliveries to a disabled webhook URL of yours again",
        security=SECURITY,
        responses={
            **_AUTH,
            200: {
                "description": "The URL is enabled (it may never have been disabled)",
                "content": {"application/json": {"model": WebhookEndpoint}},
            },
            400: openapi_problem("The body is not valid JSON"),
            422: openapi_problem("The url is missing or invalid"),
        },
    )
    def enable_webhook_endpoint(body: EnableWebhookEndpoint) -> WebhookEndpoint:
        return webhooks_of(app).enable(tenant_of(app), body.url)

    @app.post(
        "/webhooks/secret/rotate",
        summary="Replace the webhook signing secret; the old one keeps signing, beside it, for 24 h",
        security=SECURITY,
        responses=_SECRET,
    )
    def rotate_webhook_secret() -> WebhookSecret:
        return service_of(app).rotate_webhook_secret(tenant_of(app))


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
                "An invalid parameter (an unknown status, a limit out of range, a cursor off its pattern)"
            ),
        },
    )
    def list_tasks(
        status: Annotated[TaskStatus | None, Query(description="Only tasks in this status")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description="Tasks per page")] = 20,
        cursor: Annotated[
            str | None,
            Query(pattern=TASKS_CURSOR_PATTERN, description="next_cursor of the previous page (opaque)"),
        ] = None,
    ) -> Response[TaskList]:
        tasks, next_cursor = service_of(app).list_tasks(
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
        return _status_reply(service_of(app).get(tenant_of(app), task_id, wait_s=wait))

    @app.get(
        "/tasks/<task_id>/output",
        summary="The task's output as numbered chunks, from any point, held until there is more",
        security=SECURITY,
        responses={
            **_AUTH,
            200: {
                "description": "The chunks after `after` (none if the wait ran out); whether they end it",
                "content": {"application/json": {"model": TaskOutputPage}},
            },
            404: openapi_problem("Unknown, expired or another tenant's task"),
            422: openapi_problem("An invalid parameter, or `after` past the output's last chunk"),
        },
    )
    def task_output(
        task_id: str,
        after: Annotated[
            int,
            Query(
                ge=0,
                le=MAX_OUTPUT_SEQUENCE,
                description="The last chunk read (its sequence number); 0 for all",
            ),
        ] = 0,
        wait: Annotated[
            int,
            Query(
                ge=0, le=MAX_WAIT_S, description="Hold the reply up to N s until a chunk after `after` exists"
            ),
        ] = 0,
    ) -> Response[TaskOutputPage]:
        page = service_of(app).output(tenant_of(app), task_id, after=after, wait_s=wait)
        return _json(page, 200)

    @app.get(
        "/batches/<batch_id>",
        summary="A batch's status and exact counts by item status",
        security=SECURITY,
        responses=_BATCH,
    )
    def get_batch(batch_id: str) -> Response[BatchView]:
        batches = batches_of(app)
        batch = batches.get(tenant_of(app), batch_id)
        return _batch_reply(batch, batches.spend(batch.batch_id))

    @app.get(
        "/batches/<batch_id>/refused",
        summary="The lines of a batch's input file that are not items, and why (JSON Lines)",
        security=SECURITY,
        responses={
            **_AUTH,
            200: {
                "description": "A file of JSON Lines, one a refused line: `line` (from 1), `custom_id`,"
                " `error`",
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            },
            307: {"description": "Over 4 MiB: a presigned URL to the same lines (Location)"},
            404: openapi_problem(
                "Unknown, expired or another tenant's batch; one not made from a file, or still read"
            ),
        },
    )
    def batch_refused_lines(batch_id: str) -> Response[Any]:
        data, link = batches_of(app).refused_lines(tenant_of(app), batch_id)
        # A file, as the OpenAI surface serves its files (and as client generators read one).
        return file_reply(data, link, content_type="application/octet-stream")

    @app.get(
        "/batches/<batch_id>/events",
        summary="The batch's events (items whose status moved, and the counts), held until one exists",
        security=SECURITY,
        responses={
            **_AUTH,
            200: {
                "description": "The events after `after` (none if the wait ran out); whether they end it",
                "content": {"application/json": {"model": BatchEventPage}},
            },
            404: openapi_problem("Unknown, expired or another tenant's batch"),
            422: openapi_problem("An invalid parameter, or `after` past the batch's last event"),
        },
    )
    def batch_events(
        batch_id: str,
        after: Annotated[
            int,
            Query(
                ge=0,
                le=MAX_OUTPUT_SEQUENCE,
                description="The last event read (its sequence number); 0 for all",
            ),
        ] = 0,
        wait: Annotated[
            int,
            Query(
                ge=0,
                le=MAX_WAIT_S,
                description="Hold the reply up to N s until an event after `after` exists",
            ),
        ] = 0,
    ) -> Response[BatchEventPage]:
        page = batches_of(app).events(tenant_of(app), batch_id, after=after, wait_s=wait)
        return _json(page, 200)

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
            str | None,
            Query(pattern=RESULTS_CURSOR_PATTERN, description="next_cursor of the previous page (opaque)"),
        ] = None,
        format: Annotated[
            Literal["json", "jsonl"], Query(description="jsonl: one JSON object a line")
        ] = "json",
    ) -> Response[Any]:
        rows, next_cursor = batches_of(app).results(tenant_of(app), batch_id, limit=limit, cursor=cursor)
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
        "/tasks/<task_id>/webhook/attempts",
        summary="Every HTTP attempt at a task's webhook: when, the answer or error, the latency",
        security=SECURITY,
        responses={**_ATTEMPTS, 404: openapi_problem("Unknown, expired or another tenant's task")},
    )
    def task_webhook_attempts(
        task_id: str, limit: AttemptsLimit = 20, cursor: AttemptsCursor = None
    ) -> Response[WebhookAttemptList]:
        return _attempts_page(service_of(app).owned(tenant_of(app), task_id), limit, cursor)

    @app.get(
        "/batches/<batch_id>/webhook/attempts",
        summary="Every HTTP attempt at a batch's webhook: when, the answer or error, the latency",
        security=SECURITY,
        responses={**_ATTEMPTS, 404: openapi_problem("Unknown, expired or another tenant's batch")},
    )
    def batch_webhook_attempts(
        batch_id: str, limit: AttemptsLimit = 20, cursor: AttemptsCursor = None
    ) -> Response[WebhookAttemptList]:
        return _attempts_page(batches_of(app).get(tenant_of(app), batch_id), limit, cursor)

    @app.get(
        "/webhooks/secret",
        summary="The tenant's webhook signing secret (Standard Webhooks)",
        security=SECURITY,
        responses=_SECRET,
    )
    def get_webhook_secret() -> WebhookSecret:
        return service_of(app).webhook_secret(tenant_of(app))

    @app.get(
        "/usage",
        summary="The tenant's billed LLM calls, tokens and cost, by day, model or API key",
        security=SECURITY,
        responses={
            **_AUTH,
            200: {
                "description": "The totals of each group, and of all",
                "content": {"application/json": {"model": UsageReport}},
            },
            422: openapi_problem(
                "An invalid parameter: a date that is not YYYY-MM-DD, `from` after `to`, a span over 366 days"
            ),
        },
    )
    def get_usage(
        from_: Annotated[
            Day | None,
            Query(alias="from", description="The first UTC day (YYYY-MM-DD); 29 days before `to` if absent"),
        ] = None,
        to: Annotated[
            Day | None, Query(description="The last UTC day (YYYY-MM-DD), included; today if absent")
        ] = None,
        group_by: Annotated[GroupBy, Query(description="One row a day, a model or an API key")] = "day",
    ) -> Response[UsageReport]:
        report = service_of(app).usage(tenant_of(app), first=from_, last=to, group_by=group_by)
        return _json(report, 200)

    @app.get("/health", summary="Liveness")
    def health() -> Health:
        return Health(version=__version__)
