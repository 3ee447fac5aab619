"""Amazon Bedrock through boto3's Converse API (one request shape for every Bedrock model).

The Chat Completions request maps onto Converse: images and documents (data URLs) as their
bytes, tool calls and results as toolUse and toolResult blocks, tools as toolConfig, a
json_schema format as a forced tool whose input is the answer (json_object as an instruction),
reasoning_effort as Claude's thinking budget, stop, top_p and the token limit as inferenceConfig.
What a model cannot take is refused by domain.bedrock_models, at submit and again here.

Errors are classified by the HTTP status Bedrock documents for each, by the same rule as the
OpenAI-compatible provider: throttling (429), timeouts (408) and service errors (5xx) are
transient; validation (400), access (403), unknown models (404) and model errors (424) fail the
task at once. botocore's own retries are off: the task's retries, with their backoff and
Retry-After, are the one retry policy.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, ReadTimeoutError

from llmtasks.domain.bedrock_models import (
    ANSWER_TOKENS,
    BEDROCK_TIERS,
    IMAGE_FORMATS,
    METADATA_FIELDS,
    Refusal,
    check_request,
    document_format,
    thinking_budget,
)
from llmtasks.domain.errors import LLMError
from llmtasks.domain.llm_request import (
    AudioPart,
    ChatMessage,
    FilePart,
    FunctionCall,
    ImagePart,
    JsonObjectFormat,
    JsonSchemaFormat,
    LLMRequest,
    NamedToolChoice,
    TextPart,
    ToolCall,
    data_url_parts,
)
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import Usage
from llmtasks.llm import OnProgress, http_error_code, is_transient_status

if TYPE_CHECKING:
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient


# A task whose request its model cannot take (the submit refuses the same; this is for a task
# submitted before the stack changed its model).
UNSUPPORTED = "llm_unsupported_input"
JSON_OBJECT_INSTRUCTION = "Answer with one JSON object and nothing else: no prose, no code fence."
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "content_filtered": "content_filter",
    "guardrail_intervened": "content_filter",
}


def bedrock_client(*, timeout_s: float) -> BedrockRuntimeClient:
    from botocore.config import Config

    from llmtasks.aws.clients import new_client

    config = Config(read_timeout=timeout_s, retries={"total_max_attempts": 1, "mode": "standard"})
    client: BedrockRuntimeClient = new_client("bedrock-runtime", config)
    return client


def converse_request(request: LLMRequest, default_model: str) -> dict[str, Any]:
    """Converse's arguments for `request`, or LLMError when its model cannot take it (the
    submit refuses the same: domain.bedrock_models)."""
    model = request.model or default_model
    try:
        check_request(request, model)
    except Refusal as refused:
        raise LLMError(
            f"{refused.field}: {refused.why} (Bedrock model {model}).", code=UNSUPPORTED, transient=False
        ) from None
    budget = thinking_budget(request)
    body: dict[str, Any] = {
        "modelId": model,
        "messages": _Messages().of(request),
        "system": _system(request),
        "inferenceConfig": _inference_config(request, budget),
        "requestMetadata": {
            name: getattr(request, name) for name in METADATA_FIELDS if getattr(request, name)
        },
    }
    body["toolConfig"] = _tool_config(request, body["messages"])
    if request.service_tier in BEDROCK_TIERS:
        body["serviceTier"] = {"type": request.service_tier}
    if budget is not None:
        body["additionalModelRequestFields"] = {"thinking": {"type": "enabled", "budget_tokens": budget}}
    return {name: value for name, value in body.items() if value or name == "messages"}


def _system(request: LLMRequest) -> list[dict[str, Any]]:
    """The system prompt, then the conversation's system and developer messages."""
    system = [{"text": m.text()} for m in request.messages or [] if m.role in ("system", "developer")]
    if request.system:
        system.insert(0, {"text": request.system})
    if isinstance(request.response_format, JsonObjectFormat):
        # Converse has no JSON mode: the model is told, and the worker checks the answer.
        system.append({"text": JSON_OBJECT_INSTRUCTION})
    return system


