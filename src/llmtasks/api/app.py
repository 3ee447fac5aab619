"""The HTTP API as one Powertools resolver (the routes of commands.py, queries.py and openai.py, their
errors in each surface's shape, the OpenAPI document), and one invocation of it as SubmitFunction
and StatusFunction run it: the body decoded, the caller admitted, the routes given their services."""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError

from llmtasks import __version__
from llmtasks.api import openai as openai_api
from llmtasks.api.commands import add_commands
from llmtasks.api.problems import (
    backend_unavailable,
    malformed_json,
    on_api_error,
    on_backend_error,
    on_not_found,
    on_unexpected,
    on_validation_error,
    unexpected,
)
from llmtasks.api.queries import add_queries
from llmtasks.api.routes import (
    PUBLIC_ROUTES,
    SECURITY,
    SECURITY_SCHEMES,
    batches_of,
    caller_of,
    service_of,
    takes_multipart,
    tenant_of,
)
from llmtasks.domain.caller import Caller
from llmtasks.domain.caller import caller_of as caller_of_event
from llmtasks.domain.errors import ApiError, BackendError, Unauthorized
from llmtasks.services.batches import BatchService
from llmtasks.services.tasks import TaskService
from llmtasks.services.webhook_controls import WebhookControls


def build_app(*, commands: bool = False, queries: bool = False, docs: bool = False) -> APIGatewayHttpResolver:
    """A resolver with the chosen routes; `docs` adds /docs and /openapi.json describing all of them.
    The /v1 routes (openai_api) answer errors in OpenAI's shape, the others in problem+json."""
    app = APIGatewayHttpResolver(enable_validation=True)
    if commands or docs:
        add_commands(app)
        openai_api.add_commands(app, service_of, batches_of, caller_of, SECURITY)
    if queries or docs:
        add_queries(app)
        openai_api.add_queries(app, service_of, batches_of, tenant_of, SECURITY)

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

        @functools.cache  # the routes are all added: one document a sandbox
        def document_text() -> str:
            from llmtasks.api import document  # the document's alone

            schema = app.get_openapi_json_schema(
                title="llmtasks",
                version=__version__,
                description="Long LLM calls, asynchronously: submit, then poll or receive a signed webhook.",
                security_schemes=SECURITY_SCHEMES,
            )
            return json.dumps(document.complete(json.loads(schema)), separators=(",", ":"))

        @app.get("/openapi.json", include_in_schema=False)
        def openapi_json() -> Response[str]:
            return Response(status_code=200, content_type="application/json", body=document_text())

        @app.get("/docs", include_in_schema=False)
        def swagger_ui() -> Response[str]:
            # Powertools' Swagger UI page (its script and style inlined: no CDN), on the same
            # document /openapi.json serves, so both say the same.
            from llmtasks.api import document

            return Response(
                status_code=200, content_type="text/html", body=document.swagger_page(document_text())
            )

    return app


def handle(
    app: APIGatewayHttpResolver,
    event: dict[str, Any],
    context: Any,
    service: TaskService,
    batches: Callable[[], BatchService],
    webhooks: Callable[[], WebhookControls],
) -> dict[str, Any]:
    """One HTTP invocation: the routes read `service`, `batches` and `webhooks` (providers,
    called by the batch and webhook routes alone) from the resolver's context."""
    headers = event.get("headers") or {}
    openai_shaped = openai_api.is_openai_path(event.get("rawPath") or "")
    multipart = takes_multipart(event.get("rawPath") or "")
    if event.get("body") and event.get("isBase64Encoded") and not multipart:
        # API Gateway base64-encodes bodies it does not take for text; JSON must be UTF-8 (an
        # upload's multipart body is bytes, read as such by its route).
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
        and not multipart
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
    app.append_context(service=service, batches=batches, webhooks=webhooks, caller=caller)  # type: ignore[no-untyped-call]
    return app.resolve(event, context)


def _lambda_reply(response: Response[Any]) -> dict[str, Any]:
    body = response.body if isinstance(response.body, str) else json.dumps(response.body)
    return {"statusCode": response.status_code, "headers": dict(response.headers), "body": body}


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
