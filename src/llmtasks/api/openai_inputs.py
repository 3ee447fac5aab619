"""The Responses API's shapes beside its top-level fields, as OpenAI's SDK sends them: input
items (messages with content parts, function calls and their outputs), function and MCP tools,
tool choice and text formats. Each maps onto the shape a task carries (domain/llm_request.py);
one OpenAI has that a task cannot serve (a hosted tool, a file by URL, a stored item's
reference) is refused by name (`Refused`, with the field's path).

Long because the input items and the tools are one vocabulary, each item's rule beside it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    Tag,
    ValidationError,
    WithJsonSchema,
)
from pydantic.json_schema import SkipJsonSchema

from llmtasks.domain.fields import Text
from llmtasks.domain.json_schema import exactly_one_of
from llmtasks.domain.llm_request import (
    FILE_DATA_PATTERN,
    FILE_ID_PATTERN,
    IMAGE_URL_PATTERN,
    ChatMessage,
    ContentPart,
    Detail,
    FilePart,
    FileRef,
    FunctionCall,
    FunctionDefinition,
    FunctionTool,
    ImagePart,
    ImageUrl,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    TextFormat,
    TextPart,
    ToolCall,
    ToolName,
)
from llmtasks.domain.mcp_servers import McpServer

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class Invalid(ValueError):
    """A value a task cannot hold: `field` names where, as the request does."""

    def __init__(self, detail: str, field: str) -> None:
        super().__init__(detail)
        self.field = field


class Refused(Invalid):
    """A shape OpenAI has that a task cannot serve."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- content parts -----------------------------------------------------------------------------


class InputText(_Closed):
    type: Literal["input_text", "output_text"]
    text: Text
    annotations: list[Any] | None = None  # on an earlier response's output_text: ignored
    logprobs: list[Any] | None = None


FileId = Annotated[str, Field(pattern=FILE_ID_PATTERN)]
# OpenAI's fields a task cannot serve, refused by name (400); the document says null alone is served.
RefusedField = WithJsonSchema({"type": "null"})


class InputImage(_Closed):
    model_config = ConfigDict(json_schema_extra=exactly_one_of("image_url", "file_id"))

    type: Literal["input_image"]
    image_url: Annotated[str, Field(max_length=2048 * 1024, pattern=IMAGE_URL_PATTERN)] | None = Field(
        default=None, description="An http(s) URL or a data:image/...;base64 URL."
    )
    file_id: FileId | None = Field(default=None, description="An uploaded file (POST /v1/files).")
    detail: Detail | None = None


class InputFile(_Closed):
    model_config = ConfigDict(json_schema_extra=exactly_one_of("file_data", "file_id"))

    type: Literal["input_file"]
    file_data: Annotated[str, Field(pattern=FILE_DATA_PATTERN)] | None = Field(
        default=None, description="data:application/pdf;base64,... or base64."
    )
    file_id: FileId | None = None
    filename: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    file_url: Annotated[str | None, RefusedField] = Field(
        default=None, description="Refused: send file_data or file_id."
    )
    detail: Annotated[Detail | None, RefusedField] = Field(default=None, description="Refused.")


class OutputRefusal(_Closed):
    """An earlier response's refusal, sent back as history."""

    type: Literal["refusal"]
    refusal: str


MessagePart = Annotated[InputText | InputImage | InputFile | OutputRefusal, Field(discriminator="type")]


def _part(part: InputText | InputImage | InputFile, where: str) -> ContentPart:
    if isinstance(part, InputText):
        return TextPart(type="text", text=part.text)
    if isinstance(part, InputImage):
        image = ImageUrl(url=part.image_url, file_id=part.file_id, detail=part.detail)
        return ImagePart(type="image_url", image_url=image)
    if part.file_url is not None:
        raise Refused(
            "a file by URL is not served: send its bytes as file_data, or upload it"
            " (POST /v1/files) and send its file_id",
            field=f"{where}.file_url",
        )
    if part.detail is not None:
        raise Refused("'detail' of an input_file is not served", field=f"{where}.detail")
    return FilePart(
        type="file", file=FileRef(file_id=part.file_id, file_data=part.file_data, filename=part.filename)
    )


# --- input items -------------------------------------------------------------------------------


def _parts_by_role(schema: dict[str, Any]) -> None:
    """The rules `InputMessage.chat` enforces (through ChatMessage's), in the document: a `oneOf`
    of partial schemas by role, each with the part types that role may carry."""
    text, parts = schema["properties"]["content"]["anyOf"]
    by_type = parts["items"]["discriminator"]["mapping"]

    def carrying(*types: str) -> dict[str, Any]:
        refs = dict.fromkeys(by_type[kind] for kind in types)  # output_text shares input_text's
        return {"anyOf": [text, {**parts, "items": {"oneOf": [{"$ref": ref} for ref in refs]}}]}

    texts = ("input_text", "output_text")
    schema["oneOf"] = [
        {"properties": {"role": {"enum": ["system", "developer"]}, "content": carrying(*texts)}},
        {"properties": {"role": {"const": "user"}, "content": carrying(*texts, "input_image", "input_file")}},
        {"properties": {"role": {"const": "assistant"}, "content": carrying(*texts, "refusal")}},
    ]


