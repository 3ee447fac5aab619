"""The mock's Responses API routes: `POST /v1/responses` (synchronous, or in background mode),
`GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`.

A call is read into the chat call the mock answers (responses.py) and goes through the same
knobs: the draws of 429, 500 and hangs, the rate and key limits, the counters. In background mode
the create is answered `queued` at once (a 429 of admission refuses it as OpenAI does); a drawn
500 or `[mock:background-fail]` fails it at its end, a drawn hang keeps it in progress for
`hang_s`; its think time is `[mock:background-s=N]` in its latest input item, else the call's latency.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmtasks_local.mock_llm.background import ResponseStore, Stored, event_type, send_event
from llmtasks_local.mock_llm.config import Decision, MockConfig, MockStats
from llmtasks_local.mock_llm.request import ChatCall, OpenAIError, error
from llmtasks_local.mock_llm.responses import output_items, read_response_call, response_id, response_object

Headers = dict[str, str]
Shape = Callable[[dict[str, Any]], dict[str, Any]]  # a chat completion as the body to answer


class Mock(Protocol):
    """What the Responses routes use of the mock (server.MockLLM): its knobs, counters, draws
    and the chat answer's steps."""

    lock: threading.Lock
    stats: MockStats
    config: MockConfig

    def take(self, call: ChatCall) -> None: ...
    def draw(self) -> float: ...
    def decide(self, call: ChatCall, key: str) -> Decision: ...
    def leave(self) -> None: ...
    def settle(self, call: ChatCall, key: str, used: int) -> Headers: ...
    def completion(self, call: ChatCall) -> dict[str, Any]: ...
    async def answer(
        self, request: Request, decided: Decision, call: ChatCall, key: str, shape: Shape | None = None
    ) -> Response: ...
    def trickle(self, call: ChatCall, shape: Shape | None = None) -> AsyncIterator[bytes]: ...


# `[mock:background-s=N]`: a background response's think time, N seconds.
BACKGROUND_S = re.compile(r"\[mock:background-s=(?P<seconds>\d+(?:\.\d+)?)\]")