def _inference_config(request: LLMRequest, budget: int | None) -> dict[str, Any]:
    inference: dict[str, Any] = {}
    limit = request.output_limit
    if limit is None and budget is not None:
        limit = budget + ANSWER_TOKENS  # maxTokens must exceed the thinking budget
    if limit is not None:
        inference["maxTokens"] = limit
    if request.temperature is not None:
        inference["temperature"] = request.temperature
    if request.top_p is not None:
        inference["topP"] = request.top_p
    if request.stop is not None:
        inference["stopSequences"] = [request.stop] if isinstance(request.stop, str) else request.stop
    return inference


class _Messages:
    """A conversation as Converse's messages: system prompts apart (in `system`), tool results
    as the user's, and consecutive messages of one role joined (Converse alternates roles)."""

    def __init__(self) -> None:
        self._documents: set[str] = set()

    def of(self, request: LLMRequest) -> list[dict[str, Any]]:
        chat = request.messages or [ChatMessage(role="user", content=request.prompt)]
        messages: list[dict[str, Any]] = []
        for message in chat:
            if message.role in ("system", "developer"):
                continue
            role = "assistant" if message.role == "assistant" else "user"
            blocks = self._blocks(message)
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].extend(blocks)
            elif blocks:
                messages.append({"role": role, "content": blocks})
        return messages

    def _blocks(self, message: ChatMessage) -> list[dict[str, Any]]:
        if message.role == "tool":
            text = message.text()
            result = {"toolUseId": message.tool_call_id, "content": [{"text": text}] if text else []}
            return [{"toolResult": result}]
        blocks = [self._block(part) for part in message.parts()]
        if message.refusal:
            blocks.append({"text": message.refusal})
        for call in message.tool_calls or []:
            use = {
                "toolUseId": call.id,
                "name": call.function.name,
                "input": json.loads(call.function.arguments),
            }
            blocks.append({"toolUse": use})
        return [block for block in blocks if block.get("text", True)]  # Converse refuses empty text

    def _block(self, part: TextPart | ImagePart | FilePart | AudioPart) -> dict[str, Any]:
        if isinstance(part, TextPart):
            return {"text": part.text}
        if isinstance(part, ImagePart) and part.image_url.url is not None:
            mime, data = data_url_parts(part.image_url.url) or ("", "")
            image = {"format": IMAGE_FORMATS[mime], "source": {"bytes": base64.b64decode(data)}}
            return {"image": image}
        if isinstance(part, FilePart) and part.file.file_data is not None:
            parts = data_url_parts(part.file.file_data)
            document = {
                "format": document_format(part.file),
                "name": self._name(part.file.filename),
                "source": {"bytes": base64.b64decode(parts[1] if parts else part.file.file_data)},
            }
            return {"document": document}
        # The worker puts uploaded files' bytes in their place before the call; audio is refused.
        raise LLMError("A file part reached Bedrock without its bytes.", code=UNSUPPORTED, transient=False)

    def _name(self, filename: str | None) -> str:
        """A document's name as Converse takes it (letters, digits, single spaces, hyphens,
        parentheses, brackets), unique within the request."""
        stem = (filename or "").rsplit(".", 1)[0]
        name = re.sub(r"\s+", " ", re.sub(r"[^A-Za-z0-9\s()\[\]-]", "-", stem)).strip() or "document"
        unique, n = name[:200], 1
        while unique in self._documents:
            n += 1
            unique = f"{name[:190]} ({n})"
        self._documents.add(unique)
        return unique


def _tool_config(request: LLMRequest, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """toolConfig: the request's tools (none with tool_choice none), and a tool named after a
    json_schema format, forced, whose input is the answer."""
    tools = [
        _tool_spec(t.function.name, t.function.description, t.function.parameters or {"type": "object"})
        for t in request.tools or []
    ]
    choice = request.tool_choice
    history = {block["toolUse"]["name"] for m in messages for block in m["content"] if "toolUse" in block}
    if choice == "none" and not history:
        tools = []
    # Converse needs the tools a history's calls name: those the request does not carry, bare.
    tools += [_tool_spec(name, None, {"type": "object"}) for name in sorted(history - set(_names(tools)))]
    schema = request.response_format
    if isinstance(schema, JsonSchemaFormat):
        spec = schema.json_schema
        description = spec.description or "Give the answer as this tool's input."
        forced: dict[str, Any] = {"tool": {"name": spec.name}}
        if isinstance(choice, NamedToolChoice):
            forced = {"tool": {"name": choice.function.name}}
        elif tools and choice != "none":
            forced = {"any": {}}  # a tool call, or the answer
        return {"tools": [*tools, _tool_spec(spec.name, description, spec.json_schema)], "toolChoice": forced}
    if not tools:
        return None
    config: dict[str, Any] = {"tools": tools}
    if choice == "required":
        config["toolChoice"] = {"any": {}}
    elif isinstance(choice, NamedToolChoice):
        config["toolChoice"] = {"tool": {"name": choice.function.name}}
    elif choice == "auto":
        config["toolChoice"] = {"auto": {}}
    return config


def _tool_spec(name: str, description: str | None, schema: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "inputSchema": {"json": schema}}
    if description:
        spec["description"] = description
    return {"toolSpec": spec}


def _names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool["toolSpec"]["name"] for tool in tools]


