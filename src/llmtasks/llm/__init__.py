"""LLM providers. The worker sees one protocol; `provider_from_settings` picks the implementation."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llmtasks.aws.key_limits import KeyRates
    from llmtasks.domain.llm_request import LLMRequest
    from llmtasks.domain.messages import Completion
    from llmtasks.settings import LlmSettings


@dataclass(frozen=True)
class BackgroundCall:
    """A call running in the provider's background mode: its id there, and the key it runs on."""

    response_id: str
    key_index: int
    model: str


# The error codes of a background call that ended without an answer; a look at it that failed has
# a plain call's codes, as the call may still be running.
ENDED_CODE_PREFIX = "llm_background_"


class BackgroundCalls(Protocol):
    """A provider's background mode (OpenAI's Responses API `background: true`): the call runs at
    the provider while no worker waits, and the worker checks back on it."""

    async def start_background(
        self, request: LLMRequest, *, timeout_s: float, tokens: int = 0
    ) -> BackgroundCall: ...

    async def poll_background(self, call: BackgroundCall, *, timeout_s: float) -> Completion | None:
        """The answer once the call has ended, else None; LLMError when it failed there."""
        ...

    async def cancel_background(self, call: BackgroundCall, *, timeout_s: float) -> None: ...


# Called as the reply streams in: the text so far, and how many chunks (about tokens) it took.
OnProgress = Callable[[str, int], Coroutine[Any, Any, None]]


class LLMProvider(Protocol):
    async def complete(
        self,
        request: LLMRequest,
        *,
        timeout_s: float,
        on_progress: OnProgress | None = None,
        tokens: int = 0,
    ) -> Completion:
        """One completion; raises `LLMError` (transient or permanent) when there is none. With
        `on_progress` the reply is streamed and reported as it grows; what `on_progress` raises
        ends the call and comes out of it. `tokens` is the most the call can use (the budget's
        estimate), which a provider whose keys have limits reserves first; it raises KeysFull
        when no key has room."""
        ...


# 408 and 409 are a provider's own transient conflicts, 429 a rate limit, 5xx its failures; any
# other 4xx is the request's fault and fails the task at once. Every provider classifies so.
_TRANSIENT_4XX = frozenset({408, 409, 429})


def is_transient_status(status: int) -> bool:
    return status in _TRANSIENT_4XX or status >= 500


def http_error_code(status: int) -> str:
    from llmtasks.domain.errors import RATE_LIMITED

    return RATE_LIMITED if status == 429 else f"llm_http_{status}"


def provider_from_settings(settings: LlmSettings, *, key_rates: KeyRates | None = None) -> LLMProvider:
    """The configured provider; with `key_rates`, an OpenAI-compatible one paces its keys by
    their tokens and requests a minute, shared by every worker (llm/keys.py)."""
    if settings.llm_provider == "bedrock":
        from llmtasks.llm.bedrock import BedrockConverse, bedrock_client

        return BedrockConverse(
            default_model=settings.llm_model, client=bedrock_client(timeout_s=settings.llm_timeout_s)
        )
    from llmtasks.llm.keys import KeyPool, endpoints_from_settings
    from llmtasks.llm.openai import OpenAIChat

    # "mock" is the project's own OpenAI-compatible server: the same wire protocol.
    pool = KeyPool(endpoints_from_settings(settings), rates=key_rates)
    return OpenAIChat(pool=pool, default_model=settings.llm_model)
