"""The moto server's request loop made lighter: werkzeug's, http.client's and Flask's work
around each request, done once or not at all, with the same replies
(tests/local/test_moto_dispatch.py sends the same requests both ways).

`install()` puts every one in place, through the moto_patches gate (moto_patches.enabled()):
they replace private code of moto's server, of werkzeug and of http.client.
"""

from __future__ import annotations

import email.parser
import http.client
import importlib.metadata
import io
import re
import sys
import traceback
from typing import Any

from llmtasks_local import moto_patches

# Paths moto's dispatcher routes by path, not by the signing scope.
_SPECIAL_PATHS = ("/moto-api", "/favicon.ico", "/latest/meta-data/", "/latest/api/")


def _install_backend_cache() -> None:
    """moto's dispatcher finds each request's backend under one lock, by matching the request's
    inferred host against every service's URL patterns (hundreds of regexes): in a burst, most
    of the server's threads waited on that lock. A signed request's backend
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
    connection, and the server accepted it, started a thread for it, drained and closed it
    (about one a request), and on the client's side urllib3 reset its dropped connection before
    each call. Here a request's body is read whole before
    the app runs (its Content-Length says how much), and the reply is written whole with its
    length, so the connection takes the client's next request: a thread a connection, not a
    request. A request whose length is not given (a chunked upload) is served as werkzeug serves
    it, and its connection closed after."""
    from werkzeug.serving import WSGIRequestHandler

    WSGIRequestHandler.protocol_version = "HTTP/1.1"
    # The headers and the body are two writes: on a kept connection, Nagle's algorithm held the
    # body until the client's delayed ACK of the headers (closing flushed it).
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
    """werkzeug wrote a log line per request to stderr, and formats each request's line (its
    time, its address, its path as an IRI) before its logger says it drops it: the line is
    formatted only when it would be written."""
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
    fed the whole block, each line matched against its patterns), for requests whose headers are
    all `Name: value` lines. A block whose every line is
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
    class made a request). The apps run without it here, and
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


# The versions of the other libraries whose private code these patches replace, as checked.
CHECKED_WITH = {"werkzeug": "3.1.9", "flask": "3.1.3"}


def refusal() -> str | None:
    """Why the request loop's patches are not installed beside moto's, or None when they may be."""
    for package, checked in CHECKED_WITH.items():
        found = importlib.metadata.version(package)
        if found != checked:
            return f"{package} {found} found, the request loop's patches were checked with {checked}"
    if not hasattr(http.client, "_read_headers"):
        return "this Python's http.client has no _read_headers"
    return None


def install() -> None:
    """Every patch of the server's request loop; in the moto server's process, before it serves."""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
    reason = refusal()
    if reason is not None:  # moto's own request loop: slower, the same replies
        print(f"request loop patches off ({reason}): slower, never wrong", file=sys.stderr, flush=True)
        return
    _install_backend_cache()
    _serve_lightly()
    _no_access_log()
    http.client.parse_headers = parse_headers_lightly  # type: ignore[assignment]
    _debug_mode_off()
    _dispatch_json_rpc_directly()
