"""The mock's answer to a Bedrock request body: what a batch inference job's record gets.

A record's `modelInput` is one of two shapes, by the job's `modelInvocationType`:
- `Converse`: the Converse request body (messages, system, inferenceConfig, toolConfig), answered
  with the Converse response body;
- `InvokeModel`: the model's native body. Only Anthropic Claude's Messages body
  (`anthropic_version`, `messages`, `system`, `tools`, ...) is taken, answered with Claude's
  native response; other families' native bodies are refused as a record error.
Either is read into a Chat Completions body and answered by the mock's own rules (reply.py), so
the `[mock:...]` markers steer a batch record as they steer a chat call; the answer is then
written back in the Bedrock shape. A body the mock cannot read raises BedrockInputError, which a
job writes as the record's `error` (400), as Bedrock does for a malformed record.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from llmtasks_local.mock_llm import reply
from llmtasks_local.mock_llm.errors import OpenAIError
from llmtasks_local.mock_llm.request import read_call

CONVERSE_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
CLAUDE_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}
DOCUMENT_TYPES = {"pdf": "application/pdf", "txt": "text/plain", "csv": "text/csv", "html": "text/html"}


class BedrockInputError(ValueError):
    """A record's modelInput the model would refuse (Bedrock: a 400 in the record's error)."""


def converse_answer(model: str, body: dict[str, Any]) -> dict[str, Any]:
    """The Converse response body to a Converse request body."""
    chat = _Converse().chat(model, body)
    done = _answer(chat)
    message = done["choices"][0]["message"]
    content: list[dict[str, Any]] = []
    text = message["content"] if message["content"] is not None else message["refusal"]
    if text:
        content.append({"text": text})
    for call in message.get("tool_calls") or []:
        use = {"toolUseId": call["id"], "name": call["function"]["name"]}
        content.append({"toolUse": use | {"input": json.loads(call["function"]["arguments"])}})
    usage = done["usage"]
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": CONVERSE_STOP.get(done["choices"][0]["finish_reason"], "end_turn"),
        "usage": {
            "inputTokens": usage["prompt_tokens"],
            "outputTokens": usage["completion_tokens"],
            "totalTokens": usage["total_tokens"],
        },
        "metrics": {"latencyMs": 1},
    }


def claude_answer(model: str, body: dict[str, Any]) -> dict[str, Any]:
    """Claude's native InvokeModel response body to its native request body."""
    if "anthropic_version" not in body or "max_tokens" not in body:
        raise BedrockInputError(
            "Malformed input request: required key [anthropic_version, max_tokens] missing"
        )
    done = _answer(_claude_chat(model, body))
    message = done["choices"][0]["message"]
    content: list[dict[str, Any]] = []
    text = message["content"] if message["content"] is not None else message["refusal"]
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        tool = {"type": "tool_use", "id": call["id"], "name": call["function"]["name"]}
        content.append(tool | {"input": json.loads(call["function"]["arguments"])})
    return {
        "id": f"msg_bdrk_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": CLAUDE_STOP.get(done["choices"][0]["finish_reason"], "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": done["usage"]["prompt_tokens"],
            "output_tokens": done["usage"]["completion_tokens"],
        },
    }


def _answer(chat: dict[str, Any]) -> dict[str, Any]:
    try:
        return reply.completion(read_call(chat))
    except OpenAIError as refused:
        raise BedrockInputError(str(refused)) from None


