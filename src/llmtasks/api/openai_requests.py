"""The request bodies of OpenAI's API that llmtasks serves (`POST /v1/responses`, and the lines
of a batch's input file), validated as closed models: every field OpenAI has that a task cannot
serve is refused by name. Both the responses routes (openai.py) and the batches
(openai_batches.py) read them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, WithJsonSchema

from llmtasks.domain.batches import MAX_INPUT_FILE_BYTES
from llmtasks.domain.errors import InvalidInput
from llmtasks.domain.fields import MaxTokens, Temperature, WebhookUrl
from llmtasks.domain.input_files import MAX_TASK_FILE_BYTES
from llmtasks.domain.llm_request import ChatMessage
from llmtasks.domain.models import WEBHOOK_URL_RULE, SubmitTaskRequest

# OpenAI's metadata: up to 16 string values.
OpenAIMetadata = Annotated[
    dict[str, str],
    Field(max_length=16),
    WithJsonSchema({"type": "object", "additionalProperties": {"type": "string"}, "maxProperties": 16}),
]
# llmtasks' extension (the SDK's extra_body): where OpenAI's webhook events go.
OpenAIWebhookUrl = Annotated[WebhookUrl, Field(description=WEBHOOK_URL_RULE)]
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class _Closed(BaseModel):
    # Every field OpenAI has that a task cannot serve is refused, by name.
    model_config = ConfigDict(extra="forbid")


class InputText(_Closed):
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None  # on an earlier response's output_text: ignored


class InputMessage(_Closed):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: Annotated[str, Field(min_length=1)] | Annotated[list[InputText], Field(min_length=1)]
    id: str | None = None  # an earlier response's output message, sent back as history
    status: str | None = None

    def chat(self) -> ChatMessage:
        text = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return ChatMessage(role=_ROLES[self.role], content=text)


class CreateResponse(_Closed):
    """`POST /v1/responses`: the fields of OpenAI's request that map onto a task.

    The document says background must be true and store must not be false (the validation below
    answers either with a sentence that says why), and holds the task's own bounds."""

    model_config = ConfigDict(json_schema_extra={"required": ["input", "background"]})

    model: str | None = Field(default=None, max_length=200)
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputMessage], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    metadata: OpenAIMetadata | None = None
    background: Annotated[StrictBool | None, WithJsonSchema({"type": "boolean", "const": True})] = None
    store: Annotated[
        StrictBool | None, WithJsonSchema({"anyOf": [{"type": "boolean", "const": True}, {"type": "null"}]})
    ] = None
    webhook_url: OpenAIWebhookUrl | None = None
    # The reply: the response's events (text/event-stream), a segment of up to 25 s, instead of
    # the Response object; read on with GET /v1/responses/{id}?stream=true&starting_after=N.
    stream: StrictBool | None = None

    def task_request(self) -> SubmitTaskRequest:
        if not self.background:
            raise InvalidInput(
                "llmtasks serves background responses only: send background=true and poll"
                " responses.retrieve, or call the native API (POST /tasks with ?wait= on GET /tasks/{id})",
                field="background",
            )
        if self.store is False:
            raise InvalidInput("a background response is stored: store=false cannot be served", field="store")
        try:
            asked: dict[str, Any] = (
                {"prompt": self.input}
                if isinstance(self.input, str)
                else {"messages": [message.chat() for message in self.input]}
            )
            return SubmitTaskRequest(
                **asked,
                model=self.model,
                system=self.instructions,
                max_tokens=self.max_output_tokens,
                temperature=self.temperature,
                metadata=self.metadata,
                webhook_url=self.webhook_url,
                webhook_format="openai" if self.webhook_url else None,
            )
        except ValidationError as invalid:
            # A value OpenAI's schema allows that a task's does not (an empty model, a lone
            # surrogate): refused under OpenAI's name for the field.
            first = invalid.errors()[0]
            where = [str(part) for part in first.get("loc", ())]
            field = ".".join([_OPENAI_NAMES.get(where[0], where[0]), *where[1:]]) if where else "input"
            raise InvalidInput(f"Invalid '{field}': {first.get('msg', 'invalid')}.", field=field) from None


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
    "role": "input",
    "content": "input",
}
