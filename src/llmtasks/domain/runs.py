"""A run's request-side vocabulary: the tools a task body may give with an endpoint, its step cap,
the calls a waiting run asks its client to answer and the answers (steps.py has the steps;
mcp_servers.py the MCP servers').

A task is a run when its body gives tools: the worker then loops (the model, the tool calls it
asks for, their outputs back, the model again) until the model answers with no call. A tool with
a `url` is called by the worker; one without is the client's; an MCP server's are called by the
worker, after the client's approval where it is asked.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from llmtasks.domain.fields import Strict, Text, WebhookUrl, not_a_bool
from llmtasks.domain.llm_request import FunctionTool, ToolCall
from llmtasks.domain.mcp_servers import McpApproval, McpApprovalRequest

DEFAULT_MAX_STEPS = 20
# error_code of a run whose model asked for more steps than its max_steps.
MAX_STEPS_EXCEEDED = "max_steps_exceeded"
# Model steps a run may take: each is a billed call, and its steps' items are read together.
MaxSteps = Annotated[int, Field(ge=1, le=100), BeforeValidator(not_a_bool)]
# A client's tool output, kept whole in its step's item (the API writes no step text to S3).
MAX_CLIENT_OUTPUT_BYTES = 100_000
TOOL_URL_RULE = (
    "https, and its host must resolve to public addresses only (a host of the deployment's"
    " WEBHOOK_ALLOWED_HOSTS may be anything, over http too); refused with 422 otherwise."
)


class EndpointTool(FunctionTool):
    """A function tool of a task body: with a `url` (llmtasks' extension) the worker calls it."""

    url: WebhookUrl | None = Field(
        default=None,
        description="llmtasks' extension: the worker POSTs each call's arguments (JSON) here, signed"
        " as webhooks are (the tenant's secret), and the answer's body is the call's output; the task"
        " is then a run. " + TOOL_URL_RULE,
    )

    @model_validator(mode="before")
    @classmethod
    def _from_a_tool(cls, data: Any) -> Any:
        """A request's tool, as /v1/responses maps its own onto a task body."""
        return data.model_dump(exclude_none=True) if isinstance(data, FunctionTool) else data


class RequiredAction(BaseModel):
    """What a run in `requires_action` waits for: the outputs of these calls of the client's
    functions, and the client's approval of these calls of MCP tools (POST /tasks/{id}/tool_outputs)."""

    type: Literal["submit_tool_outputs"] = "submit_tool_outputs"
    tool_calls: list[ToolCall]
    mcp_approval_requests: list[McpApprovalRequest] | None = Field(
        default=None, description="Calls of MCP tools that wait for the client's approval."
    )


class ToolOutput(Strict):
    tool_call_id: Text = Field(min_length=1, max_length=256, description="The call it answers.")
    output: Text = Field(
        max_length=MAX_CLIENT_OUTPUT_BYTES,
        description=f"The call's output, as the model reads it: up to {MAX_CLIENT_OUTPUT_BYTES:,} bytes"
        " of UTF-8 (422 past them).",
    )


class SubmitToolOutputs(Strict):
    """`POST /tasks/{id}/tool_outputs`: an output for each call `required_action.tool_calls` lists,
    and an approval (or denial) of each of its `mcp_approval_requests`."""

    tool_outputs: Annotated[list[ToolOutput], Field(max_length=128)] = Field(default_factory=list)
    mcp_approvals: Annotated[list[McpApproval], Field(max_length=128)] = Field(
        default_factory=list,
        description="OpenAI's mcp_approval_response: `approve` true runs the call, false gives the"
        " model a denial (with `reason`) as its output.",
    )

    @model_validator(mode="after")
    def _once_each(self) -> SubmitToolOutputs:
        if not self.tool_outputs and not self.mcp_approvals:
            raise ValueError("give tool_outputs, mcp_approvals or both")
        ids = [given.tool_call_id for given in self.tool_outputs]
        if len(set(ids)) != len(ids):
            raise ValueError("each tool_call_id once")
        approved = [given.approval_request_id for given in self.mcp_approvals]
        if len(set(approved)) != len(approved):
            raise ValueError("each approval_request_id once")
        return self
