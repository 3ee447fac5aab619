"""Errors as RFC 9457 problem details: every domain error, a request that does not validate, an
unknown route, a backend that failed, and anything unexpected (logged, never shown); and how the
OpenAPI document describes them."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.types import (
    OpenAPIResponse,
    OpenAPIResponseContentModel,
    OpenAPIResponseContentSchema,
)

from llmtasks.domain.errors import ApiError, BackendError, ServiceUnavailable, Unauthorized
from llmtasks.domain.models import Problem
from llmtasks.observability import logger

PROBLEM_JSON = "application/problem+json"
PROBLEM_BASE = "https://llmtasks.dev/problems/"

PROBLEM_CONTENT: dict[str, OpenAPIResponseContentModel | OpenAPIResponseContentSchema] = {
    PROBLEM_JSON: {"model": Problem}
}


def openapi_problem(description: str) -> OpenAPIResponse:
    """A route's documented error reply (in the OpenAPI document)."""
    return {"description": description, "content": PROBLEM_CONTENT}


def problem(
    status: int, title: str, detail: str, *, slug: str, errors: list[dict[str, Any]] | None = None
) -> Response[Any]:
    body = Problem(type=PROBLEM_BASE + slug, title=title, status=status, detail=detail, errors=errors)
    return Response(
        status_code=status, content_type=PROBLEM_JSON, body=body.model_dump_json(exclude_none=True)
    )


def _field(loc: Any) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


def on_api_error(exc: ApiError) -> Response[Any]:
    field = getattr(exc, "field", None)
    errors = [{"field": field, "message": exc.detail}] if field else None
    reply = problem(exc.status, exc.title, exc.detail, slug=exc.slug, errors=errors)
    if isinstance(exc, Unauthorized):
        reply.headers["WWW-Authenticate"] = 'Bearer realm="llmtasks"'
    if exc.retry_after_s is not None:
        reply.headers["Retry-After"] = str(exc.retry_after_s)
    return reply


def malformed_json() -> Response[Any]:
    return problem(400, "Malformed JSON", "The request body is not valid UTF-8 JSON.", slug="malformed-json")


def on_validation_error(exc: RequestValidationError) -> Response[Any]:
    raw = exc.errors()
    if any(err.get("type") == "json_invalid" for err in raw):
        return malformed_json()
    errors = [{"field": _field(err.get("loc", ())), "message": str(err.get("msg", "invalid"))} for err in raw]
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return problem(422, "Invalid request", detail, slug="validation", errors=errors)


def on_not_found(_: NotFoundError) -> Response[Any]:
    return problem(404, "Not found", "No such route.", slug="not-found")


def backend_unavailable(exc: BackendError) -> ServiceUnavailable:
    """DynamoDB, SQS or S3 failed under a request: the client may retry it."""
    logger.exception("backend failed", error_type=type(exc).__name__)
    return ServiceUnavailable("A storage or queue call failed. Retry the request.")


def on_backend_error(exc: BackendError) -> Response[Any]:
    return on_api_error(backend_unavailable(exc))


def unexpected(exc: Exception, reply: Response[Any]) -> Response[Any]:
    logger.exception("unhandled error", error_type=type(exc).__name__)
    return reply


def on_unexpected(exc: Exception) -> Response[Any]:
    return unexpected(
        exc, problem(500, "Internal error", "Something went wrong on our side.", slug="internal")
    )