class BedrockConverse:
    def __init__(self, *, default_model: str, client: BedrockRuntimeClient) -> None:
        self._default_model = default_model
        self._client = client

    async def complete(
        self,
        request: LLMRequest,
        *,
        timeout_s: float,
        on_progress: OnProgress | None = None,
        tokens: int = 0,  # Bedrock's quotas are per model and account: nothing to reserve per key
    ) -> Completion:
        arguments = converse_request(request, self._default_model)
        loop = asyncio.get_running_loop()
        try:
            # boto3 blocks: in a thread, so the other records of the batch keep their calls going.
            async with asyncio.timeout(timeout_s):
                if on_progress is None:
                    reply: Any = await asyncio.to_thread(self._client.converse, **arguments)
                else:
                    reply = await asyncio.to_thread(
                        self._stream, arguments, answer_tool(request), on_progress, loop
                    )
        except (TimeoutError, ReadTimeoutError, ConnectTimeoutError) as exc:
            raise LLMError(
                f"Bedrock did not answer within {timeout_s:.0f} s.", code="llm_timeout", transient=True
            ) from exc
        except ClientError as exc:
            error = exc.response.get("Error", {})
            status = self._status_of(exc)
            raise LLMError(
                f"Bedrock answered {status} {error.get('Code', '')}: {error.get('Message', '')[:500]}",
                code=http_error_code(status),
                transient=is_transient_status(status),
            ) from exc
        except BotoCoreError as exc:  # the endpoint could not be reached, or the connection broke
            raise LLMError(
                f"Bedrock could not be reached ({type(exc).__name__}).",
                code="llm_unreachable",
                transient=True,
            ) from exc
        return converse_completion(reply, arguments["modelId"], answer_tool(request))

    def _stream(
        self,
        arguments: dict[str, Any],
        answer: str | None,
        on_progress: OnProgress,
        loop: asyncio.AbstractEventLoop,
    ) -> dict[str, Any]:
        """ConverseStream, read to its end in this thread; each delta of the answer (its text,
        or a schema tool's input) is reported on the caller's loop. Returns what Converse would
        have."""
        reply = _StreamedReply(answer)
        stream: Any = self._client.converse_stream(**arguments)["stream"]
        for event in stream:
            shown = reply.add(event)
            if shown:
                asyncio.run_coroutine_threadsafe(on_progress(*shown), loop).result()
        return reply.converse()

    def _status_of(self, exc: ClientError) -> int:
        """The HTTP status of an error: its reply's, or for an error inside an event stream (which
        arrives with a 200), the one Bedrock documents for that error."""
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        if status >= 400:
            return status
        code = str(exc.response.get("Error", {}).get("Code", ""))
        try:
            shape = self._client.meta.service_model.shape_for(code[:1].upper() + code[1:])
        except Exception:
            return 500
        return int(shape.metadata.get("error", {}).get("httpStatusCode", 500))


