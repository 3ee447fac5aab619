"""The HTTP API's routes that change state, served by SubmitFunction (template.yaml maps each
path); their shared parts are routes.py's.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel

from llmtasks.api import openai as openai_api
from llmtasks.api.problems import openapi_problem
from llmtasks.api.routes import (
    AUTH_RESPONSES,
    BATCH_RESPONSES,
    RETRY_AFTER_S,
    SECRET_RESPONSES,
    SECURITY,
    STATUS_RESPONSES,
    batch_reply,
    batches_of,
    caller_of,
    json_reply,
    service_of,
    status_reply,
    tenant_of,
    webhooks_of,
)
from llmtasks.domain.batches import (
    BatchAccepted,
    BatchUpload,
    BatchView,
    RetryBatchRequest,
    SubmitBatchRequest,
)
from llmtasks.domain.messages import WebhookSecret
from llmtasks.domain.models import (
    EnableWebhookEndpoint,
    SubmitTaskRequest,
    TaskAccepted,
    TaskView,
    WebhookEndpoint,
    WebhookReplay,
)
from llmtasks.domain.runs import SubmitToolOutputs
from llmtasks.observability import trace_header


class ProviderEventTaken(BaseModel):
    woken: bool  # a run was waiting on the response, and goes on now


def _accepted(accepted: BaseModel, location: str, *, replayed: bool) -> Response[Any]:
    """The 202 of a submit: where to poll, how soon, and whether an Idempotency-Key replayed it."""
    headers = {"Location": location, "Retry-After": str(RETRY_AFTER_S)}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return json_reply(accepted, 202, headers)


_REPLAY: dict[int, OpenAPIResponse] = {
    **AUTH_RESPONSES,
    202: {
        "description": "The event is queued for one attempt now, with its own webhook-id",
        "content": {"application/json": {"model": WebhookReplay}},
    },
    409: openapi_problem(
        "No event to replay: no webhook_url, not ended yet, an event its webhook_events leave out,"
        " a URL the SSRF guard refuses now, or a disabled URL"
    ),
}


def add_commands(app: APIGatewayHttpResolver) -> None:
    """Routes that change state (SubmitFunction)."""

    @app.post(
        "/tasks",
        status_code=202,
        summary="Submit a task",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
            202: {"description": "Accepted", "content": {"application/json": {"model": TaskAccepted}}},
            400: openapi_problem("The body is not valid JSON"),
            404: openapi_problem("A file the request names by file_id is unknown, expired or not yours"),
            409: openapi_problem("A request with this Idempotency-Key is still being processed"),
            413: openapi_problem("The request's text and inline data are over the size limit"),
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
        responses={**STATUS_RESPONSES, 409: openapi_problem("The task is already terminal")},
    )
    def cancel_task(task_id: str) -> Response[TaskView]:
        return status_reply(service_of(app).cancel(tenant_of(app), task_id))

    @app.post(
        "/tasks/<task_id>/tool_outputs",
        summary="Answer the client function calls a run waits for (requires_action); the run goes on",
        security=SECURITY,
        responses={
            **STATUS_RESPONSES,
            400: openapi_problem("The body is not valid JSON"),
            409: openapi_problem("The task is not waiting for tool outputs (not in requires_action)"),
            422: openapi_problem("An invalid body, or outputs that do not answer exactly the calls asked"),
        },
    )
    def submit_tool_outputs(task_id: str, body: SubmitToolOutputs) -> Response[TaskView]:
        service = service_of(app)
        task = service.owned(tenant_of(app), task_id)
        return status_reply(service.runs.submit_tool_outputs(task, body))

    @app.post(
        "/provider-webhooks/openai",
        summary="OpenAI's webhook (response.completed and the other ends of a response): wakes the run"
        " whose background call it ends, to read the answer now rather than at its next look",
        responses={
            200: {
                "description": "Taken (whether or not a run was waiting on the response)",
                "content": {"application/json": {"model": ProviderEventTaken}},
            },
            401: openapi_problem(
                "The Standard Webhooks signature does not verify with OPENAI_WEBHOOK_SECRET"
            ),
            404: openapi_problem(
                "This deployment takes no OpenAI webhook (OPENAI_WEBHOOK_SECRET is not set)"
            ),
        },
    )
    def openai_webhook() -> Response[ProviderEventTaken]:
        event = app.current_event
        woken = service_of(app).runs.provider_event(event.body or "", event.headers)
        return json_reply(ProviderEventTaken(woken=woken), 200)

    @app.post(
        "/batches",
        status_code=202,
        summary="Submit a batch: up to 100,000 task bodies run as one job (inline, or an uploaded file)",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
            202: {"description": "Accepted", "content": {"application/json": {"model": BatchAccepted}}},
            400: openapi_problem("The body is not valid JSON"),
            404: openapi_problem(
                "No input file of this id, or no file an item names by file_id (never uploaded,"
                " expired, or another tenant's)"
            ),
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
            **AUTH_RESPONSES,
            201: {
                "description": "The upload's URL and file id",
                "content": {"application/json": {"model": BatchUpload}},
            },
        },
    )
    def create_batch_upload() -> Response[BatchUpload]:
        return json_reply(batches_of(app).create_upload(tenant_of(app)), 201)

    @app.post(
        "/batches/<batch_id>/cancel",
        summary="Cancel a batch: pending items are cancelled, running ones finish or are discarded",
        security=SECURITY,
        responses={**BATCH_RESPONSES, 409: openapi_problem("The batch has ended already")},
    )
    def cancel_batch(batch_id: str) -> Response[BatchView]:
        return batch_reply(batches_of(app).cancel(tenant_of(app), batch_id))

    @app.post(
        "/batches/<batch_id>/retry",
        status_code=202,
        summary="Run an ended batch's failed (or cancelled) items again, in the same batch",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
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
        return json_reply(webhooks_of(app).replay_task(task), 202)

    @app.post(
        "/batches/<batch_id>/webhook/replay",
        status_code=202,
        summary="Send a batch's webhook event again now (same webhook-id, fresh signature)",
        security=SECURITY,
        responses={**_REPLAY, 404: openapi_problem("Unknown, expired or another tenant's batch")},
    )
    def replay_batch_webhook(batch_id: str) -> Response[WebhookReplay]:
        batch = batches_of(app).get(tenant_of(app), batch_id)
        return json_reply(webhooks_of(app).replay_batch(batch), 202)

    @app.post(
        "/webhooks/endpoints/enable",
        summary="Attempt deliveries to a disabled webhook URL of yours again",
        security=SECURITY,
        responses={
            **AUTH_RESPONSES,
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
        responses=SECRET_RESPONSES,
    )
    def rotate_webhook_secret() -> WebhookSecret:
        return service_of(app).rotate_webhook_secret(tenant_of(app))
