"""OpenAI's Responses API as the worker speaks it to a provider for a call in background mode
(`background: true`): a task's chat request as a Response's body, and a Response read back as a
completion. The provider runs the call while no worker waits; the worker checks back on it.

Chat Completions parameters that the Responses API has no place for (`stop`, `seed`, the
penalties, `logprobs`, audio input) are refused at submit for a task in background mode
(domain.models.BACKGROUND_REFUSES), so every request that reaches here maps whole.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import LLMRequest, ToolCall
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import Usage
from llmtasks.llm import ENDED_CODE_PREFIX

# A background response's statuses until it ends; `queued` or `in_progress` mean look again.
RUNNING = frozenset({"queued", "in_progress"})
# OpenAI's incomplete reasons, as Chat Completions' finish reasons.
_FINISH_OF_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}
# Chat names that the Responses API keeps as they are.
_SAME_NAMES = (
    "temperature",
    "top_p",
    "top_logprobs",
    "parallel_tool_calls",
    "service_tier",
    "prompt_cache_key",
    "user",
    "safety_identifier",
)


def request_body(request: LLMRequest, model: str) -> dict[str, Any]:
    """`POST /responses` for `request` in background mode: stored (background needs it), with the
    messages as input items and the parameters under the Responses API's names."""
    given = request.parameters()
    body: dict[str, Any] = {
        "model": model,
        "input": [item for message in request.chat_messages() for item in _input_items(message)],
        "background": True,
        "store": True,
        **{name: given[name] for name in _SAME_NAMES if name in given},
    }
    limit = request.output_limit
    if limit is not None:
        body["max_output_tokens"] = limit
    if "reasoning_effort" in given:
        body["reasoning"] = {"effort": given["reasoning_effort"]}
    if "response_format" in given:
        body["text"] = {"format": _text_format(given["response_format"])}
    if "tools" in given:
        body["tools"] = [{"type": "function", **tool["function"]} for tool in given["tools"]]
    choice = given.get("tool_choice")
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "function", "name": choice["function"]["name"]}
    elif choice is not None:
        body["tool_choice"] = choice
    return body


def _text_format(response_format: dict[str, Any]) -> dict[str, Any]:
    if response_format["type"] != "json_schema":
        return {"type": response_format["type"]}
    return {"type": "json_schema", **response_format["json_schema"]}


def _input_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat message as Responses input items: a message, or an assistant's calls as
    function_call items, or a tool's answer as a function_call_output."""
    role = message["role"]
    if role == "tool":
        return [
            {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}
        ]
    items: list[dict[str, Any]] = []
    content = message.get("content")
    if content:
        parts = content if isinstance(content, str) else [_input_part(part, role) for part in content]
        items.append({"role": role, "content": parts})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        items.append(
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
            }
        )
    return items


def _input_part(part: dict[str, Any], role: str) -> dict[str, Any]:
    kind = part["type"]
    if kind == "text":
        # An assistant's own text is output, as the Responses API reads its history.
        return {"type": "output_text" if role == "assistant" else "input_text", "text": part["text"]}
    if kind == "image_url":
        image = part["image_url"]
        return {"type": "input_image", "image_url": image["url"], "detail": image.get("detail", "auto")}
    if kind == "file":
        file = part["file"]
        return {"type": "input_file", **{k: v for k, v in file.items() if k in ("file_data", "filename")}}
    # Audio is refused at submit for a background task (domain.models.BACKGROUND_REFUSES).
    raise LLMError(
        f"A {kind} part has no place in the Responses API.", code="llm_invalid_request", transient=False
    )


class _Response(BaseModel):
    id: str
    status: str
    model: str | None = None
    output: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    service_tier: str | None = None  # the tier that served the call


def response_id(content: bytes) -> tuple[str, str]:
    """The id and status of the Response a create answered with."""
    response = _parse(content)
    return response.id, response.status


def completion(content: bytes, model: str) -> Completion | None:
    """The Response's answer once it has ended; None while it is queued or in progress. A
    response that failed or was cancelled at the provider raises LLMError."""
    response = _parse(content)
    if response.status in RUNNING:
        return None
    if response.status == "failed":
        error = response.error or {}
        code = str(error.get("code") or "server_error")
        raise LLMError(
            f"The LLM's background response failed: {error.get('message') or code}",
            code=f"{ENDED_CODE_PREFIX}{code}",
            transient=code in ("server_error", "rate_limit_exceeded"),
        )
    if response.status not in ("completed", "incomplete"):
        raise LLMError(
            f"The LLM's background response ended {response.status}.",
            code=f"{ENDED_CODE_PREFIX}{response.status}",
            transient=False,
        )
    text, refusal, reasoning, calls = "", None, None, []
    for item in response.output:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    text += part.get("text", "")
                elif part.get("type") == "refusal":
                    refusal = part.get("refusal")
        elif kind == "function_call":
            calls.append(
                ToolCall.model_validate(
                    {
                        "id": item["call_id"],
                        "function": {"name": item["name"], "arguments": item["arguments"]},
                    }
                )
            )
        elif kind == "reasoning":
            summary = [part.get("text", "") for part in item.get("summary") or []]
            reasoning = "\n".join(summary) or reasoning
    if response.status == "incomplete":
        reason = (response.incomplete_details or {}).get("reason", "")
        finish = _FINISH_OF_INCOMPLETE.get(reason, "length")
    else:
        finish = "tool_calls" if calls else "stop"
    return Completion(
        text=text,
        model=response.model or model,
        usage=_usage(response.usage or {}).model_copy(update={"service_tier": response.service_tier}),
        finish_reason=finish,
        refusal=refusal,
        tool_calls=calls or None,
        reasoning=reasoning,
    )


def _usage(usage: dict[str, Any]) -> Usage:
    prompt, answer = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=answer,
        total_tokens=int(usage.get("total_tokens") or prompt + answer),
        cached_tokens=int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0),
        reasoning_tokens=int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0),
    )


def _parse(content: bytes) -> _Response:
    try:
        return _Response.model_validate_json(content)
    except ValidationError as exc:
        raise LLMError(
            "The LLM's reply is not a Response.", code="llm_invalid_reply", transient=False
        ) from exc
