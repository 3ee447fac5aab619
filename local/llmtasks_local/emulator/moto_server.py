"""The embedded AWS endpoint: moto's server, run in its own process by `llmtasks up`.

A separate process keeps moto's request handling off the functions' interpreter lock. This
module is where the local stack adds what moto lacks, so every client sees one endpoint:
redrive and atomic conditional writes (llmtasks_local.moto_patches), a count of the AWS API
calls it served, by service and operation, at `/_llmtasks/calls` (GET reads, DELETE zeroes),
which the benchmark reads to count what a task costs at the backend rather than estimate it,
the CPU each operation's answers took (`/_llmtasks/calls/cpu`) and how much of that was moto's
backend doing the work asked for and the journal writing it (`/_llmtasks/calls/backend`: the
floor the bench sets beside what serving costs), the DynamoDB items written by table with their
sizes and the write units DynamoDB would bill for them (`/_llmtasks/calls/writes`), and its state
kept in a state dir (`--state-dir DIR`: a snapshot and a journal, moto_state): `GET
/_llmtasks/state` says whether changes can be written there, `POST` takes a clean stop's snapshot.
`/_llmtasks/streams/records` counts the records each table's stream has taken, and waits for the
next (StreamRecords), so the stack's stream pollers read a stream only when it has something new,
and `/_llmtasks/queues/receivable` names the queues holding a message a receive would take now,
and waits for that to change (ReceivableQueues), so an idle queue's poller sends no receive.
Requests signed for
Lambda go to the stack's Lambda API (`--lambda-url`), which runs the template's functions.
"""

from __future__ import annotations

import email.parser
import functools
import hashlib
import http.client
import io
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
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


