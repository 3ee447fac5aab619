"""The embedded AWS endpoint: moto's server, run in its own process by `llmtasks up`.

A separate process keeps moto's request handling off the functions' interpreter lock. moto's
WSGI app is served inside the stack's own paths:

- `/_llmtasks/calls` (and `/cpu`, `/backend`, `/writes`): the AWS calls served by operation, the
  CPU they took, moto's share of it, the DynamoDB items written (GET reads, DELETE zeroes); the
  bench counts what a task costs at the backend from them;
- `/_llmtasks/state`: GET says whether changes can be written to the state dir (`--state-dir`,
  moto_state), POST takes a clean stop's snapshot;
- `/_llmtasks/streams/records` and `/_llmtasks/queues/receivable`: long polls that tell the
  stack's pollers when a stream or a queue has something new (patched moto only);
- requests signed for Lambda go on to the stack's Lambda API (`--lambda-url`).

moto's own code is patched only when moto_patches.enabled() allows it (the pinned version);
otherwise stock moto serves, with DynamoDB requests and SQS message changes taken one at a time
(_one_at_a_time), so nothing a task relies on is lost. Over 400 lines: the endpoints above share
the call counter and the server's start, and the request loop's patches live in
moto_patches/serving.py.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import json
import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

if TYPE_CHECKING:  # moto is imported by the server process alone, not by the stack that starts it
    from llmtasks_local.emulator.moto_state import DurableState

CALLS_PATH = "/_llmtasks/calls"
CPU_PATH = "/_llmtasks/calls/cpu"
BACKEND_PATH = "/_llmtasks/calls/backend"
WRITES_PATH = "/_llmtasks/calls/writes"
_COUNTS_PATHS = (CALLS_PATH, CPU_PATH, BACKEND_PATH, WRITES_PATH)
STATE_PATH = "/_llmtasks/state"
# How many records each table's stream has taken (GET ?after=N&wait_s=S: once their sum passes N,
# or S seconds on): what lets the stack's stream pollers skip reads of a stream with nothing new.
STREAM_RECORDS_PATH = "/_llmtasks/streams/records"
# The queues holding a message a receive would take now (GET ?after=VERSION&wait_s=S: once that
# set's version differs from VERSION, or S seconds on): what lets an idle queue's poller wait
# without receiving.
RECEIVABLE_QUEUES_PATH = "/_llmtasks/queues/receivable"
ACTIVITY_WAIT_MAX_S = 5.0  # the longest either holds a request (its wait_s) before answering
STATE_ERROR_EXIT = 78  # EX_CONFIG: the state dir holds what cannot be read
_SCOPE = re.compile(r"Credential=[^/]+/\d+/[^/]+/([^/]+)/aws4_request")


class StreamRecords:
    """The records DynamoDB streams have taken since the endpoint started, by table, and a wait
    for the next. Lambda reads each shard four times a second, with or without records; in the
    local stack those empty reads, two stream sources' at 4 a second, were 40% of an idle stack's
    CPU (boto3's call in the stack, moto's answer: 3.7 ms a read), and the test suite keeps
    several stacks idle at once. A poller whose last read was empty reads again once its table's
    count has moved (sources.StreamActivity): the same records, in the same order, as soon."""

    def __init__(self) -> None:
        self._added = threading.Condition()
        self.by_table: Counter[str] = Counter()
        self.total = 0

    def install(self) -> None:
        """Counts each record moto's streams append (StreamShard.add, after the item's write)."""
        # StreamShard.add imports moto's Lambda (and with it Kinesis) on a table's first record,
        # to look for event source mappings of moto's own: 50-65 ms of CPU that the first task
        # after Ready paid in its submit. Imported with the server instead.
        import moto.awslambda.utils  # noqa: F401
        from moto.dynamodb.models.table import StreamShard

        add = StreamShard.add

        def add_and_count(shard: StreamShard, old: Any, new: Any) -> None:
            add(shard, old, new)
            with self._added:
                self.by_table[shard.table.name] += 1
                self.total += 1
                self._added.notify_all()

        StreamShard.add = add_and_count  # type: ignore[method-assign,assignment]

    def answer(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        asked = _long_poll_query(environ, after_default="-1")
        if asked is None or not asked[0].removeprefix("-").isdigit():
            start_response("400 Bad Request", [("Content-Type", "application/json")])
            return [b'{"error": "after is an integer, wait_s a number of seconds"}']
        after, wait_s = int(asked[0]), asked[1]
        with self._added:
            self._added.wait_for(lambda: self.total > after, timeout=wait_s)
            body = json.dumps({"total": self.total, "by_table": dict(self.by_table)})
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body.encode()]


def _long_poll_query(environ: dict[str, Any], after_default: str) -> tuple[str, float] | None:
    """`after` and `wait_s` (capped at ACTIVITY_WAIT_MAX_S) of an activity endpoint's query."""
    query = parse_qs(environ.get("QUERY_STRING", ""))
    try:
        wait_s = min(ACTIVITY_WAIT_MAX_S, max(0.0, float(query.get("wait_s", ["0"])[0])))
    except ValueError:
        return None
    return query.get("after", [after_default])[0], wait_s


