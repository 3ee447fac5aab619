"""The mock's answer to a read request, in OpenAI's shapes: a `chat.completion`, or the
`chat.completion.chunk`s that stream it.

What the answer is, first rule that applies:
1. `[mock:refuse]` in any message: `message.refusal` set, content null.
2. Tool calls, when `tool_choice` is "required", names a function, or is "auto" (or absent,
   with tools) and a message holds `[mock:call-tools]` (not after a `tool` message): every tool
   once with `parallel_tool_calls` not false (the named one alone when named), else the first;
   their arguments generated to fit their `parameters` schema. `[mock:agent-steps=N]` plays an
   agent instead: one call a turn, of the tools in turn (the first, the second, ...), for N turns
   (counted from the assistant messages with calls in the history), then rules 3-5 answer.
3. `response_format` json_schema: JSON generated to fit the schema; json_object: a JSON object.
   `[mock:invalid-json]` in a message (or the `rate_invalid_json` draw) breaks it: JSON missing a
   required property (json_schema), or JSON cut short (json_object).
4. After a `tool` message: a text quoting the tool results since the last assistant message.
5. Else `reply_text` of the last message.
Tokens are words. Reasoning tokens count against `max_completion_tokens` (or `max_tokens`): the
content is cut to what is left, with finish_reason "length"; a `stop` string cuts it too.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from llmtasks_local.mock_llm import schema
from llmtasks_local.mock_llm.request import ChatCall

FINGERPRINT = "fp_mock"
REFUSAL = "I'm sorry, I can't help with that request. (mock refusal)"
# `[mock:agent-steps=N]`: play an agent of N tool-calling turns (rule 2).
AGENT_STEPS = re.compile(r"\[mock:agent-steps=(?P<steps>\d{1,3})\]")
ARGUMENT_CHUNK_CHARS = 8  # a tool call's arguments stream in pieces of this many characters


def reply_text(prompt: str, reply_chars: int = 0, pad_word_chars: int = 0) -> str:
    text = f"Mock answer to a prompt of {len(prompt)} characters: {prompt[:200]}"
    if pad_word_chars and len(text) < reply_chars:
        word = " " + "." * max(0, pad_word_chars - 1)
        text += word * ((reply_chars - len(text)) // len(word) + 1)
        return text[:reply_chars]
    return text.ljust(reply_chars, ".")


def completion(call: ChatCall, *, reply_chars: int = 0, pad_word_chars: int = 0) -> dict[str, Any]:
    body = call.body
    message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None, "annotations": []}
    finish = "stop"
    calls = _tool_calls(call)
    cap, reasoning = call.cap, call.reasoning_tokens
    if call.marked("[mock:refuse]"):
        message["refusal"] = REFUSAL
        tokens = len(REFUSAL.split())
    elif calls:
        message["tool_calls"] = calls
        finish = "tool_calls"
        tokens = sum(len(c["function"]["arguments"].split()) + 1 for c in calls)
    else:
        text = _text(call, reply_chars, pad_word_chars)
        text, finish = _cut(text, body.get("stop"), None if cap is None else cap - reasoning)
        message["content"] = text
        tokens = len(text.split())
    usage = {
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": tokens + reasoning,
        "total_tokens": call.prompt_tokens + tokens + reasoning,
        "prompt_tokens_details": {"cached_tokens": call.cached_tokens, "audio_tokens": call.audio_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
    if body.get("logprobs") and message["content"] is not None:
        choice["logprobs"] = {
            "content": [_logprob(t, i, body) for i, t in enumerate(pieces(message["content"]))]
        }
    tier = body.get("service_tier")
    return {
        "id": f"chatcmpl-mock-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.model,
        "choices": [choice],
        "usage": usage,
        "service_tier": "default" if tier in (None, "auto") else tier,
        "system_fingerprint": FINGERPRINT,
    }


def pieces(text: str) -> list[str]:
    """The text a word a piece, each with the space before it: how the mock streams and counts it."""
    found = re.findall(r"\s*\S+", text)
    if found and text[len("".join(found)) :]:
        found[-1] += text[len("".join(found)) :]
    return found


def chunks(whole: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """`whole` as OpenAI streams it: the role, then content (a word a chunk), refusal or tool-call
    deltas (a call's id and name, then its arguments in pieces), the finish_reason alone in the
    last chunk, and with `include_usage` a chunk of usage with no choices."""
    choice, message = whole["choices"][0], whole["choices"][0]["message"]
    head = {k: whole[k] for k in ("id", "created", "model", "service_tier", "system_fingerprint")}
    head["object"] = "chat.completion.chunk"
    if include_usage:
        head["usage"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }

    out = [chunk({"role": "assistant", "content": "", "refusal": None})]
    entries = (choice.get("logprobs") or {}).get("content") or []
    for index, piece in enumerate(pieces(message["content"] or "")):
        out.append(chunk({"content": piece}, logprobs={"content": [entries[index]]} if entries else None))
    for piece in pieces(message["refusal"] or ""):
        out.append(chunk({"refusal": piece}))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = {"name": call["function"]["name"], "arguments": ""}
        out.append(
            chunk(
                {"tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": function}]}
            )
        )
        arguments = call["function"]["arguments"]
        for start in range(0, len(arguments), ARGUMENT_CHUNK_CHARS):
            piece = arguments[start : start + ARGUMENT_CHUNK_CHARS]
            out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append({**head, "choices": [], "usage": whole["usage"]})
    return out


def _text(call: ChatCall, reply_chars: int, pad_word_chars: int) -> str:
    fmt = call.structured
    if fmt is not None and fmt["type"] == "json_schema":
        shape = fmt["json_schema"].get("schema") or {"type": "object"}
        make = schema.broken if call.invalid_json else schema.instance
        return json.dumps(make(shape, call.hint))
    if fmt is not None:
        whole = json.dumps({"answer": reply_text(call.prompt)})
        return whole[: len(whole) // 2] if call.invalid_json else whole
    results = _tool_results(call.body["messages"])
    if results:
        return "Mock answer from the tool results: " + " | ".join(results)
    return reply_text(call.prompt, reply_chars, pad_word_chars)


def _cut(text: str, stop: Any, budget: int | None) -> tuple[str, str]:
    """The text up to its first stop string, then within `budget` tokens; and its finish_reason."""
    for word in [stop] if isinstance(stop, str) else stop or []:
        if word and word in text:
            text = text[: text.index(word)]
    if budget is not None and len(text.split()) > budget:
        return "".join(pieces(text)[: max(budget, 0)]), "length"
    return text, "stop"


def _tool_results(messages: list[dict[str, Any]]) -> list[str]:
    """The tool messages' contents after the last assistant message, when the last message is one."""
    results: list[str] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        content = message["content"]
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        results.insert(0, f"{message['tool_call_id']}: {text}")
    return results


def _tool_calls(call: ChatCall) -> list[dict[str, Any]]:
    body = call.body
    tools = [t["function"] for t in body.get("tools") or [] if t.get("type") == "function"]
    choice = body.get("tool_choice", "auto" if tools else "none")
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = {(t.get("function") or {}).get("name") for t in choice["allowed_tools"].get("tools", [])}
        tools = [t for t in tools if t["name"] in allowed]
        choice = choice["allowed_tools"].get("mode", "auto")
    if not tools or choice == "none":
        return []
    after_tools = body["messages"][-1].get("role") == "tool"
    agent = AGENT_STEPS.search(call.text)
    if agent and not isinstance(choice, dict):
        turns = sum(1 for m in body["messages"] if m.get("role") == "assistant" and m.get("tool_calls"))
        chosen = [tools[turns % len(tools)]] if turns < int(agent["steps"]) else []
    elif isinstance(choice, dict):
        chosen = [t for t in tools if t["name"] == (choice.get("function") or {}).get("name")]
    elif choice == "required" or (choice == "auto" and call.marked("[mock:call-tools]") and not after_tools):
        chosen = tools if body.get("parallel_tool_calls", True) is not False else tools[:1]
    else:
        return []
    return [
        {
            "id": f"call_mock{uuid.uuid4().hex[:12]}{index}",
            "type": "function",
            "function": {
                "name": tool["name"],
                "arguments": json.dumps(
                    schema.instance(tool.get("parameters") or {"type": "object"}, call.hint)
                ),
            },
        }
        for index, tool in enumerate(chosen)
    ]


def _logprob(token: str, index: int, body: dict[str, Any]) -> dict[str, Any]:
    """A deterministic log probability for the answer's `index`th token, with `top_logprobs`
    alternatives below it."""
    logprob = -round(0.01 * (1 + index % 7), 4)
    top = [{"token": token, "logprob": logprob, "bytes": list(token.encode())}]
    for rank in range(1, int(body.get("top_logprobs") or 0)):
        other = f"{token.strip()}~{rank}"
        top.append({"token": other, "logprob": round(logprob - rank, 4), "bytes": list(other.encode())})
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": top[: body.get("top_logprobs") or 0],
    }
