"""A run with an MCP server on the local stack: the test docs server (llmtasks_local.mcp_docs) on
127.0.0.1 over Streamable HTTP, its tools listed once and recorded, one called freely and one only
after the client's approval, given through the SDK."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import llmtasks_client
from llmtasks_local.mcp_docs import serving
from tests.e2e.conftest import RunningStack
from tests.helpers import HANG_S, free_port

pytestmark = pytest.mark.e2e

TOKEN = "e2e-docs-token"


@pytest.fixture
def docs() -> Iterator[str]:
    with serving(free_port(), token=TOKEN) as url:
        yield url


def test_a_run_calls_an_mcp_server_s_tools_and_waits_for_approval_where_asked(
    fresh_mock: RunningStack, docs: str
) -> None:
    server = {
        "type": "mcp",
        "server_label": "docs",
        "server_url": docs,
        "headers": {"Authorization": f"Bearer {TOKEN}"},
        "allowed_tools": ["list_documents", "read_document"],
        # read_document waits for the client's approval; list_documents runs at once
        "require_approval": {"never": {"tool_names": ["list_documents"]}},
    }
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        # Given a run whose model calls read_document, then list_documents (the server's order),
        # then answers
        task = client.submit("Survey the documents [mock:agent-steps=2]", tools=[server])

        # When it runs, its first call waits for approval
        waiting = client.wait(task.task_id, timeout=HANG_S)
        assert waiting.status is llmtasks_client.TaskStatus.REQUIRES_ACTION, waiting.error
        assert waiting.required_action is not None
        assert waiting.required_action.tool_calls == []
        [request] = waiting.required_action.mcp_approval_requests or []
        assert (request.server_label, request.name) == ("docs", "read_document")
        assert fresh_mock.mock_stats()["calls"] == 1
        status = fresh_mock.run_cli("status", task.task_id)
        assert status.returncode == 0, status.stderr
        assert f"{request.id}  approve? docs: read_document(" in status.stdout

        # And the client's approval, through the SDK, lets it go on to its answer
        resumed = client.submit_tool_outputs(task.task_id, {}, approvals={request.id: True})
        assert resumed.status is llmtasks_client.TaskStatus.PROCESSING
        done = client.wait(task.task_id, timeout=HANG_S)
        assert done.status is llmtasks_client.TaskStatus.COMPLETED, done.error
        # The last call ran with no approval asked, and its output reached the model
        assert done.result is not None
        assert "webhooks: Signed webhooks" in done.result

        # Then the steps hold the server's list once, before the first model call, and both calls
        steps = client.steps(task.task_id).steps
        assert [(s.type, s.tool_source) for s in steps] == [
            ("mcp_list_tools", None),
            ("model_call", None),
            ("tool_call", "mcp"),
            ("model_call", None),
            ("tool_call", "mcp"),
            ("model_call", None),
        ]
        assert [tool["function_name"] for tool in steps[0].tools or []] == [
            "docs__read_document",
            "docs__list_documents",
        ]
        assert steps[2].server_label == "docs"
        assert steps[2].tool_call is not None
        assert steps[2].tool_call.id == request.id
        # The approved call made: the server's error result for the mock's made-up document id
        assert steps[2].tool_output is not None
        assert steps[2].tool_output.startswith("error: ")
        assert "No document 'mock'" in steps[2].tool_output
        assert steps[4].tool_output is not None
        assert steps[4].tool_output.startswith("queues: Queues between an API and its workers")
        assert fresh_mock.mock_stats()["calls"] == 3

        # And the task never shows the server's headers back
        with fresh_mock.client() as http:
            shown = http.get(f"/tasks/{task.task_id}").text + http.get(f"/tasks/{task.task_id}/steps").text
        assert TOKEN not in shown


def test_the_cli_shows_an_mcp_call_to_approve_and_denies_it(fresh_mock: RunningStack, docs: str) -> None:
    server = {
        "type": "mcp",
        "server_label": "docs",
        "server_url": docs,
        "headers": {"Authorization": f"Bearer {TOKEN}"},
    }
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        task = client.submit("Look it up [mock:agent-steps=1]", tools=[server])
        waiting = client.wait(task.task_id, timeout=HANG_S)
        assert waiting.required_action is not None
        [request] = waiting.required_action.mcp_approval_requests or []
        denied = fresh_mock.run_cli("tool-outputs", task.task_id, "--deny", request.id)
        assert denied.returncode == 0, denied.stderr
        done = client.wait(task.task_id, timeout=HANG_S)
        assert done.status is llmtasks_client.TaskStatus.COMPLETED, done.error
        assert done.result is not None
        assert f"{request.id}: denied: the client did not approve this call" in done.result
        assert [s.tool_source for s in client.steps(task.task_id).steps if s.type == "tool_call"] == ["mcp"]
