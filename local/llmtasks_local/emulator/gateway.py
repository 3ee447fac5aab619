"""The HTTP API on 127.0.0.1: each request becomes an API Gateway payload 2.0 event for the
function whose HttpApi route matches, and the function's reply becomes the HTTP response."""

from __future__ import annotations

import base64
import functools
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote_plus

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from llmtasks_local.emulator.payload_limits import request_too_large
from llmtasks_local.emulator.runtime import FunctionRuntime
from llmtasks_local.sam.function_spec import PSEUDO_PARAMETERS, HttpRoute, LambdaAuthorizer

_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-www-form-urlencoded")


def _is_text(content_type: str) -> bool:
    return (
        not content_type
        or any(kind in content_type for kind in _TEXT_TYPES)
        or content_type.endswith("+json")
    )


def http_event(
    *,
    route: HttpRoute,
    method: str,
    path: str,
    raw_query: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    path_parameters: Mapping[str, str],
    source_ip: str = "127.0.0.1",
    host: str = "127.0.0.1:3000",
) -> dict[str, Any]:
    """The event API Gateway's HTTP API (payload format 2.0) sends a Lambda integration."""
    joined: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers:
        key = name.lower()
        if key == "cookie":
            cookies.extend(part.strip() for part in value.split(";") if part.strip())
            continue
        joined[key] = f"{joined[key]},{value}" if key in joined else value
    query: dict[str, str] = {}
    for pair in raw_query.split("&") if raw_query else []:
        name, _, value = pair.partition("=")
        name, value = unquote_plus(name), unquote_plus(value)
        query[name] = f"{query[name]},{value}" if name in query else value
    now = datetime.now(tz=UTC)
    # API Gateway starts an X-Ray trace for each request (or continues the caller's) and passes
    # its header on to the integration.
    joined.setdefault("x-amzn-trace-id", new_trace_header(now))
    content_type = joined.get("content-type", "")
    as_text = _is_text(content_type)
    if as_text:
        try:
            text_body = body.decode()
        except UnicodeDecodeError:
            as_text = False
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route.route_key,
        "rawPath": path,
        "rawQueryString": raw_query,
        "headers": joined,
        "requestContext": {
            "accountId": PSEUDO_PARAMETERS["AWS::AccountId"],
            "apiId": "local",
            "domainName": host,
            "domainPrefix": host.split(".", maxsplit=1)[0],
            "http": {
                "method": method.upper(),
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": joined.get("user-agent", ""),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": route.route_key,
            "stage": "$default",
            "time": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "timeEpoch": int(now.timestamp() * 1000),
        },
        "isBase64Encoded": bool(body) and not as_text,
    }
    if cookies:
        event["cookies"] = cookies
    if query:
        event["queryStringParameters"] = query
    if path_parameters:
        event["pathParameters"] = dict(path_parameters)
    if body:
        event["body"] = text_body if as_text else base64.b64encode(body).decode()
    return event


def new_trace_header(now: datetime) -> str:
    """X-Ray's format: Root=1-<epoch seconds, 8 hex>-<96 random bits, 24 hex>;Sampled=1."""
    return f"Root=1-{int(now.timestamp()):08x}-{secrets.token_hex(12)};Sampled=1"


def http_response(payload: Any) -> Response:
    """A Lambda reply in payload format 2.0: a full response, or any JSON value meaning 200."""
    if not isinstance(payload, dict) or "statusCode" not in payload:
        return Response(json.dumps(payload), 200, media_type="application/json")
    body = payload.get("body") or ""
    content = base64.b64decode(body) if payload.get("isBase64Encoded") else str(body).encode()
    response = Response(content, int(payload["statusCode"]))
    for name, value in (payload.get("headers") or {}).items():
        response.headers[name] = str(value)
    for name, values in (payload.get("multiValueHeaders") or {}).items():
        for value in values:
            response.headers.append(name, str(value))
    for cookie in payload.get("cookies") or []:
        response.headers.append("set-cookie", cookie)
    return response


def authorizer_event(event: Mapping[str, Any], identity: Sequence[str] = ()) -> dict[str, Any]:
    """The event an HTTP API sends a Lambda authorizer (payload format 2.0, REQUEST)."""
    context = event["requestContext"]
    route_arn = (
        f"arn:aws:execute-api:{PSEUDO_PARAMETERS['AWS::Region']}:{context['accountId']}:{context['apiId']}"
        f"/{context['stage']}/{context['http']['method']}{context['http']['path']}"
    )
    copied = (
        "version",
        "routeKey",
        "rawPath",
        "rawQueryString",
        "cookies",
        "headers",
        "queryStringParameters",
    )
    return {
        **{key: event[key] for key in copied if key in event},
        "type": "REQUEST",
        "routeArn": route_arn,
        "identitySource": list(identity),
        "requestContext": context,
        "pathParameters": event.get("pathParameters") or {},
        "stageVariables": {},
    }


# API Gateway's own refusals (plain JSON, not the functions' problem+json).
UNAUTHORIZED = {"message": "Unauthorized"}  # an identity source is missing: nothing runs
FORBIDDEN = {"message": "Forbidden"}  # the authorizer said no


