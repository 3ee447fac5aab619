"""What a task asks the model: one generation of OpenAI's Chat Completions request, validated.

Every provider takes this one shape: the OpenAI-compatible one sends it as it is (the worker first
replaces file ids with the files' bytes), Bedrock maps it to Converse or refuses what a model
cannot take, and `/v1/responses` and the batch lines map their own shapes onto it. A field
OpenAI has for one generation is a field here, passed on; anything else is refused by name.

Long because the request is one vocabulary: its parts, messages, formats and tools are checked
against each other (a tool choice names a tool, an image rides a user message), so they change
together.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BeforeValidator, ConfigDict, Field, StrictBool, model_validator

from llmtasks.domain.fields import (
    Fraction,
    FreeJson,
    MaxTokens,
    Penalty,
    Strict,
    Temperature,
    Text,
    not_a_bool,
)
from llmtasks.domain.json_schema import Ways, alternatives, each, exactly_one_of, needs, non_null

# The rules between fields (LLMRequest's validator enforces them; json_schema.py writes them into
# the document): exactly one of prompt and messages; top_logprobs only with logprobs true; a tool
# choice only beside tools.
ONE_INPUT: Ways = [{"prompt": True, "messages": False}, {"prompt": False, "messages": True}]
FIELD_RULES: dict[str, dict[str, Any]] = {
    "top_logprobs": {"logprobs": {"type": "boolean", "const": True}},
    "tool_choice": {"tools": {"type": "array"}},
    "parallel_tool_calls": {"tools": {"type": "array"}},
}
FIELD_NEEDS = needs(FIELD_RULES)
# The name of a tool, a schema or a message's author, as OpenAI allows them.
NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# An id of a file uploaded to llmtasks (POST /v1/files), as api/openai_batch_files.py makes them.
FILE_ID_PATTERN = r"^file-[A-Za-z0-9_-]{1,64}$"
ToolName = Annotated[str, Field(pattern=NAME_PATTERN)]
# Base64 as Python's strict decoder takes it: whole quanta, padded. The patterns below are the
# document's (ECMA) and the validators' alike, so both say the same.
BASE64 = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
_MEDIA_TYPE = r"[A-Za-z0-9_.+-]+/[A-Za-z0-9_.+-]+(?:;[A-Za-z0-9_-]+=[A-Za-z0-9_.-]+)*"
IMAGE_URL_PATTERN = (
    rf"^(?:https?://[^\s/]|data:image/[A-Za-z0-9_.+-]+(?:;[A-Za-z0-9_-]+=[A-Za-z0-9_.-]+)*;base64,{BASE64}$)"
)
FILE_DATA_PATTERN = rf"^(?:data:{_MEDIA_TYPE};base64,)?{BASE64}$"
BASE64_PATTERN = rf"^{BASE64}$"
_DATA_URL = re.compile(rf"^data:(?P<mime>{_MEDIA_TYPE});base64,(?P<data>.*)$", re.S)

# Within a double's exact integers: a document's bound past them reads as a float to generators.
Seed = Annotated[int, Field(ge=-(2**53), le=2**53), BeforeValidator(not_a_bool)]
CacheKey = Annotated[str, Field(min_length=1, max_length=1024)]
EndUser = Annotated[str, Field(max_length=256)]
SafetyIdentifier = Annotated[str, Field(min_length=1, max_length=64)]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]
Detail = Literal["auto", "low", "high"]


def data_url_parts(url: str) -> tuple[str, str] | None:
    """A data URL's media type and base64 text; None for any other URL."""
    match = _DATA_URL.match(url)
    return (match["mime"], match["data"]) if match else None


# --- content parts -----------------------------------------------------------------------------


class TextPart(Strict):
    type: Literal["text"]
    text: Text


class ImageUrl(Strict):
    """An image by URL (http(s), or a base64 data URL), or by the id of a file uploaded to
    llmtasks (its extension, which `input_image.file_id` of /v1/responses maps to)."""

    model_config = ConfigDict(json_schema_extra=exactly_one_of("url", "file_id"))

    url: Annotated[str, Field(max_length=2048 * 1024, pattern=IMAGE_URL_PATTERN)] | None = Field(
        default=None, description="An http(s) URL or a data:image/...;base64 URL."
    )
    file_id: Annotated[str, Field(pattern=FILE_ID_PATTERN)] | None = Field(
        default=None, description="llmtasks' extension: an uploaded file (POST /v1/files), instead of url."
    )
    detail: Detail | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ImageUrl:
        if (self.url is None) == (self.file_id is None):
            raise ValueError("give exactly one of 'url' or 'file_id'")
        return self