def _install_backend_cache() -> None:
    """moto's dispatcher finds each request's backend under one lock, by matching the request's
    inferred host against every service's URL patterns (hundreds of regexes): in a burst of
    submits, 73% of the server's active samples waited on that lock. A signed request's backend
    follows from its signing scope alone, so the app found for an inferred host is kept and
    looked up without the lock; anything else takes moto's own way."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    find = DomainDispatcherApplication.get_application
    apps: dict[str, Any] = {}

    def get_application(self: DomainDispatcherApplication, environ: dict[str, Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if (
            not isinstance(path, str)
            or not environ.get("HTTP_AUTHORIZATION")
            or path.startswith(_SPECIAL_PATHS)
        ):
            return find(self, environ)
        host = self.infer_service_region_host(environ, path)
        if host is None:
            return find(self, environ)
        app = apps.get(host)
        if app is None:
            app = apps[host] = find(self, environ)
        return app

    DomainDispatcherApplication.get_application = get_application  # type: ignore[method-assign]


def _serve_lightly() -> None:
    """Keep-alive connections and no access log.

    werkzeug's development server closes every connection after its response (it says
    `Connection: close` each time: http.server cannot drain a body the app left unread before
    the next request line), so each boto3 call of a sandbox or of the stack opened a TCP
    connection, and the server accepted it, started a thread for it, drained and closed it:
    2,531 connections in 20 s of a burst, about one a request, and on the client's side urllib3
    reset its dropped connection before each call. Here a request's body is read whole before
    the app runs (its Content-Length says how much), and the reply is written whole with its
    length, so the connection takes the client's next request: a thread a connection, not a
    request. A request whose length is not given (a chunked upload) is served as werkzeug serves
    it, and its connection closed after."""
    from werkzeug.serving import WSGIRequestHandler

    WSGIRequestHandler.protocol_version = "HTTP/1.1"
    # The headers and the body are two writes: on a kept connection, Nagle's algorithm held the
    # body until the client's delayed ACK of the headers (40 ms a reply; closing flushed it).
    WSGIRequestHandler.disable_nagle_algorithm = True
    serve_and_close = WSGIRequestHandler.run_wsgi

    def run_wsgi(handler: WSGIRequestHandler) -> None:
        length = handler.headers.get("Content-Length")
        if handler.headers.get("Transfer-Encoding") or not (length or "0").isdigit():
            serve_and_close(handler)
            return
        body = handler.rfile.read(int(length or 0))
        environ = handler.make_environ()
        environ["wsgi.input"] = io.BytesIO(body)
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [status, headers]
            return None

        try:
            reply = handler.server.app(environ, start_response)
            try:
                content = b"".join(reply)
            finally:
                if hasattr(reply, "close"):
                    reply.close()
        except Exception:
            handler.close_connection = True
            handler.server.log("error", "Error on request:\n%s", traceback.format_exc())
            started[:] = ["500 Internal Server Error", [("Content-Type", "text/plain")]]
            content = b"Internal Server Error"
        status, headers = started
        code, _, message = status.partition(" ")
        handler.send_response(int(code), message)
        head = environ["REQUEST_METHOD"] == "HEAD"
        # What no body follows: a HEAD's, a 1xx's, a 204's, a 304's (a body written after one
        # would be read as the connection's next reply).
        bodyless = head or int(code) < 200 or int(code) in (204, 304)
        # The length written is the reply's own (a length the app misstated would corrupt the
        # connection's next reply), but a HEAD's, which is its GET's.
        framing = (
            ("connection", "transfer-encoding")
            if head
            else ("connection", "transfer-encoding", "content-length")
        )
        for name, value in headers:
            if name.lower() not in framing:
                handler.send_header(name, value)
        if not bodyless:
            handler.send_header("Content-Length", str(len(content)))
        if handler.close_connection:
            handler.send_header("Connection", "close")
        handler.end_headers()
        if not bodyless:
            handler.wfile.write(content)

    WSGIRequestHandler.run_wsgi = run_wsgi  # type: ignore[method-assign,assignment]


def _no_access_log() -> None:
    """werkzeug wrote a log line per request to stderr (7% of the server's samples in a burst);
    and it formats each request's line (its time, its address, its path as an IRI) before its
    logger says it drops it, 1.5% more: the line is formatted only when it would be written."""
    import logging

    from werkzeug.serving import WSGIRequestHandler

    werkzeug_log = logging.getLogger("werkzeug")
    werkzeug_log.setLevel(logging.WARNING)
    log_request = WSGIRequestHandler.log_request

    def log_request_if_logged(
        handler: WSGIRequestHandler, code: int | str = "-", size: int | str = "-"
    ) -> None:
        if werkzeug_log.isEnabledFor(logging.INFO):
            log_request(handler, code, size)

    WSGIRequestHandler.log_request = log_request_if_logged  # type: ignore[method-assign,assignment]


# A header line as the email parser takes one whole (email.feedparser.headerRE's header form,
# name not empty), ending its line, with no other line break and not a mailbox's "From " line.
_PLAIN_HEADER_LINE = re.compile(r"[\041-\071\073-\176]+:[^\r\n]*\r?\n")


def parse_headers_lightly(fp: Any, _class: type[http.client.HTTPMessage] = http.client.HTTPMessage) -> Any:
    """http.client.parse_headers, without the email parser where it has nothing to do.

    http.server reads each request's headers with the email package's parser (a FeedParser
    fed the whole block, each line matched against its patterns): 4% of moto's server's CPU in a
    burst, for requests whose headers are all `Name: value` lines. A block whose every line is
    one (no folded line, no line the email parser would take as the body's start or a defect)
    is made into the same message as the parser makes, each header through the message's own
    policy (header_source_parse, as the parser calls it); any other block goes to the email
    parser (tests/local/test_moto_dispatch.py parses blocks both ways)."""
    lines = http.client._read_headers(fp)  # type: ignore[attr-defined]  # the limits and errors of parse_headers
    ended = lines[-1] in (b"\r\n", b"\n")
    block = [line.decode("iso-8859-1") for line in (lines[:-1] if ended else lines)]
    if any(line.startswith("From ") or not _PLAIN_HEADER_LINE.fullmatch(line) for line in block):
        return email.parser.Parser(_class=_class).parsestr(b"".join(lines).decode("iso-8859-1"))
    message = _class()
    for line in block:
        message.set_raw(*message.policy.header_source_parse([line]))
    return message


def _debug_mode_off() -> None:
    """moto makes each service's Flask app in debug mode, where Flask subclasses each request's
    files dict to word a KeyError better (flask.debughelpers.attach_enctype_error_multidict: a
    class made a request), 4% of the server's CPU in a burst. The apps run without it here, and
    keep what debug mode does to errors: an unhandled one still propagates to werkzeug, which
    answers 500 and prints its traceback."""
    import moto.server

    create = moto.server.create_backend_app  # type: ignore[attr-defined]

    def create_backend_app(service: Any) -> Any:
        app = create(service)
        app.debug = False
        app.config["PROPAGATE_EXCEPTIONS"] = True
        return app

    moto.server.create_backend_app = create_backend_app  # type: ignore[attr-defined]


# The content types of AWS's JSON RPC protocols, whose requests name their operation in
# X-Amz-Target: DynamoDB and its streams (1.0), SQS and CloudWatch Logs (1.1).
_JSON_RPC_TYPES = frozenset({"application/x-amz-json-1.0", "application/x-amz-json-1.1"})


def _dispatch_json_rpc_directly() -> None:
    """JSON RPC requests handed to moto's handler without Flask around it.

    Each request of the services a task uses (DynamoDB, its streams, SQS) is a POST to `/` that
    names its operation in X-Amz-Target, and moto's Flask app routes every one of them to one
    view: convert_to_flask_response around the service's response class's dispatch. Around that
    call Flask pushed an app and a request context, matched the URL map, ran Flask-CORS's
    after-request hook and popped the contexts, for each request. Here the view an app's URL map
    gives `/` is found once, and called as Flask calls it (the same view, on moto's own request
    class, the reply the same Response object, written by werkzeug as Flask has it written),
    with the one header Flask-CORS adds to a request without an Origin
    (`Access-Control-Allow-Origin: *`, unless MOTO_DISABLE_GLOBAL_CORS). A request with an
    Origin, a Content-Encoding, another method, path or content type takes Flask's way
    (tests/local/test_moto_dispatch.py sends the same requests both ways, compares the replies)."""
    from botocore.exceptions import ClientError
    from flask import Flask, Response
    from moto.core.utils import convert_to_flask_response
    from moto.moto_api import recorder
    from moto.moto_server.werkzeug_app import BackendRequest, DomainDispatcherApplication
    from moto.settings import DISABLE_GLOBAL_CORS
    from werkzeug.exceptions import HTTPException
    from werkzeug.wrappers import Response as WerkzeugResponse

    # id(Flask app) -> the view it routes a JSON RPC request to, None where that is not moto's
    # view (Flask's way then)
    views: dict[int, convert_to_flask_response | None] = {}

    def view_of(app: Flask, environ: dict[str, Any]) -> convert_to_flask_response | None:
        if id(app) not in views:
            try:
                endpoint, _arguments = app.url_map.bind_to_environ(environ).match()
            except HTTPException:  # no route: Flask's way answers it (404, 405)
                view = None
            else:
                view = app.view_functions[endpoint]
            views[id(app)] = view if isinstance(view, convert_to_flask_response) else None
        return views[id(app)]

    def direct(environ: dict[str, Any]) -> bool:
        return (
            environ.get("REQUEST_METHOD") == "POST"
            and environ.get("PATH_INFO") == "/"
            and not environ.get("QUERY_STRING")
            and environ.get("CONTENT_TYPE") in _JSON_RPC_TYPES
            and "HTTP_X_AMZ_TARGET" in environ
            and "HTTP_ORIGIN" not in environ
            and "HTTP_CONTENT_ENCODING" not in environ
        )

    def dispatch(self: DomainDispatcherApplication, environ: dict[str, Any], start_response: Any) -> Any:
        app = self.get_application(environ)
        view = view_of(app, environ) if direct(environ) and isinstance(app, Flask) else None
        if view is None:
            return app(environ, start_response)
        # convert_to_flask_response.__call__, on the request Flask would have made
        request = BackendRequest(environ)
        recorder._record_request(request)
        try:
            result = view.callback(request, request.raw_url, dict(request.headers))
        except ClientError as error:
            result = 400, {}, error.response["Error"]["Message"]
        except HTTPException as error:  # Flask answers it with its own response
            result = error.get_response(environ)
        if isinstance(result, WerkzeugResponse):
            response = result
        else:
            status, headers, content = result if len(result) == 3 else (200, {}, result)
            response = Response(response=content, status=status, headers=headers)
        if not DISABLE_GLOBAL_CORS and "Access-Control-Allow-Origin" not in response.headers:
            response.headers.add("Access-Control-Allow-Origin", "*")
        return response(environ, start_response)

    DomainDispatcherApplication.__call__ = dispatch  # type: ignore[method-assign]


# Paths moto's dispatcher routes by path, not by the signing scope.
_SPECIAL_PATHS = ("/moto-api", "/favicon.ico", "/latest/meta-data/", "/latest/api/")


def _install_endpoints(state: DurableState | None, lambda_url: str | None) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    dispatch = DomainDispatcherApplication.__call__
    counter = CallCounter()
    _time_backends(counter)
    _account_writes(counter)
    stream_records = StreamRecords()
    stream_records.install()
    receivable_queues = ReceivableQueues()
    receivable_queues.install()

    def served(self: DomainDispatcherApplication, environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO")
        if path == STATE_PATH:
            return _state_endpoint(state, environ.get("REQUEST_METHOD", "GET"), start_response)
        if path == STREAM_RECORDS_PATH:
            return stream_records.answer(environ, start_response)
        if path == RECEIVABLE_QUEUES_PATH:
            return receivable_queues.answer(environ, start_response)
        if lambda_url is not None and service_of(environ) == "lambda":
            return counter(lambda e, s: _forward(lambda_url, e, s), environ, start_response)
        return counter(lambda e, s: dispatch(self, e, s), environ, start_response)

    DomainDispatcherApplication.__call__ = served  # type: ignore[method-assign]


# Headers of one hop, not passed on by a proxy (RFC 9110 7.6.1), and the length it recomputes.
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
# An invocation may run 15 minutes (Lambda's longest Timeout); the forward waits a little longer.
_FORWARD_TIMEOUT_S = 960


def _forward(lambda_url: str, environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """A request signed for Lambda, passed to the stack's Lambda API (emulator/lambda_api.py),
    which runs the functions: moto's own Lambda knows nothing of them."""
    import http.client
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
    from moto.server import main as moto_main

    from llmtasks_local.emulator import moto_state
    from llmtasks_local.moto_patches import atomic, fair_queues, fast_paths, queue_index, redrive

    args = list(argv if argv is not None else sys.argv[1:])
    state_dir, report_file = _path_option(args, "--state-dir"), _path_option(args, "--report-file")
    lambda_url = _option(args, "--lambda-url")  # the stack's Lambda API, which Lambda calls go to
    listening_fd = _option(args, "--fd")
    if listening_fd is not None:
        # The stack bound the port and handed the socket over (processes.spawn_python): werkzeug
        # serves an inherited socket when told so, as its own reloader's child does.
        os.environ |= {"WERKZEUG_RUN_MAIN": "true", "WERKZEUG_SERVER_FD": listening_fd}
    # moto_patches.install()'s order, with the journal between: it records the atomic writes
    # (so replays take the same locks), and the fair queue's bookkeeping wraps what it journals.
    redrive.install()
    atomic.install()
    queue_index.install()  # beneath what the journal and the fair queue's clock wrap
    moto_state.install()
    fair_queues.install()
    fast_paths.install()
    _install_backend_cache()
    _serve_lightly()
    _no_access_log()
    http.client.parse_headers = parse_headers_lightly  # type: ignore[assignment]
    _debug_mode_off()
    _dispatch_json_rpc_directly()
    # A file over the size limit (ulimit -f) is a write error, answered 503 and reported, not
    # a death of the endpoint (SIGXFSZ's default).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    state = None if state_dir is None else _open_state(state_dir, report_file)
    _install_endpoints(state, lambda_url)
    moto_main(args)


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