class ResponsesAPI:
    """The Responses routes of `mock`, and the responses it keeps."""

    def __init__(self, mock: Mock) -> None:
        self.mock = mock
        self.store = ResponseStore()
        self._tasks: set[asyncio.Task[None]] = set()  # background ends and webhooks under way

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.create_response, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.retrieve_response, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", self.cancel_response, methods=["POST"]),
        ]

    async def create_response(self, request: Request) -> Response:
        """POST /v1/responses: answered at once when synchronous; with `background: true`, queued
        and ended after its think time."""
        try:
            body = await request.json()
            history = self._history(body.get("previous_response_id") if isinstance(body, dict) else None)
            call, items = read_response_call(body, history)
        except ValueError:
            call, refused = None, OpenAIError("We could not parse the JSON body of your request.").body
        except OpenAIError as exc:
            call, refused = None, exc.body
        if call is None:
            with self.mock.lock:
                self.mock.stats.invalid_requests += 1
            return JSONResponse(refused, 400)
        self.mock.take(call)
        authorization = request.headers.get("authorization", "")
        key = authorization.removeprefix("Bearer ").strip()
        decided = self.mock.decide(call, key)
        with self.mock.lock:
            self.mock.stats.responses += 1
            self.mock.stats.calls_with_key += authorization.startswith("Bearer ")
        stored = Stored(
            response_id(),
            call,
            items,
            key,
            background=bool(body.get("background")),
            created_at=int(time.time()),
        )
        if stored.background:
            try:
                return self._start(stored, decided)
            finally:
                self.mock.leave()
        if decided[0] == "hang":
            return StreamingResponse(
                self.mock.trickle(call, self._shape(stored)), media_type="application/json"
            )
        try:
            return await self.mock.answer(request, decided, call, key, self._shape(stored))
        finally:
            self.mock.leave()

    def _history(self, previous: Any) -> list[Any] | None:
        """The input items and output of the response `previous` (`previous_response_id`)."""
        if previous is None:
            return None
        stored = self.store.get(previous) if isinstance(previous, str) else None
        if stored is None or stored.response is None:
            raise OpenAIError(
                f"Previous response with id '{previous}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return [*stored.items, *output_items(stored.response)]

    def _shape(self, stored: Stored) -> Shape:
        """The chat completion of a synchronous response as its Response, kept unless store=false."""

        def shape(body: dict[str, Any]) -> dict[str, Any]:
            response = response_object(
                stored.call, body, response_id=stored.id, status="completed", created_at=stored.created_at
            )
            stored.response = response
            if stored.call.asked.get("store", True) is not False:
                self.store.add(stored)
            return response

        return shape

    def _start(self, stored: Stored, decided: Decision) -> Response:
        """A background response queued (its end scheduled), or the 429 of its admission."""
        outcome, wait, latency, _, headers = decided
        if outcome == "rps":
            return error(429, "requests per second limit (mock)", retry_after=wait)
        if outcome == "limited":
            return error(429, "Rate limit reached for requests or tokens per min (mock).", headers=headers)
        if outcome == "429":
            headers = self.mock.settle(stored.call, stored.key, 0)
            return error(429, "rate limited (mock)", retry_after=wait, headers=headers)
        asked = BACKGROUND_S.search(stored.call.prompt)  # the latest input: one step of a run
        stored.think_s = (
            self.mock.config.hang_s if outcome == "hang" else float(asked["seconds"]) if asked else latency
        )
        stored.fail = outcome == "500" or stored.call.marked("[mock:background-fail]")
        self.store.add(stored)
        with self.mock.lock:
            self.mock.stats.background_started += 1
        stored.task = self._spawn(self._end_later(stored))
        # Queued, as OpenAI answers a create, however short its think time
        queued = response_object(
            stored.call, None, response_id=stored.id, status="queued", created_at=stored.created_at
        )
        return JSONResponse(queued, headers=headers)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _end_later(self, stored: Stored) -> None:
        await asyncio.sleep(stored.think_s)
        self._end(stored)

    def _end(self, stored: Stored) -> None:
        """A background response's end: its answer (or failure) made, counted, announced."""
        if stored.response is not None:
            return
        call = stored.call
        if stored.fail:
            response = response_object(
                call, None, response_id=stored.id, status="failed", created_at=stored.created_at
            )
            response["error"] = {"code": "server_error", "message": "The mock failed this response (mock)."}
            self.mock.settle(call, stored.key, 0)
        else:
            body = self.mock.completion(call)
            self.mock.settle(call, stored.key, body["usage"]["total_tokens"])
            response = response_object(
                call, body, response_id=stored.id, status="completed", created_at=stored.created_at
            )
        stored.response = response
        with self.mock.lock:
            if stored.fail:
                self.mock.stats.background_failed += 1
            else:
                self.mock.stats.background_completed += 1
                self.mock.stats.completed += 1
        self._announce(stored)

    def _announce(self, stored: Stored) -> None:
        """OpenAI's webhook event for a background response that ended (when one is configured)."""
        assert stored.response is not None

        def counted(delivered: bool) -> None:
            with self.mock.lock:
                if delivered:
                    self.mock.stats.webhooks_sent += 1
                else:
                    self.mock.stats.webhook_failures += 1

        kind = event_type(stored.response["status"])
        self._spawn(send_event(self.mock.config, kind, stored.id, counted))

    def _view(self, stored: Stored) -> dict[str, Any]:
        """The response as it stands now (ending it first when its time is up)."""
        if stored.background and stored.due(time.monotonic()):
            self._end(stored)
        if stored.response is not None:
            return stored.response
        status = stored.status(time.monotonic())
        return response_object(
            stored.call, None, response_id=stored.id, status=status, created_at=stored.created_at
        )

    async def retrieve_response(self, request: Request) -> Response:
        stored = self.store.get(request.path_params["response_id"])
        if stored is None:
            return _not_found(request.path_params["response_id"])
        if stored.background:
            with self.mock.lock:
                self.mock.stats.background_polls += 1
        return JSONResponse(self._view(stored))

    async def cancel_response(self, request: Request) -> Response:
        """Cancels a queued or in-progress background response; a cancelled one is answered
        again as it is; a finished or synchronous one gets OpenAI's 400."""
        with self.mock.lock:
            self.mock.stats.cancel_requests += 1
        stored = self.store.get(request.path_params["response_id"])
        if stored is None:
            return _not_found(request.path_params["response_id"])
        if not stored.background:
            return error(400, "Cannot cancel a synchronous response.", param="response_id")
        response = self._view(stored)
        if response["status"] == "cancelled":
            return JSONResponse(response)
        if stored.response is not None:
            return error(400, f"Cannot cancel a {response['status']} response.", param="response_id")
        if stored.task is not None:
            stored.task.cancel()
        stored.response = {**response, "status": "cancelled"}
        self.mock.settle(stored.call, stored.key, 0)
        with self.mock.lock:
            self.mock.stats.background_cancelled += 1
        self._announce(stored)
        return JSONResponse(stored.response)


def _not_found(response_id: str) -> JSONResponse:
    return error(404, f"Response with id '{response_id}' not found.", param="response_id")