class ReceivableQueues:
    """The queues holding a message a receive would take now (visible, not delayed), by ARN, and
    a wait for that set to change. Lambda's idle pollers long-poll each queue, for no one's CPU;
    in the local stack the quiet poller of each of a stack's five queues received once a second
    (a boto3 call in the stack, moto's answer: 3.7 ms each), half of an idle stack's CPU, and the
    test suite keeps several stacks idle at once. A quiet poller receives once its queue is in
    the set (sources.QueueActivity): a send wakes the wait at once; a message whose delay or
    visibility timeout runs out is seen within RESCAN_S, as moto's own long poll sees it within
    its one-second slices."""

    RESCAN_S = 0.25

    def __init__(self) -> None:
        self._sent = threading.Condition()
        self._sends = 0  # read before each scan: a send during the scan ends the wait after it

    def install(self) -> None:
        """A send (Queue.add_message: SendMessage, its batch, a redrive) wakes the waits."""
        from moto.sqs.models import Message, Queue

        add = Queue.add_message

        def add_and_wake(queue: Queue, message: Message) -> None:
            add(queue, message)
            with self._sent:
                self._sends += 1
                self._sent.notify_all()

        Queue.add_message = add_and_wake  # type: ignore[method-assign,assignment]

    def _wait_for_send(self, seen: int, timeout_s: float) -> None:
        with self._sent:
            self._sent.wait_for(lambda: self._sends != seen, timeout=timeout_s)

    @staticmethod
    def receivable() -> list[str]:
        from moto.sqs.models import sqs_backends

        from llmtasks_local.moto_patches.atomic import sqs_lock

        with sqs_lock():  # no send, receive or delete changes a queue's messages meanwhile
            return sorted(
                queue.queue_arn
                for _account, _region, backend in sqs_backends.iter_backends()
                for queue in list(backend.queues.values())  # type: ignore[attr-defined]
                if any(message.visible and not message.delayed for message in queue._messages)
            )

    @staticmethod
    def version(arns: list[str]) -> str:
        return hashlib.blake2b("\n".join(arns).encode(), digest_size=8).hexdigest()

    def answer(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        asked = _long_poll_query(environ, after_default="")
        if asked is None:
            start_response("400 Bad Request", [("Content-Type", "application/json")])
            return [b'{"error": "wait_s is a number of seconds"}']
        after, wait_s = asked
        deadline = time.monotonic() + wait_s
        while True:
            sends = self._sends
            arns = self.receivable()
            version = self.version(arns)
            left = deadline - time.monotonic()
            if version != after or left <= 0:
                break
            self._wait_for_send(sends, min(left, self.RESCAN_S))
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps({"version": version, "receivable": arns}).encode()]


def service_of(environ: dict[str, Any]) -> str:
    """The service a request is signed for (its SigV4 scope), or "unknown"."""
    scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
    return scope.group(1) if scope else "unknown"


def operation_of(environ: dict[str, Any]) -> str:
    """`service.Operation` of one request: JSON protocols name it in X-Amz-Target, query
    protocols in Action; REST ones (S3, Lambda) only by method."""
    service = service_of(environ)
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target.startswith("DynamoDBStreams"):
        service = "dynamodbstreams"  # signed as dynamodb, billed apart (free to Lambda triggers)
    if target:
        return f"{service}.{target.rsplit('.', 1)[-1]}"
    action = parse_qs(environ.get("QUERY_STRING", "")).get("Action")
    if action:
        return f"{service}.{action[0]}"
    return f"{service}.{environ.get('REQUEST_METHOD', 'GET')}"


