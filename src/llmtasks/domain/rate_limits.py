"""Rate limits as providers count them: tokens and requests a minute, per API key.

A key's use is kept as GCRA (the generic cell rate algorithm) keeps a token bucket: one time
per counted thing, `at`, the moment the key's minute would be whole again. A call of t tokens
moves `tokens_at` on by t/tpm of a minute (`requests_at` by 1/rpm), from now if the time lies
in the past; it fits while the time stays within a minute of now, which is a bucket of tpm
tokens that refills tpm a minute: what OpenAI's headers describe (`remaining` refilling to the
`limit` within `reset`). So the wait for room is exact, and a settle gives tokens back by moving
the time back. The reads and writes of these times live in aws/key_limits.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

WINDOW_S = 60.0  # the providers' limits are a minute's

# OpenAI writes durations as Go does: "1s", "6m0s", "20ms", "1m30.5s", "2h3m".
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


class KeyLimits(BaseModel):
    """What one provider key may use a minute; None: not bounded (or not known yet)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tpm: int | None = Field(default=None, ge=1)
    rpm: int | None = Field(default=None, ge=1)

    @property
    def bounded(self) -> bool:
        return self.tpm is not None or self.rpm is not None

    def over(self, known: KeyLimits) -> KeyLimits:
        """These limits where set, `known` elsewhere (what a provider said wins over the config)."""
        return KeyLimits(tpm=self.tpm or known.tpm, rpm=self.rpm or known.rpm)

    def tokens_s(self, tokens: int) -> float:
        """How far a call of `tokens` moves the tokens' time: its share of the minute, at most the
        whole minute (a call larger than the limit runs alone on a whole minute)."""
        if self.tpm is None:
            return 0.0
        return WINDOW_S * min(tokens, self.tpm) / self.tpm

    def request_s(self) -> float:
        return 0.0 if self.rpm is None else WINDOW_S / self.rpm


class KeyUse(BaseModel):
    """One key's state as every worker shares it (aws/key_limits.py keeps it): the GCRA times
    of its tokens and requests, when a 429 lets calls start again, and the limits the provider
    said (None until it has)."""

    model_config = ConfigDict(frozen=True)

    tokens_at: float | None = None
    # The part of tokens_at that calls still running reserved (at their most): what their
    # answers may give back.
    tokens_held: float | None = None
    requests_at: float | None = None
    held_until: float | None = None
    said: KeyLimits = KeyLimits()

    def wait_s(self, limits: KeyLimits, tokens: int, now: float) -> float:
        """How long until a call of `tokens` fits: 0 when it fits now."""
        waits = [0.0, (self.held_until or 0.0) - now]
        if limits.tpm is not None and self.tokens_at is not None:
            waits.append(self.tokens_at + limits.tokens_s(tokens) - WINDOW_S - now)
        if limits.rpm is not None and self.requests_at is not None:
            waits.append(self.requests_at + limits.request_s() - WINDOW_S - now)
        return max(waits)

    def soonest_s(self, limits: KeyLimits, tokens: int, now: float) -> float:
        """The wait if the calls running now used none of their reservations: a lower bound of
        the wait, which wait_s bounds from above (the running calls' answers tell which)."""
        held = max(0.0, self.tokens_held or 0.0)  # a crashed call's reservation is never given back
        if self.tokens_at is None or not held:
            return self.wait_s(limits, tokens, now)
        settled = self.model_copy(update={"tokens_at": max(now, self.tokens_at - held)})
        return min(settled.wait_s(limits, tokens, now), self.wait_s(limits, tokens, now))

    def free_share(self, limits: KeyLimits, now: float) -> float:
        """The share of the key's minute that is free now (of the tighter of its two limits):
        the pool tries the freest key first."""
        shares = [1.0]
        if (self.held_until or 0.0) > now:
            return 0.0
        for at, bounded in ((self.tokens_at, limits.tpm), (self.requests_at, limits.rpm)):
            if bounded is not None and at is not None:
                shares.append(1.0 - min(WINDOW_S, max(0.0, at - now)) / WINDOW_S)
        return min(shares)


class RateHeaders(BaseModel):
    """OpenAI's rate-limit headers of one answer (None where a header is missing or unreadable)."""

    limit_requests: int | None = None
    limit_tokens: int | None = None
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    reset_requests_s: float | None = None
    reset_tokens_s: float | None = None

    @classmethod
    def read(cls, headers: Mapping[str, str]) -> RateHeaders:
        lower = {name.lower(): value for name, value in headers.items()}

        def count(name: str) -> int | None:
            value = lower.get(f"x-ratelimit-{name}", "").strip()
            return int(value) if value.isdigit() else None

        return cls(
            limit_requests=count("limit-requests"),
            limit_tokens=count("limit-tokens"),
            remaining_requests=count("remaining-requests"),
            remaining_tokens=count("remaining-tokens"),
            reset_requests_s=parse_duration(lower.get("x-ratelimit-reset-requests")),
            reset_tokens_s=parse_duration(lower.get("x-ratelimit-reset-tokens")),
        )

    @property
    def limits(self) -> KeyLimits:
        return KeyLimits(tpm=self.limit_tokens or None, rpm=self.limit_requests or None)

    def used_s(self, limits: KeyLimits, *, unsettled_tokens: int = 0) -> tuple[float | None, float | None]:
        """How far the provider's count puts the key's tokens' and requests' times past now (the
        used part of each minute); `unsettled_tokens` of the count the caller is giving back."""
        tokens = requests = None
        if limits.tpm is not None and self.remaining_tokens is not None:
            used = max(0, limits.tpm - self.remaining_tokens - unsettled_tokens)
            tokens = limits.tokens_s(used)
        if limits.rpm is not None and self.remaining_requests is not None:
            requests = WINDOW_S * max(0, limits.rpm - self.remaining_requests) / limits.rpm
        return tokens, requests

    def reset_s(self) -> float | None:
        """When the exhausted count is whole again: the later of the two resets a 429 names."""
        resets = [r for r in (self.reset_requests_s, self.reset_tokens_s) if r is not None]
        exhausted = [
            reset
            for reset, left in (
                (self.reset_requests_s, self.remaining_requests),
                (self.reset_tokens_s, self.remaining_tokens),
            )
            if reset is not None and left == 0
        ]
        chosen = exhausted or resets
        return max(chosen) if chosen else None


def parse_duration(value: str | None) -> float | None:
    """Seconds from a duration as OpenAI writes it ("6m0s", "20ms", "1.5s"); None if unreadable."""
    text = (value or "").strip()
    if not text:
        return None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def format_duration(seconds: float) -> str:
    """A duration as OpenAI writes it: "20ms" under a second, else "1s", "6m0s", "1h2m3.5s"."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole_ms = round(seconds * 1000)
    hours, rest = divmod(whole_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
