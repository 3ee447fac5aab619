"""Runs with MCP servers: the tools of the test docs server (llmtasks_local.mcp_docs, over
Streamable HTTP on 127.0.0.1) listed once a run and recorded, offered to the mock LLM as functions,
called through the mcp SDK's client, and waiting for the client's approval where it is asked."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from llmtasks.domain.errors import InvalidInput
from llmtasks.domain.llm_request import FunctionCall, LLMRequest, ToolCall
from llmtasks.domain.mcp_servers import (
    McpListedTool,
    McpServer,
    McpUnavailable,
    function_name,
    listed_tools,
)
from llmtasks.domain.models import SubmitTaskRequest, TaskStatus, TaskView
from llmtasks.domain.runs import SubmitToolOutputs
from llmtasks.domain.steps import CallModel, RunStep, StepView, conversation, next_move
from llmtasks.llm.openai import OpenAIChat
from llmtasks.services.mcp_tools import McpTools
from llmtasks.services.webhook_urls import no_lookups
from llmtasks.settings import Settings
from llmtasks.worker.steps import MCP_SERVER_UNAVAILABLE
from llmtasks_local.mcp_docs import serving
from tests.conftest import Aws, RunningMock
from tests.helpers import free_port
from tests.unit.test_runs import ASK_USER, CrashAfter, RunWorker
from tests.unit.test_worker import redelivered

pytestmark = pytest.mark.unit

TOKEN = "s3cret-token"


class CountedMcp(McpTools):
    """The real MCP client, counting the lists it fetches."""

    def __init__(self) -> None:
        super().__init__(allowed_hosts=frozenset({"127.0.0.1"}), resolve=no_lookups, attempts=1)
        self.lists = 0

    async def list_tools(self, server: McpServer) -> list[dict[str, Any]]:
        self.lists += 1
        return await super().list_tools(server)


class McpWorker(RunWorker):
    """The worker with its MCP client and function endpoints real (on 127.0.0.1)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.mcp = CountedMcp()

    def runner_parts(self, llm: Any) -> dict[str, Any]:
        return {"mcp": self.mcp}


@pytest.fixture
def docs() -> Iterator[str]:
    with serving(free_port(), token=TOKEN) as url:
        yield url


