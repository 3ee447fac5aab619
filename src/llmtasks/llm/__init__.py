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


def provider_from_settings(settings: Settings) -> LLMProvider:
    from llmtasks.llm.openai import OpenAIChat, api_key_from_settings

    # "mock" is the project's own OpenAI-compatible server: the same wire protocol.
    return OpenAIChat(
        base_url=settings.llm_base_url,
        api_key=api_key_from_settings(settings),
        default_model=settings.llm_model,
    )