class InputMessage(_Closed):
    """A message of the conversation: media parts in a user's alone, refusals in an assistant's."""

    model_config = ConfigDict(json_schema_extra=_parts_by_role)

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[str, Field(min_length=1)] | Annotated[list[MessagePart], Field(min_length=1)]
    id: str | None = None  # an earlier response's output message, sent back as history
    status: str | None = None
    phase: Literal["commentary", "final_answer"] | None = None

    def chat(self, where: str) -> ChatMessage:
        """The message as Chat Completions takes it: text alone as one string, else its parts."""
        role = _ROLES[self.role]
        if isinstance(self.content, str):
            return ChatMessage(role=role, content=self.content)
        refusals = [part.refusal for part in self.content if isinstance(part, OutputRefusal)]
        if refusals and role != "assistant":
            raise Refused("only an assistant message has a refusal", field=f"{where}.content")
        parts = [
            _part(part, f"{where}.content.{index}")
            for index, part in enumerate(self.content)
            if not isinstance(part, OutputRefusal)
        ]
        texts = [part.text for part in parts if isinstance(part, TextPart)]
        content: str | list[ContentPart] | None = (
            "".join(texts) if len(texts) == len(parts) and texts else parts or None
        )
        return ChatMessage(role=role, content=content, refusal="".join(refusals) if refusals else None)


class FunctionCallItem(_Closed):
    """A call the model asked for earlier: the assistant's `tool_calls` in the history."""

    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text
    id: str | None = None
    status: str | None = None

    def tool_call(self) -> ToolCall:
        return ToolCall(id=self.call_id, function=FunctionCall(name=self.name, arguments=self.arguments))


class FunctionCallOutputItem(_Closed):
    """A call's result: a `tool` message."""

    type: Literal["function_call_output"]
    call_id: Text
    output: Text | list[InputText]
    id: str | None = None
    status: str | None = None

    def chat(self) -> ChatMessage:
        text = self.output if isinstance(self.output, str) else "".join(part.text for part in self.output)
        return ChatMessage(role="tool", tool_call_id=self.call_id, content=text)


