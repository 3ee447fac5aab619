"""The request bodies of OpenAI's API that llmtasks serves (`POST /v1/responses`, and the lines
of a batch's input file), validated as closed models: every field OpenAI has that a task cannot
serve is refused by name. Both the responses routes (openai.py) and the batches
(openai_batches.py) read them."""

from __future__ import annotations

import re
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

from llmtasks.api.openai_inputs import (
    FunctionCallOutputItem,
    InputItem,
    Invalid,
    McpApprovalResponseItem,
    Refused,
    TextConfig,
    Tool,
    ToolChoice,
    chat_messages,
    chat_tool_choice,
    chat_tools,
)
from llmtasks.domain.batches import MAX_INPUT_FILE_BYTES
from llmtasks.domain.errors import InvalidInput
from llmtasks.domain.fields import Fraction, MaxTokens, Temperature, WebhookUrl
from llmtasks.domain.input_files import MAX_TASK_FILE_BYTES
from llmtasks.domain.json_schema import each, needs
from llmtasks.domain.llm_request import (
    CacheKey,
    ChatMessage,
    EndUser,
    ReasoningEffort,
    SafetyIdentifier,
    ServiceTier,
)
from llmtasks.domain.models import WEBHOOK_URL_RULE, SubmitTaskRequest
from llmtasks.domain.provider_batches import BatchMode
from llmtasks.domain.runs import SubmitToolOutputs

