"""A run on the local stack: a task with tools takes steps through the worker, calling a function
endpoint on 127.0.0.1 and waiting for a client function's output, given through the SDK."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from standardwebhooks import Webhook

import llmtasks_client
from llmtasks_local.mcp_docs import serving
from tests.e2e.conftest import RunningStack
from tests.helpers import HANG_S, ToolEndpoint, free_port, load_example, serve

pytestmark = pytest.mark.e2e


@pytest.fixture
def endpoint() -> Iterator[tuple[ToolEndpoint, str]]:
    tool = ToolEndpoint()
    with serve(tool.app()) as url:
        yield tool, url + "/tool"


def test_a_run_of_several_steps_with_an_endpoint_and_a_client_function(
    fresh_mock: RunningStack, endpoint: tuple[ToolEndpoint, str]
) -> None:
    tool, url = endpoint
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "url": url}
    confirm = {"type": "function", "function": {"name": "confirm", "parameters": {"type": "object"}}}
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        # Given a run whose model asks for lookup, confirm, lookup, then answers
        task = client.submit("Plan the trip [mock:agent-steps=3]", tools=[lookup, confirm])

        # When it runs, it stops for the client's function after the endpoint's call
        waiting = client.wait(task.task_id, timeout=HANG_S)
        assert waiting.status is llmtasks_client.TaskStatus.REQUIRES_ACTION, waiting.error
        assert waiting.required_action is not None
        [asked] = waiting.required_action.tool_calls
        assert asked.function.name == "confirm"
        assert len(tool.calls) == 1

        # And the client's output, through the SDK, lets it go on to its answer
        resumed = client.submit_tool_outputs(task.task_id, {asked.id: "confirmed by the user"})
        assert resumed.status is llmtasks_client.TaskStatus.PROCESSING
        done = client.wait(task.task_id, timeout=HANG_S)
        assert done.status is llmtasks_client.TaskStatus.COMPLETED, done.error
        assert done.result is not None
        assert "tool result 2" in done.result

        # Then the steps are listed in order, four model calls and three tool calls
        steps = client.steps(task.task_id).steps
        assert [(s.type, s.tool_source) for s in steps] == [
            ("model_call", None),
            ("tool_call", "endpoint"),
            ("model_call", None),
            ("tool_call", "client"),
            ("model_call", None),
            ("tool_call", "endpoint"),
            ("model_call", None),
        ]
        assert steps[3].tool_output == "confirmed by the user"
        assert done.usage is not None
        assert done.usage.total_tokens == sum(s.usage.total_tokens for s in steps if s.usage)

        # And the mock saw each model step once; the endpoint's calls came signed
        assert fresh_mock.mock_stats()["calls"] == 4
        with fresh_mock.client() as http:
            secret = http.get("/webhooks/secret").json()["key"]
        for call in tool.calls:
            Webhook(secret).verify(call.body, call.headers)

        # Answering again is refused: the run waits for nothing
        with pytest.raises(llmtasks_client.ProblemError) as refused:
            client.submit_tool_outputs(task.task_id, {asked.id: "again"})
        assert refused.value.status == 409


def test_the_cli_shows_a_waiting_run_s_calls_and_answers_them(fresh_mock: RunningStack) -> None:
    confirm = {"type": "function", "name": "confirm", "parameters": {"type": "object"}}
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        task = client.submit("Ask first [mock:agent-steps=1]", tools=[confirm], max_steps=3)
        waiting = client.wait(task.task_id, timeout=HANG_S)
        assert waiting.required_action is not None
        [asked] = waiting.required_action.tool_calls
        status = fresh_mock.run_cli("status", task.task_id)
        assert status.returncode == 0, status.stderr
        shown = status.stdout
        assert "requires_action" in shown
        assert f"{asked.id}  confirm(" in shown
        answered = fresh_mock.run_cli("tool-outputs", task.task_id, f"{asked.id}=yes")
        assert answered.returncode == 0, answered.stderr
        done = client.wait(task.task_id, timeout=HANG_S)
        assert done.status is llmtasks_client.TaskStatus.COMPLETED, done.error
        assert done.result is not None
        assert f"{asked.id}: yes" in done.result


def test_a_run_s_steps_stream_in_order_through_the_sdk_and_the_cli_wait(
    fresh_mock: RunningStack, endpoint: tuple[ToolEndpoint, str]
) -> None:
    tool, url = endpoint
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "url": url}
    confirm = {"type": "function", "name": "confirm", "parameters": {"type": "object"}}
    with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        # Given a run whose model asks for lookup, confirm, lookup, then answers
        task = client.submit("Plan the trip [mock:agent-steps=3]", tools=[lookup, confirm], max_steps=10)

        # When its output is streamed, the steps come as events, and the stream ends at the wait
        paused = list(client.stream(task.task_id, timeout=HANG_S))
        events = [chunk.event for chunk in paused if chunk.event is not None]
        assert [(e.type, e.step) for e in events] == [
            ("model_call", 0),
            ("tool_call", 1),
            ("model_call", 2),
            ("requires_action", 2),
        ]
        assert events[0].usage is not None
        assert events[0].usage.total_tokens > 0
        assert events[1].tool_call is not None
        assert events[1].tool_call.function.name == "lookup"
        assert (events[1].tool_source, events[1].tool_output) == ("endpoint", "tool result 1")
        [asked] = events[3].tool_calls or []
        assert asked.function.name == "confirm"

        # And the CLI's wait prints a line a step, then the call to answer
        waited = fresh_mock.run_cli("wait", task.task_id, "--timeout", str(HANG_S))
        assert waited.returncode == 0, waited.stderr
        assert "step 1 tool_call lookup({" in waited.stderr
        assert "[endpoint] -> tool result 1" in waited.stderr
        assert f"{asked.id}  confirm(" in waited.stdout

        # When the client answers, the stream goes on from the wait to the answer
        client.submit_tool_outputs(task.task_id, {asked.id: "confirmed by the user"})
        rest = list(client.stream(task.task_id, after=paused[-1].sequence, timeout=HANG_S))
        done = client.get(task.task_id)
        assert done.status is llmtasks_client.TaskStatus.COMPLETED, done.error
        more = [chunk.event for chunk in rest if chunk.event is not None]
        assert [(e.type, e.step, e.tool_source) for e in more] == [
            ("tool_call", 3, "client"),
            ("model_call", 4, None),
            ("tool_call", 5, "endpoint"),
            ("model_call", 6, None),
        ]
        last_tool = max(i for i, chunk in enumerate(rest) if chunk.event and chunk.event.type == "tool_call")
        assert "".join(chunk.text for chunk in rest[last_tool + 1 :]) == done.result
        assert done.usage is not None
        every = [*events, *more]
        assert done.usage.total_tokens == sum(e.usage.total_tokens for e in every if e.usage)
        assert len(tool.calls) == 2

        # And the CLI's wait of the ended run prints its seven steps in order, then its answer
        whole = fresh_mock.run_cli("wait", task.task_id, "--timeout", str(HANG_S))
        assert whole.returncode == 0, whole.stderr
        numbers = [line.split()[1] for line in whole.stderr.splitlines() if line.startswith("step ")]
        assert numbers == [str(n) for n in range(7)]
        assert done.result is not None
        assert done.result in whole.stdout


def test_a_twelve_step_run_with_mcp_endpoint_and_client_tools_completes(
    fresh_mock: RunningStack, endpoint: tuple[ToolEndpoint, str]
) -> None:
    tool, url = endpoint
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "url": url}
    confirm = {"type": "function", "name": "confirm", "parameters": {"type": "object"}}
    with serving(free_port()) as docs:
        server = {"type": "mcp", "server_label": "docs", "server_url": docs, "require_approval": "never"}
        with llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
            # Given a run whose model takes twelve tool turns over its five tools in turn: the
            # endpoint, the client's function, then the docs server's three
            task = client.submit("Research and report [mock:agent-steps=12]", tools=[lookup, confirm, server])

            # When each wait for the client is answered through the SDK, the run goes on
            pauses = 0
            while (current := client.wait(task.task_id, timeout=HANG_S)).status is (
                llmtasks_client.TaskStatus.REQUIRES_ACTION
            ):
                assert current.required_action is not None
                pauses += 1
                answers = {call.id: f"confirmed {pauses}" for call in current.required_action.tool_calls}
                client.submit_tool_outputs(task.task_id, answers)
            steps = client.steps(task.task_id, limit=100).steps

    # Then it completed after three pauses, every step recorded once and in order
    assert current.status is llmtasks_client.TaskStatus.COMPLETED, current.error
    assert pauses == 3
    assert steps[0].type == "mcp_list_tools"
    turns = [(s.type, s.tool_source) for s in steps[1:]]
    tools = [source for kind, source in turns if kind == "tool_call"]
    assert tools == ["endpoint", "client", "mcp", "mcp", "mcp"] * 2 + ["endpoint", "client"]
    assert [kind for kind, _ in turns] == ["model_call", "tool_call"] * 12 + ["model_call"]
    assert [s.step for s in steps] == list(range(26))
    # Each model step was called once; the endpoint was called on each of its turns
    assert fresh_mock.mock_stats()["calls"] == 13
    assert len(tool.calls) == 3
    assert current.usage is not None
    assert current.usage.total_tokens == sum(s.usage.total_tokens for s in steps if s.usage)


def test_the_plan_and_execute_example_researches_the_mcp_server_s_documents_and_reports(
    fresh_mock: RunningStack,
) -> None:
    example = load_example("plan_and_execute")
    with serving(free_port()) as docs, llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        report = example.plan_and_execute(
            client, "How do webhooks work?", docs, model="gpt-4o-mini", agent_steps=2
        )
    # A plan (its questions fit the schema), a research run a question, each calling the server's
    # tools twice, and the report written from their findings
    assert 1 <= len(report.findings) <= example.MOST_QUESTIONS
    assert all(finding.tool_calls == 2 for finding in report.findings)
    assert all(finding.answer for finding in report.findings)
    assert report.tasks == len(report.findings) + 2
    assert report.text
    assert report.tokens > 0
    assert fresh_mock.mock_stats()["structured"] >= 1
