"""A pool of LLM API keys (and, if need be, endpoints) for one provider.

Calls go round the pool; a key that answers 429 rests for its Retry-After (or `REST_S`) while
the others carry the traffic. The pool lives in one sandbox: each learns of a key's 429 from its
own calls, which is what spreads the load without a shared write per call.

The keys come, in this order, from LLM_KEYS, the file LLM_KEYS_FILE, the secret
LLM_API_KEY_SECRET_ARN, or LLM_API_KEY, each holding one of:
- one key, or several separated by commas or newlines, all for LLM_BASE_URL;
- a JSON list of keys, or of objects `{"api_key": ..., "base_url": ..., "tpm": ..., "rpm": ...}`
  (all but api_key optional), for keys of several accounts or deployments of one provider; `tpm`
  and `rpm` are the key's tokens and requests a minute.

A key's limits (configured, or said by the provider's rate-limit headers, which win) are shared
by every worker (aws/key_limits.py): before a call the pool reserves its tokens and one request
on the freest key with room, and when none has room the task waits on its queue (KeysFull).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from llmtasks.domain.errors import KeysFull
from llmtasks.domain.rate_limits import KeyLimits, RateHeaders

if TYPE_CHECKING:
    from llmtasks.aws.key_limits import KeyRates
    from llmtasks.settings import LlmSettings

# How long a key rests after a 429 that named no Retry-After.
REST_S = 5.0


@dataclass(frozen=True)
class LlmEndpoint:
    base_url: str
    api_key: str | None = None
    limits: KeyLimits = field(default_factory=KeyLimits)

    @property
    def key_id(self) -> str:
        """The key's name in shared state: a hash, never the key (the URL for a keyless one)."""
        return hashlib.sha256((self.api_key or self.base_url).encode()).hexdigest()[:24]