@pytest.fixture
def mcp_worker(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> McpWorker:
    overrides = {"retry_base_delay_s": 0.0, "worker_call_slots": 0}
    return McpWorker(aws, handler, settings.model_copy(update=overrides), mock_llm)


def docs_server(url: str, **options: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "docs",
        "server_url": url,
        "headers": {"Authorization": f"Bearer {TOKEN}"},
        **options,
    }


def test_a_run_lists_its_server_once_and_calls_its_tools_through_the_mcp_client(
    mcp_worker: McpWorker, docs: str, mock_llm: RunningMock
) -> None:
    # Given a run whose model calls the docs server's allowed tools in turn, with no approval
    server = docs_server(docs, allowed_tools=["read_document", "list_documents"], require_approval="never")
    task_id = mcp_worker.submit_run("research [mock:agent-steps=2]", [server])
    [message] = mcp_worker.queued()

    # When its worker dies after its first model call, and the message comes again
    real = OpenAIChat(base_url=mcp_worker.llm_url, api_key=None, default_model="mock-model")
    mcp_worker.run([message], llm=CrashAfter(real, 1))
    assert mcp_worker.task(task_id).status is TaskStatus.PROCESSING
    mcp_worker.run([redelivered(message, 2)])

    # Then the run completes, its server's tools listed once, before its first model call
    done = mcp_worker.task(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert mcp_worker.mcp.lists == 1
    assert mock_llm.stats.calls == 3
    steps = mcp_worker.service.runs.steps(done, limit=50, cursor=None).steps
    assert [(s.type, s.tool_source, s.server_label) for s in steps] == [
        ("mcp_list_tools", None, "docs"),
        ("model_call", None, None),
        ("tool_call", "mcp", "docs"),
        ("model_call", None, None),
        ("tool_call", "mcp", "docs"),
        ("model_call", None, None),
    ]
    listed = steps[0].tools or []
    assert [(t.name, t.function_name, t.read_only) for t in listed] == [
        ("read_document", "docs__read_document", True),
        ("list_documents", "docs__list_documents", True),
    ]
    # The model called the functions it was offered; the server answered through the client
    calls = [s.tool_call.function.name for s in steps if s.tool_call]
    assert calls == ["docs__read_document", "docs__list_documents"]
    assert steps[2].tool_output is not None
    assert steps[2].tool_output.startswith("error: ")  # an error result: the mock asked for 'mock'
    assert "No document 'mock'" in steps[2].tool_output
    assert steps[4].tool_output == (
        "queues: Queues between an API and its workers\nretries: Retrying calls to a language model\n"
        "webhooks: Signed webhooks\ncosts: What a serverless task costs\nagents: Agent runs"
    )
    # And the last output reached the model, which quoted it
    assert done.result is not None
    assert "webhooks: Signed webhooks" in done.result


def test_a_call_that_needs_approval_waits_and_runs_once_approved_or_tells_the_model_it_was_denied(
    mcp_worker: McpWorker, docs: str, mock_llm: RunningMock
) -> None:
    # Given a run whose MCP calls all need approval (the default), beside a client function
    task_id = mcp_worker.submit_run("ask first [mock:agent-steps=3]", [ASK_USER, docs_server(docs)])

    # When it runs, the client's function comes first; then the MCP call waits for approval
    mcp_worker.deliver()
    waiting = mcp_worker.task(task_id)
    [asked] = waiting.required_action.tool_calls
    mcp_worker.service.runs.submit_tool_outputs(
        waiting, SubmitToolOutputs(tool_outputs=[{"tool_call_id": asked.id, "output": "go on"}])
    )
    mcp_worker.deliver()
    waiting = mcp_worker.task(task_id)
    assert waiting.status is TaskStatus.REQUIRES_ACTION
    assert waiting.required_action.tool_calls == []
    [request] = waiting.required_action.mcp_approval_requests
    assert (request.type, request.server_label, request.name) == (
        "mcp_approval_request",
        "docs",
        "search_documents",
    )
    assert json.loads(request.arguments) == {"query": "mock"}

    # An answer that is not for the request it waits for is refused
    with pytest.raises(InvalidInput, match="mcp_approvals"):
        mcp_worker.service.runs.submit_tool_outputs(
            waiting, SubmitToolOutputs(mcp_approvals=[{"approval_request_id": "call_x", "approve": True}])
        )

    # When the client approves it, the worker makes the call; the next waits in turn
    approve = SubmitToolOutputs(mcp_approvals=[{"approval_request_id": request.id, "approve": True}])
    assert mcp_worker.service.runs.submit_tool_outputs(waiting, approve).status is TaskStatus.PROCESSING
    mcp_worker.deliver()
    waiting = mcp_worker.task(task_id)
    assert waiting.status is TaskStatus.REQUIRES_ACTION
    [second] = waiting.required_action.mcp_approval_requests
    assert second.name == "read_document"

    # And a denial, with its reason, is the call's output the model reads
    deny = SubmitToolOutputs(
        mcp_approvals=[{"approval_request_id": second.id, "approve": False, "reason": "not that one"}]
    )
    mcp_worker.service.runs.submit_tool_outputs(waiting, deny)
    mcp_worker.deliver()
    done = mcp_worker.task(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert f"{second.id}: denied: the client did not approve this call: not that one" in done.result
    steps = mcp_worker.service.runs.steps(done, limit=50, cursor=None).steps
    assert [(s.type, s.tool_source) for s in steps] == [
        ("mcp_list_tools", None),
        ("model_call", None),
        ("tool_call", "client"),
        ("model_call", None),
        ("tool_call", "mcp"),
        ("model_call", None),
        ("tool_call", "mcp"),
        ("model_call", None),
    ]
    assert steps[4].tool_output is not None
    assert steps[4].tool_output.startswith("No document holds 'mock'")  # the approved call, made
    assert mcp_worker.mcp.lists == 1
    assert mock_llm.stats.calls == 4


def test_a_server_whose_tools_cannot_be_listed_is_tried_again_then_fails_the_run(
    mcp_worker: McpWorker, docs: str, mock_llm: RunningMock
) -> None:
    # Given a server that answers 401 without its token: nothing to list, nothing to call
    server = {"type": "mcp", "server_label": "docs", "server_url": docs}
    task_id = mcp_worker.submit_run("x [mock:agent-steps=1]", [server], max_retries=1)
    # When its first delivery cannot list the tools, the run is tried again, as after a 5xx
    mcp_worker.deliver()
    again = mcp_worker.task(task_id)
    assert again.status is TaskStatus.PENDING
    assert again.last_error_code == MCP_SERVER_UNAVAILABLE
    # Then, its retries spent, it fails before any model call
    mcp_worker.deliver()
    failed = mcp_worker.task(task_id)
    assert failed.status is TaskStatus.FAILED
    assert failed.error_code == MCP_SERVER_UNAVAILABLE
    assert "MCP server 'docs' listed no tools" in failed.error
    assert mock_llm.stats.calls == 0
    assert mcp_worker.mcp.lists == 2


def test_the_headers_go_to_the_server_and_are_never_shown_back(mcp_worker: McpWorker, docs: str) -> None:
    task_id = mcp_worker.submit_run("x", [docs_server(docs)])
    task = mcp_worker.task(task_id)
    assert task.mcp_servers[0].headers == {"Authorization": f"Bearer {TOKEN}"}
    assert TOKEN not in TaskView.of(task).model_dump_json()
    assert TOKEN not in repr(task.mcp_servers[0])
    assert task.is_run
    assert task.max_steps == 20
    assert task.request.tools is None  # the provider sees the server's tools only as functions


def test_a_server_url_must_pass_the_ssrf_guard(mcp_worker: McpWorker) -> None:
    inside = {"type": "mcp", "server_label": "docs", "server_url": "https://10.0.0.1/mcp"}
    with pytest.raises(InvalidInput, match="server_url of MCP server 'docs'"):
        mcp_worker.submit_run("x", [inside])
    tools = McpTools(allowed_hosts=frozenset(), resolve=no_lookups)
    server = McpServer.model_validate({**inside, "server_url": "http://127.0.0.1:9/mcp"})
    with pytest.raises(McpUnavailable, match="must use https"):
        asyncio.run(tools.list_tools(server))
    call = ToolCall(id="call_1", function=FunctionCall(name="docs__x", arguments="{}"))
    assert asyncio.run(tools.call(server, "x", call)).startswith("error: The server_url of MCP server 'docs'")


@pytest.mark.parametrize(
    ("tools", "wrong"),
    [
        ([{"type": "mcp", "server_label": "a__b", "server_url": "https://x.example"}], "server_label"),
        ([{"type": "mcp", "server_label": "_a", "server_url": "https://x.example"}], "server_label"),
        ([{"type": "mcp", "server_label": "a", "server_url": "ftp://x.example"}], "server_url"),
        ([{"type": "mcp", "server_label": "a"}], "server_url"),
        (
            [{"type": "mcp", "server_label": "a", "server_url": "https://x", "connector_id": "c"}],
            "connector_id",
        ),
        (
            [{"type": "mcp", "server_label": "a", "server_url": "https://x", "headers": {"k": "a\r\nb"}}],
            "one line",
        ),
        (
            [{"type": "mcp", "server_label": "a", "server_url": "https://x", "headers": {"k": "\u00e9"}}],
            "printable ASCII",
        ),
        (
            [{"type": "mcp", "server_label": "a", "server_url": "https://x", "headers": {"a b": "v"}}],
            "HTTP token",
        ),
        (
            [
                {
                    "type": "mcp",
                    "server_label": "a",
                    "server_url": "https://x",
                    "require_approval": "sometimes",
                }
            ],
            "require_approval",
        ),
        ([{"type": "mcp", "server_label": "a", "server_url": "https://x"}] * 2, "server_label' once"),
        (
            [
                {"type": "mcp", "server_label": "docs", "server_url": "https://x"},
                {"type": "function", "name": "docs__search", "parameters": {"type": "object"}},
            ],
            "rename it",
        ),
    ],
)
def test_an_mcp_tool_is_refused_with_a_clear_reason(tools: list[dict[str, Any]], wrong: str) -> None:
    with pytest.raises(ValidationError, match=wrong):
        SubmitTaskRequest.model_validate({"prompt": "x", "tools": tools})


def test_tool_choice_beside_mcp_servers_alone_is_refused() -> None:
    server = {"type": "mcp", "server_label": "a", "server_url": "https://x.example"}
    with pytest.raises(ValidationError, match="need a function tool beside MCP servers"):
        SubmitTaskRequest.model_validate({"prompt": "x", "tools": [server], "tool_choice": "required"})
    body = SubmitTaskRequest.model_validate(
        {"prompt": "x", "tools": [server, ASK_USER], "tool_choice": "required"}
    )
    assert [t.function.name for t in body.llm_request().tools or []] == ["ask_user"]
    assert body.run_steps == 20


# --- the rules ----------------------------------------------------------------------------------


def tool(name: str, read_only: bool | None = None) -> McpListedTool:
    return McpListedTool(name=name, function_name=function_name("s", name), read_only=read_only)


def server(**options: Any) -> McpServer:
    return McpServer.model_validate(
        {"type": "mcp", "server_label": "s", "server_url": "https://x", **options}
    )


def test_which_calls_need_approval() -> None:
    assert server().needs_approval(tool("a"))  # OpenAI's default: always
    assert not server(require_approval="never").needs_approval(tool("a"))
    only_always = server(require_approval={"always": {"tool_names": ["write"]}})
    assert only_always.needs_approval(tool("write"))
    assert not only_always.needs_approval(tool("read"))
    only_never = server(require_approval={"never": {"read_only": True}})
    assert not only_never.needs_approval(tool("read", read_only=True))
    assert only_never.needs_approval(tool("write", read_only=False))
    assert only_never.needs_approval(tool("unsure"))


def test_which_tools_are_offered_and_by_what_name() -> None:
    listing = [
        {"name": "search", "description": "finds", "input_schema": {"type": "object"}},
        {"name": "write", "annotations": {"read_only_hint": False}},
        {
            "name": "read.v2",
            "inputSchema": {"type": "object", "properties": {}},
            "annotations": {"readOnlyHint": True},
        },
        {"name": "read/v2"},  # the same function name as read.v2: the first stands
    ]
    offered = listed_tools(server(), listing, room=10)
    assert [(t.name, t.function_name, t.read_only) for t in offered] == [
        ("search", "s__search", None),
        ("write", "s__write", False),
        ("read.v2", "s__read_v2", True),
    ]
    assert [t.name for t in listed_tools(server(allowed_tools=["write", "nope"]), listing, room=10)] == [
        "write"
    ]
    read_only = server(allowed_tools={"read_only": True})
    assert [t.name for t in listed_tools(read_only, listing, room=10)] == ["read.v2"]
    assert [t.name for t in listed_tools(server(), listing, room=1)] == ["search"]
    # A list keeps to its step's room: 100 tools of 5 KB schemas are cut short
    large = {"type": "object", "description": "x" * 5000}
    many = listed_tools(server(), [{"name": f"t{n}", "input_schema": large} for n in range(100)], room=128)
    assert 30 < len(many) < 40
    assert function_name("label", "x" * 100) == ("label__" + "x" * 100)[:64]
    assert offered[0].function_tool().function.model_dump(exclude_none=True) == {
        "name": "s__search",
        "description": "finds",
        "parameters": {"type": "object"},
    }


def test_the_first_model_call_comes_after_the_servers_lists_which_the_model_never_reads() -> None:
    lists = [
        RunStep(step=n, type="mcp_list_tools", started_at=0, ended_at=0, server_label=label, tools=[])
        for n, label in enumerate(["a", "b"])
    ]
    assert next_move(lists) == CallModel(step=2, model_steps=0)
    assert conversation(LLMRequest(prompt="go"), lists).messages is not None
    assert [m.role for m in conversation(LLMRequest(prompt="go"), lists).messages or []] == ["user"]
    view = StepView.of(lists[0])
    assert (view.type, view.server_label, view.tools, view.tool_call) == ("mcp_list_tools", "a", [], None)


def test_an_answer_gives_outputs_approvals_or_both_each_once() -> None:
    with pytest.raises(ValidationError, match="give tool_outputs, mcp_approvals or both"):
        SubmitToolOutputs.model_validate({})
    twice = [{"approval_request_id": "c", "approve": True}] * 2
    with pytest.raises(ValidationError, match="approval_request_id once"):
        SubmitToolOutputs.model_validate({"mcp_approvals": twice})
    with pytest.raises(ValidationError, match="approve"):
        SubmitToolOutputs.model_validate({"mcp_approvals": [{"approval_request_id": "c", "approve": "yes"}]})


def test_no_function_imports_the_mcp_sdk_until_a_run_calls_a_server() -> None:
    # The API's cold start matters, and only the worker's MCP calls need the SDK
    probe = (
        "import sys, llmtasks.wiring.api, llmtasks.wiring.worker;"
        " print(sorted({'mcp', 'httpx2'} & set(sys.modules)))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert shown.stdout.strip() == "[]"