# OpenAI's metadata: up to 16 string values.
OpenAIMetadata = Annotated[
    dict[str, str],
    Field(max_length=16),
    WithJsonSchema({"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 16}),
]
# llmtasks' extension (the SDK's extra_body): where OpenAI's webhook events go.
OpenAIWebhookUrl = Annotated[WebhookUrl, Field(description=WEBHOOK_URL_RULE)]


class _Closed(BaseModel):
    # Every field OpenAI has that a task cannot serve is refused, by name.
    model_config = ConfigDict(extra="forbid")


class UnsupportedParameter(InvalidInput):
    """A field OpenAI has, with a value a task cannot serve (a hosted tool, a file by URL)."""

    slug = "unsupported-parameter"


class ReasoningConfig(_Closed):
    effort: ReasoningEffort | None = None
    # The reasoning's summary is given wherever the provider gives one: asking changes nothing.
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


# Reasoning items sent back as history go to no provider, nor do approvals of MCP calls: the
# input needs another item (a response waiting for approvals alone takes them alone, which its
# state says and the document cannot).
_NOT_REASONING = {
    "not": {
        "properties": {"type": {"enum": ["reasoning", "mcp_approval_response"]}},
        "required": ["type"],
    }
}


def _required(schema: dict[str, Any]) -> None:
    schema["required"] = ["input", "background"]


# A tool choice other than none or auto needs a tool to choose (with no tools, those two are what
# the model does anyway).
_CHOICE_NEEDS_TOOLS = needs(
    {"tool_choice": {"tools": {"type": "array", "minItems": 1}}},
    free={"tool_choice": {"enum": ["none", "auto"]}},
)


class CreateResponse(_Closed):
    """`POST /v1/responses`: the fields of OpenAI's request that map onto a task.

    The document says background must be true and store must not be false (the validation below
    answers either with a sentence that says why), and holds the task's own bounds."""

    model_config = ConfigDict(json_schema_extra=each(_required, _CHOICE_NEEDS_TOOLS))

    model: str | None = Field(default=None, max_length=200)
    # Text, or items: only the branch the value's JSON type picks says why it is refused.
    input: Annotated[
        Annotated[Annotated[str, Field(min_length=1)], Tag("as-text")]
        | Annotated[
            Annotated[list[InputItem], Field(min_length=1, json_schema_extra={"contains": _NOT_REASONING})],
            Tag("as-items"),
        ],
        Discriminator(lambda value: "as-text" if isinstance(value, str) else "as-items"),
    ]
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: Fraction | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    service_tier: ServiceTier | None = None
    prompt_cache_key: CacheKey | None = None
    user: EndUser | None = None
    safety_identifier: SafetyIdentifier | None = None
    # OpenAI's values, refused by name (400) rather than as unknown: the document says what is served.
    include: Annotated[
        list[str] | None, WithJsonSchema({"type": "array", "items": {"type": "string"}, "maxItems": 0})
    ] = Field(default=None, description="No value is served: an empty list alone.")
    truncation: Annotated[
        Literal["auto", "disabled"] | None,
        WithJsonSchema({"anyOf": [{"type": "string", "const": "disabled"}, {"type": "null"}]}),
    ] = Field(default=None, description="'disabled' alone.")
    metadata: OpenAIMetadata | None = None
    background: Annotated[StrictBool | None, WithJsonSchema({"type": "boolean", "const": True})] = None
    store: Annotated[
        StrictBool | None, WithJsonSchema({"anyOf": [{"type": "boolean", "const": True}, {"type": "null"}]})
    ] = None
    webhook_url: OpenAIWebhookUrl | None = None
    # The reply: the response's events (text/event-stream), a segment of up to 25 s, instead of
    # the Response object; read on with GET /v1/responses/{id}?stream=true&starting_after=N.
    stream: StrictBool | None = None
    previous_response_id: str | None = Field(
        default=None,
        pattern=r"^resp_[0-9a-f]{32}$",
        description="A response of this tenant to continue: one waiting for its function calls'"
        " outputs takes the input's function_call_output items alone and goes on (the same"
        " response); a completed one is the history of a new response. Unknown: 404; one queued,"
        " in progress, failed or cancelled: 400.",
    )

    def _served(self) -> None:
        """Refused (400) when llmtasks cannot serve the response as asked: synchronous or unstored."""
        if not self.background:
            raise InvalidInput(
                "llmtasks serves background responses only: send background=true and poll"
                " responses.retrieve, or call the native API (POST /tasks with ?wait= on GET /tasks/{id})",
                field="background",
            )
        if self.store is False:
            raise InvalidInput("a background response is stored: store=false cannot be served", field="store")

    def tool_outputs(self) -> SubmitToolOutputs:
        """The input as the answers a waiting run takes (POST /tasks/{id}/tool_outputs' body):
        function_call_output and mcp_approval_response items alone, each answering one call."""
        self._served()
        alone = (
            "a response waiting for its function calls or approvals takes function_call_output"
            " and mcp_approval_response items alone"
        )
        if isinstance(self.input, str):
            raise InvalidInput(alone, field="input")
        outputs: list[dict[str, Any]] = []
        approvals: list[dict[str, Any]] = []
        for index, item in enumerate(self.input):
            if isinstance(item, McpApprovalResponseItem):
                approvals.append(item.model_dump(include={"approval_request_id", "approve", "reason"}))
            elif isinstance(item, FunctionCallOutputItem):
                outputs.append({"tool_call_id": item.call_id, "output": item.chat().content})
            else:
                raise InvalidInput(f"{alone}, not {item.type or 'message'}", field=f"input.{index}")
        try:
            return SubmitToolOutputs.model_validate({"tool_outputs": outputs, "mcp_approvals": approvals})
        except ValidationError as invalid:
            first = invalid.errors()[0]
            message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
            raise InvalidInput(f"Invalid 'input': {message}.", field="input") from None

    def task_request(self, history: list[ChatMessage] | None = None) -> SubmitTaskRequest:
        """The task this response is: its input after `history` (a completed response's
        conversation, continued by previous_response_id) when given."""
        self._served()
        try:
            return SubmitTaskRequest(
                **self._asked(history or []),
                metadata=self.metadata,
                webhook_url=self.webhook_url,
                webhook_format="openai" if self.webhook_url else None,
            )
        except Refused as refused:
            raise UnsupportedParameter(str(refused), field=refused.field) from None
        except Invalid as invalid:
            raise InvalidInput(str(invalid), field=invalid.field) from None
        except ValidationError as invalid:
            # A value OpenAI's schema allows that a task's does not (an empty model, a lone
            # surrogate): refused under OpenAI's name for the field.
            first = invalid.errors()[0]
            message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
            # A rule across fields has no place: the first field its message names is the one.
            named = re.search(r"'(\w+)'", message)
            where = [str(part) for part in first.get("loc", ())] or [named[1] if named else "input"]
            field = ".".join([_OPENAI_NAMES.get(where[0], where[0]), *where[1:]])
            raise InvalidInput(f"Invalid '{field}': {message}.", field=field) from None

    def _asked(self, history: list[ChatMessage]) -> dict[str, Any]:
        """The task's request fields, from OpenAI's (Refused, or ValidationError from the models
        a task's request is made of)."""
        for value in self.include or []:
            raise Refused(f"'{value[:80]}' cannot be included: llmtasks serves no include value", "include")
        if self.truncation == "auto":
            raise Refused(
                "truncation 'auto' is not served: the input is sent whole ('disabled')", "truncation"
            )
        tools = chat_tools(self.tools) if self.tools else None
        choice = chat_tool_choice(self.tool_choice) if self.tool_choice is not None else None
        if tools is None and choice in ("auto", "none"):
            choice = None  # with no tools, what the model does anyway
        asked: dict[str, Any] = (
            {"prompt": self.input} if isinstance(self.input, str) else {"messages": chat_messages(self.input)}
        )
        if history:
            said = asked.get("messages") or [ChatMessage(role="user", content=self.input)]
            asked = {"messages": [*history, *said]}
        given = {
            "model": self.model,
            "system": self.instructions,
            "max_completion_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "reasoning_effort": self.reasoning.effort if self.reasoning else None,
            "response_format": self.text.response_format() if self.text else None,
            "tools": tools,
            "tool_choice": choice,
            # Without tools the model calls none, in parallel or not.
            "parallel_tool_calls": self.parallel_tool_calls if tools else None,
            "logprobs": True if self.top_logprobs is not None else None,
            "top_logprobs": self.top_logprobs,
            "service_tier": self.service_tier,
            "prompt_cache_key": self.prompt_cache_key,
            "user": self.user,
            "safety_identifier": self.safety_identifier,
        }
        return {**asked, **{name: value for name, value in given.items() if value is not None}}


# The endpoints a batch's lines may name.
Endpoint = Literal["/v1/chat/completions", "/v1/responses"]


class CreateBatch(_Closed):
    """`POST /v1/batches`: the fields of OpenAI's request that a native batch serves. The file
    must be one this tenant uploaded (purpose batch) with at least one line that can be served."""

    input_file_id: str = Field(max_length=200)
    endpoint: Endpoint
    completion_window: Literal["24h"]
    metadata: OpenAIMetadata | None = None
    webhook_url: OpenAIWebhookUrl | None = None
    mode: BatchMode = Field(
        default="tasks",
        description="llmtasks' own (the SDK's extra_body): 'provider' runs the batch as the"
        " provider's batch job, as POST /batches does; 'tasks', the default, as on-demand calls.",
    )


class CreateUpload(_Closed):
    """`POST /v1/uploads`: a file to send in parts (`expires_after` is refused: files expire with
    the results, ResultRetentionDays). An image or document for tasks holds at most 50 MB."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"properties": {"purpose": {"enum": ["user_data", "vision"]}}, "required": ["purpose"]},
            "then": {"properties": {"bytes": {"maximum": MAX_TASK_FILE_BYTES}}},
        },
    )

    bytes: int = Field(
        ge=1, le=MAX_INPUT_FILE_BYTES, description="The file's size: its parts must add up to it."
    )
    filename: str = Field(min_length=1, max_length=256)
    mime_type: str = Field(max_length=200)
    purpose: Literal["batch", "user_data", "vision"] = Field(
        description="batch: a batch's input; user_data or vision: an image or document (at most"
        " 50 MB) that tasks name by file_id."
    )


class CompleteUpload(_Closed):
    """`POST /v1/uploads/{id}/complete`: the parts, in the file's order."""

    part_ids: list[str] = Field(min_length=1, max_length=10_000)
    md5: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{32}$")


# A task's field names, as OpenAI's request calls them.
_OPENAI_NAMES = {
    "prompt": "input",
    "messages": "input",
    "system": "instructions",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning.effort",
    "response_format": "text.format",
    "logprobs": "top_logprobs",
    "role": "input",
    "content": "input",
}
