"""The OpenAI-shaped surface: background responses (`/v1/responses`) served by llmtasks' tasks,
so that code written with the official `openai` SDK runs unchanged against llmtasks.

A response is a task seen through OpenAI's Response object: `resp_<task id>`. Its states map
pending -> queued, processing -> in_progress, completed, failed and cancelled as they are (an
answer cut short is incomplete); a run waiting for its client's function outputs is completed
with their function_call items, which `previous_response_id` answers (openai_continuations.py).
The request fields of one generation map onto the task's (openai_requests.py,
openai_inputs.py); any other is refused with OpenAI's error shape naming it. Errors on /v1
routes are OpenAI's `{"error": {message, type, param, code}}`, so the SDK raises its own
exception types.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Protocol

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Header, Query
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from pydantic import BaseModel

from llmtasks.api.files import file_reply
from llmtasks.api.openai_continuations import continue_response
from llmtasks.api.openai_requests import CompleteUpload, CreateBatch, CreateResponse, CreateUpload
from llmtasks.api.openai_responses import response_object, segment
from llmtasks.domain.errors import ApiError, TaskNotFound, Unauthorized
from llmtasks.domain.events import task_id_of

PREFIX = "/v1/"


def is_openai_path(path: str) -> bool:
    return path.startswith(PREFIX)


def _reply(body: dict[str, Any], status: int = 200) -> Response[Any]:
    return Response(status_code=status, content_type="application/json", body=body)


def _event_stream(events: str) -> Response[Any]:
    return Response(
        status_code=200, content_type="text/event-stream", body=events, headers={"Cache-Control": "no-cache"}
    )


# --- routes -------------------------------------------------------------------------------------


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """OpenAI's error object, which the SDK turns into its exception types."""

    error: OpenAIErrorDetail


_OBJECT: OpenAPIResponse = {
    "description": "The OpenAI object (Response, File or Batch)",
    "content": {"application/json": {"schema": {"type": "object"}}},
}


class GatewayRefusal(BaseModel):
    """API Gateway's own answer, before any function runs: plain JSON on every route."""

    message: str


GATEWAY_REFUSALS: dict[int, OpenAPIResponse] = {
    status: {"description": description, "content": {"application/json": {"model": GatewayRefusal}}}
    for status, description in (
        (401, 'API Gateway: no Authorization header: {"message": "Unauthorized"}'),
        (
            403,
            'API Gateway: the authorizer denied the key (unknown, revoked): {"message": "Forbidden"}',
        ),
    )
}
DOCUMENTED: dict[int, OpenAPIResponse] = {
    200: _OBJECT,
    **GATEWAY_REFUSALS,
    **{
        status: {"description": description, "content": {"application/json": {"model": OpenAIError}}}
        for status, description in (
            (400, "An invalid or unsupported field (param names it), or a body that is not JSON"),
            (404, "Unknown, expired or another tenant's object"),
            (429, "This key's requests a second, or its tasks in flight, are at its limit (Retry-After)"),
            (409, "A request with this Idempotency-Key is still being processed"),
            (413, "A prompt over the size limit"),
            (503, "A storage or queue call failed; retry"),
        )
    },
}

IDEMPOTENCY_KEY = Header(
    alias="idempotency-key",
    min_length=1,
    max_length=255,
    description="Sent again with the same body, it returns the same resource instead of a new one;"
    " sent with another body, it is refused (422, or 400 on /v1).",
)


@contextlib.contextmanager
def _as_response(response_id: str) -> Iterator[None]:
    """A task not found is a response not found, said with the id the caller gave."""
    try:
        yield
    except TaskNotFound:
        raise ResponseNotFound(f"No response found with id '{response_id[:80]}'.") from None


class ResponseNotFound(ApiError):
    status, title, slug = 404, "Response not found", "not-found"


def _openai_batches(app: APIGatewayHttpResolver, batches_of: Any) -> Any:
    from llmtasks.api.openai_batches import OpenAIBatches  # the batch routes' alone

    return OpenAIBatches(batches_of(app))


def _body_bytes(app: APIGatewayHttpResolver) -> bytes:
    body = app.current_event.body or ""
    if app.current_event.is_base64_encoded:
        return base64.b64decode(body)
    return body.encode() if isinstance(body, str) else bytes(body)


_Handler = Callable[..., Response[Any]]
_CONTENT: dict[int, OpenAPIResponse] = {
    **DOCUMENTED,
    200: {
        "description": "The file's bytes, as uploaded or written",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    },
    307: {"description": "Over 4 MiB: a presigned URL to the same bytes (Location)"},
}


