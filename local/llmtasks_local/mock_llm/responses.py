"""OpenAI's Responses API read into the chat call the mock already answers, and that answer
written back as a Response object.

A `POST /v1/responses` body becomes the Chat Completions body it means (instructions a leading
developer message; message items, `function_call` items as an assistant's `tool_calls`,
`function_call_output` items as `tool` messages; flat function tools nested; `text.format` as
`response_format`; `reasoning.effort` as `reasoning_effort`; `max_output_tokens` as
`max_completion_tokens`), which `read_call` then checks and counts, so every marker and tool rule
of the chat endpoint holds here too. The chat answer goes back as Response output items: a
`reasoning` item when it reasoned, a `message` with `output_text` (or `refusal`), `function_call`
items; usage as `input_tokens`/`output_tokens` with their details.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from llmtasks_local.mock_llm.errors import OpenAIError
from llmtasks_local.mock_llm.request import ChatCall, read_call

# Every top-level parameter of OpenAI's responses.create the mock takes; any other gets a 400.
PARAMETERS = frozenset(
    (
        *("model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls"),
        *("max_output_tokens", "max_tool_calls", "temperature", "top_p", "top_logprobs", "reasoning"),
        *("text", "metadata", "background", "store", "stream", "include", "previous_response_id"),
        *("prompt_cache_key", "prompt_cache_retention", "safety_identifier", "service_tier"),
        *("truncation", "user"),
    )
)
# Parameters passed to the chat call under the same name.
SAME = ("temperature", "top_p", "metadata", "parallel_tool_calls", "prompt_cache_key", "service_tier")
# The content part types each role may send (OpenAI: what the model said is output_text).
INPUT_PARTS = ("input_text", "input_image", "input_file")
ROLE_PARTS = {"assistant": ("output_text", "refusal")}
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
MIN_OUTPUT_TOKENS = 16


def read_response_call(body: Any, history: list[dict[str, Any]] | None = None) -> tuple[ChatCall, list[Any]]:
    """The chat call a Responses body means (OpenAIError as OpenAI would answer 400), and its
    input items (after `history`: the items of the previous response, with its output)."""
    if not isinstance(body, dict):
        raise OpenAIError("We could not parse the JSON body of your request.")
    for name in body:
        if name not in PARAMETERS:
            raise OpenAIError(f"Unknown parameter: '{name}'.", param=name, code="unknown_parameter")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise OpenAIError(
            "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
        )
    given = body.get("input")
    if given is None:
        raise OpenAIError(
            "Missing required parameter: 'input'.", param="input", code="missing_required_parameter"
        )
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    if not isinstance(items, list):
        raise OpenAIError(
            "Invalid type for 'input': expected a string or an array.", param="input", code="invalid_type"
        )
    items = [*(history or []), *items]
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "developer", "content": body["instructions"]})
    for index, item in enumerate(items):
        _add_item(messages, item, f"input[{index}]")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    chat.update({name: body[name] for name in SAME if body.get(name) is not None})
    _read_options(body, chat)
    call = read_call(chat)
    call.asked, call.sent = body, list(body)
    return call, items


def _add_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise _invalid(where, "an object")
    kind = item.get("type", "message")
    if kind not in ITEM_TYPES:
        raise OpenAIError(
            f"Invalid value: '{kind}'. Supported values are: {', '.join(repr(t) for t in ITEM_TYPES)}.",
            param=f"{where}.type",
            code="invalid_value",
        )
    if kind == "reasoning":  # a previous answer's reasoning: context the mock has no use for
        return
    if kind == "function_call":
        _add_call(messages, item, where)
        return
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise _required(f"{where}.call_id")
        output = item.get("output")
        if output is None:
            raise _required(f"{where}.output")
        result = output if isinstance(output, str) else _parts(output, "tool", f"{where}.output")
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": result})
        return
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise OpenAIError(
            f"Invalid value: '{role}'. Supported values are: 'user', 'assistant', 'system', and 'developer'.",
            param=f"{where}.role",
            code="invalid_value",
        )
    content: Any = item.get("content")
    if content is None:
        raise _required(f"{where}.content")
    if not isinstance(content, str):
        content = _parts(content, role, f"{where}.content")
    messages.append({"role": role, "content": content})


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any], where: str) -> None:
    """A function_call item as a tool call of an assistant message: the calls (and text) of one
    turn are one message, as a chat history has them."""
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str):
            raise _required(f"{where}.{name}")
    call = {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }
    last = messages[-1] if messages else {}
    if last.get("role") == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _parts(parts: Any, role: str, where: str) -> list[dict[str, Any]]:
    """Responses content parts as the chat parts they mean."""
    if not isinstance(parts, list):
        raise _invalid(where, "a string or an array")
    out: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        here = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        allowed = ROLE_PARTS.get(role, INPUT_PARTS)
        if not isinstance(part, dict) or kind not in allowed:
            names = [f"'{name}'" for name in allowed]
            raise OpenAIError(
                f"Invalid value: '{kind}'. Supported values are: {', '.join(names[:-1])} and {names[-1]}.",
                param=f"{here}.type",
                code="invalid_value",
            )
        if kind in ("input_text", "output_text"):
            if not isinstance(part.get("text"), str):
                raise _required(f"{here}.text")
            out.append({"type": "text", "text": part["text"]})
        elif kind == "refusal":
            out.append({"type": "refusal", "refusal": str(part.get("refusal", ""))})
        elif role == "tool":  # a tool's image or file: OpenAI takes it, a chat tool message not
            continue
        elif kind == "input_image":
            url = part.get("image_url") or (
                f"https://files.mock/{part['file_id']}" if part.get("file_id") else None
            )
            if not isinstance(url, str):
                raise OpenAIError(
                    f"Invalid '{here}': one of 'image_url' or 'file_id' must be given.",
                    param=here,
                    code="missing_required_parameter",
                )
            out.append({"type": "image_url", "image_url": {"url": url, "detail": part.get("detail", "auto")}})
        else:
            file = {k: part[k] for k in ("file_data", "file_id", "filename") if k in part}
            if "file_url" in part and "file_id" not in file:
                file["file_id"] = str(part["file_url"])  # fetched by the provider: counted as a file by id
            out.append({"type": "file", "file": file})
    return out


def _read_options(body: dict[str, Any], chat: dict[str, Any]) -> None:
    cap = body.get("max_output_tokens")
    if cap is not None:
        if type(cap) is not int or cap < MIN_OUTPUT_TOKENS:
            raise OpenAIError(
                "Invalid 'max_output_tokens': integer below minimum value. Expected a value >="
                f" {MIN_OUTPUT_TOKENS}, but got {cap} instead.",
                param="max_output_tokens",
                code="integer_below_min_value",
            )
        chat["max_completion_tokens"] = cap
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise _invalid("reasoning", "an object")
        if reasoning.get("effort") is not None:
            chat["reasoning_effort"] = reasoning["effort"]
        if reasoning.get("summary") not in (None, "auto", "concise", "detailed"):
            raise OpenAIError(
                f"Invalid value: '{reasoning['summary']}'. Supported values are: 'auto', 'concise', and"
                " 'detailed'.",
                param="reasoning.summary",
                code="invalid_value",
            )
    _read_text(body.get("text"), chat)
    _read_tools(body, chat)
    if body.get("background") and body.get("store") is False:
        raise OpenAIError("Background mode requires store=true.", param="store", code="invalid_value")
    if body.get("stream"):
        raise OpenAIError(
            "The mock does not stream the Responses API: leave 'stream' unset.",
            param="stream",
            code="unsupported_value",
        )


def _read_text(text: Any, chat: dict[str, Any]) -> None:
    """`text.format` as the chat's response_format, `text.verbosity` as its verbosity."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(text, dict) and text.get("verbosity") is not None:
        chat["verbosity"] = text["verbosity"]
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("name"), str):
            raise _required("text.format.name")
        spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif isinstance(fmt, dict) and fmt.get("type") in ("json_object", "text"):
        chat["response_format"] = {"type": fmt["type"]}
    elif fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else fmt
        raise OpenAIError(
            f"Invalid value: '{kind}'. Supported values are: 'text', 'json_object', and 'json_schema'.",
            param="text.format.type",
            code="invalid_value",
        )


