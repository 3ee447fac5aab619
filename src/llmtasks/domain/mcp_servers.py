"""A run's MCP servers: the task body's `{"type": "mcp", ...}` tool (OpenAI Responses' shape), the
tools a server listed, and the rules that pick which of them the model is offered, under which
function name, and which calls wait for the client's approval (nothing here does I/O).

The model sees a server's tool as a function named `<server_label>__<tool name>` (characters a
function name cannot hold become `_`, cut at 64): a label holds no `__`, so the prefix names one
server, and a task's own functions may not start with it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, JsonValue, StrictBool, field_validator

from llmtasks.domain.fields import FreeJson, Strict, Text, WebhookUrl
from llmtasks.domain.llm_request import FunctionDefinition, FunctionTool

SEPARATOR = "__"
# Letters, digits and `-`, words joined by single `_`s: `docs`, `search-api`, `team_wiki`.
SERVER_LABEL_PATTERN = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"
MAX_FUNCTION_NAME = 64
# A header's name is an HTTP token; its value one line of printable ASCII.
HEADER_NAME_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$"
HEADER_VALUE_PATTERN = r"^[\t\x20-\x7e]*$"
MAX_HEADERS = 32
MAX_HEADER_VALUE = 8192
# The headers' rules in the document (the validator says what is wrong in words).
HEADERS_SCHEMA: dict[str, JsonValue] = {
    "maxProperties": MAX_HEADERS,
    "propertyNames": {"pattern": HEADER_NAME_PATTERN},
    "additionalProperties": {
        "type": "string",
        "maxLength": MAX_HEADER_VALUE,
        "pattern": HEADER_VALUE_PATTERN,
    },
}
# What the model may be offered in all (a request's tools, as llm_request.LLMRequest caps them).
MAX_OFFERED_TOOLS = 128
MAX_DESCRIPTION_CHARS = 4096
# What one server's list may take in its step's item (which holds 400 KB): past it, its later
# tools are not offered.
MAX_LISTED_BYTES = 200_000
DENIED = "denied: the client did not approve this call"
MCP_SERVER_RULE = (
    "https, and its host must resolve to public addresses only (a host of the deployment's"
    " WEBHOOK_ALLOWED_HOSTS may be anything, over http too); refused with 422 otherwise."
)

ToolNames = Annotated[list[Annotated[Text, Field(min_length=1, max_length=256)]], Field(max_length=256)]


class McpToolFilter(Strict):
    """Tools of a server, by name and/or by their read-only hint (both must hold when given)."""

    tool_names: ToolNames | None = None
    read_only: StrictBool | None = Field(
        default=None, description="Tools whose annotations say readOnlyHint (true) or not (false)."
    )

    def matches(self, tool: McpListedTool) -> bool:
        named = self.tool_names is None or tool.name in self.tool_names
        return named and (self.read_only is None or bool(tool.read_only) is self.read_only)


class McpApprovalFilter(Strict):
    """`require_approval`'s object form: the tools under `always` wait for approval, those under
    `never` do not; any other waits when `never` is given, and runs when only `always` is."""

    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


class McpServer(Strict):
    """A task body's MCP server tool: the worker lists its tools once a run (Streamable HTTP) and
    calls them for the model."""

    type: Literal["mcp"]
    server_label: Annotated[str, Field(min_length=1, max_length=32, pattern=SERVER_LABEL_PATTERN)] = Field(
        description="Names the server in the steps and in the functions the model sees"
        " (`<server_label>__<tool>`); unique among the task's servers, with no `__`."
    )
    server_url: WebhookUrl = Field(description="The server's Streamable HTTP endpoint. " + MCP_SERVER_RULE)
    headers: dict[str, str] | None = Field(
        default=None,
        repr=False,
        description="Sent with every request to the server (an Authorization header, a key); never"
        " shown back.",
        json_schema_extra=HEADERS_SCHEMA,
    )
    allowed_tools: ToolNames | McpToolFilter | None = Field(
        default=None, description="The server's tools the model may call (default: all it lists)."
    )
    require_approval: Literal["always", "never"] | McpApprovalFilter = Field(
        default="always",
        description="Which calls wait in requires_action for the client's approval (default: all,"
        " as at OpenAI).",
    )

    @field_validator("headers")
    @classmethod
    def _headers(cls, headers: dict[str, str] | None) -> dict[str, str] | None:
        if headers is None:
            return None
        if len(headers) > MAX_HEADERS:
            raise ValueError(f"at most {MAX_HEADERS} headers")
        for name, value in headers.items():
            if not re.fullmatch(HEADER_NAME_PATTERN, name):
                raise ValueError(f"header name {name[:64]!r} is not an HTTP token")
            if len(value) > MAX_HEADER_VALUE or not re.fullmatch(HEADER_VALUE_PATTERN, value):
                raise ValueError(
                    f"header {name!r}: one line of printable ASCII, at most {MAX_HEADER_VALUE} characters"
                )
        return headers

    def allows(self, tool: McpListedTool) -> bool:
        allowed = self.allowed_tools
        if allowed is None:
            return True
        if isinstance(allowed, McpToolFilter):
            return allowed.matches(tool)
        return tool.name in allowed

    def needs_approval(self, tool: McpListedTool) -> bool:
        rule = self.require_approval
        if isinstance(rule, str):
            return rule == "always"
        if rule.never is not None and rule.never.matches(tool):
            return False
        if rule.always is not None and rule.always.matches(tool):
            return True
        return rule.never is not None


class McpListedTool(BaseModel):
    """A tool a server listed (as its `mcp_list_tools` step keeps it), with the function name the
    model sees it by."""

    name: str
    function_name: str = Field(description="The function the model calls: `<server_label>__<name>`.")
    description: str | None = None
    input_schema: FreeJson = Field(default_factory=lambda: {"type": "object"})
    read_only: bool | None = Field(default=None, description="The tool's readOnlyHint annotation.")

    def function_tool(self) -> FunctionTool:
        return FunctionTool(
            type="function",
            function=FunctionDefinition(
                name=self.function_name, description=self.description, parameters=self.input_schema
            ),
        )


def function_name(server_label: str, tool_name: str) -> str:
    """The function a server's tool is offered as: `<label>__<tool>`, cut to a function name."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", tool_name)
    return f"{server_label}{SEPARATOR}{safe}"[:MAX_FUNCTION_NAME]


