"""The mock LLM: an OpenAI Chat Completions server in miniature, with knobs.

`llmtasks mock-llm` runs it; the local stack starts it unless LLM_BASE_URL is set. It reads a
request as OpenAI does (request.py: content parts, tools, response_format, reasoning; a 400 in
OpenAI's words for what OpenAI refuses) and answers in OpenAI's shapes (reply.py). Knobs are set
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
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from llmtasks_local import KEEP_ALIVE_S
from llmtasks_local.mock_llm.reply import chunks, completion
from llmtasks_local.mock_llm.request import ChatCall, OpenAIError, read_call

# The prompt prefixes remembered for cached_tokens (the oldest forgotten past this many).
CACHE_ENTRIES = 10_000


class MockConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MOCK_LLM_", extra="forbid")

    latency_s: float = Field(
        default=0.0, ge=0, description="Each call's time (the median with latency_sigma)."
    )
    latency_sigma: float = Field(
        default=0.0,
        ge=0,
        description="Draw each call's time from a log-normal of this sigma around latency_s.",
    )
    latency_min_s: float = Field(default=0.0, ge=0, description="The drawn times' lower bound.")
    latency_max_s: float | None = Field(default=None, ge=0, description="The drawn times' upper bound.")
    rate_429: float = Field(default=0.0, ge=0, le=1, description="Share of calls answered 429.")
    retry_after_s: float = Field(default=1.0, ge=0, description="Retry-After sent with each 429.")
    rate_500: float = Field(default=0.0, ge=0, le=1, description="Share of calls answered 500.")
    rate_hang: float = Field(
        default=0.0, ge=0, le=1, description="Share of calls that hang: 200 sent, then a byte a second."
    )
    hang_s: float = Field(default=3600.0, ge=0, description="How long a hanging call trickles.")
    max_rps: float | None = Field(
        default=None, gt=0, description="Calls per second accepted; the rest get 429 with Retry-After."
    )
    reply_chars: int = Field(default=0, ge=0, description="Pad each answer to this many characters.")
    pad_word_chars: int = Field(
        default=0,
        ge=0,
        description="The padding in words of this many characters, a space before each (a stream"
        " sends a word a chunk); 0: one word.",
    )
    refuse_stream: bool = Field(default=False, description="Answer 400 to streamed requests.")
    rate_break: float = Field(
        default=0.0, ge=0, le=1, description="Share of streamed answers cut off halfway (no [DONE])."
    )
    echo_key: bool = Field(
        default=False, description="Error messages quote the caller's Authorization (a careless provider)."
    )
    hold_until_in_flight: int = Field(
        default=0,
        ge=0,
        description="Each call's time starts once this many calls have been in flight at once (a"
        " barrier: a test of overlap ends on that event, not on a latency long enough for a loaded"
        " machine); a call held hang_s is answered anyway. 0: no hold.",
    )
    rate_invalid_json: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of structured-output calls (response_format json_schema or json_object)"
        " answered with JSON that breaks the schema (a required property missing) or is cut short.",
    )
    cache_min_tokens: int = Field(
        default=1024,
        ge=0,
        description="A prompt prefix (whole messages, same prompt_cache_key) seen before and of at"
        " least this many tokens is reported as usage.prompt_tokens_details.cached_tokens (OpenAI"
        " caches prefixes of 1,024 tokens and more).",
    )
    seed: int | None = None

    @model_validator(mode="after")
    def _shares_fit(self) -> MockConfig:
        if self.rate_429 + self.rate_500 + self.rate_hang > 1:
            raise ValueError("rate_429 + rate_500 + rate_hang must be at most 1")
        return self


# "gone": the caller hung up before its answer (its own timeout fired first), so it never saw
# what was drawn for it.
Outcome = Literal["ok", "429", "500", "hang", "rps", "gone"]
# Where one call's outcome is written: its prompt's list and its place there.
OutcomeSlot = tuple[list[Outcome], int]


class MockStats(BaseModel):
    calls: int = 0
    completed: int = 0
    errors_429: int = 0
    errors_500: int = 0
    hangs: int = 0
    rps_limited: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    # What each call with a given prompt got, in order: give each task a unique prompt to see
    # its spend and whether its first call succeeded.
    outcomes_by_prompt: dict[str, list[Outcome]] = Field(default_factory=dict)
    calls_with_key: int = 0  # calls that sent `Authorization: Bearer ...`
    latency_total_s: float = 0.0  # the call times drawn, summed (what the calls asked of the slots)
    arrivals: list[float] = Field(default_factory=list)  # each call's time.monotonic() on arrival
    # What reached the provider, summed over the calls it accepted (not the ones it answered 400):
    invalid_requests: int = 0  # requests answered 400 as OpenAI would (a malformed part, ...)
    params: dict[str, int] = Field(default_factory=dict)  # calls that sent each top-level parameter
    images: int = 0  # image_url parts
    files: int = 0  # file parts
    file_bytes: int = 0  # their decoded data
    audio_parts: int = 0  # input_audio parts
    structured: int = 0  # calls with response_format json_schema or json_object
    invalid_json: int = 0  # of them, answered with JSON broken on purpose
    reasoning_tokens: int = 0
    cached_tokens: int = 0

    def calls_for(self, prompt: str) -> int:
        return len(self.outcomes_by_prompt.get(prompt, ()))


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
        self._prefixes: OrderedDict[str, None] = OrderedDict()  # prompt prefixes seen (cached_tokens)

    def _decide(self, prompt: str) -> tuple[Outcome, float | None, float, OutcomeSlot]:
        """This call's fate and its time, drawn and counted under the lock."""
        config = self.config
        with self._lock:
            self.stats.calls += 1
            self.stats.arrivals.append(time.monotonic())
            latency = config.latency_s
            if config.latency_sigma and latency:
                latency = self._random.lognormvariate(math.log(latency), config.latency_sigma)
                latency = min(max(latency, config.latency_min_s), config.latency_max_s or math.inf)

            wait = self._rate_limit.retry_after(config.max_rps, time.monotonic())
            draw = self._random.random()
            outcome: Outcome
            if wait is not None:
                outcome = "rps"
                self.stats.rps_limited += 1
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
        return outcome, wait, latency, (record, len(record) - 1)

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
            for name in call.body:
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
        outcome, wait, latency, slot = self._decide(call.prompt)
        if request.headers.get("authorization", "").startswith("Bearer "):
            with self._lock:
                self.stats.calls_with_key += 1
        if outcome == "ok" and stream:
            return StreamingResponse(self._stream(call, latency), media_type="text/event-stream")
        if outcome == "hang":
            # Headers now, then a byte a second: a per-read timeout never fires; only a bound on
            # the whole call ends it.
            return StreamingResponse(self._trickle(call), media_type="application/json")
        try:
            return await self._answer(request, outcome, wait, latency, call, slot)
        finally:
            self._leave()

    async def _answer(
        self,
        request: Request,
        outcome: Outcome,
        wait: float | None,
        latency: float,
        call: ChatCall,
        slot: OutcomeSlot,
    ) -> Response:
        if outcome == "rps":
            return _error(429, "requests per second limit (mock)", retry_after=wait)
        if not await self._held(request) or (latency and not await _stay_connected(request, latency)):
            self._hung_up(slot)
            return Response(status_code=499)  # nobody is listening any more
        if outcome in ("429", "500"):
            said = f"{'rate limited' if outcome == '429' else 'internal error'} (mock)"
            if self.config.echo_key:
                said += f"; you sent {request.headers.get('authorization', 'no key')}"
            return _error(int(outcome), said, retry_after=wait)
        with self._lock:
            self.stats.completed += 1
        return JSONResponse(self._completion(call))

    async def _stream(self, call: ChatCall, latency: float) -> AsyncIterator[bytes]:
        """The answer as server-sent events (a word a chunk, tool calls as OpenAI streams them),
        the call's latency spread over them; with `rate_break`, cut off halfway (the connection
        closes without [DONE])."""
        try:
            await self._held(None)
            options = call.body.get("stream_options") or {}
            events = chunks(self._completion(call), include_usage=bool(options.get("include_usage")))
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

    async def _trickle(self, call: ChatCall) -> AsyncIterator[bytes]:
        try:
            give_up = time.monotonic() + self.config.hang_s
            while time.monotonic() < give_up:
                yield b" "
                await asyncio.sleep(min(1.0, max(0.0, give_up - time.monotonic())))
            yield json.dumps(self._completion(call)).encode()
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


def _error(status: int, message: str, *, retry_after: float | None = None) -> JSONResponse:
    # Fractions are off-standard but keep compressed test schedules short; llmtasks reads them.
    headers = None
    if retry_after is not None:
        value = f"{retry_after:.0f}" if float(retry_after).is_integer() else f"{retry_after:.3f}"
        headers = {"Retry-After": value}
    kind = {429: "rate_limit_exceeded", 500: "server_error"}.get(status, "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
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
