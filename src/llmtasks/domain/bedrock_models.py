"""What a Bedrock model takes through Converse, and what of a request it must refuse.

Converse has one request shape for every model, but not every model takes every part, and some
Chat Completions parameters have no Converse counterpart. A small table keyed by model id prefix
says which families take images, documents, tools and reasoning; an unknown model is taken for
text and tools only. A submit on a Bedrock stack refuses what its model cannot take (422, naming
the field: domain.rules.check_limits); the provider runs the same check before each call, for a
task submitted before the stack changed its model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from llmtasks.domain.llm_request import (
    AudioPart,
    FilePart,
    FileRef,
    ImagePart,
    JsonSchemaFormat,
    LLMRequest,
    NamedToolChoice,
    data_url_parts,
)


@dataclass(frozen=True)
class Capabilities:
    images: bool = False
    documents: bool = False
    tools: bool = True
    # toolChoice any or tool: tool_choice required or named, and a schema's answer (a forced tool).
    forced_tools: bool = False
    reasoning: bool = False  # Anthropic's extended thinking (additionalModelRequestFields)


_CLAUDE = Capabilities(images=True, documents=True, forced_tools=True)
_THINKING_CLAUDE = Capabilities(images=True, documents=True, forced_tools=True, reasoning=True)
_TEXT_AND_TOOLS = Capabilities()
_TEXT_ONLY = Capabilities(tools=False)

# By model id prefix (without an inference profile's region); the longest matching prefix wins.
FAMILIES: dict[str, Capabilities] = {
    "anthropic.claude-3": _CLAUDE,
    "anthropic.claude-3-5-haiku": Capabilities(documents=True, forced_tools=True),
    "anthropic.claude-3-7": _THINKING_CLAUDE,
    "anthropic.claude-sonnet-4": _THINKING_CLAUDE,
    "anthropic.claude-opus-4": _THINKING_CLAUDE,
    "anthropic.claude-haiku-4": _THINKING_CLAUDE,
    "anthropic.claude-v2": _TEXT_ONLY,
    "anthropic.claude-instant": _TEXT_ONLY,
    "amazon.nova-": _CLAUDE,
    "amazon.nova-micro": Capabilities(forced_tools=True),
    "meta.llama3-": _TEXT_ONLY,
    "meta.llama3-1": _TEXT_AND_TOOLS,
    "meta.llama3-2": _TEXT_AND_TOOLS,
    "meta.llama3-2-11b": Capabilities(images=True),
    "meta.llama3-2-90b": Capabilities(images=True),
    "meta.llama3-3": _TEXT_AND_TOOLS,
    "meta.llama4": Capabilities(images=True),
    "mistral.": _TEXT_ONLY,
    "mistral.mistral-large": Capabilities(forced_tools=True),
    "mistral.pixtral-large": Capabilities(images=True, forced_tools=True),
}
# An inference profile's id starts with its geography (us.anthropic.claude-...).
_PROFILE = re.compile(r"^(us|us-gov|eu|apac|global|jp|au|ca)\.")

IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/gif": "gif", "image/webp": "webp"}
DOCUMENT_FORMATS = {
    "application/pdf": "pdf",
    "text/csv": "csv",
    "application/msword": "doc",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.ms-excel": "xls",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "text/html": "html",
    "text/plain": "txt",
    "text/markdown": "md",
}
_EXTENSIONS = {"htm": "html", **{fmt: fmt for fmt in DOCUMENT_FORMATS.values()}}

# reasoning_effort as a thinking budget (tokens). Bedrock's minimum is 1,024, and the reply's
# maxTokens must exceed it; with no limit asked the reply gets the budget plus ANSWER_TOKENS,
# which stays under the size a non-streamed Claude call may ask.
THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 4096, "high": 8192, "xhigh": 16384}
MIN_THINKING_BUDGET = 1024
ANSWER_TOKENS = 4096

# Chat Completions parameters Converse has no counterpart for.
_NO_COUNTERPART = {
    "logprobs": "log probabilities",
    "top_logprobs": "log probabilities",
    "seed": "a seed",
    "presence_penalty": "penalties",
    "frequency_penalty": "penalties",
    "prompt_cache_key": "a prompt cache key",
}


# service_tier as Converse's serviceTier (Bedrock's tiers: default, flex, priority); `auto` asks
# for none (the account's default). OpenAI's `scale` tier has no counterpart.
BEDROCK_TIERS = ("default", "flex", "priority")

# user and safety_identifier go into Converse's requestMetadata (to filter invocation logs by),
# whose values take these characters.
METADATA_FIELDS = ("user", "safety_identifier")
_METADATA_VALUE = re.compile(r"^[a-zA-Z0-9\s:_@$#=/+,\-.]*$")


class Refusal(ValueError):
    """What the model cannot take: `field` names it in the request."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field
        self.why = why


