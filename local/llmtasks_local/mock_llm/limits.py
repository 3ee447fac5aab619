"""Per-key tokens and requests a minute, as OpenAI counts them, and the headers it sends.

Each key (the Authorization the call sends; "" for none) has a bucket of `tpm` tokens and one of
`rpm` requests, each refilling its whole limit over a minute. A call is admitted when both hold
its count: one request, and its tokens as OpenAI estimates them at admission (the prompt and
max_completion_tokens); otherwise it is answered 429. Once answered, the tokens count as the
answer's usage says. Every answer, 429s included, carries the six `x-ratelimit-*` headers, their
resets in OpenAI's durations ("1s", "6m0s", "20ms").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from llmtasks.domain.rate_limits import format_duration

MINUTE_S = 60.0


class KeyLimit(BaseModel):
    """One key's limits a minute (None: that count is not limited)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tpm: int | None = Field(default=None, ge=1)
    rpm: int | None = Field(default=None, ge=1)


@dataclass
class _Bucket:
    """A count that refills `limit` a minute up to `limit`: `whole_at` is when it would be whole
    again (past: it is whole)."""

    limit: int
    whole_at: float = 0.0

    def missing(self, now: float) -> float:
        return self.limit * max(0.0, self.whole_at - now) / MINUTE_S

    def fits(self, count: float, now: float) -> bool:
        return self.missing(now) + min(count, self.limit) <= self.limit

    def take(self, count: float, now: float) -> None:
        self.whole_at = max(self.whole_at, now) + MINUTE_S * count / self.limit

    def remaining(self, now: float) -> int:
        return max(0, int(self.limit - self.missing(now)))

    def reset_s(self, now: float) -> float:
        return max(0.0, self.whole_at - now)


@dataclass
class _Key:
    tokens: _Bucket | None
    requests: _Bucket | None


@dataclass
class KeyCounts:
    """The limits the mock enforces, per key; thread-safe."""

    default: KeyLimit
    per_key: dict[str, KeyLimit]
    _keys: dict[str, _Key] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _key(self, key: str) -> _Key | None:
        limit = self.per_key.get(key, self.default)
        if limit.tpm is None and limit.rpm is None:
            return None
        if key not in self._keys:
            self._keys[key] = _Key(
                tokens=_Bucket(limit.tpm) if limit.tpm else None,
                requests=_Bucket(limit.rpm) if limit.rpm else None,
            )
        return self._keys[key]

    def admit(self, key: str, tokens: int, now: float) -> tuple[bool, dict[str, str]]:
        """Whether a call of `tokens` is admitted on `key` (counted if it is), and the headers
        of its answer."""
        with self._lock:
            counts = self._key(key)
            if counts is None:
                return True, {}
            buckets = [(counts.tokens, tokens), (counts.requests, 1)]
            admitted = all(bucket is None or bucket.fits(count, now) for bucket, count in buckets)
            if admitted:
                for bucket, count in buckets:
                    if bucket is not None:
                        bucket.take(count, now)
            return admitted, self._headers(counts, now)

    def settle(self, key: str, admitted: int, used: int, now: float) -> dict[str, str]:
        """The call admitted at `admitted` tokens used `used`: counted so. The headers after it."""
        with self._lock:
            counts = self._key(key)
            if counts is None:
                return {}
            if counts.tokens is not None and used != admitted:
                counts.tokens.whole_at += MINUTE_S * (used - admitted) / counts.tokens.limit
            return self._headers(counts, now)

    @staticmethod
    def _headers(counts: _Key, now: float) -> dict[str, str]:
        headers = {}
        for name, bucket in (("requests", counts.requests), ("tokens", counts.tokens)):
            if bucket is not None:
                headers[f"x-ratelimit-limit-{name}"] = str(bucket.limit)
                headers[f"x-ratelimit-remaining-{name}"] = str(bucket.remaining(now))
                headers[f"x-ratelimit-reset-{name}"] = format_duration(bucket.reset_s(now))
        return headers
