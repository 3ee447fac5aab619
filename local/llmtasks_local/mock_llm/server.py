"""The mock LLM: OpenAI's Chat Completions, Responses and Batch APIs in miniature, with knobs.

`llmtasks mock-llm` runs it; the local stack starts it unless LLM_BASE_URL is set. It reads a
request as OpenAI does (request.py: content parts, tools, response_format, reasoning; a 400 in
OpenAI's words for what OpenAI refuses) and answers in OpenAI's shapes (reply.py). A Responses
call is read into the same chat call and its answer written back as a Response (responses.py);
background mode and its webhooks are background.py; the Files and Batches APIs are
files_api.py and batches_api.py. Knobs are set
at start (flags or MOCK_LLM_* variables) and per run over HTTP (`PUT /_mock/config`); the
counters at `GET /_mock/stats` let tests assert concurrency, spend and what reached the provider.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmtasks_local import KEEP_ALIVE_S
from llmtasks_local.mock_llm.batches_api import BatchesAPI
from llmtasks_local.mock_llm.config import Decision, MockConfig, MockStats, Outcome, OutcomeSlot
from llmtasks_local.mock_llm.files_api import FilesAPI
from llmtasks_local.mock_llm.limits import KeyCounts, KeyLimit
from llmtasks_local.mock_llm.reply import chunks, completion
from llmtasks_local.mock_llm.request import ChatCall, OpenAIError, error, read_call
from llmtasks_local.mock_llm.responses_api import ResponsesAPI, Shape

__all__ = ["MockConfig", "MockLLM", "MockStats", "serve"]

Headers = dict[str, str]
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
        self.lock = threading.Lock()
        self._random = random.Random(self.config.seed)  # noqa: S311 - fault injection, not crypto
        self._rate_limit = _RateLimit()
        self._counts = _key_counts(self.config)
        self._prefixes: OrderedDict[str, None] = OrderedDict()  # prompt prefixes seen (cached_tokens)
        self.responses = ResponsesAPI(self)
        self.files = FilesAPI(self)
        self.batches = BatchesAPI(self, self.files)

    def decide(self, call: ChatCall, key: str) -> Decision:
        """This call's fate and its time, drawn and counted under the lock; the rate-limit
        headers of its answer."""
        prompt = call.prompt
        config = self.config
        with self.lock:
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

    def settle(self, call: ChatCall, key: str, used: int) -> Headers:
        """The admitted call counted at the tokens it used; the key's headers after it."""
        with self.lock:
            if used:
                label = key[-4:]
                self.stats.tokens_by_key[label] = self.stats.tokens_by_key.get(label, 0) + used
        return self._counts.settle(key, _admitted_tokens(call), used, time.time())

    def _hung_up(self, slot: OutcomeSlot) -> None:
        with self.lock:
            record, index = slot
            record[index] = "gone"

    def draw(self) -> float:
        """A draw of the mock's seeded random, in [0, 1)."""
        with self.lock:
            return self._random.random()

    def leave(self) -> None:
        with self.lock:
            self.stats.in_flight -= 1

    def take(self, call: ChatCall) -> None:
        """Counts what reached the provider; draws whether a structured answer breaks its schema;
        finds the longest prompt prefix seen before (cached tokens)."""
        config = self.config
        with self.lock:
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
        except OpenAIError as exc:
            call, refused = None, exc.body
        if call is None:
            with self.lock:
                self.stats.invalid_requests += 1
            return JSONResponse(refused, 400)
        stream = bool(call.body.get("stream"))
        if stream and self.config.refuse_stream:
            return error(400, "stream is not supported (mock)")
        self.take(call)
        authorization = request.headers.get("authorization", "")
        key = authorization.removeprefix("Bearer ").strip()
        outcome, wait, latency, slot, headers = self.decide(call, key)
        if authorization.startswith("Bearer "):
            with self.lock:
                self.stats.calls_with_key += 1
        if outcome == "ok" and stream:
            return StreamingResponse(
                self._stream(call, latency, key), media_type="text/event-stream", headers=headers
            )
        if outcome == "hang":
            # Headers now, then a byte a second: a per-read timeout never fires; only a bound on
            # the whole call ends it.
            return StreamingResponse(self.trickle(call), media_type="application/json")
        try:
            return await self.answer(request, (outcome, wait, latency, slot, headers), call, key)
        finally:
            self.leave()

    async def answer(
        self,
        request: Request,
        decided: Decision,
        call: ChatCall,
        key: str,
        shape: Shape | None = None,
    ) -> Response:
        outcome, wait, latency, slot, headers = decided
        if outcome == "rps":
            return error(429, "requests per second limit (mock)", retry_after=wait)
        if outcome == "limited":
            said = "Rate limit reached for requests or tokens per min (mock)."
            return error(429, said, headers=headers)
        if not await self._held(request) or (latency and not await _stay_connected(request, latency)):
            self._hung_up(slot)
            return Response(status_code=499)  # nobody is listening any more
        if outcome in ("429", "500"):
            said = f"{'rate limited' if outcome == '429' else 'internal error'} (mock)"
            if self.config.echo_key:
                said += f"; you sent {request.headers.get('authorization', 'no key')}"
            return error(int(outcome), said, retry_after=wait, headers=self.settle(call, key, 0))
        with self.lock:
            self.stats.completed += 1
        body = self.completion(call)
        headers = self.settle(call, key, body["usage"]["total_tokens"])
        return JSONResponse(body if shape is None else shape(body), headers=headers)

    async def _stream(self, call: ChatCall, latency: float, key: str) -> AsyncIterator[bytes]:
        """The answer as server-sent events (a word a chunk, tool calls as OpenAI streams them),
        the call's latency spread over them; with `rate_break`, cut off halfway (the connection
        closes without [DONE])."""
        try:
            await self._held(None)
            options = call.body.get("stream_options") or {}
            body = self.completion(call)
            self.settle(call, key, body["usage"]["total_tokens"])
            events = chunks(body, include_usage=bool(options.get("include_usage")))
            broken = self._random.random() < self.config.rate_break
            pause = latency / max(1, len(events))
            for index, event in enumerate(events):
                if broken and index >= len(events) // 2:
                    raise ConnectionAbortedError("the mock cuts this stream off")
                yield f"data: {json.dumps(event)}\n\n".encode()
                await asyncio.sleep(pause)
            yield b"data: [DONE]\n\n"
            with self.lock:
                self.stats.completed += 1
        finally:
            self.leave()

    async def trickle(self, call: ChatCall, shape: Shape | None = None) -> AsyncIterator[bytes]:
        try:
            give_up = time.monotonic() + self.config.hang_s
            while time.monotonic() < give_up:
                yield b" "
                await asyncio.sleep(min(1.0, max(0.0, give_up - time.monotonic())))
            body = self.completion(call)
            yield json.dumps(body if shape is None else shape(body)).encode()
        finally:
            self.leave()

    def completion(self, call: ChatCall) -> dict[str, Any]:
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
        with self.lock:
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
                *self.responses.routes(),
                *self.files.routes(),
                *self.batches.routes(),
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