_RESPONSE: dict[int, OpenAPIResponse] = {
    **DOCUMENTED,
    200: {
        "description": "The Response object; with stream, its events (read on with starting_after)",
        "content": {
            "application/json": {"schema": {"type": "object"}},
            # Each event (OpenAPI 3.2's reading of an event stream's schema): its type, and its
            # data, the event as JSON with `type` and `sequence_number`.
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
                    "required": ["event", "data"],
                }
            },
        },
    },
}
# An event's sequence number: its output chunk's plus a few (MAX_OUTPUT_SEQUENCE's bound).
MAX_EVENT_SEQUENCE = 10_000_010


class _Route(Protocol):
    def __call__(
        self, path: str, summary: str, responses: dict[int, OpenAPIResponse] = ...
    ) -> Callable[[_Handler], _Handler]: ...


def _routes(app: APIGatewayHttpResolver, method: str, security: Any) -> _Route:
    """A route decorator of the /v1 surface: tagged, secured and documented alike (its replies
    as DOCUMENTED says, unless `responses` says otherwise)."""
    register = getattr(app, method)

    def route(
        path: str, summary: str, responses: dict[int, OpenAPIResponse] = DOCUMENTED
    ) -> Callable[[_Handler], _Handler]:
        decorate: Callable[[_Handler], _Handler] = register(
            path, summary=summary, tags=["OpenAI"], responses=responses, security=security
        )
        return decorate

    return route


def add_commands(
    app: APIGatewayHttpResolver, service_of: Any, batches_of: Any, caller_of: Any, security: Any
) -> None:
    """The /v1 routes that change state (SubmitFunction)."""
    post = _routes(app, "post", security)

    def tenant_of(app: APIGatewayHttpResolver) -> str:
        return str(caller_of(app).tenant_id)

    @post("/v1/files", "OpenAI: upload a batch's input file (multipart/form-data)")
    def upload_file() -> Response[Any]:
        content_type = app.current_event.headers.get("content-type", "")
        return _reply(_openai_batches(app, batches_of).upload(tenant_of(app), content_type, _body_bytes(app)))

    @post("/v1/uploads", "OpenAI: begin an upload of a file in parts (a batch's input of any size)")
    def create_upload(body: CreateUpload) -> Response[Any]:
        return _reply(_openai_batches(app, batches_of).create_upload(tenant_of(app), body))

    @post("/v1/uploads/<upload_id>/parts", "OpenAI: add a part (multipart/form-data, field data)")
    def add_upload_part(upload_id: str) -> Response[Any]:
        content_type = app.current_event.headers.get("content-type", "")
        part = _openai_batches(app, batches_of).add_part(
            tenant_of(app), upload_id, content_type, _body_bytes(app)
        )
        return _reply(part)

    @post("/v1/uploads/<upload_id>/complete", "OpenAI: join the parts, in order, into the file")
    def complete_upload(upload_id: str, body: CompleteUpload) -> Response[Any]:
        return _reply(_openai_batches(app, batches_of).complete_upload(tenant_of(app), upload_id, body))

    @post("/v1/uploads/<upload_id>/cancel", "OpenAI: cancel an upload (its parts expire)")
    def cancel_upload(upload_id: str) -> Response[Any]:
        return _reply(_openai_batches(app, batches_of).cancel_upload(tenant_of(app), upload_id))

    @post("/v1/batches", "OpenAI: create a batch from an uploaded file")
    def create_batch(
        body: CreateBatch, idempotency_key: Annotated[str | None, IDEMPOTENCY_KEY] = None
    ) -> Response[Any]:
        batches = _openai_batches(app, batches_of)
        return _reply(batches.create(caller_of(app), body, idempotency_key=idempotency_key))

    @post("/v1/batches/<batch_id>/cancel", "OpenAI: cancel a batch")
    def cancel_batch(batch_id: str) -> Response[Any]:
        return _reply(_openai_batches(app, batches_of).cancel(tenant_of(app), batch_id))

    @post("/v1/responses", "OpenAI: create a background response", _RESPONSE)
    def create_response(
        body: CreateResponse, idempotency_key: Annotated[str | None, IDEMPOTENCY_KEY] = None
    ) -> Response[Any]:
        caller = caller_of(app)
        service = service_of(app)
        if body.previous_response_id is not None:
            continued = continue_response(service, caller, body, idempotency_key=idempotency_key)
            task, starting_after = continued.task, continued.starting_after
        else:
            request = body.task_request()
            submission = service.submit(
                caller.tenant_id, request, idempotency_key=idempotency_key, caller=caller
            )
            task, starting_after = submission.task, -1
        if body.stream:
            events = segment(service, caller.tenant_id, task.task_id, starting_after=starting_after)
            return _event_stream(events)
        return _reply(response_object(task, service.runs.recorded(task)))

    @post("/v1/responses/<response_id>/cancel", "OpenAI: cancel a background response")
    def cancel_response(response_id: str) -> Response[Any]:
        service, tenant = service_of(app), tenant_of(app)
        with _as_response(response_id):
            try:
                task = service.cancel(tenant, task_id_of(response_id))
            except ApiError as refused:
                if refused.status != 409:
                    raise
                task = service.get(tenant, task_id_of(response_id))  # ended already: as it ended
        return _reply(response_object(task, service.runs.recorded(task)))


