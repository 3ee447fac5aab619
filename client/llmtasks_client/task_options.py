"""The keyword arguments `submit` takes besides the prompt or messages and `response_format`:
the generation parameters of one Chat Completions call, passed on as they are, and the task's
own (retries, deadline, priority, metadata, webhook). None leaves a field out of the request.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class TaskOptions(TypedDict, total=False):
    model: str | None
    system: str | None
    max_tokens: int | None
    max_completion_tokens: int | None  # reasoning tokens included
    temperature: float | None
    top_p: float | None
    stop: str | list[str] | None
    seed: int | None
    presence_penalty: float | None
    frequency_penalty: float | None
    logprobs: bool | None
    top_logprobs: int | None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None
    # Function tools: the task is a run (docs: agent runs) of up to max_steps model calls.
    tools: list[dict[str, Any]] | None
    max_steps: int | None
    # Each model call in the provider's background mode: no worker waits while it thinks.
    provider_background: bool | None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None
    parallel_tool_calls: bool | None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None
    prompt_cache_key: str | None
    user: str | None
    safety_identifier: str | None
    max_retries: int | None
    timeout_s: float | None
    priority: Literal["low", "normal", "high"] | None
    metadata: dict[str, Any] | None
    webhook_url: str | None
    webhook_events: list[str] | None
    webhook_format: Literal["llmtasks", "openai"] | None