class _Converse:
    """A Converse body as a Chat Completions body."""

    def chat(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise BedrockInputError("The model returned the following errors: messages: field required")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": block["text"]}
            for block in body.get("system") or []
            if "text" in block
        ]
        for message in body["messages"]:
            messages += self._messages(message)
        chat: dict[str, Any] = {"model": model, "messages": messages}
        config = body.get("inferenceConfig") or {}
        for name, chat_name in (
            ("maxTokens", "max_tokens"),
            ("temperature", "temperature"),
            ("topP", "top_p"),
        ):
            if name in config:
                chat[chat_name] = config[name]
        if config.get("stopSequences"):
            chat["stop"] = config["stopSequences"]
        tools = (body.get("toolConfig") or {}).get("tools") or []
        if tools:
            chat["tools"] = [
                _function(
                    t["toolSpec"]["name"],
                    t["toolSpec"].get("description"),
                    t["toolSpec"]["inputSchema"]["json"],
                )
                for t in tools
            ]
            choice = (body.get("toolConfig") or {}).get("toolChoice") or {}
            if "any" in choice:
                chat["tool_choice"] = "required"
            elif "tool" in choice:
                chat["tool_choice"] = {"type": "function", "function": {"name": choice["tool"]["name"]}}
        return chat

    def _messages(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise BedrockInputError(f"The model returned the following errors: unknown role {role!r}")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for block in message.get("content") or []:
            if "text" in block:
                parts.append({"type": "text", "text": block["text"]})
            elif "image" in block:
                image = block["image"]
                url = f"data:image/{image['format']};base64,{image['source']['bytes']}"
                parts.append({"type": "image_url", "image_url": {"url": url}})
            elif "document" in block:
                document = block["document"]
                mime = DOCUMENT_TYPES.get(document.get("format"), "application/octet-stream")
                data = f"data:{mime};base64,{document['source']['bytes']}"
                parts.append({"type": "file", "file": {"file_data": data, "filename": document.get("name")}})
            elif "toolUse" in block:
                use = block["toolUse"]
                function = {"name": use["name"], "arguments": json.dumps(use.get("input", {}))}
                calls.append({"id": use["toolUseId"], "type": "function", "function": function})
            elif "toolResult" in block:
                result = block["toolResult"]
                text = " ".join(c.get("text", json.dumps(c.get("json"))) for c in result.get("content") or [])
                results.append({"role": "tool", "tool_call_id": result["toolUseId"], "content": text})
        if role == "assistant":
            text = " ".join(p["text"] for p in parts if p["type"] == "text")
            return [{"role": "assistant", "content": text or None} | ({"tool_calls": calls} if calls else {})]
        return results + ([{"role": "user", "content": parts}] if parts else [])


def _claude_chat(model: str, body: dict[str, Any]) -> dict[str, Any]:
    """Claude's Messages body as a Chat Completions body."""
    system = body.get("system")
    if isinstance(system, list):
        system = " ".join(block.get("text", "") for block in system)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        converse = {
            "role": message.get("role"),
            "content": [_claude_block(block) for block in blocks],
        }
        messages += _Converse()._messages(converse)
    if not messages:
        raise BedrockInputError("messages: at least one message is required")
    chat: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": body["max_tokens"]}
    for name, chat_name in (("temperature", "temperature"), ("top_p", "top_p"), ("stop_sequences", "stop")):
        if body.get(name) is not None:
            chat[chat_name] = body[name]
    if body.get("tools"):
        chat["tools"] = [
            _function(t["name"], t.get("description"), t.get("input_schema") or {}) for t in body["tools"]
        ]
        choice = body.get("tool_choice") or {}
        if choice.get("type") == "any":
            chat["tool_choice"] = "required"
        elif choice.get("type") == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    return chat


def _claude_block(block: dict[str, Any]) -> dict[str, Any]:
    """One of Claude's content blocks as Converse's, to be read by _Converse."""
    kind = block.get("type")
    if kind == "text":
        return {"text": block.get("text", "")}
    if kind == "image":
        source = block.get("source") or {}
        return {
            "image": {
                "format": str(source.get("media_type", "image/png")).split("/")[-1],
                "source": {"bytes": source.get("data", "")},
            }
        }
    if kind == "tool_use":
        return {"toolUse": {"toolUseId": block["id"], "name": block["name"], "input": block.get("input", {})}}
    if kind == "tool_result":
        content = block.get("content")
        texts = (
            [{"text": content}]
            if isinstance(content, str)
            else [{"text": c.get("text", "")} for c in content or []]
        )
        return {"toolResult": {"toolUseId": block["tool_use_id"], "content": texts}}
    raise BedrockInputError(f"messages: content block type {kind!r} is not supported by the mock")


def _function(name: str, description: str | None, schema: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": schema}
    if description:
        function["description"] = description
    return {"type": "function", "function": function}
