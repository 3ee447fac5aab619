"""The local stack's Lambda API: its functions listed, described and invoked, and its event
source mappings listed, paused, resumed and retuned, on the REST paths of Lambda's 2015-03-31
API as boto3 and the AWS CLI call them.

The stack serves it on a port of its own (`--lambda-port`, as `sam local start-lambda` does)
and the embedded moto server hands it every request signed for `lambda` (moto_server.py), so
one `--endpoint-url` reaches every service. An invocation runs on the same runtime and sandboxes
that the HTTP API and the event sources use; a mapping's change reaches its running poller.

Long because Lambda's API is served whole here: each REST path beside the configuration and
mapping shapes it answers.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import heapq
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llmtasks_local.emulator.journal import read_kept, write_kept
from llmtasks_local.emulator.payload_limits import EVENT_REQUEST_BYTES, REQUEST_BYTES
from llmtasks_local.emulator.runtime import FunctionRuntime, Invocation
from llmtasks_local.emulator.sources import SqsPoller, StreamPoller
from llmtasks_local.sam.function_spec import PSEUDO_PARAMETERS, FunctionSpec, SqsSource, StreamSource

API = "/2015-03-31"
REGION = PSEUDO_PARAMETERS["AWS::Region"]
ACCOUNT = PSEUDO_PARAMETERS["AWS::AccountId"]
TAIL_BYTES = 4096  # LogType Tail: the last 4 KB of the invocation's log
INVOCATION_TYPES = ("RequestResponse", "Event", "DryRun")
EVENT_WORKERS = 8  # asynchronous invocations run at once, across functions
# Lambda tries a failed asynchronous invocation again after a minute, then after two.
EVENT_RETRY_BASE_S = 60.0


class LambdaError(Exception):
    """An error Lambda's API answers with: its HTTP status and its code (x-amzn-ErrorType)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def not_found(what: str) -> LambdaError:
    return LambdaError(404, "ResourceNotFoundException", what)


def invalid(message: str) -> LambdaError:
    return LambdaError(400, "InvalidParameterValueException", message)


def function_arn(name: str) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"


def function_name_of(given: str) -> tuple[str, str | None]:
    """(name, qualifier) of a FunctionName as Lambda takes it: a name, an ARN, or a partial ARN
    (ACCOUNT:function:NAME), each with an optional :QUALIFIER."""
    parts = given.split(":")
    if len(parts) >= 7 and parts[0] == "arn" and parts[5] == "function":
        return parts[6], (parts[7] if len(parts) > 7 else None)
    if len(parts) >= 3 and parts[1] == "function":
        return parts[2], (parts[3] if len(parts) > 3 else None)
    return parts[0], (parts[1] if len(parts) > 1 else None)


def _lambda_time(epoch_s: float) -> str:
    """A function's LastModified as Lambda writes it: 2026-12-02T16:00:00.000+0000."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"


def _code_files(spec: FunctionSpec) -> list[Path]:
    return sorted(
        path for path in spec.code_dir.rglob("*") if path.is_file() and "__pycache__" not in path.parts
    )


def configuration(spec: FunctionSpec) -> dict[str, Any]:
    """GetFunctionConfiguration's reply: the template's settings, the environment the function is
    given, and its code's size, digest and time (read from its folder now: hot reload changes
    them)."""
    files = _code_files(spec)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return {
        "FunctionName": spec.logical_id,
        "FunctionArn": function_arn(spec.logical_id),
        "Runtime": spec.runtime,
        "Role": f"arn:aws:iam::{ACCOUNT}:role/{spec.logical_id}Role",
        "Handler": spec.handler,
        "CodeSize": sum(path.stat().st_size for path in files),
        "Description": "",
        "Timeout": spec.timeout_s,
        "MemorySize": spec.memory_mb,
        "LastModified": _lambda_time(max((path.stat().st_mtime for path in files), default=0.0)),
        "CodeSha256": base64.b64encode(digest.digest()).decode(),
        "Version": "$LATEST",
        "Environment": {"Variables": dict(spec.environment)},
        "Layers": [
            {"Arn": f"arn:aws:lambda:{REGION}:{ACCOUNT}:layer:{path.name}:1"} for path in spec.layer_dirs
        ],
        "State": "Active",
        "LastUpdateStatus": "Successful",
        "PackageType": "Zip",
        "Architectures": [spec.architecture],
        "EphemeralStorage": {"Size": 512},
        "LoggingConfig": {"LogFormat": "Text", "LogGroup": f"/aws/lambda/{spec.logical_id}"},
    }


# --- event source mappings -----------------------------------------------------------------

Poller = SqsPoller | StreamPoller
Source = SqsSource | StreamSource
_COMMON_FIELDS = {
    "FunctionName",
    "Enabled",
    "BatchSize",
    "MaximumBatchingWindowInSeconds",
    "FunctionResponseTypes",
}
_SQS_FIELDS = _COMMON_FIELDS | {"ScalingConfig"}
_STREAM_FIELDS = _COMMON_FIELDS | {"MaximumRetryAttempts", "BisectBatchOnFunctionError"}


def mapping_uuid(source: Source) -> str:
    """A mapping's UUID: the same for a template's event at every start, so that a script (and
    the journal of changes) can keep it."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"llmtasks-local:{source.function_id}:{source.name}"))


