"""The mock LLM: OpenAI's Chat Completions and Responses APIs in miniature, with knobs.

`llmtasks mock-llm` runs it; the local stack starts it unless LLM_BASE_URL is set. It reads a
request as OpenAI does (request.py: content parts, tools, response_format, reasoning; a 400 in
OpenAI's words for what OpenAI refuses) and answers in OpenAI's shapes (reply.py). A Responses
call is read into the same chat call and its answer written back as a Response (responses.py);
background mode and its webhooks are background.py. Knobs are set
at start (flags or MOCK_LLM_* variables) and per run over HTTP (`PUT /_mock/config`); the
counters at `GET /_mock/stats` let tests assert concurrency, spend and what reached the provider.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmtasks_local import KEEP_ALIVE_S
from llmtasks_local.mock_llm.background import ResponseStore, Stored, event_type, send_event
from llmtasks_local.mock_llm.config import MockConfig, MockStats, Outcome, OutcomeSlot
from llmtasks_local.mock_llm.limits import KeyCounts, KeyLimit
from llmtasks_local.mock_llm.reply import chunks, completion
from llmtasks_local.mock_llm.request import ChatCall, OpenAIError, read_call
from llmtasks_local.mock_llm.responses import output_items, read_response_call, response_id, response_object

__all__ = ["MockConfig", "MockLLM", "MockStats", "serve"]

Headers = dict[str, str]
Shape = Callable[[dict[str, Any]], dict[str, Any]]  # a chat completion as the body to answer
# `[mock:background-s=N]`: a background response's think time, N seconds.
BACKGROUND_S = re.compile(r"\[mock:background-s=(?P<seconds>\d+(?:\.\d+)?)\]")
# The prompt prefixes remembered for cached_tokens (the oldest forgotten past this many).
CACHE_ENTRIES = 10_000


class _RateLimit:
    """At most `rate` calls in any one-second window (a sliding log, as providers count RPS)."""

    def __init__(self) -> None:
        self._recent: deque[float] = deque()

    def retry_after(self, rate: float | None, now: float) -> float | None:
        """None when this call is within the limit; else seconds until it would be."""
        if rate is None:
            return None
        while self._recent and self._recent[0] <= now - 1:
            self._recent.popleft()
        if len(self._recent) >= rate:
            return self._recent[0] + 1 - now
        self._recent.append(now)
        return None


class MockLLM:
    def __init__(self, config: MockConfig | None = None) -> None:
        self.config = config or MockConfig()
        self.stats = MockStats()
        self._lock = threading.Lock()
        self._random = random.Random(self.config.seed)  # noqa: S311 - fault injection, not crypto
        self._rate_limit = _RateLimit()
        self._counts = _key_counts(self.config)
        self._prefixes: OrderedDict[str, None] = OrderedDict()  # prompt prefixes seen (cached_tokens)
        self._responses = ResponseStore()
        self._tasks: set[asyncio.Task[None]] = set()  # background ends and webhooks under way

    def _decide(self, call: ChatCall, key: str) -> tuple[Outcome, float | None, float, OutcomeSlot, Headers]:
        """This call's fate and its time, drawn and counted under the lock; the rate-limit
        headers of its answer."""
        prompt = call.prompt
        config = self.config
        with self._lock:
            self.stats.calls += 1
            self.stats.arrivals.append(time.monotonic())
            latency = config.latency_s
            if config.latency_sigma and latency:
                latency = self._random.lognormvariate(math.log(latency), config.latency_sigma)
                latency = min(max(latency, config.latency_min_s), config.latency_max_s or math.inf)

            wait = self._rate_limit.retry_after(config.max_rps, time.monotonic())
            admitted, headers = True, Headers()
            if wait is None:
                admitted, headers = self._counts.admit(key, _admitted_tokens(call), time.time())
            draw = self._random.random()
            outcome: Outcome
            if wait is not None:
                outcome = "rps"
                self.stats.rps_limited += 1
            elif not admitted:
                outcome = "limited"
                self.stats.key_limited += 1
            elif draw < config.rate_429:
                outcome, wait = "429", config.retry_after_s
                self.stats.errors_429 += 1
            elif draw < config.rate_429 + config.rate_500:
                outcome = "500"
                self.stats.errors_500 += 1
            elif draw < config.rate_429 + config.rate_500 + config.rate_hang:
                outcome = "hang"
                self.stats.hangs += 1
            else:
                outcome = "ok"
            record = self.stats.outcomes_by_prompt.setdefault(prompt, [])
            record.append(outcome)
            if outcome not in ("rps", "hang"):  # the calls that take their drawn time
                self.stats.latency_total_s += latency
            self.stats.in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
        return outcome, wait, latency, (record, len(record) - 1), headers

    def _settle(self, call: ChatCall, key: str, used: int) -> Headers:
        """The admitted call counted at the tokens it used; the key's headers after it."""
        with self._lock:
            if used:
                label = key[-4:]
                self.stats.tokens_by_key[label] = self.stats.tokens_by_key.get(label, 0) + used
        return self._counts.settle(key, _admitted_tokens(call), used, time.time())

    def _hung_up(self, slot: OutcomeSlot) -> None:
        with self._lock:
            record, index = slot
            record[index] = "gone"

    def _leave(self) -> None:
        with self._lock:
            self.stats.in_flight -= 1

    def _take(self, call: ChatCall) -> None:
        """Counts what reached the provider; draws whether a structured answer breaks its schema;
        finds the longest prompt prefix seen before (cached tokens)."""
        config = self.config
        with self._lock:
            stats = self.stats
            for name in call.body if call.sent is None else call.sent:
                stats.params[name] = stats.params.get(name, 0) + 1
            stats.images += call.images
            stats.files += call.files
            stats.file_bytes += call.file_bytes
            stats.audio_parts += call.audio_parts
            stats.reasoning_tokens += call.reasoning_tokens
            if call.structured is not None:
                stats.structured += 1
                call.invalid_json = call.marked("[mock:invalid-json]") or (
                    config.rate_invalid_json > 0 and self._random.random() < config.rate_invalid_json
                )
                stats.invalid_json += call.invalid_json
            for key, tokens in zip(reversed(call.prefix_keys), reversed(call.prefix_tokens), strict=True):
                if key in self._prefixes:
                    if tokens >= config.cache_min_tokens:
                        call.cached_tokens = tokens
                    break
            stats.cached_tokens += call.cached_tokens
            for key in call.prefix_keys:
                self._prefixes[key] = None
                self._prefixes.move_to_end(key)
            while len(self._prefixes) > CACHE_ENTRIES:
                self._prefixes.popitem(last=False)

    async def chat_completions(self, request: Request) -> Response:
        try:
            call = read_call(await request.json())
        except ValueError:
            call = None
            refused: dict[str, Any] = OpenAIError("We could not parse the JSON body of your request.").body
        except OpenAIError as error:
            call, refused = None, error.body
        if call is None:
            with self._lock:
                self.stats.invalid_requests += 1
            return JSONResponse(refused, 400)
        stream = bool(call.body.get("stream"))
        if stream and self.config.refuse_stream:
            return _error(400, "stream is not supported (mock)")
        self._take(call)
        authorization = request.headers.get("authorization", "")
        key = authorization.removeprefix("Bearer ").strip()
        outcome, wait, latency, slot, headers = self._decide(call, key)
        if authorization.startswith("Bearer "):
            with self._lock:
                self.stats.calls_with_key += 1
        if outcome == "ok" and stream:
            return StreamingResponse(
                self._stream(call, latency, key), media_type="text/event-stream", headers=headers
            )
        if outcome == "hang":
            # Headers now, then a byte a second: a per-read timeout never fires; only a bound on
            # the whole call ends it.
            return StreamingResponse(self._trickle(call), media_type="application/json")
        try:
            return await self._answer(request, (outcome, wait, latency, slot, headers), call, key)
        finally:
            self._leave()

    # --- the Responses API ---------------------------------------------------------------------

    async def create_response(self, request: Request) -> Response:
        """POST /v1/responses: answered at once when synchronous; with `background: true`, queued
        and ended after its think time."""
        try:
            body = await request.json()
            history = self._history(body.get("previous_response_id") if isinstance(body, dict) else None)
            call, items = read_response_call(body, history)
        except ValueError:
            call, refused = None, OpenAIError("We could not parse the JSON body of your request.").body
        except OpenAIError as error:
            call, refused = None, error.body
        if call is None:
            with self._lock:
                self.stats.invalid_requests += 1
            return JSONResponse(refused, 400)
        self._take(call)
        authorization = request.headers.get("authorization", "")
        key = authorization.removeprefix("Bearer ").strip()
        decided = self._decide(call, key)
        with self._lock:
            self.stats.responses += 1
            self.stats.calls_with_key += authorization.startswith("Bearer ")
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
                self._leave()
        if decided[0] == "hang":
            return StreamingResponse(self._trickle(call, self._shape(stored)), media_type="application/json")
        try:
            return await self._answer(request, decided, call, key, self._shape(stored))
        finally:
            self._leave()

    def _history(self, previous: Any) -> list[Any] | None:
        """The input items and output of the response `previous` (`previous_response_id`)."""
        if previous is None:
            return None
        stored = self._responses.get(previous) if isinstance(previous, str) else None
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
                self._responses.add(stored)
            return response

        return shape

    def _start(
        self, stored: Stored, decided: tuple[Outcome, float | None, float, OutcomeSlot, Headers]
    ) -> Response:
        """A background response queued (its end scheduled), or the 429 of its admission."""
        outcome, wait, latency, _, headers = decided
        if outcome == "rps":
            return _error(429, "requests per second limit (mock)", retry_after=wait)
        if outcome == "limited":
            return _error(429, "Rate limit reached for requests or tokens per min (mock).", headers=headers)
        if outcome == "429":
            headers = self._settle(stored.call, stored.key, 0)
            return _error(429, "rate limited (mock)", retry_after=wait, headers=headers)
        asked = BACKGROUND_S.search(stored.call.text)
        stored.think_s = (
            self.config.hang_s if outcome == "hang" else float(asked["seconds"]) if asked else latency
        )
        stored.fail = outcome == "500" or stored.call.marked("[mock:background-fail]")
        self._responses.add(stored)
        with self._lock:
            self.stats.background_started += 1
        stored.task = self._spawn(self._end_later(stored))
        return JSONResponse(self._view(stored), headers=headers)

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
            self._settle(call, stored.key, 0)
        else:
            body = self._completion(call)
            self._settle(call, stored.key, body["usage"]["total_tokens"])
            response = response_object(
                call, body, response_id=stored.id, status="completed", created_at=stored.created_at
            )
        stored.response = response
        with self._lock:
            if stored.fail:
                self.stats.background_failed += 1
            else:
                self.stats.background_completed += 1
                self.stats.completed += 1
        self._announce(stored)

    def _announce(self, stored: Stored) -> None:
        """OpenAI's webhook event for a background response that ended (when one is configured)."""
        assert stored.response is not None

        def counted(delivered: bool) -> None:
            with self._lock:
                if delivered:
                    self.stats.webhooks_sent += 1
                else:
                    self.stats.webhook_failures += 1

        kind = event_type(stored.response["status"])
        self._spawn(send_event(self.config, kind, stored.id, counted))

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
        stored = self._responses.get(request.path_params["response_id"])
        if stored is None:
            return _not_found(request.path_params["response_id"])
        if stored.background:
            with self._lock:
                self.stats.background_polls += 1
        return JSONResponse(self._view(stored))

    async def cancel_response(self, request: Request) -> Response:
        """Cancels a queued or in-progress background response; a cancelled one is answered
        again as it is; a finished or synchronous one gets OpenAI's 400."""
        with self._lock:
            self.stats.cancel_requests += 1
        stored = self._responses.get(request.path_params["response_id"])
        if stored is None:
            return _not_found(request.path_params["response_id"])
        if not stored.background:
            return _error(400, "Cannot cancel a synchronous response.", param="response_id")
        response = self._view(stored)
        if response["status"] == "cancelled":
            return JSONResponse(response)
        if stored.response is not None:
            return _error(400, f"Cannot cancel a {response['status']} response.", param="response_id")
        if stored.task is not None:
            stored.task.cancel()
        stored.response = {**response, "status": "cancelled"}
        self._settle(stored.call, stored.key, 0)
        with self._lock:
            self.stats.background_cancelled += 1
        self._announce(stored)
        return JSONResponse(stored.response)

    async def _answer(
        self,
        request: Request,
        decided: tuple[Outcome, float | None, float, OutcomeSlot, Headers],
        call: ChatCall,
        key: str,
        shape: Shape | None = None,
    ) -> Response:
        outcome, wait, latency, slot, headers = decided
        if outcome == "rps":
            return _error(429, "requests per second limit (mock)", retry_after=wait)
        if outcome == "limited":
            said = "Rate limit reached for requests or tokens per min (mock)."
            return _error(429, said, headers=headers)
        if not await self._held(request) or (latency and not await _stay_connected(request, latency)):
            self._hung_up(slot)
            return Response(status_code=499)  # nobody is listening any more
        if outcome in ("429", "500"):
            said = f"{'rate limited' if outcome == '429' else 'internal error'} (mock)"
            if self.config.echo_key:
                said += f"; you sent {request.headers.get('authorization', 'no key')}"
            return _error(int(outcome), said, retry_after=wait, headers=self._settle(call, key, 0))
        with self._lock:
            self.stats.completed += 1
        body = self._completion(call)
        headers = self._settle(call, key, body["usage"]["total_tokens"])
        return JSONResponse(body if shape is None else shape(body), headers=headers)

    async def _stream(self, call: ChatCall, latency: float, key: str) -> AsyncIterator[bytes]:
        """The answer as server-sent events (a word a chunk, tool calls as OpenAI streams them),
        the call's latency spread over them; with `rate_break`, cut off halfway (the connection
        closes without [DONE])."""
        try:
            await self._held(None)
            options = call.body.get("stream_options") or {}
            body = self._completion(call)
            self._settle(call, key, body["usage"]["total_tokens"])
            events = chunks(body, include_usage=bool(options.get("include_usage")))
            broken = self._random.random() < self.config.rate_break
            pause = latency / max(1, len(events))
            for index, event in enumerate(events):
                if broken and index >= len(events) // 2:
                    raise ConnectionAbortedError("the mock cuts this stream off")
                yield f"data: {json.dumps(event)}\n\n".encode()
                await asyncio.sleep(pause)
            yield b"data: [DONE]\n\n"
            with self._lock:
                self.stats.completed += 1
        finally:
            self._leave()

    async def _trickle(self, call: ChatCall, shape: Shape | None = None) -> AsyncIterator[bytes]:
        try:
            give_up = time.monotonic() + self.config.hang_s
            while time.monotonic() < give_up:
                yield b" "
                await asyncio.sleep(min(1.0, max(0.0, give_up - time.monotonic())))
            body = self._completion(call)
            yield json.dumps(body if shape is None else shape(body)).encode()
        finally:
            self._leave()

    def _completion(self, call: ChatCall) -> dict[str, Any]:
        return completion(
            call, reply_chars=self.config.reply_chars, pad_word_chars=self.config.pad_word_chars
        )

    async def get_stats(self, _: Request) -> JSONResponse:
        return JSONResponse(self.stats.model_dump())

    def configure(self, config: MockConfig, *, reseed: bool) -> None:
        """New knobs; `reseed` restarts the draws from the config's seed (a repeatable run)."""
        if (config.tpm, config.rpm, config.key_limits) != (
            self.config.tpm,
            self.config.rpm,
            self.config.key_limits,
        ):
            self._counts = _key_counts(config)  # new limits: every key's minute starts whole
        self.config = config
        if reseed:
            self._random.seed(config.seed)

    async def put_config(self, request: Request) -> JSONResponse:
        try:
            changes = await request.json()
            config = MockConfig.model_validate({**self.config.model_dump(), **changes})
        except ValueError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, 422)
        self.configure(config, reseed="seed" in changes)
        return JSONResponse(self.config.model_dump())

    def reset_stats(self) -> None:
        """Zeroes the counters, and the requests-per-second window with them: a reset mock
        has seen no calls."""
        with self._lock:
            self.stats = MockStats(in_flight=self.stats.in_flight)
            self._rate_limit = _RateLimit()
            self._counts = _key_counts(self.config)
            self._prefixes.clear()

    async def reset(self, _: Request) -> JSONResponse:
        self.reset_stats()
        return JSONResponse(self.stats.model_dump())

    async def models(self, _: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "mock", "object": "model"}]})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/v1/responses", self.create_response, methods=["POST"]),
                Route("/v1/responses/{response_id}", self.retrieve_response, methods=["GET"]),
                Route("/v1/responses/{response_id}/cancel", self.cancel_response, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/_mock/stats", self.get_stats, methods=["GET"]),
                Route("/_mock/config", self.put_config, methods=["PUT"]),
                Route("/_mock/reset", self.reset, methods=["POST"]),
            ]
        )

    async def _held(self, request: Request | None) -> bool:
        """Waits until `hold_until_in_flight` calls have been in flight at once, or hang_s; False
        when the caller went away first. A stream's generator has no request to ask: starlette
        cancels it when its caller goes away."""
        config = self.config
        give_up = time.monotonic() + config.hang_s
        while self.stats.max_in_flight < config.hold_until_in_flight and time.monotonic() < give_up:
            if request is not None and await request.is_disconnected():
                return False
            await asyncio.sleep(0.05)
        return True


