"""LLM providers. The worker sees one protocol; `provider_from_settings` picks the implementation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from llmtasks.models import Completion, LLMRequest
    from llmtasks.settings import Settings


class LLMProvider(Protocol):
    async def complete(self, request: LLMRequest, *, timeout_s: float) -> Completion:
        """One completion; raises `LLMError` (transient or permanent) when there is none."""
        ...


# 408 and 409 are a provider's own transient conflicts, 429 a rate limit, 5xx its failures; any
# other 4xx is the request's fault and fails the task at once. Every provider classifies so.
_TRANSIENT_4XX = frozenset({408, 409, 429})


def is_transient_status(status: int) -> bool:
    return status in _TRANSIENT_4XX or status >= 500


def http_error_code(status: int) -> str:
    from llmtasks.errors import RATE_LIMITED

    return RATE_LIMITED if status == 429 else f"llm_http_{status}"


def provider_from_settings(settings: Settings) -> LLMProvider:
    if settings.llm_provider == "bedrock":
        from llmtasks.llm.bedrock import BedrockConverse, bedrock_client

        return BedrockConverse(
            default_model=settings.llm_model, client=bedrock_client(timeout_s=settings.llm_timeout_s)
        )
    from llmtasks.llm.keys import KeyPool, endpoints_from_settings
    from llmtasks.llm.openai import OpenAIChat

    # "mock" is the project's own OpenAI-compatible server: the same wire protocol.
    return OpenAIChat(pool=KeyPool(endpoints_from_settings(settings)), default_model=settings.llm_model)