def add_queries(
    app: APIGatewayHttpResolver, service_of: Any, batches_of: Any, tenant_of: Any, security: Any
) -> None:
    """The /v1 routes that only read (StatusFunction); a batch read may write its ended batch's
    output and error files."""
    get = _routes(app, "get", security)

    @get("/v1/files/<file_id>", "OpenAI: a file's object")
    def retrieve_file(file_id: str) -> Response[Any]:
        return _reply(_openai_batches(app, batches_of).file(tenant_of(app), file_id))

    @get("/v1/files/<file_id>/content", "OpenAI: a file's content", _CONTENT)
    def file_content(file_id: str) -> Response[Any]:
        # A file over 4 MiB (a batch's output of any size) is a redirect to a presigned GET,
        # which the openai SDK follows: files.content() reads it unchanged.
        data, link = _openai_batches(app, batches_of).content(tenant_of(app), file_id)
        return file_reply(data, link, content_type="application/octet-stream")

    @get("/v1/batches/<batch_id>", "OpenAI: a batch's status, counts and files")
    def retrieve_batch(batch_id: str) -> Response[Any]:
        return _reply(_openai_batches(app, batches_of).retrieve(tenant_of(app), batch_id))

    @get("/v1/responses/<response_id>", "OpenAI: retrieve a response", _RESPONSE)
    def retrieve_response(
        response_id: str,
        stream: Annotated[
            bool, Query(description="Answer its events (text/event-stream), a segment of up to 25 s")
        ] = False,
        starting_after: Annotated[
            int | None,
            Query(
                ge=0, le=MAX_EVENT_SEQUENCE, description="With stream: the events after this sequence_number"
            ),
        ] = None,
    ) -> Response[Any]:
        with _as_response(response_id):
            task_id = task_id_of(response_id)
            if stream:
                after = -1 if starting_after is None else starting_after
                return _event_stream(segment(service_of(app), tenant_of(app), task_id, starting_after=after))
            service = service_of(app)
            task = service.get(tenant_of(app), task_id)
        return _reply(response_object(task, service.runs.recorded(task)))


# --- errors -------------------------------------------------------------------------------------


def error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> Response[Any]:
    """OpenAI's error object; the SDK raises by status (BadRequestError, NotFoundError, ...)."""
    kind = {401: "invalid_request_error", 429: "rate_limit_error"}.get(
        status, "server_error" if status >= 500 else "invalid_request_error"
    )
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    reply = Response(status_code=status, content_type="application/json", body=body)
    if status == 503:
        reply.headers["Retry-After"] = "1"
    return reply


def from_api_error(exc: ApiError) -> Response[Any]:
    field = getattr(exc, "field", None)
    if isinstance(exc, Unauthorized):
        return error(401, exc.detail, code="invalid_api_key")
    # A field OpenAI would call invalid is a 400 there, whatever status the native API gives.
    status = 400 if exc.status == 422 else exc.status
    reply = error(status, exc.detail, param=field, code=exc.slug.replace("-", "_"))
    if exc.retry_after_s is not None:
        reply.headers["Retry-After"] = str(exc.retry_after_s)
    return reply


def from_validation_error(exc: RequestValidationError) -> Response[Any]:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return error(400, "The request body is not valid JSON.", code="invalid_json")
    # The field's path as a client names it: not where it came from (body, query), nor which
    # member of a union pydantic tried (constrained-str, list[InputMessage]).
    param = ".".join(
        str(part)
        for part in first.get("loc", ())
        if part not in ("body", "query", "path", "header") and (isinstance(part, int) or part.isidentifier())
    )
    if first.get("type") == "extra_forbidden":
        return error(
            400,
            f"Unsupported parameter: '{param}' is not served by llmtasks.",
            param=param,
            code="unsupported_parameter",
        )
    return error(
        400, f"Invalid '{param}': {first.get('msg', 'invalid')}.", param=param or None, code="invalid_value"
    )
