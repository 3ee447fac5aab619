"""A pool of LLM API keys (and, if need be, endpoints) for one provider.

Calls go round the pool; a key that answers 429 rests for its Retry-After (or `REST_S`) while
the others carry the traffic. The pool lives in one sandbox: each learns of a key's 429 from its
own calls, which is what spreads the load without a shared write per call.

The keys come, in this order, from LLM_KEYS, the file LLM_KEYS_FILE, the secret
LLM_API_KEY_SECRET_ARN, or LLM_API_KEY, each holding one of:
- one key, or several separated by commas or newlines, all for LLM_BASE_URL;
- a JSON list of keys, or of objects `{"api_key": ..., "base_url": ...}` (base_url optional),
  for keys of several accounts or deployments of one provider.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmtasks.settings import LlmSettings

# How long a key rests after a 429 that named no Retry-After.
REST_S = 5.0


@dataclass(frozen=True)
class LlmEndpoint:
    base_url: str
    api_key: str | None = None


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
            elif isinstance(entry, dict) and set(entry) <= {"api_key", "base_url"}:
                endpoints.append(LlmEndpoint(str(entry.get("base_url") or base_url), entry.get("api_key")))
            else:
                raise ValueError("LLM keys: each entry is a key or {api_key, base_url}")
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
    def __init__(self, endpoints: list[LlmEndpoint], *, clock: Callable[[], float] = time.monotonic) -> None:
        if not endpoints:
            raise ValueError("an LLM key pool needs at least one endpoint")
        self.endpoints = endpoints
        self._clock = clock
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

    def rest(self, index: int, seconds: float | None) -> None:
        """The key answered 429: the others go first until it has waited `seconds`."""
        self._resting_until[index] = self._clock() + (REST_S if seconds is None else seconds)

    def is_ready(self, index: int) -> bool:
        return self._resting_until[index] <= self._clock()
