"""What the embedded endpoint served: AWS calls by operation, their CPU, moto's share of it,
and the DynamoDB items written with the write units DynamoDB would bill for them.

The bench reads them (GET, DELETE zeroes) to count what a task costs at the backend rather than
estimate it. Calls are counted around moto's app on any moto version; the backend's share and
the items written come from hooks on moto's backends, installed with the moto patches only.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs

from llmtasks_local import moto_patches

CALLS_PATH = "/_llmtasks/calls"
CPU_PATH = "/_llmtasks/calls/cpu"
BACKEND_PATH = "/_llmtasks/calls/backend"
WRITES_PATH = "/_llmtasks/calls/writes"
_COUNTS_PATHS = (CALLS_PATH, CPU_PATH, BACKEND_PATH, WRITES_PATH)
_SCOPE = re.compile(r"Credential=[^/]+/\d+/[^/]+/([^/]+)/aws4_request")


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


def time_backends(counter: CallCounter) -> None:
    """Charges `counter` with the CPU moto's backends take (each public method of the services'
    backend classes, outermost call only), by the operation being served, and the journal's
    appends within them: the work each call asks for, the floor of what answering it costs.
    (An empty receive's backend time is charged to sqs.ReceiveMessage: the backend runs before
    the reply says it is empty.)"""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
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


def account_writes(counter: CallCounter) -> None:
    """Charges `counter` with each item DynamoDB writes, by table: every write path of moto's
    (PutItem, UpdateItem, DeleteItem, BatchWriteItem, a transaction's actions) goes through these
    three backend methods. The size is the item's after a put or an update (DynamoDB bills the
    larger of before and after: an item that only grows, as a task's does), the deleted one's for
    a delete, and for a write its condition refused, the item it was checked against (DynamoDB
    bills those too). Wrapped around the backends' timing: its own work is serving, not the
    floor."""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
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
