"""The HTTP API's routes that only read, served by StatusFunction (template.yaml maps each path);
their shared parts are routes.py's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse

from llmtasks import __version__
from llmtasks.api.files import file_reply
from llmtasks.api.problems import openapi_problem
from llmtasks.api.routes import (
    AUTH_RESPONSES,
    BATCH_RESPONSES,
    SECRET_RESPONSES,
    SECURITY,
    STATUS_RESPONSES,
    batch_reply,
    batches_of,
    json_reply,
    service_of,
    status_reply,
    tenant_of,
)
from llmtasks.domain.batches import Batch, BatchEventPage, BatchResults, BatchView
from llmtasks.domain.cursors import RESULTS_CURSOR_PATTERN, TASKS_CURSOR_PATTERN
from llmtasks.domain.messages import WebhookSecret
from llmtasks.domain.models import (
    WEBHOOK_ATTEMPTS_CURSOR_PATTERN,
    Health,
    Task,
    TaskList,
    TaskStatus,
    TaskView,
    WebhookAttemptList,
)
from llmtasks.domain.output import TaskOutputPage
from llmtasks.domain.steps import STEPS_CURSOR_PATTERN, StepList
from llmtasks.domain.usage import KEPT_DAYS, Day, GroupBy, UsageReport

MAX_WAIT_S = 25

# What a listing leaves out of each task: the answer (read the task for it).
LISTED_WITHOUT = {"result": None, "output": None, "parsed": None}


# A chunk is a progress write (one each 2 s): a task has a few thousand in its longest call; a
# batch has an event per count of its items, at most two per item.
MAX_OUTPUT_SEQUENCE = 10_000_000


MAX_LIST_LIMIT = 100


MAX_RESULTS_LIMIT = 1000


JSONL = "application/jsonl"


_ATTEMPTS: dict[int, OpenAPIResponse] = {
    **AUTH_RESPONSES,
    200: {
        "description": "A page of the webhook's attempts, newest first",
        "content": {"application/json": {"model": WebhookAttemptList}},
    },
    422: openapi_problem("An invalid parameter (a limit out of range, a cursor off its pattern)"),
}


def _attempts_page(log_of: Task | Batch, limit: int, cursor: str | None) -> Response[WebhookAttemptList]:
    return json_reply(WebhookAttemptList.page(log_of.webhook_log, limit=limit, cursor=cursor), 200)


AttemptsLimit = Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT, description="Attempts per page")]


AttemptsCursor = Annotated[
    str | None,
    Query(pattern=WEBHOOK_ATTEMPTS_CURSOR_PATTERN, description="next_cursor of the previous page (opaque)"),
]


StepsLimit = Annotated[int, Query(ge=1, le=100, description="Steps per page")]
StepsCursor = Annotated[
    str | None, Query(pattern=STEPS_CURSOR_PATTERN, description="next_cursor of the previous page (opaque)")
]


def add_queries(app: APIGatewayHttpResolver) -> None:
    """Routes that only read (StatusFunction)."""

    @app.get(
        "/tasks",
        summary="The tenant's tasks, newest first",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
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
        views = [TaskView.of(task).model_copy(update=LISTED_WITHOUT) for task in tasks]
        return json_reply(TaskList(data=views, next_cursor=next_cursor), 200)

    @app.get(
        "/tasks/<task_id>",
        summary="A task's status and, once completed, its result",
        security=SECURITY,
        responses=STATUS_RESPONSES,
    )
    def get_task(
        task_id: str,
        wait: Annotated[
            int, Query(ge=0, le=MAX_WAIT_S, description="Hold the reply up to N s until the task is terminal")
        ] = 0,
    ) -> Response[TaskView]:
        return status_reply(service_of(app).get(tenant_of(app), task_id, wait_s=wait))

    @app.get(
        "/tasks/<task_id>/output",
        summary="The task's output as numbered chunks, from any point, held until there is more",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
            200: {
                "description": "The chunks after `after` (none if the wait ran out, or `after` is past"
                " the last); whether they end it",
                "content": {"application/json": {"model": TaskOutputPage}},
            },
            404: openapi_problem("Unknown, expired or another tenant's task"),
            422: openapi_problem("An invalid parameter"),
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
        return json_reply(page, 200)

    @app.get(
        "/batches/<batch_id>",
        summary="A batch's status and exact counts by item status",
        security=SECURITY,
        responses=BATCH_RESPONSES,
    )
    def get_batch(batch_id: str) -> Response[BatchView]:
        batches = batches_of(app)
        batch = batches.get(tenant_of(app), batch_id)
        return batch_reply(batch, batches.spend(batch.batch_id))

    @app.get(
        "/batches/<batch_id>/refused",
        summary="The lines of a batch's input file that are not items, and why (JSON Lines)",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
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
            **AUTH_RESPONSES,
            200: {
                "description": "The events after `after` (none if the wait ran out, or `after` is past"
                " the last); whether they end it",
                "content": {"application/json": {"model": BatchEventPage}},
            },
            404: openapi_problem("Unknown, expired or another tenant's batch"),
            422: openapi_problem("An invalid parameter"),
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
        return json_reply(page, 200)

    @app.get(
        "/batches/<batch_id>/results",
        summary="A batch's items in submission order, with their results or errors",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
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
            return json_reply(BatchResults(data=rows, next_cursor=next_cursor), 200)
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
        "/tasks/<task_id>/steps",
        summary="A run's steps, in order: each model call with its message and usage, each tool call"
        " with its arguments and output",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
            200: {
                "description": "A page of the run's steps",
                "content": {"application/json": {"model": StepList}},
            },
            404: openapi_problem("Unknown, expired or another tenant's task"),
            422: openapi_problem("An invalid parameter (a limit out of range, a cursor off its pattern)"),
        },
    )
    def task_steps(task_id: str, limit: StepsLimit = 50, cursor: StepsCursor = None) -> Response[StepList]:
        service = service_of(app)
        task = service.owned(tenant_of(app), task_id)
        return json_reply(service.runs.steps(task, limit=limit, cursor=cursor), 200)

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
        responses=SECRET_RESPONSES,
    )
    def get_webhook_secret() -> WebhookSecret:
        return service_of(app).webhook_secret(tenant_of(app))

    @app.get(
        "/usage",
        summary="The tenant's billed LLM calls, tokens and cost, by day, model or API key",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
            200: {
                "description": "The totals of each group, and of all",
                "content": {"application/json": {"model": UsageReport}},
            },
            422: openapi_problem("An invalid parameter: a date that is not YYYY-MM-DD, an unknown group_by"),
        },
    )
    def get_usage(
        from_: Annotated[
            Day | None,
            Query(
                alias="from",
                description="The first UTC day (YYYY-MM-DD); 29 days before `to` if absent. Any span is"
                f" answered: days over {KEPT_DAYS} ago have no counters kept, and a `from` after `to`"
                " spans no day (an empty report)",
            ),
        ] = None,
        to: Annotated[
            Day | None, Query(description="The last UTC day (YYYY-MM-DD), included; today if absent")
        ] = None,
        group_by: Annotated[GroupBy, Query(description="One row a day, a model or an API key")] = "day",
    ) -> Response[UsageReport]:
        report = service_of(app).usage(tenant_of(app), first=from_, last=to, group_by=group_by)
        return json_reply(report, 200)

    @app.get("/health", summary="Liveness")
    def health() -> Health:
        return Health(version=__version__)