def base_model_id(model: str) -> str:
    """The model id without an ARN's path or an inference profile's geography."""
    return _PROFILE.sub("", model.rsplit("/", 1)[-1])


def capabilities(model: str) -> Capabilities:
    base = base_model_id(model)
    matches = [prefix for prefix in FAMILIES if base.startswith(prefix)]
    return FAMILIES[max(matches, key=len)] if matches else _TEXT_AND_TOOLS


def reasons(request: LLMRequest) -> bool:
    return request.reasoning_effort not in (None, "none")


def thinking_budget(request: LLMRequest) -> int | None:
    """The thinking budget of the effort asked, within the reply's limit; None: no reasoning."""
    if request.reasoning_effort is None or request.reasoning_effort == "none":
        return None
    budget = THINKING_BUDGETS[request.reasoning_effort]
    limit = request.output_limit
    return budget if limit is None else min(budget, limit - 1)


def document_format(file: FileRef) -> str | None:
    """The Converse format of a document given inline: by its data URL's type, else by its
    filename's extension; bare base64 without a name is a PDF (what OpenAI's file_data takes)."""
    parts = data_url_parts(file.file_data or "")
    if parts is not None:
        return DOCUMENT_FORMATS.get(parts[0])
    if file.filename is not None:
        return _EXTENSIONS.get(file.filename.rsplit(".", 1)[-1].lower()) if "." in file.filename else None
    return "pdf"


def check_request(request: LLMRequest, model: str) -> None:
    """Raises `Refusal` at the first thing of `request` that `model` on Bedrock cannot take."""
    can = capabilities(model)
    for name, what in _NO_COUNTERPART.items():
        if getattr(request, name) is not None:
            raise Refusal(name, f"Bedrock's Converse takes no {what}")
    for name in METADATA_FIELDS:
        if not _METADATA_VALUE.match(getattr(request, name) or ""):
            raise Refusal(
                name, "Bedrock's requestMetadata takes letters, digits, spaces and :_@$#=/+,-. only"
            )
    if request.service_tier not in (None, "auto", *BEDROCK_TIERS):
        raise Refusal("service_tier", "Bedrock's service tiers are default, flex and priority")
    if request.temperature is not None and request.temperature > 1:
        raise Refusal("temperature", "Bedrock's models take a temperature from 0 to 1")
    if request.parallel_tool_calls is False:
        raise Refusal("parallel_tool_calls", "Converse cannot turn parallel tool calls off")
    _check_messages(request, can)
    _check_tools(request, can)
    if reasons(request):
        _check_reasoning(request, can)