def _is_empty_receive(body: bytes) -> bool:
    return b"Messages" not in body and b"<Message>" not in body


class CallCounter:
    """Counts each AWS call moto answers, and the CPU its answer took (the serving thread's, in
    microseconds: what each operation costs the endpoint), and answers reads of both. Receives
    that return no message are counted apart (`sqs.ReceiveMessage.empty`): pollers make them
    while idle, at a rate set by time, not by the number of tasks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.cpu_us: Counter[str] = Counter()
        # Of cpu_us, what moto's backends took (charge_backend), by the operation being served,
        # and what the journal took of that with what it wrote (charge_journal).
        self.backend_us: Counter[str] = Counter()
        self.journal: Counter[str] = Counter()
        # DynamoDB item writes by table (charge_write): how many, their items' bytes, write units.
        self.writes: dict[str, Counter[str]] = {"items": Counter(), "bytes": Counter(), "units": Counter()}
        self._serving = threading.local()  # the operation this thread is answering

    def count(self, operation: str, cpu_s: float = 0.0) -> None:
        with self._lock:
            self.calls[operation] += 1
            self.cpu_us[operation] += round(cpu_s * 1e6)

    def charge_backend(self, cpu_s: float) -> None:
        operation = getattr(self._serving, "operation", None) or "outside requests"
        with self._lock:
            self.backend_us[operation] += round(cpu_s * 1e6)

    def charge_journal(self, cpu_s: float, written: int) -> None:
        with self._lock:
            self.journal["us"] += round(cpu_s * 1e6)
            self.journal["bytes"] += written
            self.journal["records"] += 1

    def charge_write(self, table: str, item_bytes: int) -> None:
        """One item written to `table` (put, updated or deleted), `item_bytes` its size: DynamoDB
        bills a write a unit a KB of the item, rounded up, and twice that in a transaction."""
        transaction = getattr(self._serving, "operation", None) == "dynamodb.TransactWriteItems"
        units = max(1, -(-item_bytes // 1024)) * (2 if transaction else 1)
        with self._lock:
            self.writes["items"][table] += 1
            self.writes["bytes"][table] += item_bytes
            self.writes["units"][table] += units

    def read(self, path: str, *, reset: bool = False) -> bytes:
        """The counts one of _COUNTS_PATHS answers; `reset` zeroes every count after."""
        with self._lock:
            if path == BACKEND_PATH:
                body = json.dumps({"backend_us": dict(self.backend_us), "journal": dict(self.journal)})
            elif path == WRITES_PATH:
                body = json.dumps({name: dict(counts) for name, counts in self.writes.items()})
            else:
                body = json.dumps(dict(self.cpu_us if path == CPU_PATH else self.calls))
            if reset:
                for counts in (self.calls, self.cpu_us, self.backend_us, self.journal, *self.writes.values()):
                    counts.clear()
        return body.encode()

    def __call__(self, app: Any, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        """Answers a read of the counts at CALLS_PATH, of the CPU at CPU_PATH, of the backend's
        share of it at BACKEND_PATH and of the items written at WRITES_PATH (DELETE at any of
        them zeroes them all); sends any other request to `app`, and counts it."""
        path = environ.get("PATH_INFO")
        if path in _COUNTS_PATHS:
            start_response("200 OK", [("Content-Type", "application/json")])
            return [self.read(path, reset=environ.get("REQUEST_METHOD") == "DELETE")]
        started = time.thread_time()
        operation = operation_of(environ)
        self._serving.operation = operation
        try:
            reply: Iterable[bytes] = app(environ, start_response)
        finally:
            self._serving.operation = None
        if operation.endswith(".ReceiveMessage"):
            reply = [b"".join(reply)]  # a receive's reply is small; read it to see if it is empty
            if _is_empty_receive(reply[0]):
                operation += ".empty"
        self.count(operation, time.thread_time() - started)
        return reply


def _time_backends(counter: CallCounter) -> None:
    """Charges `counter` with the CPU moto's backends take (each public method of the services'
    backend classes, outermost call only), by the operation being served, and the journal's
    appends within them: the work each call asks for, the floor of what answering it costs.
    (An empty receive's backend time is charged to sqs.ReceiveMessage: the backend runs before
    the reply says it is empty.)"""
    import inspect

    from moto.cloudwatch.models import CloudWatchBackend
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodbstreams.models import DynamoDBStreamsBackend
    from moto.logs.models import LogsBackend
    from moto.s3.models import S3Backend
    from moto.sqs.models import SQSBackend

    from llmtasks_local.emulator.journal import Journal

    inside = threading.local()

    def timed(method: Any) -> Any:
        @functools.wraps(method)
        def backend_call(*args: Any, **kwargs: Any) -> Any:
            if getattr(inside, "backend", False):
                return method(*args, **kwargs)
            inside.backend = True
            started = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                inside.backend = False
                counter.charge_backend(time.thread_time() - started)

        return backend_call

    for backend_class in (
        DynamoDBBackend,
        DynamoDBStreamsBackend,
        SQSBackend,
        S3Backend,
        LogsBackend,
        CloudWatchBackend,
    ):
        for name, member in list(vars(backend_class).items()):
            if not name.startswith("_") and inspect.isfunction(member):
                setattr(backend_class, name, timed(member))

    append = Journal.append

    def timed_append(journal: Journal, record: Any) -> int:
        started, before = time.thread_time(), journal.bytes_since_rotation
        seq = append(journal, record)
        counter.charge_journal(time.thread_time() - started, journal.bytes_since_rotation - before)
        return seq

    Journal.append = timed_append  # type: ignore[method-assign,assignment]


def _account_writes(counter: CallCounter) -> None:
    """Charges `counter` with each item DynamoDB writes, by table: every write path of moto's
    (PutItem, UpdateItem, DeleteItem, BatchWriteItem, a transaction's actions) goes through these
    three backend methods. The size is the item's after a put or an update (DynamoDB bills the
    larger of before and after: an item that only grows, as a task's does), the deleted one's for
    a delete, and for a write its condition refused, the item it was checked against (DynamoDB
    bills those too). Wrapped around the backends' timing: its own work is serving, not the
    floor."""
    from moto.dynamodb.exceptions import ConditionalCheckFailed
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType

    def accounted(write: Any, keyed: bool) -> Any:
        @functools.wraps(write)
        def written(backend: DynamoDBBackend, table_name: str, *args: Any, **kwargs: Any) -> Any:
            try:
                item = write(backend, table_name, *args, **kwargs)
            except ConditionalCheckFailed:
                attrs = args[0] if args else kwargs.get("key" if keyed else "item_attrs", {})
                table = backend.get_table(table_name)
                hash_key = attrs.get(table.hash_key_attr)
                range_key = attrs.get(table.range_key_attr) if table.range_key_attr else None
                checked = table.get_item(DynamoType(hash_key), DynamoType(range_key) if range_key else None)
                counter.charge_write(table_name, checked.size() if checked is not None else 0)
                raise
            if item is not None:
                counter.charge_write(table_name, item.size())
            return item

        return written

    for name, keyed in (("put_item", False), ("update_item", True), ("delete_item", True)):
        setattr(DynamoDBBackend, name, accounted(getattr(DynamoDBBackend, name), keyed))


def _endpoint_app(moto_app: Any, state: DurableState | None, lambda_url: str | None, *, patched: bool) -> Any:
    """moto's WSGI app inside the local stack's own paths: the state dir, the call counts, the
    Lambda forward and, with the patches, the stream and queue activity (without them those
    answer 404 and the stack's pollers read as Lambda does)."""
    counter = CallCounter()
    stream_records, receivable_queues = StreamRecords(), ReceivableQueues()
    if patched:
        _time_backends(counter)
        _account_writes(counter)
        stream_records.install()
        receivable_queues.install()
    serve = moto_app if patched else _one_at_a_time(moto_app)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO")
        if path == STATE_PATH:
            return _state_endpoint(state, environ.get("REQUEST_METHOD", "GET"), start_response)
        if path in (STREAM_RECORDS_PATH, RECEIVABLE_QUEUES_PATH):
            if not patched:
                start_response("404 Not Found", [("Content-Type", "application/json")])
                return [b'{"error": "not counted on stock moto"}']
            activity = stream_records if path == STREAM_RECORDS_PATH else receivable_queues
            return activity.answer(environ, start_response)
        if lambda_url is not None and service_of(environ) == "lambda":
            return counter(lambda e, s: _forward(lambda_url, e, s), environ, start_response)
        return counter(serve, environ, start_response)

    return app


# The SQS operations that change a queue's messages, served one at a time on stock moto. A
# receive is left out: it may long-poll, and two receives at once may both take one message,
# which SQS's at-least-once delivery allows (the service takes a second delivery over).
_SQS_MESSAGE_WRITES = frozenset(
    {
        "SendMessage",
        "SendMessageBatch",
        "DeleteMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
        "PurgeQueue",
    }
)


def _one_at_a_time(moto_app: Any) -> Any:
    """On stock moto (no moto_patches.atomic): each DynamoDB request served alone, so that a
    conditional write is checked and applied as one step, as DynamoDB does, and each SQS change
    of messages alone, so that a delete does not drop a message sent meanwhile. The locks are
    atomic's own, which a snapshot takes too. Slower, never wrong."""
    from llmtasks_local.moto_patches.atomic import sqs_lock, write_lock

    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        service, _, operation = operation_of(environ).partition(".")
        if service in ("dynamodb", "dynamodbstreams"):
            lock = write_lock()
        elif service == "sqs" and operation in _SQS_MESSAGE_WRITES:
            lock = sqs_lock()
        else:
            return moto_app(environ, start_response)
        with lock:
            return [b"".join(moto_app(environ, start_response))]

    return serve


# Headers of one hop, not passed on by a proxy (RFC 9110 7.6.1), and the length it recomputes.
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
# An invocation may run 15 minutes (Lambda's longest Timeout); the forward waits a little longer.
_FORWARD_TIMEOUT_S = 960


def _forward(lambda_url: str, environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """A request signed for Lambda, passed to the stack's Lambda API (emulator/lambda_api.py),
    which runs the functions: moto's own Lambda knows nothing of them."""
    from urllib.parse import quote, urlsplit

    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    path = environ.get("RAW_URI") or quote(environ.get("PATH_INFO", "/"), safe="/:$@")
    if not environ.get("RAW_URI") and environ.get("QUERY_STRING"):
        path += "?" + environ["QUERY_STRING"]
    headers = {
        name[5:].replace("_", "-").title(): value
        for name, value in environ.items()
        if name.startswith("HTTP_") and name[5:].replace("_", "-").lower() not in _HOP_HEADERS
    }
    if environ.get("CONTENT_TYPE"):
        headers["Content-Type"] = environ["CONTENT_TYPE"]
    target = urlsplit(lambda_url)
    connection = http.client.HTTPConnection(
        target.hostname or "127.0.0.1", target.port, timeout=_FORWARD_TIMEOUT_S
    )
    try:
        connection.request(environ.get("REQUEST_METHOD", "GET"), path, body, headers)
        reply = connection.getresponse()
        payload = reply.read()
    except OSError as error:
        start_response(
            "503 Service Unavailable",
            [("Content-Type", "application/json"), ("x-amzn-ErrorType", "ServiceException")],
        )
        return [
            json.dumps(
                {"Type": "Service", "message": f"the stack's Lambda API did not answer: {error}"}
            ).encode()
        ]
    finally:
        connection.close()
    passed = [(name, value) for name, value in reply.getheaders() if name.lower() not in _HOP_HEADERS]
    start_response(f"{reply.status} {reply.reason}", [*passed, ("Content-Length", str(len(payload)))])
    return [payload]


def _state_endpoint(state: DurableState | None, method: str, start_response: Any) -> list[bytes]:
    """GET: whether changes can be journaled; POST: a clean stop's snapshot."""
    if state is None:
        start_response("409 Conflict", [("Content-Type", "application/json")])
        return [b'{"error": "started without --state-dir"}']
    body = state.status() if method == "GET" else {"bytes": state.save(clean=True)}
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]


def _open_state(directory: Path, report_file: Path | None) -> DurableState:
    """The state dir loaded. What the start found is written to `report_file` for the stack to
    say (this process's own output may go nowhere): notes, or the error that stops it."""
    from llmtasks_local.emulator.journal import StateError
    from llmtasks_local.emulator.moto_state import DurableState

    def report(**said: Any) -> None:
        if report_file is not None:
            report_file.write_text(json.dumps(said))

    state = DurableState(directory)
    try:
        loaded = state.open()
    except (StateError, OSError) as error:
        what, where = (
            (error.what, str(error.path))
            if isinstance(error, StateError)
            else (f"the state dir cannot be used: {error.strerror}", str(error.filename or directory))
        )
        fix = "start empty with --reset, or move the file aside to keep it"
        report(error={"what": what, "where": where, "fix": fix})
        print(f"Error: {what} ({where}): {fix}", file=sys.stderr, flush=True)
        raise SystemExit(STATE_ERROR_EXIT) from error
    notes = []
    if loaded.torn is not None:
        notes.append(f"Warning: {loaded.torn}")
    if not loaded.clean:
        notes.append(
            f"The last run stopped without saving: {loaded.replayed} journaled change(s) replayed;"
            f" {loaded.released} message(s) received before the stop and not deleted are visible again"
        )
    report(notes=notes)
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    return state


def main(argv: list[str] | None = None) -> None:
    from llmtasks_local import moto_patches

    args = list(argv if argv is not None else sys.argv[1:])
    state_dir, report_file = _path_option(args, "--state-dir"), _path_option(args, "--report-file")
    lambda_url = _option(args, "--lambda-url")  # the stack's Lambda API, which Lambda calls go to
    listening_fd = _option(args, "--fd")
    host, port = _option(args, "-H") or "127.0.0.1", int(_option(args, "-p") or 5000)
    if listening_fd is not None:
        # The stack bound the port and handed the socket over (processes.spawn_python): werkzeug
        # serves an inherited socket when told so, as its own reloader's child does.
        os.environ |= {"WERKZEUG_RUN_MAIN": "true", "WERKZEUG_SERVER_FD": listening_fd}
    patched = moto_patches.enabled()  # on another moto version: stock moto, said in one line
    if patched:
        _install_patches()
    # A file over the size limit (ulimit -f) is a write error, answered 503 and reported, not
    # a death of the endpoint (SIGXFSZ's default).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    state = None if state_dir is None else _open_state(state_dir, report_file)
    _serve(host, port, state, lambda_url, patched=patched)


def _install_patches() -> None:
    """moto_patches.install()'s order, with the journal between: it records the atomic writes
    (so replays take the same locks), and the fair queue's bookkeeping wraps what it journals."""
    from llmtasks_local.emulator import moto_state
    from llmtasks_local.moto_patches import atomic, fair_queues, fast_paths, queue_index, redrive, serving

    redrive.install()
    atomic.install()
    queue_index.install()  # beneath what the journal and the fair queue's clock wrap
    moto_state.install()
    fair_queues.install()
    fast_paths.install()
    serving.install()


def _serve(
    host: str, port: int, state: DurableState | None, lambda_url: str | None, *, patched: bool
) -> None:
    """moto.server.main's server (its app, request handler and stop on SIGTERM), its app
    inside the stack's own endpoints."""
    import moto.server
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler
    from werkzeug.serving import run_simple

    signal.signal(signal.SIGINT, moto.server.signal_handler)
    signal.signal(signal.SIGTERM, moto.server.signal_handler)
    # looked up now: serving._debug_mode_off may have replaced it
    moto_app = DomainDispatcherApplication(moto.server.create_backend_app)  # type: ignore[attr-defined]
    moto_app.debug = True  # type: ignore[attr-defined]  # as moto.server.main has it
    app = _endpoint_app(moto_app, state, lambda_url, patched=patched)
    run_simple(host, port, app, threaded=True, request_handler=MotoRequestHandler)


def _option(args: list[str], name: str) -> str | None:
    """Takes `name VALUE` out of `args` (moto's own parser knows none of ours)."""
    if name not in args:
        return None
    at = args.index(name)
    value = args[at + 1]
    del args[at : at + 2]
    return value


def _path_option(args: list[str], name: str) -> Path | None:
    value = _option(args, name)
    return None if value is None else Path(value)


if __name__ == "__main__":
    main()
