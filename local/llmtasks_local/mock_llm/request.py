"""A Chat Completions request read as OpenAI reads it: what it may hold, and its 400 when not.

Errors carry OpenAI's body (`{"error": {"message", "type", "param", "code"}}`) and its wording
for the same fault. Content parts are counted into the prompt's tokens by these rules (the
mock decodes no image, so it takes OpenAI's documented figures):
- text: one token a word;
- an image: 85 at `detail: low`, else 765 (a 1024x1024 at high: 85 + 170 per 512 px tile, 4 tiles);
- a file: 85, plus one token per 4 bytes of its decoded data (by `file_id`: 85 only, unseen);
- input audio: one token per 3,200 bytes of decoded data (about 10 a second of 16 kHz PCM).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from llmtasks_local.mock_llm.errors import OpenAIError

# Every top-level parameter of OpenAI's chat.completions.create; any other gets a 400.
PARAMETERS = frozenset(
    (
        *("messages", "model", "audio", "frequency_penalty", "function_call", "functions"),
        *("logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities"),
        *("moderation", "n", "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key"),
        *("prompt_cache_options", "prompt_cache_retention", "reasoning_effort", "response_format"),
        *("safety_identifier", "seed", "service_tier", "stop", "store", "stream", "stream_options"),
        *("temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity"),
        "web_search_options",
    )
)
MESSAGE_FIELDS = {
    "system": {"role", "content", "name"},
    "developer": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "name", "refusal", "tool_calls", "function_call", "audio"},
    "tool": {"role", "content", "tool_call_id"},
    "function": {"role", "content", "name"},
}
PART_TYPES = {"text", "image_url", "input_audio", "refusal", "audio", "file"}
# The part types each role may send (OpenAI: images, files and audio come from the user only).
ROLE_PARTS = {"user": {"text", "image_url", "input_audio", "file"}, "assistant": {"text", "refusal"}}
EFFORTS = {"none": 0, "minimal": 16, "low": 64, "medium": 256, "high": 1024, "xhigh": 2048, "max": 4096}
REASONING_MODELS = ("o1", "o3", "o4", "gpt-5")
IMAGE_TOKENS_LOW, IMAGE_TOKENS = 85, 765
FILE_TOKENS = 85


@dataclass
class ChatCall:
    """One valid request, read: what the answer is built from."""

    body: dict[str, Any]
    model: str
    prompt: str  # the last message's text: the plain answer quotes it, the stats key on it
    text: str = ""  # every message's text, where the markers are looked for
    hint: str = ""  # the user's and the tools' text and files: what steers an enum
    prompt_tokens: int = 0
    prefix_tokens: list[int] = field(default_factory=list)  # prompt tokens up to each message
    prefix_keys: list[str] = field(default_factory=list)  # a digest of the messages up to each
    images: int = 0
    files: int = 0
    file_bytes: int = 0
    audio_parts: int = 0
    audio_tokens: int = 0
    reasoning_tokens: int = 0
    invalid_json: bool = False  # decided by the server: this answer breaks its schema
    cached_tokens: int = 0  # decided by the server from the prefixes it has seen
    # A Responses API call: its own body and top-level parameters (`body` is the chat body it means).
    asked: dict[str, Any] = field(default_factory=dict)
    sent: list[str] | None = None

    @property
    def cap(self) -> Any:
        """The most completion tokens asked for, reasoning included."""
        return self.body.get("max_completion_tokens", self.body.get("max_tokens"))

    @property
    def structured(self) -> dict[str, Any] | None:
        fmt = self.body.get("response_format")
        return fmt if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema") else None

    def marked(self, marker: str) -> bool:
        return marker in self.text


def read_call(body: Any) -> ChatCall:
    """The request, checked as OpenAI checks it; OpenAIError when it would answer 400."""
    if not isinstance(body, dict):
        raise OpenAIError("We could not parse the JSON body of your request.")
    for name in body:
        if name not in PARAMETERS:
            raise OpenAIError(f"Unrecognized request argument supplied: {name}")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise OpenAIError("you must provide a model parameter")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _missing("messages")
    if not messages:
        raise OpenAIError(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty"
            " array instead.",
            param="messages",
            code="empty_array",
        )
    call = ChatCall(body=body, model=body["model"], prompt="")
    digest = hashlib.sha256(str(body.get("prompt_cache_key") or "").encode())
    texts: list[str] = []
    for index, message in enumerate(messages):
        text = _read_message(call, message, f"messages[{index}]")
        texts.append(text)
        if message.get("role") in ("user", "tool"):
            call.hint += "\n" + text
        digest.update(json.dumps(message, sort_keys=True).encode())
        call.prefix_keys.append(digest.hexdigest())
        call.prefix_tokens.append(call.prompt_tokens)
    call.prompt, call.text = texts[-1], "\n".join(texts)
    _read_options(call)
    return call


def _read_message(call: ChatCall, message: Any, where: str) -> str:
    """The message's text; counts its parts into `call`."""
    if not isinstance(message, dict):
        raise _invalid_type(where, "an object", message)
    role = message.get("role")
    if role not in MESSAGE_FIELDS:
        if role is None:
            raise _missing(f"{where}.role")
        raise OpenAIError(
            f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'function',"
            " 'tool', and 'developer'.",
            param=f"{where}.role",
            code="invalid_value",
        )
    _known(message, MESSAGE_FIELDS[role], where)
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise _missing(f"{where}.tool_call_id")
    content = message.get("content")
    if content is None:
        if role == "assistant" and (message.get("tool_calls") or message.get("function_call")):
            return _tool_calls_text(message)
        raise _missing(f"{where}.content")
    if isinstance(content, str):
        call.prompt_tokens += len(content.split())
        return content
    if not isinstance(content, list):
        raise _invalid_type(f"{where}.content", "a string or an array", content)
    texts = [_read_part(call, role, part, f"{where}.content[{i}]") for i, part in enumerate(content)]
    return "\n".join(text for text in texts if text)


