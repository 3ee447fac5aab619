"""The mock LLM: an OpenAI-compatible chat-completions server with knobs.

`llmtasks mock-llm` runs it; the local stack starts it unless LLM_BASE_URL is set. Knobs are set
at start (flags or MOCK_LLM_* variables) and per run over HTTP (`PUT /_mock/config`); the
counters at `GET /_mock/stats` let tests assert concurrency and spend at the provider itself.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


class MockConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MOCK_LLM_", extra="forbid")

    latency_s: float = Field(default=0.0, ge=0)
    rate_429: float = Field(default=0.0, ge=0, le=1, description="Share of calls answered 429.")
    retry_after_s: float = Field(default=1.0, ge=0, description="Retry-After sent with each 429.")
    rate_500: float = Field(default=0.0, ge=0, le=1, description="Share of calls answered 500.")
    reply_chars: int = Field(default=0, ge=0, description="Pad each answer to this many characters.")
    seed: int | None = None


class MockStats(BaseModel):
    calls: int = 0
    completed: int = 0
    errors_429: int = 0
    errors_500: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    # Calls per prompt text: give each task a unique prompt to count the spend per task.
    calls_by_prompt: dict[str, int] = Field(default_factory=dict)


def reply_text(prompt: str, reply_chars: int = 0) -> str:
    text = f"Mock answer to a prompt of {len(prompt)} characters: {prompt[:200]}"
    return text.ljust(reply_chars, ".")


class MockLLM:
    def __init__(self, config: MockConfig | None = None) -> None:
        self.config = config or MockConfig()
        self.stats = MockStats()
        self._lock = threading.Lock()
        self._random = random.Random(self.config.seed)  # noqa: S311 - fault injection, not crypto

    async def chat_completions(self, request: Request) -> JSONResponse:
        try:
            body: dict[str, Any] = await request.json()
            messages = body["messages"]
            prompt = str(messages[-1]["content"])
        except (ValueError, KeyError, IndexError, TypeError):
            return JSONResponse({"error": {"message": "expected a chat completion request"}}, 400)
        with self._lock:
            self.stats.calls += 1
            self.stats.in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
            self.stats.calls_by_prompt[prompt] = self.stats.calls_by_prompt.get(prompt, 0) + 1
            draw = self._random.random()
        try:
            if self.config.latency_s:
                await asyncio.sleep(self.config.latency_s)
            if draw < self.config.rate_429:
                self.stats.errors_429 += 1
                return JSONResponse(
                    {"error": {"message": "rate limited (mock)", "type": "rate_limit_error"}},
                    429,
                    headers={"Retry-After": f"{self.config.retry_after_s:g}"},
                )
            if draw < self.config.rate_429 + self.config.rate_500:
                self.stats.errors_500 += 1
                return JSONResponse({"error": {"message": "internal error (mock)"}}, 500)
            text = reply_text(prompt, self.config.reply_chars)
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
            completion_tokens = len(text.split())
            self.stats.completed += 1
            return JSONResponse(
                {
                    "id": f"chatcmpl-mock-{self.stats.calls}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model") or "mock",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    },
                }
            )
        finally:
            with self._lock:
                self.stats.in_flight -= 1

    async def get_stats(self, _: Request) -> JSONResponse:
        return JSONResponse(self.stats.model_dump())

    async def put_config(self, request: Request) -> JSONResponse:
        try:
            changes = await request.json()
            self.config = MockConfig.model_validate({**self.config.model_dump(), **changes})
        except ValueError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, 422)
        if "seed" in changes:
            self._random.seed(self.config.seed)
        return JSONResponse(self.config.model_dump())

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = MockStats(in_flight=self.stats.in_flight)

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


def serve(host: str = "127.0.0.1", port: int = 8800, config: MockConfig | None = None) -> None:
    import uvicorn

    uvicorn.run(MockLLM(config).app(), host=host, port=port, log_level="warning", access_log=False)
