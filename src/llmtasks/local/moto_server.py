"""The embedded AWS endpoint: moto's server, run in its own process by `llmtasks up`.

A separate process keeps moto's request handling off the functions' interpreter lock. This
module is where the local stack adds what moto lacks, so every client sees one endpoint:
redrive (see moto_redrive) and a count of the AWS API calls it served, by service and
operation, at `/_llmtasks/calls` (GET reads, DELETE zeroes), which the benchmark reads to
count what a task costs at the backend rather than estimate it.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections import Counter
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
    if target:
        return f"{service}.{target.rsplit('.', 1)[-1]}"
    action = parse_qs(environ.get("QUERY_STRING", "")).get("Action")
    if action:
        return f"{service}.{action[0]}"
    return f"{service}.{environ.get('REQUEST_METHOD', 'GET')}"


class CallCounter:
    """Counts each AWS call before moto answers it, and answers reads of the count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: Counter[str] = Counter()

    def answer(self, environ: dict[str, Any]) -> bytes | None:
        """The count as JSON for a request to CALLS_PATH (zeroed by a DELETE); for any other
        request None, once it is counted."""
        if environ.get("PATH_INFO") != CALLS_PATH:
            with self._lock:
                self.calls[operation_of(environ)] += 1
            return None
        with self._lock:
            body = json.dumps(dict(self.calls)).encode()
            if environ.get("REQUEST_METHOD") == "DELETE":
                self.calls.clear()
        return body


def _install_call_counter() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    dispatch = DomainDispatcherApplication.__call__
    counter = CallCounter()

    def counted(self: DomainDispatcherApplication, environ: dict[str, Any], start_response: Any) -> Any:
        body = counter.answer(environ)
        if body is None:
            return dispatch(self, environ, start_response)
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]

    DomainDispatcherApplication.__call__ = counted  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main

    from llmtasks.local import moto_redrive

    moto_redrive.install()
    _install_call_counter()
    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
