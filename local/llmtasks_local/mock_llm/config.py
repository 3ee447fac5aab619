"""The mock LLM's knobs (MockConfig: flags, MOCK_LLM_* variables, `PUT /_mock/config`) and its
counters (MockStats, at `GET /_mock/stats`)."""

from __future__ import annotations

import binascii
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from standardwebhooks import Webhook

from llmtasks_local.mock_llm.limits import KeyLimit


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
    tpm: int | None = Field(
        default=None, ge=1, description="Tokens a minute each key may use (OpenAI's count); None: no limit."
    )
    rpm: int | None = Field(default=None, ge=1, description="Requests a minute each key may make.")
    key_limits: dict[str, KeyLimit] = Field(
        default_factory=dict,
        description='Limits of named keys, over tpm and rpm: {"sk-a": {"tpm": 10000, "rpm": 60}}.',
    )
    webhook_url: str | None = Field(
        default=None,
        description="Where OpenAI's webhook events go when a background response ends (response.completed,"
        " .failed, .cancelled, .incomplete) or a batch does (batch.completed, .failed, .expired,"
        " .cancelled), signed as OpenAI signs them (Standard Webhooks); None: none.",
    )
    webhook_secret: str | None = Field(
        default=None, description="The webhooks' signing secret, `whsec_` and base64 (as OpenAI's are)."
    )
    webhook_attempts: int = Field(
        default=4,
        ge=1,
        description="Attempts at each webhook event before giving it up (on a non-2xx or no answer).",
    )
    webhook_retry_s: float = Field(
        default=0.5, ge=0, description="The first pause between attempts; each next one doubles."
    )
    batch_delay_s: float = Field(
        default=2.0,
        ge=0,
        description="A batch's time from create to completed: validating, its lines run spread over"
        " the time, finalizing.",
    )
    rate_batch_fail: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of a batch's lines that fail (a 500 in its error file); `[mock:batch-fail]`"
        " in a line's messages fails that line.",
    )
    batch_expire_s: float | None = Field(
        default=None,
        gt=0,
        description="A batch still running this long after its create expires: its lines not run are"
        " written to the error file as batch_expired. None: the 24 h window (never, in a test).",
    )
    batch_max_requests: int = Field(default=50_000, ge=1, description="Lines a batch may hold (OpenAI's).")
    batch_max_bytes: int = Field(
        default=200 * 1024 * 1024, ge=1, description="Bytes a batch input file may hold (OpenAI's 200 MB)."
    )
    seed: int | None = None

    @model_validator(mode="after")
    def _shares_fit(self) -> MockConfig:
        if self.rate_429 + self.rate_500 + self.rate_hang > 1:
            raise ValueError("rate_429 + rate_500 + rate_hang must be at most 1")
        if self.webhook_url is not None and not self.webhook_url.startswith(("http://", "https://")):
            raise ValueError("webhook_url must be an http:// or https:// URL")
        if self.webhook_url is not None and not self.webhook_secret:
            raise ValueError("webhook_url needs webhook_secret (whsec_ and base64): OpenAI signs every event")
        if self.webhook_secret is not None:
            try:
                Webhook(self.webhook_secret)
            except (ValueError, binascii.Error) as exc:
                raise ValueError("webhook_secret must be whsec_ and base64") from exc
        return self


# "gone": the caller hung up before its answer (its own timeout fired first), so it never saw
# what was drawn for it.
# "limited": refused by the key's tokens or requests a minute (tpm, rpm, key_limits).
Outcome = Literal["ok", "429", "500", "hang", "rps", "limited", "gone"]
# Where one call's outcome is written: its prompt's list and its place there.
OutcomeSlot = tuple[list[Outcome], int]
# A call's fate as drawn on arrival: its outcome, the Retry-After of a 429, its latency, where its
# outcome is written, the rate-limit headers of its answer.
Decision = tuple[Outcome, float | None, float, OutcomeSlot, dict[str, str]]


class MockStats(BaseModel):
    calls: int = 0
    completed: int = 0
    errors_429: int = 0
    errors_500: int = 0
    hangs: int = 0
    rps_limited: int = 0
    key_limited: int = 0  # 429s of the keys' tokens and requests a minute
    tokens_by_key: dict[str, int] = Field(default_factory=dict)  # usage answered, by key's last 4
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
    # The Responses API (POST /v1/responses): calls taken, and background responses by how they ended.
    responses: int = 0
    background_started: int = 0
    background_completed: int = 0  # completed, or incomplete at max_output_tokens
    background_failed: int = 0
    background_cancelled: int = 0
    background_polls: int = 0  # GET /v1/responses/{id} of a background response
    cancel_requests: int = 0  # POST /v1/responses/{id}/cancel, answered or refused
    webhooks_sent: int = 0  # events delivered (a 2xx)
    webhook_failures: int = 0  # attempts that got no 2xx
    # The Files and Batches APIs.
    files_uploaded: int = 0
    batches_created: int = 0
    batch_lines_run: int = 0  # lines answered (200) or failed (4xx, 5xx); not the expired ones
    batch_lines_failed: int = 0
    batch_polls: int = 0  # GET /v1/batches/{id}
    batches_ended: dict[str, int] = Field(default_factory=dict)  # by end: completed, failed, ...

    def calls_for(self, prompt: str) -> int:
        return len(self.outcomes_by_prompt.get(prompt, ()))