def _read_tools(body: dict[str, Any], chat: dict[str, Any]) -> None:
    """Flat tools nested as the chat's; tool_choice in the chat's shape."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _invalid("tools", "an array")
        chat["tools"] = [_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = [
            {"type": "function", "function": {"name": t.get("name")}} for t in choice.get("tools") or []
        ]
        chat["tool_choice"] = {
            "type": "allowed_tools",
            "allowed_tools": {"mode": choice.get("mode", "auto"), "tools": allowed},
        }
    elif choice is not None:
        chat["tool_choice"] = choice


def _tool(tool: Any, where: str) -> dict[str, Any]:
    """A Responses tool (flat) as the chat tool (nested) it means."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind not in ("function", "custom"):
        raise OpenAIError(
            f"Invalid value: '{kind}'. The mock serves 'function' and 'custom' tools.",
            param=f"{where}.type",
            code="invalid_value",
        )
    if not isinstance(tool.get("name"), str):
        raise _required(f"{where}.name")
    inner = {k: v for k, v in tool.items() if k != "type"}
    return {"type": kind, kind: inner}


def response_object(
    call: ChatCall, completion: dict[str, Any] | None, *, response_id: str, status: str, created_at: int
) -> dict[str, Any]:
    """The Response object of this call: its output and usage from `completion` (None: not yet
    answered, or cancelled: no output)."""
    body = call.body
    asked: dict[str, Any] = call.asked
    reasoning = asked.get("reasoning") or {}
    effort = reasoning.get("effort") or (body.get("reasoning_effort") if call.reasoning_tokens else None)
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": bool(asked.get("background")),
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": asked.get("instructions"),
        "max_output_tokens": asked.get("max_output_tokens"),
        "max_tool_calls": asked.get("max_tool_calls"),
        "metadata": asked.get("metadata") or {},
        "model": call.model,
        "output": [],
        "parallel_tool_calls": asked.get("parallel_tool_calls", True),
        "previous_response_id": asked.get("previous_response_id"),
        "prompt_cache_key": asked.get("prompt_cache_key"),
        "reasoning": {"effort": effort, "summary": reasoning.get("summary")},
        "safety_identifier": asked.get("safety_identifier"),
        "service_tier": asked.get("service_tier")
        if asked.get("service_tier") not in (None, "auto")
        else "default",
        "store": asked.get("store", True),
        "temperature": asked.get("temperature", 1.0),
        "text": {
            "format": (asked.get("text") or {}).get("format") or {"type": "text"},
            "verbosity": "medium",
        },
        "tool_choice": asked.get("tool_choice", "auto"),
        "tools": asked.get("tools") or [],
        "top_logprobs": asked.get("top_logprobs", 0),
        "top_p": asked.get("top_p", 1.0),
        "truncation": asked.get("truncation", "disabled"),
        "usage": None,
        "user": asked.get("user"),
    }
    if completion is None:
        return response
    choice = completion["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if call.reasoning_tokens:
        item: dict[str, Any] = {"id": _id("rs"), "type": "reasoning", "summary": []}
        if reasoning.get("summary"):
            item["summary"] = [
                {"type": "summary_text", "text": f"Mock reasoning over {call.prompt_tokens} tokens."}
            ]
        if "reasoning.encrypted_content" in (asked.get("include") or []):
            item["encrypted_content"] = "gAAAAmock"
        output.append(item)
    incomplete = choice["finish_reason"] == "length"
    if message.get("refusal") is not None:
        content = [{"type": "refusal", "refusal": message["refusal"]}]
    elif message.get("content"):
        content = [{"type": "output_text", "text": message["content"], "annotations": [], "logprobs": []}]
    else:
        content = []
    if content:
        output.append(
            {
                "id": _id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "incomplete" if incomplete else "completed",
                "content": content,
            }
        )
    for tool_call in message.get("tool_calls") or []:
        output.append(
            {
                "id": _id("fc"),
                "type": "function_call",
                "call_id": tool_call["id"],
                "name": tool_call["function"]["name"],
                "arguments": tool_call["function"]["arguments"],
                "status": "completed",
            }
        )
    usage = completion["usage"]
    response["output"] = output
    response["usage"] = {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": usage["completion_tokens_details"]["reasoning_tokens"]},
        "total_tokens": usage["total_tokens"],
    }
    if incomplete:
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        response["completed_at"] = int(time.time())
    return response


def output_items(response: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished response's output as input items of the next one (`previous_response_id`)."""
    return [item for item in response["output"] if item["type"] in ("message", "function_call")]


def response_id() -> str:
    return _id("resp")


def _id(prefix: str) -> str:
    return f"{prefix}_mock{uuid.uuid4().hex}"


def _required(param: str) -> OpenAIError:
    return OpenAIError(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _invalid(param: str, expected: str) -> OpenAIError:
    return OpenAIError(f"Invalid type for '{param}': expected {expected}.", param=param, code="invalid_type")