def converse_completion(reply: Any, model: str, answer: str | None) -> Completion:
    """A Converse reply as a Completion (`answer`: the json_schema tool whose input is the
    answer); LLMError when it holds no answer. A batch job's modelOutput is read the same way."""
    blocks = reply.get("output", {}).get("message", {}).get("content", [])
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    answered = False
    for block in blocks:
        if "text" in block:
            texts.append(block["text"])
        elif "reasoningContent" in block:
            reasoning.append(block["reasoningContent"].get("reasoningText", {}).get("text", ""))
        elif "toolUse" in block:
            use = block["toolUse"]
            if use["name"] == answer:  # a json_schema's answer: the tool's input
                texts, answered = [json.dumps(use.get("input", {}))], True
                break
            arguments_text = json.dumps(use.get("input", {}))
            calls.append(
                ToolCall(
                    id=use["toolUseId"], function=FunctionCall(name=use["name"], arguments=arguments_text)
                )
            )
    if not answered and not texts and not calls:
        raise LLMError("Bedrock's reply has no text.", code="llm_invalid_reply", transient=False)
    usage = reply.get("usage", {})
    stop = reply.get("stopReason")
    finish = "stop" if answered else FINISH_REASONS.get(stop, stop) if stop else None
    return Completion(
        text="".join(texts),
        model=model,
        # Converse counts cache reads apart from inputTokens; Usage has them inside the
        # prompt's tokens, as OpenAI does, so that one price rule serves both.
        usage=Usage(
            prompt_tokens=usage.get("inputTokens", 0) + usage.get("cacheReadInputTokens", 0),
            completion_tokens=usage.get("outputTokens", 0),
            total_tokens=usage.get("totalTokens", 0),
            cached_tokens=usage.get("cacheReadInputTokens", 0),
            service_tier=(reply.get("serviceTier") or {}).get("type"),  # the tier that served it
        ),
        finish_reason=finish,
        tool_calls=None if answered else calls or None,
        reasoning="".join(reasoning) or None,
    )


class _StreamedReply:
    """ConverseStream's events put together: content blocks by index (a tool call's input
    arrives as pieces of JSON text), the stop reason, the usage."""

    def __init__(self, answer: str | None) -> None:
        self._answer = answer
        self._blocks: dict[int, dict[str, Any]] = {}
        self._shown: list[str] = []
        self._reply: dict[str, Any] = {"usage": {}}

    def add(self, event: dict[str, Any]) -> tuple[str, int] | None:
        """Takes one event; returns the answer so far and its pieces when the event added to it."""
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = start.get("start", {}).get("toolUse")
            if use is not None:
                self._blocks[start["contentBlockIndex"]] = {"toolUse": dict(use), "input": []}
        elif "contentBlockDelta" in event:
            return self._delta(event["contentBlockDelta"])
        elif "messageStop" in event:
            self._reply["stopReason"] = event["messageStop"].get("stopReason")
        elif "metadata" in event:
            self._reply["usage"] = event["metadata"].get("usage", {})
            if "serviceTier" in event["metadata"]:
                self._reply["serviceTier"] = event["metadata"]["serviceTier"]
        return None

    def _delta(self, event: dict[str, Any]) -> tuple[str, int] | None:
        block, delta = self._blocks.setdefault(event["contentBlockIndex"], {}), event["delta"]
        if "reasoningContent" in delta:
            block["reasoning"] = block.get("reasoning", "") + delta["reasoningContent"].get("text", "")
            return None
        if "toolUse" in delta and "toolUse" in block:
            piece = delta["toolUse"].get("input", "")
            block["input"].append(piece)
            if block["toolUse"].get("name") != self._answer:
                return None
        else:
            piece = delta.get("text", "")
            block["text"] = block.get("text", "") + piece
        if not piece:
            return None
        self._shown.append(piece)
        return "".join(self._shown), len(self._shown)

    def converse(self) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        for _, block in sorted(self._blocks.items()):
            if "toolUse" in block:
                raw = "".join(block["input"])
                try:
                    tool_input = json.loads(raw) if raw else {}
                except ValueError as exc:
                    raise LLMError(
                        "Bedrock streamed a tool call whose input is not JSON.",
                        code="llm_invalid_reply",
                        transient=False,
                    ) from exc
                content.append({"toolUse": {**block["toolUse"], "input": tool_input}})
            elif "reasoning" in block:
                content.append({"reasoningContent": {"reasoningText": {"text": block["reasoning"]}}})
            elif "text" in block:
                content.append({"text": block["text"]})
        return {**self._reply, "output": {"message": {"role": "assistant", "content": content}}}


def answer_tool(request: LLMRequest) -> str | None:
    """The tool whose input is the answer: a json_schema format's, named after the schema."""
    form = request.response_format
    return form.json_schema.name if isinstance(form, JsonSchemaFormat) else None
