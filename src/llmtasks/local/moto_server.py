"""The embedded AWS endpoint: moto's server, run in its own process by `llmtasks up`.

A separate process keeps moto's request handling off the functions' interpreter lock. This
module is where the local stack adds what moto lacks, so every client sees one endpoint:
redrive (moto_redrive), atomic conditional writes (moto_atomic), and a count of the AWS API
calls it served, by service and operation, at `/_llmtasks/calls` (GET reads, DELETE zeroes),
which the benchmark reads to count what a task costs at the backend rather than estimate it.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qs

CALLS_PATH = "/_llmtasks/calls"
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


def _install_call_counter() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    dispatch = DomainDispatcherApplication.__call__
    counter = CallCounter()

    def counted(self: DomainDispatcherApplication, environ: dict[str, Any], start_response: Any) -> Any:
        return counter(lambda e, s: dispatch(self, e, s), environ, start_response)

    DomainDispatcherApplication.__call__ = counted  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main

    from llmtasks.local import moto_atomic, moto_redrive

    moto_redrive.install()
    moto_atomic.install()
    _install_call_counter()
    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
