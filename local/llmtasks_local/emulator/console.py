"""The local console: `llmtasks up` serves it at /console beside the API (it is not part of the
deployed API). One page (console.html, no assets from the internet) that polls two JSON
views: the deployment's overview (`llmtasks.ops.stats`, what `llmtasks stats` prints) and its
dead letters, with a button per queue that redrives it (`llmtasks.ops.deadletters`, what
`llmtasks dlq redrive` does). Both read the tables and queues the functions use, through the
AWS endpoint. An ended batch with failed items has a Retry button: the stack's own HTTP API,
`POST /batches/{id}/retry`, called as the batch's tenant (with a key `key_of` gives).

The overview is read by one thread of the console's own, every REFRESH_S while a page polls
and never after IDLE_S without a poll; a poll answers the newest view at once (its age in
`age_s`, `stale` once older than STALE_S), or, before the first, within FIRST_S with what
there is. So any number of pages cost the stack one read every REFRESH_S, a closed page none
after IDLE_S, and a slow stack a late view, never a pile of reads. A read's parts not begun
within READ_S are left out and named (`incomplete`). A view whose read fails answers 503 with
why, never a 500.

It shows every tenant's tasks, so its data needs the token `llmtasks up` prints in the console's
URL, as Jupyter does: opening /console?token=... keeps it in a cookie for the page (HttpOnly,
SameSite=Strict, so another site's page cannot use it); a script may send it as a Bearer token.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

import httpx
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from llmtasks.domain.errors import BackendError
from llmtasks.ops.batches import batch_tenant
from llmtasks.ops.deadletters import QUEUE_NAMES, DeadLetters
from llmtasks.ops.stats import overview
from llmtasks_local.emulator.cpu_account import ACCOUNT

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from llmtasks.ops.deployment import Deployment

PREFIX = "/console"
REFRESH_S = 2.0  # how often the overview is read while polled: the page polls every two seconds
IDLE_S = 10.0  # no read after this long without a poll
STALE_S = 3 * REFRESH_S  # a view older than this says it is stale
FIRST_S = 0.5  # how long a poll waits for the first view: a poll answers within a second
READ_S = 5.0  # the parts of a read begun after this are left out
# The console's AWS clients: a call that takes longer is cut short, and not retried (botocore's
# 60 s, retried, kept a page's Scan going for minutes): the next read asks again.
CALLS = Config(connect_timeout=2, read_timeout=READ_S, retries={"total_max_attempts": 1})
COOKIE = "llmtasks_console"
RETRY_TIMEOUT_S = 30.0
NEEDS_TOKEN = {
    "message": "The console needs its token: open the console URL `llmtasks up` printed (/console?token=...)."
}


class Console:
    def __init__(
        self,
        dynamodb: DynamoDBClient,
        sqs: SQSClient,
        deployment: Deployment,
        dead_letters: DeadLetters,
        *,
        cloudwatch: CloudWatchClient | None = None,
        api_url: str | None = None,
        key_of: Callable[[str, bool], str | None] = lambda _tenant, _renew: None,
        token: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._token = token
        self._api_url = api_url  # the Retry button's: the stack's HTTP API (None: no Retry)
        self._key_of = key_of  # a tenant's API key for it, a new one if asked (None: the API takes no key)
        self._dynamodb = dynamodb
        self._sqs = sqs
        self._deployment = deployment
        self._dead_letters = dead_letters
        self._cloudwatch = cloudwatch  # the functions' errors, throttles and stream lag, if given
        self._clock = clock
        self._page = resources.files("llmtasks_local.emulator").joinpath("console.html").read_text()
        self._views = threading.Condition()
        self._last: dict[str, Any] | None = None
        self._last_at = 0.0  # when it was read (monotonic)
        self._asked_at = 0.0  # the newest poll (monotonic)
        self._reader: threading.Thread | None = None

    def overview(self) -> dict[str, Any]:
        """The newest view read, at once, with its age (the reader started if it is not running);
        before the first, what FIRST_S brings."""
        with self._views:
            self._asked_at = time.monotonic()
            if self._reader is None or not self._reader.is_alive():
                self._reader = threading.Thread(target=self._read_while_polled, name="console", daemon=True)
                self._reader.start()
            if self._last is None:
                self._views.wait_for(lambda: self._last is not None, timeout=FIRST_S)
            if self._last is None:
                return {"generated_at": None, "incomplete": {"all": "not read yet: the stack is busy"}}
            age = time.monotonic() - self._last_at
            return {**self._last, "age_s": round(age, 1), "stale": age > STALE_S}

    def _read_while_polled(self) -> None:
        while True:
            with self._views:
                if time.monotonic() - self._asked_at > IDLE_S:
                    self._reader = None
                    return
            started = time.monotonic()
            view = self.read_overview(deadline=started + READ_S)  # its parts' failures are in it
            with self._views:
                self._last, self._last_at = view, time.monotonic()
                self._views.notify_all()
            time.sleep(max(0.0, REFRESH_S - (time.monotonic() - started)))

    def read_overview(self, *, deadline: float | None = None) -> dict[str, Any]:
        """One read of the overview (the reader's)."""
        return overview(
            self._dynamodb,
            self._sqs,
            self._deployment,
            now=self._clock(),
            cloudwatch=self._cloudwatch,
            deadline=deadline,
        )

    def letters(self) -> dict[str, Any]:
        return {
            queue: [letter.model_dump(mode="json") for letter in self._dead_letters.letters(queue)]
            for queue in QUEUE_NAMES
        }

    def retry_batch(self, batch_id: str) -> tuple[dict[str, Any], int]:
        """The ended batch's failed items run again: its tenant's POST /batches/{id}/retry (the
        console sees every tenant's batches); the API's refusal is said as it gives it."""
        if self._api_url is None:
            return {"message": "This console cannot retry batches."}, 404
        tenant = batch_tenant(self._dynamodb, self._deployment.tasks_table, batch_id)
        if tenant is None:
            return {"message": f"No batch '{batch_id[:64]}' (unknown or expired)."}, 404
        try:
            reply = self._retry_as(tenant, batch_id, renew=False)
            if reply.status_code in (401, 403):  # its key revoked, or its table reset: a new one
                reply = self._retry_as(tenant, batch_id, renew=True)
        except httpx.HTTPError as failure:
            return {"message": f"The API did not answer: {type(failure).__name__}: {failure}"}, 502
        try:
            body = reply.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {}
        if reply.status_code != 202:
            return {"message": body.get("detail") or body.get("title") or reply.text}, reply.status_code
        return {name: body.get(name) for name in ("batch_id", "status", "retries")}, 202

    def _retry_as(self, tenant: str, batch_id: str, *, renew: bool) -> httpx.Response:
        key = self._key_of(tenant, renew)
        return httpx.post(
            f"{self._api_url}/batches/{batch_id}/retry",
            json={},
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=RETRY_TIMEOUT_S,
        )

    def _is_token(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self._token.encode())

    def _allowed(self, request: Request) -> bool:
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        given = bearer.strip() if scheme.lower() == "bearer" else None
        return self._is_token(request.cookies.get(COOKIE)) or self._is_token(given)

    async def handle(self, request: Request) -> Response:
        path = request.url.path.removeprefix(PREFIX).rstrip("/")
        if request.method == "GET" and path == "":
            # The page itself says how to open it when its data is refused (console.html).
            page = HTMLResponse(self._page)
            if self._is_token(request.query_params.get("token")):
                page.set_cookie(COOKIE, self._token, path=PREFIX, httponly=True, samesite="strict")
            return page
        if not self._allowed(request):
            return JSONResponse(NEEDS_TOKEN, 401)
        body, status = await run_in_threadpool(self._answer, request.method, path)
        return JSONResponse(body, status)

    def _answer(self, method: str, path: str) -> tuple[Any, int]:
        """The data routes' JSON and status (the caller holds the token); a read the stack did
        not answer is a 503 that says so."""
        try:
            return self._route(method, path)
        except (BackendError, BotoCoreError, ClientError) as error:
            return {"message": f"The stack did not answer this view: {type(error).__name__}."}, 503

    def _route(self, method: str, path: str) -> tuple[Any, int]:
        if method == "GET" and path == "/api/overview":
            return self.overview(), 200
        if method == "GET" and path == "/api/dlq":
            return self.letters(), 200
        if method == "GET" and path == "/api/cpu":
            return ACCOUNT.read(), 200  # where the stack's CPU went, by part (the bench's account)
        batch_id = path.removeprefix("/api/batches/").removesuffix("/retry")
        if method == "POST" and path == f"/api/batches/{batch_id}/retry":
            return self.retry_batch(batch_id)
        queue = path.removeprefix("/api/dlq/").removesuffix("/redrive")
        if method == "POST" and path == f"/api/dlq/{queue}/redrive" and queue in QUEUE_NAMES:
            return self._dead_letters.redrive(queue).model_dump(mode="json"), 200
        return {"message": "Not Found"}, 404

    def around(self, api: ASGIApp) -> ASGIApp:
        """The API as it was, with /console in front of it."""

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            path = scope.get("path", "")
            if scope["type"] == "http" and (path == PREFIX or path.startswith(PREFIX + "/")):
                response = await self.handle(Request(scope, receive))
                await response(scope, receive, send)
                return
            await api(scope, receive, send)

        return serve
