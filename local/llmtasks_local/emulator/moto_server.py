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
- `/_llmtasks/ttl/expired`: the keys of a TTL table's expired items, for the stack's TTL sweep
  (patched moto only: on stock moto the sweep scans);
- requests signed for Lambda go on to the stack's Lambda API (`--lambda-url`).

moto's own code is patched only when moto_patches.enabled() allows it (the pinned version);
otherwise stock moto serves, with DynamoDB requests and SQS message changes taken one at a time
(moto_stock), so nothing a task relies on is lost. The counts live in moto_counts, the long
polls in moto_activity, the request loop's patches in moto_patches/serving.py.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmtasks_local.emulator import moto_stock
from llmtasks_local.emulator.moto_activity import (
    RECEIVABLE_QUEUES_PATH,
    STREAM_RECORDS_PATH,
    TTL_EXPIRED_PATH,
    ExpiredItems,
    ReceivableQueues,
    StreamRecords,
)
from llmtasks_local.emulator.moto_counts import (
    BACKEND_PATH,
    CALLS_PATH,
    CPU_PATH,
    WRITES_PATH,
    CallCounter,
    account_writes,
    service_of,
    time_backends,
)

if TYPE_CHECKING:  # moto is imported by the server process alone, not by the stack that starts it
    from llmtasks_local.emulator.moto_state import DurableState

# The endpoint's paths and its call counter, as the stack, the bench and the tests import them.
__all__ = [
    "BACKEND_PATH",
    "CALLS_PATH",
    "CPU_PATH",
    "RECEIVABLE_QUEUES_PATH",
    "STATE_PATH",
    "STREAM_RECORDS_PATH",
    "TTL_EXPIRED_PATH",
    "WRITES_PATH",
    "CallCounter",
    "main",
]
STATE_PATH = "/_llmtasks/state"
STATE_ERROR_EXIT = 78  # EX_CONFIG: the state dir holds what cannot be read


def _endpoint_app(moto_app: Any, state: DurableState | None, lambda_url: str | None, *, patched: bool) -> Any:
    """moto's WSGI app inside the local stack's own paths: the state dir, the call counts, the
    Lambda forward and, with the patches, the stream and queue activity (without them those
    answer 404 and the stack's pollers read as Lambda does)."""
    counter = CallCounter()
    stream_records, receivable_queues = StreamRecords(), ReceivableQueues()
    if patched:
        time_backends(counter)
        account_writes(counter)
        stream_records.install()
        receivable_queues.install()
    serve = moto_app if patched else moto_stock.one_at_a_time(moto_app)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO")
        if path == STATE_PATH:
            return _state_endpoint(state, environ.get("REQUEST_METHOD", "GET"), start_response)
        if path in (STREAM_RECORDS_PATH, RECEIVABLE_QUEUES_PATH, TTL_EXPIRED_PATH):
            if not patched:
                start_response("404 Not Found", [("Content-Type", "application/json")])
                return [b'{"error": "not counted on stock moto"}']
            if path == TTL_EXPIRED_PATH:
                return ExpiredItems.answer(environ, start_response)
            activity = stream_records if path == STREAM_RECORDS_PATH else receivable_queues
            return activity.answer(environ, start_response)
        if lambda_url is not None and service_of(environ) == "lambda":
            return counter(lambda e, s: _forward(lambda_url, e, s), environ, start_response)
        return counter(serve, environ, start_response)

    return app


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


def _open_state(directory: Path, report_file: Path | None, *, patched: bool) -> DurableState:
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
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    if not patched:  # said on stderr already (moto_patches.enabled); the stack says it to its user
        from llmtasks_local import moto_patches

        notes.insert(0, moto_patches.stock_line(moto_patches.refusal() or "refused"))
    report(notes=notes)
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
    else:
        from llmtasks_local.emulator import moto_state

        moto_state.install()  # the journal, on any moto that has the methods it follows
    # A file over the size limit (ulimit -f) is a write error, answered 503 and reported, not
    # a death of the endpoint (SIGXFSZ's default).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    state = None if state_dir is None else _open_state(state_dir, report_file, patched=patched)
    _serve(host, port, state, lambda_url, patched=patched)


def _install_patches() -> None:
    """moto_patches.install(), with the journal beneath the fair queue's bookkeeping (which wraps
    what it journals), and the server's request loop."""
    from llmtasks_local import moto_patches
    from llmtasks_local.emulator import moto_state
    from llmtasks_local.moto_patches import serving

    moto_patches.install(beneath_fair_queues=moto_state.install)
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