def _check_tools(request: LLMRequest, can: Capabilities) -> None:
    if request.tools is not None and not can.tools:
        raise Refusal("tools", "the model takes no tools")
    for i, tool in enumerate(request.tools or []):
        if not _is_object_schema(tool.function.parameters or {"type": "object"}):
            raise Refusal(
                f"tools[{i}].function.parameters", "Bedrock takes a tool's input as an object schema"
            )
    forced = request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice)
    if forced and not can.forced_tools:
        raise Refusal(
            "tool_choice", "the model cannot be made to call a tool (Converse's toolChoice any/tool)"
        )
    schema = request.response_format
    if isinstance(schema, JsonSchemaFormat):
        # The answer is a forced call of a tool named after the schema, its input the answer.
        if not can.forced_tools:
            raise Refusal(
                "response_format", "the model cannot be made to call a tool, as Bedrock answers a schema"
            )
        if any(tool.function.name == schema.json_schema.name for tool in request.tools or []):
            raise Refusal("response_format", "the schema's name is a tool's; Bedrock answers it as a tool")
        if not _is_object_schema(schema.json_schema.json_schema):
            raise Refusal("response_format", "Bedrock answers a schema as a tool's input, which is an object")


def _is_object_schema(schema: dict[str, Any]) -> bool:
    return bool(schema.get("type", "object") == "object")


def _check_messages(request: LLMRequest, can: Capabilities) -> None:
    for i, message in enumerate(request.messages or []):
        at = f"messages[{i}]"
        if (message.tool_calls or message.role == "tool") and not can.tools:
            raise Refusal(at, "the model takes no tools, so no tool calls or results")
        for k, call in enumerate(message.tool_calls or []):
            try:
                arguments = json.loads(call.function.arguments)
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                raise Refusal(f"{at}.tool_calls[{k}].function.arguments", "Bedrock needs a JSON object")
        if isinstance(message.content, str):
            continue
        for j, part in enumerate(message.content or []):
            _check_part(part, f"{at}.content[{j}]", can)


def _check_part(part: object, at: str, can: Capabilities) -> None:
    if isinstance(part, AudioPart):
        raise Refusal(at, "Bedrock's Converse takes no audio")
    if isinstance(part, ImagePart):
        if not can.images:
            raise Refusal(at, "the model takes no images")
        url = part.image_url.url
        if url is not None:
            parts = data_url_parts(url)
            if parts is None:
                raise Refusal(f"{at}.image_url.url", "Bedrock takes images as data URLs, not by http(s) URL")
            if parts[0] not in IMAGE_FORMATS:
                raise Refusal(
                    f"{at}.image_url.url", f"Bedrock takes png, jpeg, gif or webp images, not {parts[0]}"
                )
    if isinstance(part, FilePart):
        if not can.documents:
            raise Refusal(at, "the model takes no documents")
        if part.file.file_data is not None and document_format(part.file) is None:
            kinds = ", ".join(sorted(set(DOCUMENT_FORMATS.values())))
            raise Refusal(f"{at}.file", f"Bedrock takes documents of {kinds}: give a data URL of one")


def _check_reasoning(request: LLMRequest, can: Capabilities) -> None:
    if not can.reasoning:
        raise Refusal("reasoning_effort", "the model has no reasoning that Bedrock can turn on")
    # Anthropic's thinking takes no sampling changes and no forced tool (a schema is one).
    for name in ("temperature", "top_p"):
        if getattr(request, name) is not None:
            raise Refusal(name, "Bedrock's Claude thinking takes no sampling changes")
    if request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice):
        raise Refusal("tool_choice", "Bedrock's Claude thinking cannot be forced to call a tool")
    if isinstance(request.response_format, JsonSchemaFormat):
        raise Refusal(
            "response_format", "a schema is answered through a forced tool, which thinking cannot take"
        )
    # Claude wants the thinking that led to a tool call sent back with it, which a Chat
    # Completions history does not carry.
    assistants = [i for i, m in enumerate(request.messages or []) if m.role == "assistant"]
    if assistants and (request.messages or [])[assistants[-1]].tool_calls:
        raise Refusal(
            f"messages[{assistants[-1]}].tool_calls",
            "Claude thinking needs the thinking behind a tool call, which the history does not carry",
        )
    limit = request.output_limit
    if limit is not None and limit <= MIN_THINKING_BUDGET:
        name = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        raise Refusal(name, f"reasoning needs more than {MIN_THINKING_BUDGET} tokens (its least budget)")