def _source_arn(source: Source) -> str:
    return source.queue_arn if isinstance(source, SqsSource) else source.stream_arn


def _whole(body: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid(f"{name} must be a whole number from {low} to {high}, not {value!r}")
    return value


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body[name]
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, not {value!r}")
    return value


def changed_source(source: Source, body: Mapping[str, Any]) -> Source:
    """`source` with an UpdateEventSourceMapping's changes, checked as Lambda checks them. A
    field this stack does not apply is refused rather than taken and ignored."""
    sqs = isinstance(source, SqsSource)
    allowed = _SQS_FIELDS if sqs else _STREAM_FIELDS
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise invalid(
            f"{', '.join(unknown)}: not changed by the local stack's UpdateEventSourceMapping"
            f" (it changes {', '.join(sorted(allowed))})"
        )
    updates: dict[str, Any] = {}
    if "FunctionName" in body and function_name_of(str(body["FunctionName"]))[0] != source.function_id:
        raise invalid(
            f"the local stack does not move a mapping to another function than {source.function_id}"
        )
    if "Enabled" in body:
        updates["enabled"] = _flag(body, "Enabled")
    if "BatchSize" in body:
        updates["batch_size"] = _whole(body, "BatchSize", 1, 10000)
    if "MaximumBatchingWindowInSeconds" in body:
        updates["batching_window_s"] = _whole(body, "MaximumBatchingWindowInSeconds", 0, 300)
    if "FunctionResponseTypes" in body:
        kinds = body["FunctionResponseTypes"]
        if not isinstance(kinds, list) or not set(kinds) <= {"ReportBatchItemFailures"}:
            raise invalid(f"FunctionResponseTypes may hold ReportBatchItemFailures alone, not {kinds!r}")
        updates["report_batch_item_failures"] = bool(kinds)
    if "ScalingConfig" in body:
        scaling = body["ScalingConfig"]
        if not isinstance(scaling, dict) or set(scaling) - {"MaximumConcurrency"}:
            raise invalid(f"ScalingConfig holds MaximumConcurrency alone, not {scaling!r}")
        updates["maximum_concurrency"] = (
            _whole(scaling, "MaximumConcurrency", 2, 1000) if "MaximumConcurrency" in scaling else None
        )
    if "MaximumRetryAttempts" in body:
        updates["maximum_retry_attempts"] = _whole(body, "MaximumRetryAttempts", -1, 10000)
    if "BisectBatchOnFunctionError" in body:
        updates["bisect_on_error"] = _flag(body, "BisectBatchOnFunctionError")
    changed = dataclasses.replace(source, **updates)
    if sqs and changed.batch_size > 10 and changed.batching_window_s < 1:
        raise invalid(
            "Maximum batch window in seconds must be greater than 0 if maximum batch size is greater than 10"
        )
    return changed


def mapping(source: Source, modified: float) -> dict[str, Any]:
    """An EventSourceMappingConfiguration as Lambda returns it."""
    reply: dict[str, Any] = {
        "UUID": mapping_uuid(source),
        "EventSourceArn": _source_arn(source),
        "FunctionArn": function_arn(source.function_id),
        "BatchSize": source.batch_size,
        "MaximumBatchingWindowInSeconds": int(source.batching_window_s),
        "LastModified": modified,
        "State": "Enabled" if source.enabled else "Disabled",
        "StateTransitionReason": "USER_INITIATED",
        "FunctionResponseTypes": ["ReportBatchItemFailures"] if source.report_batch_item_failures else [],
    }
    if isinstance(source, SqsSource):
        if source.maximum_concurrency is not None:
            reply["ScalingConfig"] = {"MaximumConcurrency": source.maximum_concurrency}
        return reply
    reply |= {
        "StartingPosition": source.starting_position,
        "MaximumRetryAttempts": source.maximum_retry_attempts,
        "BisectBatchOnFunctionError": source.bisect_on_error,
    }
    if source.filter_patterns:
        reply["FilterCriteria"] = {"Filters": [{"Pattern": pattern} for pattern in source.filter_patterns]}
    if source.on_failure_arn:
        reply["DestinationConfig"] = {"OnFailure": {"Destination": source.on_failure_arn}}
    return reply


class EventSourceMappings:
    """The stack's event source mappings, one a poller, by UUID. Each change is journaled (in
    `journal`, a JSON file of every mapping's changes, rewritten whole): a paused source stays
    paused after a restart, a crash too, until it is resumed."""

    def __init__(self, pollers: Iterable[Poller], journal: Path | None = None) -> None:
        self._pollers = {mapping_uuid(poller.source): poller for poller in pollers}
        self._modified = dict.fromkeys(self._pollers, time.time())
        self._journal = journal
        self._lock = threading.Lock()
        self._changes: dict[str, dict[str, Any]] = {}
        kept = read_kept(journal, "the event source mappings' changes") if journal is not None else None
        for key, change in (kept or {}).items():
            if key not in self._pollers:
                continue  # a mapping the template no longer has is forgotten
            try:
                self.update(key, change)
            except LambdaError as refused:  # the template changed under it: its own settings hold
                print(
                    f"A kept change to event source mapping {key} no longer applies ({refused}); dropped",
                    flush=True,
                )

    def list(self, *, function_id: str | None = None, source_arn: str | None = None) -> list[dict[str, Any]]:
        return [
            mapping(poller.source, self._modified[key])
            for key, poller in self._pollers.items()
            if function_id in (None, poller.source.function_id)
            and source_arn in (None, _source_arn(poller.source))
        ]

    def get(self, key: str) -> dict[str, Any]:
        poller = self._poller(key)
        return mapping(poller.source, self._modified[key])

    def update(self, key: str, body: Mapping[str, Any]) -> dict[str, Any]:
        poller = self._poller(key)
        with self._lock:
            source = changed_source(poller.source, body)
            self._changes[key] = {**self._changes.get(key, {}), **body}
            self._keep()
            poller.reconfigure(source)  # type: ignore[arg-type]  # a poller takes its own kind
            self._modified[key] = time.time()
        return mapping(source, self._modified[key])

    def _poller(self, key: str) -> Poller:
        poller = self._pollers.get(key)
        if poller is None:
            raise not_found(f"The resource you requested does not exist. (Service: Lambda, UUID: {key})")
        return poller

    def _keep(self) -> None:
        if self._journal is not None:
            write_kept(self._journal, self._changes)


# --- asynchronous invocations ---------------------------------------------------------------


@dataclasses.dataclass(order=True)
class _EventJob:
    due: float
    seq: int
    function_id: str = dataclasses.field(compare=False)
    request_id: str = dataclasses.field(compare=False)
    event: Any = dataclasses.field(compare=False)
    attempt: int = dataclasses.field(default=0, compare=False)


class EventInvocations:
    """Lambda's asynchronous invocations (InvocationType Event): queued, run on the function's
    runtime, a failed one tried again after `retry_base_s`, then after twice that (Lambda: one
    minute, then two), up to the function's MaximumRetryAttempts, under the same request id; then
    a record of it goes to the function's SQS on-failure destination (`destination`), or a line
    says it was dropped. The queue is kept in memory: a stop drops what waits in it."""

    def __init__(
        self,
        runtimes: Mapping[str, FunctionRuntime],
        stop: threading.Event,
        *,
        retry_base_s: float = EVENT_RETRY_BASE_S,
        destination: Callable[[FunctionSpec], Callable[[dict[str, Any]], None] | None] = lambda _: None,
        say: Callable[[str], None] = print,
    ) -> None:
        self._runtimes = runtimes
        self._stop = stop
        self._retry_base_s = retry_base_s
        self._destination = destination
        self._say = say
        self._due: list[_EventJob] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=EVENT_WORKERS, thread_name_prefix="event-invoke")
        self.thread = threading.Thread(target=self._dispatch, name="event-invocations", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, function_id: str, event: Any, request_id: str) -> None:
        self._schedule(_EventJob(time.monotonic(), 0, function_id, request_id, event))

    def _schedule(self, job: _EventJob) -> None:
        with self._changed:
            heapq.heappush(self._due, dataclasses.replace(job, seq=next(self._order)))
            self._changed.notify()

    def _dispatch(self) -> None:
        while not self._stop.is_set():
            with self._changed:
                wait_s = self._due[0].due - time.monotonic() if self._due else 1.0
                if wait_s > 0:
                    self._changed.wait(min(wait_s, 1.0))  # a second at most: a stop is seen
                    continue
                job = heapq.heappop(self._due)
            self._pool.submit(self._attempt, job)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _attempt(self, job: _EventJob) -> None:
        runtime = self._runtimes[job.function_id]
        invocation = runtime.invoke(job.event, request_id=job.request_id)
        if invocation.ok:
            return
        spec = runtime.spec
        if job.attempt < spec.event_invoke.maximum_retry_attempts:
            delay_s = self._retry_base_s * 2**job.attempt
            self._schedule(dataclasses.replace(job, due=time.monotonic() + delay_s, attempt=job.attempt + 1))
            return
        self._give_up(spec, job, invocation)

    def _give_up(self, spec: FunctionSpec, job: _EventJob, invocation: Invocation) -> None:
        tries = job.attempt + 1
        send = self._destination(spec)
        if send is None:
            self._say(
                f"[{spec.logical_id}] Event invocation {job.request_id} failed {tries} time(s)"
                f" ({invocation.error}); dropped: the function has no SQS on-failure destination"
            )
            return
        send(
            {
                "version": "1.0",
                "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                "requestContext": {
                    "requestId": job.request_id,
                    "functionArn": f"{function_arn(spec.logical_id)}:$LATEST",
                    "condition": "RetriesExhausted",
                    "approximateInvokeCount": tries,
                },
                "requestPayload": job.event,
                "responseContext": {
                    "statusCode": 200,
                    "executedVersion": "$LATEST",
                    "functionError": "Unhandled",
                },
                "responsePayload": invocation.error_payload(job.request_id),
            }
        )