async def _stay_connected(request: Request, seconds: float) -> bool:
    """Sleeps `seconds` unless the client goes away first (then False), so `in_flight` counts
    only calls someone still waits for."""
    give_up = time.monotonic() + seconds
    while (left := give_up - time.monotonic()) > 0:
        if await request.is_disconnected():
            return False
        await asyncio.sleep(min(0.05, left))
    return True


def _admitted_tokens(call: ChatCall) -> int:
    """A call's tokens as OpenAI counts them at admission: its prompt and max_completion_tokens."""
    return call.prompt_tokens + (call.cap or 0)


def _key_counts(config: MockConfig) -> KeyCounts:
    return KeyCounts(KeyLimit(tpm=config.tpm, rpm=config.rpm), dict(config.key_limits))


def _not_found(response_id: str) -> JSONResponse:
    return _error(404, f"Response with id '{response_id}' not found.", param="response_id")


def _error(
    status: int,
    message: str,
    *,
    retry_after: float | None = None,
    headers: Headers | None = None,
    param: str | None = None,
) -> JSONResponse:
    # Fractions are off-standard but keep compressed test schedules short; llmtasks reads them.
    headers = dict(headers or {})
    if retry_after is not None:
        value = f"{retry_after:.0f}" if float(retry_after).is_integer() else f"{retry_after:.3f}"
        headers["Retry-After"] = value
    kind = {429: "rate_limit_exceeded", 500: "server_error"}.get(status, "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status, headers=headers)


def serve(
    host: str = "127.0.0.1", port: int = 8800, config: MockConfig | None = None, *, fd: int | None = None
) -> None:
    """Serves the mock on host:port, or on the listening socket `fd` a parent handed over."""
    import socket

    import uvicorn

    uv_config = uvicorn.Config(
        MockLLM(config).app(),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = uvicorn.Server(uv_config)
    # uvicorn's own `fd` option takes Unix sockets only; a TCP socket goes in as a socket.
    server.run(sockets=None if fd is None else [socket.socket(fileno=fd)])