class ReasoningItem(_Closed):
    """An earlier response's reasoning, sent back with its output: Chat Completions has no place
    for it, so it is not passed on (as OpenAI drops it for a model that does not reason)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class McpApprovalResponseItem(_Closed):
    """The client's answer to an MCP call a response waits to have approved (its
    mcp_approval_request item's id): taken by that response's continuation (previous_response_id);
    sent as history, not passed on (the call's output, or its denial, is in the conversation)."""

    type: Literal["mcp_approval_response"]
    approval_request_id: Annotated[Text, Field(min_length=1, max_length=256)]
    approve: StrictBool
    reason: Annotated[Text, Field(max_length=1000)] | None = None
    id: str | None = None


def _item_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return str(kind or "message")


# The tags are no identifiers, so that the path of a refused field leaves them out (openai.py).
InputItem = Annotated[
    Annotated[InputMessage, Tag("type:message")]
    | Annotated[FunctionCallItem, Tag("type:function_call")]
    | Annotated[FunctionCallOutputItem, Tag("type:function_call_output")]
    | Annotated[ReasoningItem, Tag("type:reasoning")]
    | Annotated[McpApprovalResponseItem, Tag("type:mcp_approval_response")],
    Discriminator(lambda value: "type:" + _item_type(value)),
]
AnyInputItem = (
    InputMessage | FunctionCallItem | FunctionCallOutputItem | ReasoningItem | McpApprovalResponseItem
)


def chat_messages(items: list[AnyInputItem]) -> list[ChatMessage]:
    """The input items as a chat (Invalid or Refused, naming the item, where a rule of a task's
    message or part refuses one)."""
    messages: list[ChatMessage] = []
    for index, item in enumerate(items):
        try:
            _add(messages, item, index)
        except ValidationError as invalid:  # a rule of the task's message or part
            first = invalid.errors()[0]
            message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
            at = ".".join(str(part) for part in first.get("loc", ()))
            said = f"{at}: {message}" if at else message
            raise Invalid(f"Invalid 'input.{index}': {said}.", field=f"input.{index}") from None
    return messages


def _add(messages: list[ChatMessage], item: AnyInputItem, index: int) -> None:
    """One item into the chat: function calls join the assistant message before them (or make
    one), their outputs are tool messages, reasoning and approvals are not passed on."""
    if isinstance(item, ReasoningItem | McpApprovalResponseItem):
        return
    if isinstance(item, FunctionCallItem):
        last = messages[-1] if messages else None
        if last is not None and last.role == "assistant":
            messages[-1] = last.model_copy(
                update={"tool_calls": [*(last.tool_calls or []), item.tool_call()]}
            )
        else:
            messages.append(ChatMessage(role="assistant", tool_calls=[item.tool_call()]))
    elif isinstance(item, FunctionCallOutputItem):
        messages.append(item.chat())
    else:
        messages.append(item.chat(f"input.{index}"))


# --- tools and formats -------------------------------------------------------------------------


class ResponsesFunctionTool(_Closed):
    """A function tool in the Responses API's flat shape."""

    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None

    def chat(self) -> FunctionTool:
        definition = FunctionDefinition(
            name=self.name, description=self.description, parameters=self.parameters, strict=self.strict
        )
        return FunctionTool(type="function", function=definition)


class HostedTool(BaseModel):
    """One of OpenAI's own tools (web_search, file_search, ...): refused by its type."""

    model_config = ConfigDict(extra="allow")
    type: str


def _tool_type(value: Any) -> str:
    kind = _item_type(value)
    return f"type:{kind}" if kind in ("function", "mcp") else "type:hosted"


Tool = Annotated[
    # The document lists function tools and remote MCP servers (a task body's, as OpenAI shapes
    # them): another hosted tool is refused by name (400), as unserved.
    Annotated[ResponsesFunctionTool, Tag("type:function")]
    | Annotated[McpServer, Tag("type:mcp")]
    | SkipJsonSchema[Annotated[HostedTool, Tag("type:hosted")]],
    Discriminator(_tool_type),
]


def chat_tools(tools: list[ResponsesFunctionTool | McpServer | HostedTool]) -> list[FunctionTool | McpServer]:
    """The task body's tools: functions in Chat Completions' shape, MCP servers as they are."""
    served: list[FunctionTool | McpServer] = []
    for tool in tools:
        if isinstance(tool, HostedTool):
            raise Refused(
                f"the hosted tool '{tool.type[:40]}' is not served: llmtasks serves function tools"
                " and remote MCP servers",
                field="tools",
            )
        served.append(tool if isinstance(tool, McpServer) else tool.chat())
    return served


def flat_mcp_tool(server: McpServer) -> dict[str, Any]:
    """A task's MCP server as the Response object gives it back (its headers never are)."""
    shown = server.model_dump(mode="json", exclude={"headers"})
    return {**shown, "headers": None, "server_description": None}


def flat_tool(tool: FunctionTool) -> dict[str, Any]:
    """A task's tool as the Response object gives it back."""
    function = tool.function
    return {
        "type": "function",
        "name": function.name,
        "description": function.description,
        "parameters": function.parameters,
        "strict": function.strict,
    }


class ToolChoiceFunction(_Closed):
    type: Literal["function"]
    name: ToolName


# Another choice (a hosted tool's) is refused by name; the document lists the ones served.
ToolChoice = Literal["none", "auto", "required"] | ToolChoiceFunction | SkipJsonSchema[dict[str, Any]]


def chat_tool_choice(choice: ToolChoice) -> Literal["none", "auto", "required"] | NamedToolChoice:
    if isinstance(choice, ToolChoiceFunction):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    if isinstance(choice, dict):
        kind = str(choice.get("type", ""))[:40]
        raise Refused(
            f"a tool choice of type '{kind}' is not served: llmtasks serves function tools", "tool_choice"
        )
    return choice


def flat_tool_choice(choice: Any) -> Any:
    """A task's tool choice as the Response object gives it back."""
    if isinstance(choice, NamedToolChoice):
        return {"type": "function", "name": choice.function.name}
    return choice or "auto"


class JsonSchemaText(_Closed):
    """`text.format` of type json_schema: the Chat Completions spec, flattened."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["json_schema"]
    name: ToolName
    json_schema: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: StrictBool | None = None


TextFormatConfig = Annotated[TextFormat | JsonObjectFormat | JsonSchemaText, Field(discriminator="type")]


class TextConfig(_Closed):
    format: TextFormatConfig | None = None
    # OpenAI's field, refused by name (400); the document says null alone is served.
    verbosity: Annotated[Literal["low", "medium", "high"] | None, RefusedField] = Field(
        default=None, description="Refused."
    )

    def response_format(self) -> ResponseFormat | None:
        if self.verbosity is not None:
            raise Refused(
                "'verbosity' is not served (Chat Completions' providers take none)", "text.verbosity"
            )
        if isinstance(self.format, JsonSchemaText):
            spec = JsonSchemaSpec(
                name=self.format.name,
                description=self.format.description,
                json_schema=self.format.json_schema,
                strict=self.format.strict,
            )
            return JsonSchemaFormat(type="json_schema", json_schema=spec)
        return self.format


def text_config(response_format: ResponseFormat | None) -> dict[str, Any]:
    """A task's response format as the Response object's `text`."""
    if isinstance(response_format, JsonSchemaFormat):
        spec = response_format.json_schema
        return {
            "format": {
                "type": "json_schema",
                "name": spec.name,
                "schema": spec.json_schema,
                "description": spec.description,
                "strict": spec.strict,
            }
        }
    return {"format": {"type": response_format.type if response_format else "text"}}