def parse_keys(text: str, *, base_url: str) -> list[LlmEndpoint]:
    """The endpoints a key setting names (formats: the module's docstring)."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        entries = json.loads(text)
        if not isinstance(entries, list):
            raise ValueError("LLM keys: a JSON list is expected")
        endpoints = []
        for entry in entries:
            if isinstance(entry, str):
                endpoints.append(LlmEndpoint(base_url, entry))
            elif isinstance(entry, dict) and set(entry) <= {"api_key", "base_url", "tpm", "rpm"}:
                limits = KeyLimits(tpm=entry.get("tpm"), rpm=entry.get("rpm"))
                endpoints.append(
                    LlmEndpoint(str(entry.get("base_url") or base_url), entry.get("api_key"), limits)
                )
            else:
                raise ValueError("LLM keys: each entry is a key or {api_key, base_url, tpm, rpm}")
        return endpoints
    keys = [part.strip() for part in text.replace("\n", ",").split(",")]
    return [LlmEndpoint(base_url, key) for key in keys if key]


def endpoints_from_settings(settings: LlmSettings) -> list[LlmEndpoint]:
    base_url = settings.llm_base_url
    if settings.llm_keys is not None:
        return parse_keys(settings.llm_keys.get_secret_value(), base_url=base_url)
    if settings.llm_keys_file:
        return parse_keys(Path(settings.llm_keys_file).read_text(), base_url=base_url)
    if settings.llm_api_key_secret_arn:
        # Powertools caches the value for 5 minutes, so a warm function does not call Secrets
        # Manager per task; imported here so the local stack never needs it.
        from aws_lambda_powertools.utilities.parameters import get_secret

        return parse_keys(str(get_secret(settings.llm_api_key_secret_arn)), base_url=base_url)
    if settings.llm_api_key is not None:
        return [LlmEndpoint(base_url, settings.llm_api_key.get_secret_value())]
    return [LlmEndpoint(base_url)]  # a keyless server (a local model, the mock)


class KeyPool:
    def __init__(
        self,
        endpoints: list[LlmEndpoint],
        *,
        clock: Callable[[], float] = time.monotonic,
        rates: KeyRates | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not endpoints:
            raise ValueError("an LLM key pool needs at least one endpoint")
        self.endpoints = endpoints
        self._clock = clock
        self._rates = rates
        self._wall_clock = wall_clock  # the shared state's times are epoch seconds
        self._resting_until = [0.0] * len(endpoints)
        self._next = 0

    def pick(self, *, besides: frozenset[int] = frozenset()) -> int | None:
        """The index of the next key to use, round the pool, skipping resting keys and `besides`;
        when every other key rests, the one back soonest (None: only `besides` are left)."""
        now = self._clock()
        candidates = [i for i in range(len(self.endpoints)) if i not in besides]
        if not candidates:
            return None
        ready = [i for i in candidates if self._resting_until[i] <= now]
        if not ready:
            return min(candidates, key=lambda i: self._resting_until[i])
        order = sorted(ready, key=lambda i: (i - self._next) % len(self.endpoints))
        chosen = order[0]
        self._next = chosen + 1
        return chosen

    def limits(self, index: int) -> KeyLimits:
        """The key's limits: what its provider said, else what the pool's config gives."""
        endpoint = self.endpoints[index]
        said = self._rates.seen.get(endpoint.key_id) if self._rates is not None else None
        return said.said.over(endpoint.limits) if said is not None else endpoint.limits

    async def take(self, tokens: int, *, besides: frozenset[int] = frozenset()) -> int | None:
        """The index of a key with room for a call of `tokens`, that call reserved on it (the
        freest key first, round the pool among equals; resting keys and `besides` skipped, as
        pick does). Raises KeysFull with the shortest wait when no key has room; None when only
        `besides` are left."""
        rates = self._rates
        if rates is None:
            return self.pick(besides=besides)
        now, clock_now = self._wall_clock(), self._clock()
        candidates = [i for i in range(len(self.endpoints)) if i not in besides]
        if not candidates:
            return None
        ready = [i for i in candidates if self._resting_until[i] <= clock_now] or candidates
        size = len(self.endpoints)

        def freest(i: int) -> tuple[float, int]:
            use = rates.seen.get(self.endpoints[i].key_id)
            share = use.free_share(self.limits(i), now) if use is not None else 1.0
            return -share, (i - self._next) % size

        waits, soonest = [], []
        for index in sorted(ready, key=freest):
            limits = self.limits(index)
            wait = 0.0
            if limits.bounded:
                key_id = self.endpoints[index].key_id
                wait = await asyncio.to_thread(rates.reserve, key_id, limits, tokens, now)
            if wait <= 0:
                self._next = index + 1
                return index
            waits.append(wait)
            soonest.append(rates.seen[self.endpoints[index].key_id].soonest_s(limits, tokens, now))
        raise KeysFull(min(waits), min(soonest))

    async def answered(
        self, index: int, reserved: int, used: int, headers: Mapping[str, str], *, counted: bool = True
    ) -> None:
        """The call on the key is answered: its reservation settled to the `used` tokens, and
        what the provider's headers say of the key learned (`counted`: the provider's count,
        which may date from before its own settle, includes the call)."""
        if self._rates is None:
            return
        key_id, limits = self.endpoints[index].key_id, self.limits(index)
        if limits.bounded:
            await asyncio.to_thread(self._rates.settle, key_id, limits, reserved, used)
        heard = RateHeaders.read(headers)
        if heard.limits.bounded:
            unsettled = max(0, reserved - used) if counted else 0
            now = self._wall_clock()
            await asyncio.to_thread(self._rates.learn, key_id, heard, now, unsettled_tokens=unsettled)

    async def refused(
        self, index: int, reserved: int, headers: Mapping[str, str], retry_after: float | None
    ) -> None:
        """The key answered 429 (another client of it used its minute, or the limits were not
        known yet): it rests here for `retry_after`, and its reservation, which the provider did
        not count, is given back. Shared with every worker: the use its headers say (the exact
        wait follows from it), or without such headers a hold of `retry_after`."""
        self.rest(index, retry_after)
        if self._rates is None:
            return
        await self.answered(index, reserved, 0, headers, counted=False)
        heard = RateHeaders.read(headers)
        if heard.remaining_tokens is None and heard.remaining_requests is None:
            until = self._wall_clock() + (REST_S if retry_after is None else retry_after)
            await asyncio.to_thread(self._rates.hold, self.endpoints[index].key_id, until)

    def rest(self, index: int, seconds: float | None) -> None:
        """The key answered 429: the others go first until it has waited `seconds`."""
        self._resting_until[index] = self._clock() + (REST_S if seconds is None else seconds)

    def is_ready(self, index: int) -> bool:
        return self._resting_until[index] <= self._clock()