class ImagePart(Strict):
    type: Literal["image_url"]
    image_url: ImageUrl


class FileRef(Strict):
    """A document (a PDF): its bytes as a data URL (or bare base64), or an uploaded file's id."""

    model_config = ConfigDict(json_schema_extra=exactly_one_of("file_id", "file_data"))

    file_id: Annotated[str, Field(pattern=FILE_ID_PATTERN)] | None = None
    file_data: Annotated[str, Field(pattern=FILE_DATA_PATTERN)] | None = Field(
        default=None, description="data:application/pdf;base64,... or base64."
    )
    filename: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> FileRef:
        if (self.file_id is None) == (self.file_data is None):
            raise ValueError("give exactly one of 'file_id' or 'file_data'")
        return self


class FilePart(Strict):
    type: Literal["file"]
    file: FileRef


class InputAudio(Strict):
    data: str = Field(pattern=BASE64_PATTERN, description="The audio, base64.")
    format: Literal["wav", "mp3"]


class AudioPart(Strict):
    type: Literal["input_audio"]
    input_audio: InputAudio


ContentPart = Annotated[TextPart | ImagePart | FilePart | AudioPart, Field(discriminator="type")]
# The parts that only a user's message may carry.
_MEDIA_PARTS = (ImagePart, FilePart, AudioPart)


# --- messages ----------------------------------------------------------------------------------


class FunctionCall(Strict):
    name: Text
    arguments: Text = Field(description="The arguments, as the model wrote them: JSON text.")


class ToolCall(Strict):
    """A call the model asked for (an assistant message's, or a completion's `tool_calls`)."""

    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


Role = Literal["system", "developer", "user", "assistant", "tool"]


def _roles_rules(schema: dict[str, Any]) -> None:
    """The rules `ChatMessage._fits_its_role` enforces, in the document: a `oneOf` of partial
    schemas by role beside the properties (the form schemathesis' generator reads nested)."""
    properties = schema["properties"]
    text, parts = [form for form in properties["content"]["anyOf"] if form != {"type": "null"}]
    text_parts = {**parts, "items": parts["items"]["oneOf"][0]}  # ContentPart's first: TextPart
    given = {name: non_null(properties[name]) for name in ("tool_calls", "tool_call_id", "refusal")}
    null = {"type": "null"}
    only_text = {"anyOf": [text, text_parts]}
    schema["oneOf"] = [
        {
            "properties": {
                "role": {"enum": ["system", "developer"]},
                "content": only_text,
                **dict.fromkeys(given, null),
            },
            "required": ["content"],
        },
        {
            "properties": {
                "role": {"const": "user"},
                "content": {"anyOf": [text, parts]},
                **dict.fromkeys(given, null),
            },
            "required": ["content"],
        },
        {
            "properties": {
                "role": {"const": "assistant"},
                "content": {"anyOf": [text, text_parts, null]},
                "tool_call_id": null,
            },
            "anyOf": [
                {"properties": {"content": only_text}, "required": ["content"]},
                {"properties": {"tool_calls": given["tool_calls"]}, "required": ["tool_calls"]},
                {"properties": {"refusal": given["refusal"]}, "required": ["refusal"]},
            ],
        },
        {
            "properties": {
                "role": {"const": "tool"},
                "content": only_text,
                "tool_call_id": given["tool_call_id"],
                "tool_calls": null,
                "refusal": null,
            },
            "required": ["content", "tool_call_id"],
        },
    ]