def listed_tools(server: McpServer, tools: list[dict[str, Any]], *, room: int) -> list[McpListedTool]:
    """The tools of a server's listing (name, description, inputSchema, annotations) that the model
    is offered: those `allowed_tools` lets through, each under a function name no earlier one
    has, at most `room` of them and MAX_LISTED_BYTES of JSON."""
    offered: list[McpListedTool] = []
    names: set[str] = set()
    size = 0
    for given in tools:
        annotations = given.get("annotations") or {}
        schema = given.get("input_schema") or given.get("inputSchema") or {"type": "object"}
        tool = McpListedTool(
            name=str(given["name"]),
            function_name=function_name(server.server_label, str(given["name"])),
            description=(given.get("description") or "")[:MAX_DESCRIPTION_CHARS] or None,
            input_schema=schema,
            read_only=annotations.get("read_only_hint", annotations.get("readOnlyHint")),
        )
        if tool.function_name in names or not server.allows(tool):
            continue
        size += len(tool.model_dump_json().encode())
        if len(offered) >= room or size > MAX_LISTED_BYTES:
            break
        names.add(tool.function_name)
        offered.append(tool)
    return offered


class McpUnavailable(Exception):
    """A server's tools could not be listed: a connection or protocol error (`transient`: the run
    is tried again as after a transient LLM error), or a URL the SSRF guard refuses; then the run
    fails `mcp_server_unavailable`."""

    def __init__(self, detail: str, *, transient: bool = True) -> None:
        super().__init__(detail)
        self.detail = detail
        self.transient = transient


class McpApprovalRequest(BaseModel):
    """A call of an MCP tool that waits for the client's approval (OpenAI's mcp_approval_request)."""

    id: str = Field(description="The call's id: answer it as `approval_request_id`.")
    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    server_label: str
    name: str = Field(description="The server's tool.")
    arguments: str = Field(description="The arguments the model wrote: JSON text.")


class McpApproval(Strict):
    """The client's answer to an approval request (OpenAI's mcp_approval_response)."""

    approval_request_id: Text = Field(min_length=1, max_length=256)
    approve: StrictBool
    reason: Text | None = Field(default=None, max_length=1000, description="Told to the model with a denial.")

    def denial(self) -> str:
        """The call's output when denied."""
        return DENIED + (f": {self.reason}" if self.reason else "")
