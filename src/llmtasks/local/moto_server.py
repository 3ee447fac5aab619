"""The embedded AWS endpoint: moto's server, run in its own process by `llmtasks up`.

A separate process keeps moto's request handling off the functions' interpreter lock. This
module is where the local stack adds what moto lacks, so every client sees one endpoint:
redrive (moto_redrive), atomic conditional writes (moto_atomic), a count of the AWS API
calls it served, by service and operation, at `/_llmtasks/calls` (GET reads, DELETE zeroes),
which the benchmark reads to count what a task costs at the backend rather than estimate it,
and its state kept across restarts (`--state FILE`; `POST /_llmtasks/state` saves it).

The state is a snapshot of moto's own backends (pickle), not moto's recorder: a replay of every
request would redo each receive and delete of a queue in order, at start, slowly; a snapshot
restores tables, stream records, objects and messages as they were, delays and visibility
timers included (they are wall-clock times, and go on running while the stack is down).
"""

from __future__ import annotations

import copyreg
import json
import pickle
import re
import sys
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

CALLS_PATH = "/_llmtasks/calls"
STATE_PATH = "/_llmtasks/state"
# What the local stack keeps: tables and their streams, buckets, queues.
STATE_SERVICES = ("dynamodb", "dynamodbstreams", "s3", "sqs")
_SCOPE = re.compile(r"Credential=[^/]+/\d+/[^/]+/([^/]+)/aws4_request")


def operation_of(environ: dict[str, Any]) -> str:
    """`service.Operation` of one request: JSON protocols name it in X-Amz-Target, query
    protocols in Action; REST ones (S3) only by method."""
    scope = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
    service = scope.group(1) if scope else "unknown"
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
    """Counts each AWS call moto answers, and answers reads of the count. Receives that return
    no message are counted apart (`sqs.ReceiveMessage.empty`): pollers make them while idle,
    at a rate set by time, not by the number of tasks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()

    def count(self, operation: str) -> None:
        with self._lock:
            self.calls[operation] += 1

    def read(self, *, reset: bool = False) -> bytes:
        with self._lock:
            body = json.dumps(dict(self.calls)).encode()
            if reset:
                self.calls.clear()
        return body

    def __call__(self, app: Any, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        """Answers a read of the count at CALLS_PATH (DELETE zeroes it); sends any other request
        to `app` and counts it."""
        if environ.get("PATH_INFO") == CALLS_PATH:
            start_response("200 OK", [("Content-Type", "application/json")])
            return [self.read(reset=environ.get("REQUEST_METHOD") == "DELETE")]
        operation = operation_of(environ)
        reply: Iterable[bytes] = app(environ, start_response)
        if operation.endswith(".ReceiveMessage"):
            reply = [b"".join(reply)]  # a receive's reply is small; read it to see if it is empty
            if _is_empty_receive(reply[0]):
                operation += ".empty"
        self.count(operation)
        return reply


def _picklable_locks() -> None:
    """moto's SQS queues hold locks; a snapshot holds fresh ones in their place."""
    copyreg.pickle(type(threading.RLock()), lambda _: (threading.RLock, ()))
    copyreg.pickle(type(threading.Lock()), lambda _: (threading.Lock, ()))


def save_state(path: Path) -> int:
    """Writes moto's backends to `path` (whole or not at all); returns the bytes written."""
    from llmtasks.local.moto_atomic import write_lock

    with write_lock():  # no DynamoDB write lands halfway through the snapshot
        state = {
            name: {account: dict(regions) for account, regions in _backends(name).items()}
            for name in STATE_SERVICES
        }
        data = pickle.dumps(state)
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(path)
    return len(data)


def _backends(name: str) -> Any:
    from moto.backends import get_backend

    return get_backend(name)  # type: ignore[call-overload]


def load_state(path: Path) -> None:
    state = pickle.loads(path.read_bytes())  # noqa: S301 - the stack's own file, in its own state dir
    for name, accounts in state.items():
        backends = _backends(name)
        for account, regions in accounts.items():
            for region, backend in regions.items():
                backends[account][region] = backend


def _install_endpoints(state_file: Path | None) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    dispatch = DomainDispatcherApplication.__call__
    counter = CallCounter()

    def served(self: DomainDispatcherApplication, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == STATE_PATH and environ.get("REQUEST_METHOD") == "POST":
            if state_file is None:
                start_response("409 Conflict", [("Content-Type", "application/json")])
                return [b'{"error": "started without --state"}']
            size = save_state(state_file)
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps({"bytes": size}).encode()]
        return counter(lambda e, s: dispatch(self, e, s), environ, start_response)

    DomainDispatcherApplication.__call__ = served  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main

    from llmtasks.local import moto_atomic, moto_redrive

    args = list(argv if argv is not None else sys.argv[1:])
    state_file = None
    if "--state" in args:
        at = args.index("--state")
        state_file = Path(args[at + 1])
        del args[at : at + 2]
    moto_redrive.install()
    moto_atomic.install()
    _picklable_locks()
    if state_file is not None and state_file.exists():
        load_state(state_file)
    _install_endpoints(state_file)
    moto_main(args)


if __name__ == "__main__":
    main()