class ChatMessage(Strict):
    """One message of the conversation, as Chat Completions takes it."""

    model_config = ConfigDict(json_schema_extra=_roles_rules)

    role: Role
    content: Text | Annotated[list[ContentPart], Field(min_length=1)] | None = None
    name: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = Field(
        default=None, description="An assistant's: the calls it asked for (history of a tool run)."
    )
    tool_call_id: Text | None = Field(default=None, description="A tool's: the call it answers.")
    refusal: Text | None = Field(default=None, description="An assistant's: its refusal, as history.")

    @model_validator(mode="after")
    def _fits_its_role(self) -> ChatMessage:
        role, content = self.role, self.content
        if self.tool_calls is not None and role != "assistant":
            raise ValueError("only an assistant message has 'tool_calls'")
        if (self.tool_call_id is not None) != (role == "tool"):
            raise ValueError("a tool message, and only it, has 'tool_call_id'")
        if self.refusal is not None and role != "assistant":
            raise ValueError("only an assistant message has 'refusal'")
        answered = self.tool_calls is not None or self.refusal is not None
        if content is None and not (role == "assistant" and answered):
            raise ValueError(f"a {role} message needs 'content'")
        media = isinstance(content, list) and any(isinstance(part, _MEDIA_PARTS) for part in content)
        if media and role != "user":
            raise ValueError("only a user message may carry images, files or audio")
        return self

    def text(self) -> str:
        """Its text: the content, or its text parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content or [] if isinstance(part, TextPart))

    def parts(self) -> list[TextPart | ImagePart | FilePart | AudioPart]:
        if self.content is None:
            return []
        if isinstance(self.content, str):
            return [TextPart(type="text", text=self.content)]
        return list(self.content)


# --- formats and tools -------------------------------------------------------------------------


class TextFormat(Strict):
    type: Literal["text"]


class JsonObjectFormat(Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(Strict):
    model_config = ConfigDict(serialize_by_alias=True, validate_by_name=True, validate_by_alias=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: Text | None = None
    json_schema: FreeJson = Field(alias="schema", description="The JSON Schema the answer must fit.")
    strict: StrictBool | None = None

    @model_validator(mode="after")
    def _is_a_schema(self) -> JsonSchemaSpec:
        try:
            Draft202012Validator.check_schema(self.json_schema)
        except SchemaError as exc:
            raise ValueError(f"'schema' is not a JSON Schema: {exc.message}") from None
        return self


class JsonSchemaFormat(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


class FunctionDefinition(Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: Text | None = None
    parameters: FreeJson | None = Field(default=None, description="A JSON Schema of its arguments.")
    strict: StrictBool | None = None


class FunctionTool(Strict):
    """A function the model may call: nested under `function` as Chat Completions takes it, or
    flat (`name`, `parameters` ... beside `type`) as the Responses API does."""

    type: Literal["function"]
    function: FunctionDefinition

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """Responses' flat shape, {"type", "name", "parameters", ...}, nested as Chat Completions'."""
        if not isinstance(data, dict) or "function" in data or "name" not in data:
            return data
        inner = {k: v for k, v in data.items() if k in FunctionDefinition.model_fields}
        return {**{k: v for k, v in data.items() if k not in inner}, "function": inner}


class NamedFunction(Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
StopText = Annotated[str, Field(min_length=1)]
Stop = StopText | Annotated[list[StopText], Field(min_length=1, max_length=4)]

# The generation parameters passed to the provider as they are, beside the messages and model.
PARAMETERS = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
    "reasoning_effort",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "service_tier",
    "prompt_cache_key",
    "user",
    "safety_identifier",
)


class LLMRequest(Strict):
    """What the provider is asked: exactly one of `prompt` or `messages`, plus the parameters of
    one Chat Completions generation."""

    model_config = ConfigDict(json_schema_extra=each(alternatives(ONE_INPUT), FIELD_NEEDS))

    prompt: Text | None = Field(default=None, description="A single user prompt.")
    messages: list[ChatMessage] | None = Field(
        default=None,
        min_length=1,
        description="A chat history, as Chat Completions takes it: text or content parts (text,"
        " image_url, file, input_audio), assistant tool calls and tool results.",
    )
    model: Text | None = Field(default=None, max_length=200, description="The provider's model id.")
    system: Text | None = Field(default=None, description="A system prompt placed before the conversation.")
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = Field(
        default=None, description="The most the reply may use, reasoning tokens included."
    )
    temperature: Temperature | None = None
    top_p: Fraction | None = None
    stop: Stop | None = Field(default=None, description="Up to 4 sequences where the reply stops.")
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20), BeforeValidator(not_a_bool)] | None = None
    reasoning_effort: ReasoningEffort | None = Field(
        default=None, description="How hard a reasoning model thinks before it answers."
    )
    response_format: ResponseFormat | None = Field(
        default=None,
        description="json_object, or json_schema (with strict): the answer is JSON, and for a"
        " schema it is validated and given as the task's `parsed`.",
    )
    tools: Annotated[list[FunctionTool], Field(min_length=1, max_length=128)] | None = Field(
        default=None, description="Function tools the model may call; its calls come back in `output`."
    )
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    service_tier: ServiceTier | None = None
    prompt_cache_key: CacheKey | None = None
    user: EndUser | None = None
    safety_identifier: SafetyIdentifier | None = None

    @model_validator(mode="after")
    def _consistent(self) -> LLMRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("'top_logprobs' needs 'logprobs': true")
        if self.tools is None and (self.tool_choice is not None or self.parallel_tool_calls is not None):
            raise ValueError("'tool_choice' and 'parallel_tool_calls' need 'tools'")
        # A task body's tools may hold MCP servers (models.SubmitTaskRequest): functions alone here.
        names = [tool.function.name for tool in self.tools or [] if isinstance(tool, FunctionTool)]
        if len(set(names)) != len(names):
            raise ValueError("each tool needs a name of its own")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            named = self.tool_choice.function.name
            raise ValueError(f"'tool_choice' names {named!r}, which is not in 'tools'")
        return self

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages as Chat Completions takes them: the system prompt, then the prompt or
        the history."""
        chat: list[dict[str, Any]] = [{"role": "system", "content": self.system}] if self.system else []
        if self.prompt is not None:
            chat.append({"role": "user", "content": self.prompt})
        chat.extend(m.model_dump(mode="json", exclude_none=True) for m in self.messages or [])
        return chat

    def parameters(self) -> dict[str, Any]:
        """The generation parameters given, as the provider takes them (schemas as objects)."""
        return self.model_dump(include=set(PARAMETERS), exclude_none=True, by_alias=True)

    @property
    def output_limit(self) -> int | None:
        """The most tokens the reply may use, as asked (reasoning included)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The schema the answer must fit, when one is asked."""
        if isinstance(self.response_format, JsonSchemaFormat):
            return self.response_format.json_schema.json_schema
        return None

    @property
    def wants_json(self) -> bool:
        return isinstance(self.response_format, JsonObjectFormat | JsonSchemaFormat)

    def parts(self) -> list[TextPart | ImagePart | FilePart | AudioPart]:
        """Every content part of every message, in order."""
        return [part for message in self.messages or [] for part in message.parts()]

    def file_ids(self) -> list[str]:
        """The uploaded files the request names (images and documents), in order, once each."""
        ids: list[str] = []
        for part in self.parts():
            file_id = (
                part.image_url.file_id
                if isinstance(part, ImagePart)
                else part.file.file_id
                if isinstance(part, FilePart)
                else None
            )
            if file_id is not None and file_id not in ids:
                ids.append(file_id)
        return ids

    def text_bytes(self) -> int:
        """The size the request cap applies to: every piece of text and inline data sent to the
        model (images and documents as data URLs, schemas, tools); an uploaded file counts its id."""
        texts = [self.prompt or "", self.system or ""]
        for message in self.messages or []:
            texts.extend(call.function.arguments for call in message.tool_calls or [])
        # A message's text content is one text part (parts()), counted once here.
        for part in self.parts() if self.messages else []:
            if isinstance(part, TextPart):
                texts.append(part.text)
            elif isinstance(part, ImagePart):
                texts.append(part.image_url.url or "")
            elif isinstance(part, FilePart):
                texts.append(part.file.file_data or "")
            else:
                texts.append(part.input_audio.data)
        size = sum(len(text.encode()) for text in texts)
        schemas = (tool.function.parameters for tool in self.tools or [] if isinstance(tool, FunctionTool))
        extras = [self.json_schema, *schemas]
        return size + sum(len(json.dumps(extra)) for extra in extras if extra is not None)
