"""A run's steps, as its journal keeps them and `GET /tasks/{id}/steps` shows them, and what the
run does next, read from the steps done (nothing here does I/O).

Steps are numbered from 0 in the order they run: first, in a run with MCP servers, one
`mcp_list_tools` step a server (its tools, listed once a run); then a model call `m`, then one step
for each tool call it asked for (`m + 1 + i` for its i-th call), then the next model call. The
numbers follow from the model's answers, so a redelivery that reads the steps done knows each
step's number and never makes a recorded step again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, Field

from llmtasks.domain.llm_request import ChatMessage, LLMRequest, ToolCall
from llmtasks.domain.mcp_servers import McpListedTool
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import OutputMessage, Usage

StepKind = Literal["mcp_list_tools", "model_call", "tool_call"]
ToolSource = Literal["endpoint", "client", "mcp", "unknown"]
# A step event's texts (a call's arguments, a tool's output) at most, in characters: the event
# is a glance at the step; GET /tasks/{id}/steps has them whole.
EVENT_TEXT_CHARS = 1000
# The steps' cursor: the number of the step a page starts at.
STEPS_CURSOR_PATTERN = r"^[1-9][0-9]{0,5}$"


class RunStep(BaseModel):
    """One finished step: a model call with its answer, or a tool call with its output. Written
    once (the journal's put is conditional on the step not existing)."""

    step: int
    type: StepKind
    started_at: float
    ended_at: float
    completion: Completion | None = None  # a model call's
    tool_call: ToolCall | None = None  # a tool call's
    source: ToolSource | None = None
    output: str | None = None
    server_label: str | None = None  # an MCP server's list, or a call of its tool
    tools: list[McpListedTool] | None = None  # an mcp_list_tools step's
    # Where a text too large for the item lives (ResultsBucket): the tool's output, or the
    # model's text; the field itself is then empty until the journal reads it back.
    text_ref: str | None = None


class StepView(BaseModel):
    """A step as `GET /tasks/{id}/steps` shows it."""

    step: int = Field(description="Its place in the run, from 0.")
    type: StepKind
    started_at: datetime
    ended_at: datetime
    output: OutputMessage | None = Field(default=None, description="A model call's message.")
    model: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = Field(default=None, description="A model call's tokens and cost.")
    tool_call: ToolCall | None = Field(default=None, description="A tool call: the call the model made.")
    tool_source: ToolSource | None = Field(
        default=None,
        description="Who answered the call: endpoint (its url), client (tool_outputs), unknown (no"
        " tool has its name).",
    )
    tool_output: str | None = Field(default=None, description="A tool call's output.")
    server_label: str | None = Field(
        default=None, description="The MCP server listed (mcp_list_tools) or called (tool_source mcp)."
    )
    tools: list[McpListedTool] | None = Field(
        default=None, description="An mcp_list_tools step's: the server's tools the model is offered."
    )

    @classmethod
    def of(cls, step: RunStep) -> StepView:
        at = {
            "step": step.step,
            "type": step.type,
            "started_at": datetime.fromtimestamp(step.started_at, tz=UTC),
            "ended_at": datetime.fromtimestamp(step.ended_at, tz=UTC),
        }
        done = step.completion
        if done is not None:
            message = OutputMessage(
                content=done.text or None,
                refusal=done.refusal,
                tool_calls=done.tool_calls,
                reasoning=done.reasoning,
            )
            return cls(
                **at, output=message, model=done.model, finish_reason=done.finish_reason, usage=done.usage
            )
        if step.type == "mcp_list_tools":
            return cls(**at, server_label=step.server_label, tools=step.tools)
        return cls(
            **at,
            tool_call=step.tool_call,
            tool_source=step.source,
            tool_output=step.output,
            server_label=step.server_label,
        )


class StepEvent(BaseModel):
    """A run's step, or its pause for its client, as the task's output stream shows it (a chunk's
    `event`): a model call with its usage, a tool call with who answered it, its arguments and
    its output (both trimmed to EVENT_TEXT_CHARS), or `requires_action` with the calls to answer."""

    type: Literal["mcp_list_tools", "model_call", "tool_call", "requires_action"]
    step: int = Field(description="Its place in the run; requires_action: the model call whose calls wait.")
    server_label: str | None = Field(default=None, description="An MCP server's list, or its tool's call.")
    tools: list[str] | None = Field(default=None, description="mcp_list_tools: the tools the server listed.")
    model: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = Field(default=None, description="A model call's tokens and cost.")
    tool_calls: list[ToolCall] | None = Field(
        default=None,
        description="The calls a model call asked for, or the calls to answer (arguments trimmed).",
    )
    tool_call: ToolCall | None = Field(default=None, description="A tool call's call (arguments trimmed).")
    tool_source: ToolSource | None = None
    tool_output: str | None = Field(default=None, description="A tool call's output (trimmed).")
    tool_error: bool | None = Field(
        default=None, description="A tool call that failed (its output says why)."
    )

    @classmethod
    def of(cls, step: RunStep) -> StepEvent:
        if step.type == "mcp_list_tools":
            names = [tool.name for tool in step.tools or []]
            return cls(type="mcp_list_tools", step=step.step, server_label=step.server_label, tools=names)
        done = step.completion
        if done is not None:
            calls = [_trimmed_call(call) for call in done.tool_calls or []] or None
            return cls(
                type="model_call",
                step=step.step,
                model=done.model,
                finish_reason=done.finish_reason,
                usage=done.usage,
                tool_calls=calls,
            )
        return cls(
            type="tool_call",
            step=step.step,
            tool_call=_trimmed_call(step.tool_call) if step.tool_call else None,
            tool_source=step.source,
            tool_output=trimmed(step.output or ""),
            tool_error=is_tool_error(step),
            server_label=step.server_label,
        )

    @classmethod
    def waiting(cls, calls: list[ToolCall], model_step: int) -> StepEvent:
        return cls(
            type="requires_action", step=model_step, tool_calls=[_trimmed_call(call) for call in calls]
        )


def trimmed(text: str, most: int = EVENT_TEXT_CHARS) -> str:
    """`text`, cut to its first `most` characters (an ellipsis says it was)."""
    return text if len(text) <= most else text[: most - 1] + "\u2026"


def _trimmed_call(call: ToolCall) -> ToolCall:
    arguments = trimmed(call.function.arguments)
    return call.model_copy(update={"function": call.function.model_copy(update={"arguments": arguments})})


def is_tool_error(step: RunStep) -> bool:
    """A tool call that failed: one no tool answers, or one the worker answered with its error
    text (an endpoint that kept failing, a url refused); a client's output is its own."""
    if step.type != "tool_call":
        return False
    return step.source == "unknown" or (step.source != "client" and (step.output or "").startswith("error: "))


class StepList(BaseModel):
    """`GET /tasks/{id}/steps`: a page of the run's steps, in order."""

    steps: list[StepView]
    next_cursor: str | None = Field(
        default=None, description="Pass as `cursor` for the next page; absent on the last page."
    )


# --- what comes next ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CallModel:
    step: int
    model_steps: int  # model calls made before this one


@dataclass(frozen=True)
class CallTools:
    """The calls of model step `model_step` that have no output yet, with their step numbers."""

    model_step: int
    pending: list[tuple[int, ToolCall]]


@dataclass(frozen=True)
class Answer:
    completion: Completion  # the model's last answer, with the usage of every model step summed


Move = CallModel | CallTools | Answer


def next_move(steps: list[RunStep]) -> Move:
    """What the run does next, given the steps done (in order, gaps where a call is unanswered)."""
    models = [step for step in steps if step.completion is not None]
    if not models:  # the first model call comes after the MCP servers' lists, if any
        return CallModel(step=max((step.step for step in steps), default=-1) + 1, model_steps=0)
    last = models[-1]
    calls = last.completion.tool_calls or [] if last.completion else []
    if not calls:
        assert last.completion is not None
        return Answer(last.completion.model_copy(update={"usage": usage_of(steps)}))
    done = {step.step for step in steps}
    pending = [(last.step + 1 + i, call) for i, call in enumerate(calls) if last.step + 1 + i not in done]
    if pending:
        return CallTools(model_step=last.step, pending=pending)
    return CallModel(step=last.step + 1 + len(calls), model_steps=len(models))


def usage_of(steps: list[RunStep]) -> Usage:
    """The usage of every model step, summed."""
    total = Usage()
    for step in steps:
        if step.completion is not None:
            total += step.completion.usage
    return total


def conversation(request: LLMRequest, steps: list[RunStep]) -> LLMRequest:
    """The request a run's next model call sends: the task's, then each step as a message (the
    model's answers as assistant messages, the tools' outputs as tool messages). A tool_choice
    that forces a call holds for the run's first model call only, as OpenAI's Agents SDK resets
    it: forced on every call, the model could never answer and the run would end at max_steps."""
    messages = list(request.messages or [ChatMessage(role="user", content=request.prompt)])
    answered = False
    for step in steps:
        if step.completion is not None:
            done = step.completion
            answered = True
            # An answer with neither text nor calls (a refusal) is still the assistant's turn.
            text = done.text or (None if done.tool_calls else done.refusal or "")
            messages.append(ChatMessage(role="assistant", content=text, tool_calls=done.tool_calls or None))
        elif step.tool_call is not None:
            messages.append(
                ChatMessage(role="tool", tool_call_id=step.tool_call.id, content=step.output or "")
            )
    update: dict[str, object] = {"prompt": None, "messages": messages}
    if answered and request.tool_choice not in (None, "auto", "none"):
        update["tool_choice"] = "auto"
    return request.model_copy(update=update)