class AuthorizerCache:
    """API Gateway's authorizer result cache: a decision (allow with its context, or deny) kept
    per authorizer and identity-source values for the authorizer's ReauthorizeEvery."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._decisions: dict[tuple[str, tuple[str, ...]], tuple[float, dict[str, Any] | None]] = {}
        self._lock = threading.Lock()

    def get(
        self, authorizer: LambdaAuthorizer, identity: tuple[str, ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """(found, context): a cached allow gives its context, a cached deny None."""
        with self._lock:
            kept = self._decisions.get((authorizer.function_id, identity))
        if kept is None or kept[0] <= self._clock():
            return False, None
        return True, kept[1]

    def put(
        self, authorizer: LambdaAuthorizer, identity: tuple[str, ...], context: dict[str, Any] | None
    ) -> None:
        if authorizer.ttl_s <= 0 or not authorizer.identity_headers:
            return  # without an identity source API Gateway caches nothing
        with self._lock:
            if len(self._decisions) > 10_000:
                self._decisions.clear()
            self._decisions[(authorizer.function_id, identity)] = (self._clock() + authorizer.ttl_s, context)


class HttpGateway:
    def __init__(
        self,
        routes: Sequence[HttpRoute],
        runtimes: Mapping[str, FunctionRuntime],
        *,
        fixed_tenant: str | None = None,
        cache: AuthorizerCache | None = None,
    ) -> None:
        # Like API Gateway: the most specific route wins (fewer path variables, then longer).
        self._routes = sorted(routes, key=lambda r: (r.path.count("{"), -len(r.path), r.method == "ANY"))
        self._runtimes = runtimes
        # `llmtasks up --no-auth`: the authorizers do not run and every request is this tenant,
        # as if the authorizer had said so. The deployed functions have no such switch.
        self._fixed_tenant = fixed_tenant
        self._cache = cache or AuthorizerCache()

    async def _authorized(self, route: HttpRoute, event: dict[str, Any]) -> Response | None:
        """Runs the route's authorizer as API Gateway does: None to go on (its context now in the
        event), else the reply API Gateway gives instead."""
        authorizer = route.authorizer
        if authorizer is None:
            return None
        if self._fixed_tenant is not None:
            event["requestContext"]["authorizer"] = {"lambda": {"tenant_id": self._fixed_tenant}}
            return None
        headers = event["headers"]
        identity = tuple(headers.get(name.lower(), "") for name in authorizer.identity_headers)
        if not all(identity):
            return JSONResponse(UNAUTHORIZED, 401)
        found, context = self._cache.get(authorizer, identity)
        if not found:
            result = await run_in_threadpool(
                functools.partial(self._runtimes[authorizer.function_id].invoke, synchronous=True),
                authorizer_event(event, identity),
            )
            if not result.ok or not isinstance(result.payload, dict):
                print(f"[{authorizer.function_id}] {result.error or 'not a simple response'}", flush=True)
                return JSONResponse({"message": "Internal Server Error"}, 500)
            allowed = result.payload.get("isAuthorized") is True
            context = dict(result.payload.get("context") or {}) if allowed else None
            self._cache.put(authorizer, identity, context)
        if context is None:
            return JSONResponse(FORBIDDEN, 403)
        event["requestContext"]["authorizer"] = {"lambda": context}
        return None

    async def handle(self, request: Request) -> Response:
        # The decoded path as the server got it: `request.url.path` goes through urlsplit, which
        # drops newlines and tabs (WHATWG), so /tasks/a%0Ab would reach the function as "ab".
        path: str = request.scope["path"]
        for route in self._routes:
            parameters = route.match(request.method, path)
            if parameters is not None:
                break
        else:
            return JSONResponse({"message": "Not Found"}, 404)
        body = await request.body()
        event = http_event(
            route=route,
            method=request.method,
            path=path,
            raw_query=request.url.query,
            headers=request.headers.items(),
            body=body,
            path_parameters=parameters,
            source_ip=request.client.host if request.client else "127.0.0.1",
            host=request.headers.get("host", "127.0.0.1"),
        )
        if request_too_large(body, event):
            # Lambda takes no event over 6 MB, and API Gateway answers so without running it.
            return JSONResponse({"message": "Request Too Long"}, 413)
        started = time.monotonic()
        refused = await self._authorized(route, event)
        if refused is not None:
            return refused
        result = await run_in_threadpool(
            functools.partial(self._runtimes[route.function_id].invoke, synchronous=True), event
        )
        if result.timed_out:
            # API Gateway's answer when the integration does not reply in time.
            return JSONResponse({"message": "Service Unavailable"}, 503)
        if result.error is not None:
            print(f"[{route.function_id}] {result.error}", flush=True)
            return JSONResponse({"message": "Internal Server Error"}, 500)
        response = http_response(result.payload)
        response.headers["apigw-requestid"] = event["requestContext"]["requestId"]
        response.headers.setdefault(
            "x-llmtasks-local-duration-ms", str(int((time.monotonic() - started) * 1000))
        )
        return response

    def app(self) -> ASGIApp:
        """Every request goes to `handle`, whatever its path: Starlette's own routing would answer
        a path with a newline in it (`/tasks/%0A`) with a bare 404, where API Gateway routes it."""

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                response = await self.handle(Request(scope, receive))
                await response(scope, receive, send)

        return serve
