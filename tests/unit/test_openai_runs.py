"""`POST /v1/responses` with `previous_response_id` against the worker and its store (moto): a
waiting run takes its outputs through RunService and goes on, a completed response continues as a
conversation, and every other case is refused in OpenAI's terms (the SDK's side is in
tests/e2e/test_openai.py)."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response

from llmtasks.api.openai import from_api_error, response_object
from llmtasks.api.openai_continuations import PreviousResponseNotFound, continue_response
from llmtasks.api.openai_requests import CreateResponse
from llmtasks.domain.caller import Caller
from llmtasks.domain.errors import InvalidInput
from llmtasks.domain.models import TaskStatus
from tests.conftest import RunningMock
from tests.unit.test_mcp_runs import McpWorker, docs, docs_server, mcp_worker
from tests.unit.test_runs import RunWorker

pytestmark = pytest.mark.unit
__all__ = ["docs", "mcp_worker"]  # the MCP runs' fixtures, used here too

CALLER = Caller(tenant_id="default")
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}


@pytest.fixture
def worker(aws: Any, handler: Any, settings: Any, mock_llm: RunningMock) -> RunWorker:
    overrides = {"retry_base_delay_s": 0.0, "worker_call_slots": 0}
    return RunWorker(aws, handler, settings.model_copy(update=overrides), mock_llm)


def respond(worker: RunWorker, **fields: Any) -> Any:
    body = CreateResponse.model_validate({"model": "mock-model", "background": True, **fields})
    if "previous_response_id" in fields:
        return continue_response(worker.service, CALLER, body, idempotency_key=None)
    return worker.service.submit(CALLER.tenant_id, body.task_request(), caller=CALLER).task


def output(call_id: str, text: str) -> dict[str, str]:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def waiting_response(worker: RunWorker) -> tuple[str, str]:
    """A response whose run waits for its client's one call: its id and the call's id."""
    task = respond(worker, input="Who is Ada? [mock:call-tools]", tools=[LOOKUP])
    worker.deliver()
    waiting = worker.task(task.task_id)
    assert waiting.status is TaskStatus.REQUIRES_ACTION
    [call] = waiting.required_action.tool_calls
    return "resp_" + task.task_id, call.id


def test_the_outputs_go_to_the_waiting_run_which_answers_from_them(
    worker: RunWorker, mock_llm: RunningMock
) -> None:
    response_id, call_id = waiting_response(worker)

    continued = respond(worker, previous_response_id=response_id, input=[output(call_id, "Ada Lovelace")])

    # The same response, going on: its output recorded as the run's client step
    assert "resp_" + continued.task.task_id == response_id
    assert continued.task.status is TaskStatus.PROCESSING
    assert continued.starting_after == 6  # after the wait's response.completed
    steps = worker.service.runs.recorded(continued.task)
    assert [(s.type, s.source, s.output) for s in steps] == [
        ("model_call", None, None),
        ("tool_call", "client", "Ada Lovelace"),
    ]
    worker.deliver()
    done = worker.task(continued.task.task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert "Ada Lovelace" in done.result
    assert mock_llm.stats.calls == 2


def test_a_completed_response_continues_as_a_new_one_with_its_conversation(worker: RunWorker) -> None:
    response_id, call_id = waiting_response(worker)
    respond(worker, previous_response_id=response_id, input=[output(call_id, "Ada Lovelace")])
    worker.deliver()

    followed = respond(worker, previous_response_id=response_id, input="And her father?")

    assert "resp_" + followed.task.task_id != response_id
    messages = followed.task.request.messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert messages[0].content == "Who is Ada? [mock:call-tools]"
    assert messages[1].tool_calls[0].id == call_id
    assert messages[2].content == "Ada Lovelace"
    assert messages[-1].content == "And her father?"
    assert followed.task.request.tools is None  # OpenAI carries no tools over: this request gave none


def test_an_unknown_or_another_tenant_s_response_is_openai_s_404(worker: RunWorker) -> None:
    response_id, call_id = waiting_response(worker)
    stranger = Caller(tenant_id="someone-else")
    body = CreateResponse.model_validate(
        {"previous_response_id": response_id, "input": [output(call_id, "x")], "background": True}
    )

    for caller, asked in (
        (stranger, body),
        (CALLER, body.model_copy(update={"previous_response_id": "resp_" + "0" * 32})),
    ):
        with pytest.raises(PreviousResponseNotFound) as missing:
            continue_response(worker.service, caller, asked, idempotency_key=None)
        reply = from_api_error(missing.value)
        assert reply.status_code == 404
        assert reply.body["error"]["param"] == "previous_response_id"
        assert reply.body["error"]["type"] == "invalid_request_error"
    assert worker.task(response_id.removeprefix("resp_")).status is TaskStatus.REQUIRES_ACTION


def test_outputs_that_do_not_answer_the_calls_exactly_are_a_400_and_the_run_still_waits(
    worker: RunWorker,
) -> None:
    response_id, call_id = waiting_response(worker)

    for wrong in ([output("call_other", "x")], [output(call_id, "x"), output("call_other", "y")]):
        with pytest.raises(InvalidInput) as refused:
            respond(worker, previous_response_id=response_id, input=wrong)
        reply = from_api_error(refused.value)
        assert reply.status_code == 400
        assert reply.body["error"]["param"] == "input"
        assert call_id in reply.body["error"]["message"]
    assert worker.task(response_id.removeprefix("resp_")).status is TaskStatus.REQUIRES_ACTION


def test_a_response_neither_waiting_nor_completed_is_a_400_saying_which_it_is(worker: RunWorker) -> None:
    queued = respond(worker, input="Who is Ada?")

    with pytest.raises(InvalidInput) as refused:
        respond(worker, previous_response_id="resp_" + queued.task_id, input="go on")

    assert refused.value.field == "previous_response_id"
    assert "is queued" in refused.value.detail


def test_an_output_for_a_call_already_answered_is_a_400(worker: RunWorker) -> None:
    response_id, call_id = waiting_response(worker)
    respond(worker, previous_response_id=response_id, input=[output(call_id, "Ada Lovelace")])
    worker.deliver()

    with pytest.raises(InvalidInput) as refused:
        respond(worker, previous_response_id=response_id, input=[output(call_id, "again")])

    assert refused.value.field == "input"
    assert call_id in refused.value.detail


def test_outputs_sent_again_are_the_same_response_and_taken_once(
    worker: RunWorker, mock_llm: RunningMock
) -> None:
    response_id, call_id = waiting_response(worker)
    first = respond(worker, previous_response_id=response_id, input=[output(call_id, "Ada Lovelace")])

    # Sent again while the run goes on, and again once it has answered: as the SDK retries
    again = respond(worker, previous_response_id=response_id, input=[output(call_id, "Ada Lovelace")])
    worker.deliver()
    later = respond(worker, previous_response_id=response_id, input=[output(call_id, "Ada Lovelace")])

    assert again.task.task_id == later.task.task_id == first.task.task_id
    assert again.starting_after == later.starting_after == first.starting_after == 6
    assert later.task.status is TaskStatus.COMPLETED
    steps = worker.service.runs.recorded(later.task)
    assert [(s.type, s.source) for s in steps] == [
        ("model_call", None),
        ("tool_call", "client"),
        ("model_call", None),
    ]
    assert mock_llm.stats.calls == 2


def test_an_mcp_call_to_approve_is_answered_with_an_mcp_approval_response(
    mcp_worker: McpWorker, docs: str, mock_llm: RunningMock
) -> None:
    # Given a response whose model calls a docs tool that needs approval (the default)
    server = docs_server(docs, allowed_tools=["read_document", "list_documents"])
    task = respond(mcp_worker, input="research [mock:agent-steps=1]", tools=[server])
    mcp_worker.deliver()
    waiting = mcp_worker.task(task.task_id)
    assert waiting.status is TaskStatus.REQUIRES_ACTION

    # Then it completed with the request to approve, and nothing called yet
    shown = Response.model_validate(response_object(waiting, mcp_worker.service.runs.recorded(waiting)))
    [request] = shown.output
    assert request.type == "mcp_approval_request"
    assert (request.server_label, request.name) == ("docs", "read_document")
    # An item of another kind, or no answer to the request, is a 400 naming it
    with pytest.raises(InvalidInput, match=request.id):
        respond(mcp_worker, previous_response_id="resp_" + task.task_id, input=[output(request.id, "x")])

    # When the client approves it, the same response goes on, makes the call and answers
    approval = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    continued = respond(mcp_worker, previous_response_id="resp_" + task.task_id, input=[approval])
    assert continued.task.task_id == task.task_id
    assert continued.task.status is TaskStatus.PROCESSING
    assert continued.starting_after == 4  # after the wait's response.completed
    mcp_worker.deliver()
    done = mcp_worker.task(task.task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    answered = Response.model_validate(response_object(done, mcp_worker.service.runs.recorded(done)))
    assert [item.type for item in answered.output] == ["mcp_list_tools", "mcp_call", "message"]
    assert answered.output[1].name == "read_document"
    assert mock_llm.stats.calls == 2