def _read_part(call: ChatCall, role: str, part: Any, where: str) -> str:
    if not isinstance(part, dict):
        raise _invalid_type(where, "an object", part)
    kind = part.get("type")
    if kind not in PART_TYPES:
        raise OpenAIError(
            f"Invalid value: '{kind}'. Supported values are: 'text', 'image_url', 'input_audio', 'refusal',"
            " 'audio', and 'file'.",
            param=f"{where}.type",
            code="invalid_value",
        )
    if kind not in ROLE_PARTS.get(role, {"text"}):
        raise OpenAIError(
            f"Invalid '{where}'. A part of type '{kind}' is not allowed in a message with role '{role}'.",
            param=where,
            code="invalid_value",
        )
    _known(part, {"type", kind, "prompt_cache_breakpoint"}, where)
    if kind in ("text", "refusal"):
        if not isinstance(part.get(kind), str):
            raise _missing(f"{where}.{kind}")
        call.prompt_tokens += len(part[kind].split())
        return str(part[kind])
    inner = part.get(kind)
    if not isinstance(inner, dict):
        raise (
            _missing(f"{where}.{kind}")
            if inner is None
            else _invalid_type(f"{where}.{kind}", "an object", inner)
        )
    if kind == "image_url":
        _read_image(call, inner, f"{where}.image_url")
        return ""
    if kind == "file":
        return _read_file(call, inner, f"{where}.file")
    _known(inner, {"data", "format"}, f"{where}.input_audio")
    if not isinstance(inner.get("data"), str):
        raise _missing(f"{where}.input_audio.data")
    if inner.get("format") not in ("wav", "mp3"):
        raise _value(f"{where}.input_audio.format", inner.get("format"), "'wav' and 'mp3'")
    data = _base64(inner["data"], f"{where}.input_audio.data")
    call.audio_parts += 1
    tokens = -(-len(data) // 3200)
    call.audio_tokens += tokens
    call.prompt_tokens += tokens
    return ""


def _read_image(call: ChatCall, image: dict[str, Any], where: str) -> None:
    _known(image, {"url", "detail"}, where)
    url = image.get("url")
    if not isinstance(url, str):
        raise _missing(f"{where}.url")
    detail = image.get("detail", "auto")
    if detail not in ("auto", "low", "high", "original"):
        raise _value(f"{where}.detail", detail, "'auto', 'low', 'high', and 'original'")
    if url.startswith("data:"):
        match = re.fullmatch(r"data:(image/[\w.+-]+);base64,(.*)", url, re.DOTALL)
        data = _base64(match.group(2), where) if match else b""
        if not data:
            raise OpenAIError(
                f"Invalid '{where}'. Expected a base64-encoded data URL with an image MIME type (e.g."
                " 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got an invalid or empty value.",
                param=where,
                code="invalid_value",
            )
    elif not url.startswith(("https://", "http://")):
        raise OpenAIError(
            f"Invalid '{where}': expected a URL or a data URL.", param=where, code="invalid_value"
        )
    call.images += 1
    call.prompt_tokens += IMAGE_TOKENS_LOW if detail == "low" else IMAGE_TOKENS


def _read_file(call: ChatCall, file: dict[str, Any], where: str) -> str:
    _known(file, {"file_data", "file_id", "filename"}, where)
    if not isinstance(file.get("file_data"), str) and not isinstance(file.get("file_id"), str):
        raise OpenAIError(
            f"Invalid '{where}': one of 'file_id' or 'file_data' must be given.",
            param=where,
            code="missing_required_parameter",
        )
    call.files += 1
    call.prompt_tokens += FILE_TOKENS
    if not isinstance(file.get("file_data"), str):
        return ""
    encoded = file["file_data"]
    match = re.fullmatch(r"data:[\w.+-]+/[\w.+-]+;base64,(.*)", encoded, re.DOTALL)
    data = _base64(match.group(1) if match else encoded, f"{where}.file_data")
    call.file_bytes += len(data)
    call.prompt_tokens += -(-len(data) // 4)
    # Its bytes as text: a text file, or a PDF's uncompressed strings, can steer an enum.
    call.hint += "\n" + data.decode("latin-1")
    return ""


def _read_options(call: ChatCall) -> None:
    body = call.body
    if body.get("n") not in (None, 1):
        raise OpenAIError("The mock answers one choice: 'n' must be 1.", param="n", code="unsupported_value")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise OpenAIError(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
            code="invalid_value",
        )
    for name in ("max_completion_tokens", "max_tokens"):
        if body.get(name) is not None and (type(body[name]) is not int or body[name] < 1):
            raise _invalid_type(name, "a positive integer", body[name])
    stop = [] if body.get("stop") is None else body["stop"]
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(w, str) for w in stop):
        raise _invalid_type("stop", "a string or an array of at most 4 strings", body["stop"])
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise _value("reasoning_effort", effort, ", ".join(f"'{e}'" for e in EFFORTS))
    model = call.model.lower()
    named = model.startswith(REASONING_MODELS) and "-chat" not in model
    if named and body.get("max_tokens") is not None:
        raise OpenAIError(
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use"
            " 'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )
    call.reasoning_tokens = EFFORTS[effort or ("medium" if named else "none")]
    if isinstance(call.cap, int):
        call.reasoning_tokens = min(call.reasoning_tokens, call.cap)  # they count against the cap
    temperature = body.get("temperature")
    if call.reasoning_tokens and temperature is not None and temperature != 1:
        raise OpenAIError(
            f"Unsupported value: 'temperature' does not support {temperature} with this model. Only the"
            " default (1) value is supported.",
            param="temperature",
            code="unsupported_value",
        )
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or not 0 <= top <= 20):
        raise OpenAIError(
            f"Invalid 'top_logprobs': integer between 0 and 20 expected, got {top}.",
            param="top_logprobs",
            code="integer_out_of_range",
        )
    _read_response_format(body.get("response_format"))
    _read_tools(body)


def _read_response_format(fmt: Any) -> None:
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise _invalid_type("response_format", "an object", fmt)
    kind = fmt.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise _value("response_format.type", kind, "'text', 'json_object', and 'json_schema'")
    _known(fmt, {"type", "json_schema"} if kind == "json_schema" else {"type"}, "response_format")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise _missing("response_format.json_schema")
        _known(spec, {"name", "description", "schema", "strict"}, "response_format.json_schema")
        if not isinstance(spec.get("name"), str):
            raise _missing("response_format.json_schema.name")
        if not isinstance(spec.get("schema", {}), dict):
            raise _invalid_type("response_format.json_schema.schema", "an object", spec["schema"])


def _read_tools(body: dict[str, Any]) -> None:
    tools = body.get("tools")
    names: list[str] = []
    for index, tool in enumerate(tools or []):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") not in ("function", "custom"):
            raise _value(
                f"{where}.type", tool.get("type") if isinstance(tool, dict) else tool, "'function', 'custom'"
            )
        inner = tool.get(tool["type"])
        if not isinstance(inner, dict) or not isinstance(inner.get("name"), str):
            raise _missing(f"{where}.{tool['type']}.name")
        if tool["type"] == "function":
            _known(inner, {"name", "description", "parameters", "strict"}, f"{where}.function")
            names.append(inner["name"])
    choice = body.get("tool_choice")
    if choice is None:
        return
    if not tools:
        raise OpenAIError(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            param="tool_choice",
        )
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise _value("tool_choice", choice, "'none', 'auto', and 'required'")
        return
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name not in names:
            raise OpenAIError(
                f"Invalid value for 'tool_choice': no function named '{name}' was specified in the 'tools'"
                " parameter.",
                param="tool_choice",
                code="invalid_value",
            )
    elif not isinstance(choice, dict) or choice.get("type") not in ("allowed_tools", "custom"):
        raise _invalid_type("tool_choice", "a string or an object", choice)


def _tool_calls_text(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    return "\n".join(
        str((c.get("function") or {}).get("arguments", "")) for c in calls if isinstance(c, dict)
    )


def _base64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise OpenAIError(
            f"Invalid '{where}': the data is not valid base64.", param=where, code="invalid_value"
        ) from exc


def _known(value: dict[str, Any], names: set[str], where: str) -> None:
    for name in value:
        if name not in names:
            raise OpenAIError(
                f"Unknown parameter: '{where}.{name}'.", param=f"{where}.{name}", code="unknown_parameter"
            )


def _missing(param: str) -> OpenAIError:
    return OpenAIError(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _value(param: str, value: Any, supported: str) -> OpenAIError:
    return OpenAIError(
        f"Invalid value: '{value}'. Supported values are: {supported}.", param=param, code="invalid_value"
    )


def _invalid_type(param: str, expected: str, value: Any) -> OpenAIError:
    got = {str: "a string", list: "an array", dict: "an object", int: "an integer"}.get(
        type(value), "another type"
    )
    return OpenAIError(
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        param=param,
        code="invalid_type",
    )