# --- the API ----------------------------------------------------------------------------------


class LambdaApi:
    def __init__(
        self,
        runtimes: Mapping[str, FunctionRuntime],
        mappings: EventSourceMappings,
        events: EventInvocations,
    ) -> None:
        self._runtimes = runtimes
        self._mappings = mappings
        self._events = events

    def app(self) -> Starlette:
        routes = [
            # boto3 asks for the lists without the trailing slash the API's reference shows
            *(Route(f"{API}/functions{end}", self.list_functions, methods=["GET"]) for end in ("", "/")),
            Route(f"{API}/functions/{{name}}", self.get_function, methods=["GET"]),
            Route(f"{API}/functions/{{name}}/configuration", self.get_configuration, methods=["GET"]),
            Route(f"{API}/functions/{{name}}/invocations", self.invoke, methods=["POST"]),
            *(
                Route(f"{API}/event-source-mappings{end}", self.list_mappings, methods=["GET"])
                for end in ("", "/")
            ),
            Route(f"{API}/event-source-mappings/{{key}}", self.get_mapping, methods=["GET"]),
            Route(f"{API}/event-source-mappings/{{key}}", self.update_mapping, methods=["PUT"]),
            Route("/{rest:path}", self.unsupported, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
        ]
        return Starlette(routes=routes, exception_handlers={LambdaError: _error_reply})

    def _runtime(self, given: str, qualifier: str | None = None) -> FunctionRuntime:
        name, in_name = function_name_of(given)
        runtime = self._runtimes.get(name)
        wanted = qualifier or in_name
        if runtime is None or wanted not in (None, "$LATEST"):
            shown = f"{function_arn(name)}:{wanted}" if wanted else function_arn(name)
            raise not_found(f"Function not found: {shown}")
        return runtime

    async def list_functions(self, request: Request) -> Response:
        return _page(
            request, "Functions", [configuration(runtime.spec) for runtime in self._runtimes.values()]
        )

    async def get_function(self, request: Request) -> Response:
        spec = self._runtime(request.path_params["name"], request.query_params.get("Qualifier")).spec
        return JSONResponse(
            {
                "Configuration": configuration(spec),
                "Code": {"RepositoryType": "Local", "Location": spec.code_dir.as_uri()},
            }
        )

    async def get_configuration(self, request: Request) -> Response:
        spec = self._runtime(request.path_params["name"], request.query_params.get("Qualifier")).spec
        return JSONResponse(configuration(spec))

    async def invoke(self, request: Request) -> Response:
        runtime = self._runtime(request.path_params["name"], request.query_params.get("Qualifier"))
        kind = request.headers.get("x-amz-invocation-type", "RequestResponse")
        log_type = request.headers.get("x-amz-log-type", "None")
        if kind not in INVOCATION_TYPES:
            raise invalid(f"InvocationType must be one of {', '.join(INVOCATION_TYPES)}, not {kind!r}")
        if log_type not in ("None", "Tail"):
            raise invalid(f"LogType must be None or Tail, not {log_type!r}")
        if log_type == "Tail" and kind != "RequestResponse":
            raise invalid("LogType Tail is for RequestResponse invocations")
        if "x-amz-client-context" in request.headers:
            raise invalid(
                "ClientContext is not passed on by the local stack (its sandboxes have no mobile context)"
            )
        body = await request.body()
        limit = EVENT_REQUEST_BYTES if kind == "Event" else REQUEST_BYTES
        if len(body) > limit:
            raise LambdaError(
                413,
                "RequestTooLargeException",
                f"Request must be smaller than {limit} bytes for the {kind} invocation type",
            )
        try:
            event = json.loads(body) if body.strip() else {}
        except ValueError as error:
            raise LambdaError(
                400, "InvalidRequestContentException", f"Could not parse request body into json: {error}"
            ) from error
        request_id = str(uuid.uuid4())
        ids = {"x-amzn-RequestId": request_id}
        if kind == "DryRun":
            return Response(status_code=204, headers=ids)
        if kind == "Event":
            self._events.put(runtime.spec.logical_id, event, request_id)
            return Response(status_code=202, headers=ids)
        invocation = await run_in_threadpool(
            runtime.invoke, event, request_id=request_id, synchronous=True, log=log_type == "Tail"
        )
        headers = {**ids, "X-Amz-Executed-Version": "$LATEST"}
        if log_type == "Tail":
            tail = "\n".join(invocation.log).encode()[-TAIL_BYTES:]
            headers["X-Amz-Log-Result"] = base64.b64encode(tail).decode()
        if not invocation.ok:
            headers["X-Amz-Function-Error"] = "Unhandled"
            return JSONResponse(invocation.error_payload(request_id), headers=headers)
        return Response(json.dumps(invocation.payload), headers=headers, media_type="application/json")

    async def list_mappings(self, request: Request) -> Response:
        given = request.query_params.get("FunctionName")
        function_id = None if given is None else self._runtime(given).spec.logical_id
        found = self._mappings.list(
            function_id=function_id, source_arn=request.query_params.get("EventSourceArn")
        )
        return _page(request, "EventSourceMappings", found)

    async def get_mapping(self, request: Request) -> Response:
        return JSONResponse(self._mappings.get(request.path_params["key"]))

    async def update_mapping(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError as error:
            raise LambdaError(
                400, "InvalidRequestContentException", f"Could not parse request body into json: {error}"
            ) from error
        if not isinstance(body, dict):
            raise LambdaError(400, "InvalidRequestContentException", "the request body must be a JSON object")
        changed = await run_in_threadpool(self._mappings.update, request.path_params["key"], body)
        return JSONResponse(changed, status_code=202)

    async def unsupported(self, request: Request) -> Response:
        raise LambdaError(
            400,
            "InvalidParameterValueException",
            f"{request.method} {request.url.path}: the local stack's Lambda API serves ListFunctions,"
            " GetFunction, GetFunctionConfiguration, Invoke, ListEventSourceMappings,"
            " GetEventSourceMapping and UpdateEventSourceMapping",
        )


def _page(request: Request, name: str, items: list[dict[str, Any]]) -> Response:
    """A List call's reply: the page its Marker and MaxItems ask for, as `name`, and the
    NextMarker of the next page, if there is one."""
    marker, max_items = request.query_params.get("Marker"), request.query_params.get("MaxItems")
    try:
        start = int(marker) if marker else 0
        count = int(max_items) if max_items else 50
    except ValueError:
        raise invalid(f"Marker and MaxItems are numbers here, not {marker!r} and {max_items!r}") from None
    if not 0 <= start <= len(items) or not 1 <= count <= 10000:
        raise invalid(f"Marker {marker!r} or MaxItems {max_items!r} is out of range")
    reply: dict[str, Any] = {name: items[start : start + count]}
    if start + count < len(items):
        reply["NextMarker"] = str(start + count)
    return JSONResponse(reply)


async def _error_reply(_: Request, error: Exception) -> Response:
    assert isinstance(error, LambdaError)
    return JSONResponse(
        {"Type": "User", "message": str(error)},
        status_code=error.status,
        headers={"x-amzn-ErrorType": error.code},
    )
