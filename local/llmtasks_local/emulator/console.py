"""The local console: `llmtasks up` serves it at /console beside the API (it is not part of the
deployed API). One page (console.html, no assets from the internet) that polls two JSON
views: the deployment's overview (`stats.overview`, what `llmtasks stats` prints) and its
dead letters, with a button per queue that redrives it (`DeadLetters.redrive`, what
`llmtasks dlq redrive` does). Both read the tables and queues the functions use. An ended batch
with failed items has a Retry button: the service's own retry (`BatchService.retry`, what
`POST /batches/{id}/retry` and `llmtasks batch retry` run), as the batch's tenant.

It shows every tenant's tasks, so its data needs the token `llmtasks up` prints in the console's
URL, as Jupyter does: opening /console?token=... keeps it in a cookie for the page (HttpOnly,
SameSite=Strict, so another site's page cannot use it); a script may send it as a Bearer token.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from llmtasks.aws.apikeys import presented_key
from llmtasks.domain.batches import RetryBatchRequest
from llmtasks.domain.errors import ApiError
from llmtasks_local.emulator.cpu_account import ACCOUNT
from llmtasks_local.ops.deadletters import QUEUE_NAMES, DeadLetters
from llmtasks_local.ops.stats import overview

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from llmtasks.services.batches import BatchService
    from llmtasks_local.ops.deployment import Deployment

PREFIX = "/console"
COOKIE = "llmtasks_console"
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
        batches: BatchService | None = None,
        token: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._token = token
        self._batches = batches  # the Retry button's: what POST /batches/{id}/retry runs
        self._dynamodb = dynamodb
        self._sqs = sqs
        self._deployment = deployment
        self._dead_letters = dead_letters
        self._cloudwatch = cloudwatch  # the functions' errors, throttles and stream lag, if given
        self._clock = clock
        self._page = resources.files("llmtasks_local.emulator").joinpath("console.html").read_text()

    def overview(self) -> dict[str, Any]:
        return overview(
            self._dynamodb, self._sqs, self._deployment, now=self._clock(), cloudwatch=self._cloudwatch
        )

    def letters(self) -> dict[str, Any]:
        return {
            queue: [letter.model_dump(mode="json") for letter in self._dead_letters.letters(queue)]
            for queue in QUEUE_NAMES
        }

    def retry_batch(self, batch_id: str) -> tuple[dict[str, Any], int]:
        """The ended batch's failed items run again, as its tenant's POST /batches/{id}/retry
        would (the console sees every tenant's batches)."""
        if self._batches is None:
            return {"message": "This console cannot retry batches."}, 404
        try:
            batch = self._batches.get_any(batch_id)
            retried, _ = self._batches.retry(batch.tenant_id, batch_id, RetryBatchRequest())
        except ApiError as refused:
            return {"message": refused.detail}, refused.status
        return {
            "batch_id": retried.batch_id,
            "status": retried.read_status.value,
            "retries": retried.retries,
        }, 202

    def _is_token(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self._token.encode())

    def _allowed(self, request: Request) -> bool:
        return self._is_token(request.cookies.get(COOKIE)) or self._is_token(presented_key(request.headers))

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
        """The data routes' JSON and status (the caller holds the token)."""
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
