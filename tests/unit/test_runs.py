"""Runs: a task with tools taking steps (model, tools, model ...) through the worker, on moto and
the mock LLM over HTTP; its journal, its waits for the client's outputs, its step cap."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from standardwebhooks import Webhook

from llmtasks.domain.errors import InvalidInput, TaskConflict
from llmtasks.domain.llm_request import FunctionCall, LLMRequest, ToolCall
from llmtasks.domain.messages import Completion, new_webhook_secret
from llmtasks.domain.models import SubmitTaskRequest, TaskStatus, Usage
from llmtasks.domain.output import OutputChunk
from llmtasks.domain.runs import DEFAULT_MAX_STEPS, MAX_STEPS_EXCEEDED, SubmitToolOutputs
from llmtasks.domain.steps import (
    EVENT_TEXT_CHARS,
    Answer,
    CallModel,
    CallTools,
    RunStep,
    StepEvent,
    conversation,
    next_move,
)
from llmtasks.llm.openai import OpenAIChat
from llmtasks.ops.stats import overview
from llmtasks.services.tool_calls import EndpointTools
from llmtasks.services.webhook_urls import no_lookups
from llmtasks.settings import Settings
from llmtasks.worker.runner import TaskRunner
from llmtasks_local.sam.provision import local_deployment
from tests.conftest import Aws, RunningMock, lambda_context
from tests.helpers import HANG_S, ToolEndpoint, blobs, count_tasks, emf_records, eventually, serve
from tests.unit.test_worker import CrashingLLM, Worker, redelivered

pytestmark = pytest.mark.unit


class RunWorker(Worker):
    """The worker with its function endpoints called for real (on 127.0.0.1)."""

    def runner(self, llm: Any = None, pacer: Any = None, **overrides: Any) -> TaskRunner:
        settings = self.settings.model_copy(update=overrides)
        llm = llm or OpenAIChat(base_url=self.llm_url, api_key=None, default_model="mock-model")
        tools = EndpointTools(allowed_hosts=frozenset({"127.0.0.1"}), resolve=no_lookups, attempts=2)
        parts = self.runner_parts(llm)
        return TaskRunner(
            settings,
            self.store,
            self.lanes,
            llm,
            clock=self.clock,
            results=blobs(settings),
            tools=tools,
            **parts,
        )

    def runner_parts(self, llm: Any) -> dict[str, Any]:
        """The runner's other parts a suite makes real (its MCP client, the background mode)."""
        return {}

    def submit_run(self, prompt: str, tools: list[dict[str, Any]], **options: Any) -> str:
        body = SubmitTaskRequest.model_validate({"prompt": prompt, "tools": tools, **options})
        return self.service.submit("default", body).task.task_id

    def deliver(self) -> dict[str, Any]:
        """The queued messages (a resume's is delayed a second) handed to the worker."""
        messages = eventually(self.queued, bool, timeout_s=HANG_S, every_s=0.2)
        return self.run(messages)


@pytest.fixture
def worker(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> RunWorker:
    overrides = {"retry_base_delay_s": 0.0, "worker_call_slots": 0}
    return RunWorker(aws, handler, settings.model_copy(update=overrides), mock_llm)


@pytest.fixture
def endpoint() -> Iterator[tuple[ToolEndpoint, str]]:
    tool = ToolEndpoint()
    with serve(tool.app()) as url:
        yield tool, url + "/tool"


def lookup(url: str) -> dict[str, Any]:
    # Responses' flat shape, with the endpoint: the worker calls it.
    return {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "url": url}


# Chat Completions' nested shape, no url: the client answers its calls.
ASK_USER = {"type": "function", "function": {"name": "ask_user", "parameters": {"type": "object"}}}


def test_a_run_calls_its_endpoint_waits_for_its_client_and_answers(
    worker: RunWorker, endpoint: tuple[ToolEndpoint, str], mock_llm: RunningMock
) -> None:
    # Given a run whose model asks for lookup, then ask_user, then lookup again, then answers
    tool, url = endpoint
    task_id = worker.submit_run("plan it [mock:agent-steps=3]", [lookup(url), ASK_USER])

    # When the worker takes it: it calls the endpoint, then stops for the client's function
    worker.deliver()
    waiting = worker.task(task_id)
    assert waiting.status is TaskStatus.REQUIRES_ACTION
    assert waiting.lease_id is None  # no worker holds a waiting run
    [asked] = waiting.required_action.tool_calls
    assert asked.function.name == "ask_user"
    assert len(tool.calls) == 1
    assert mock_llm.stats.calls == 2

    # The endpoint's request is signed with the tenant's secret, as webhooks are
    secret = worker.service.webhook_secret("default").key
    call = tool.calls[0]
    Webhook(secret).verify(call.body, call.headers)
    first_model = worker.service.runs.steps(worker.task(task_id), limit=10, cursor=None).steps[0]
    assert call.headers["webhook-id"] == first_model.output.tool_calls[0].id

    # When the client answers it, the run goes on to its answer
    resumed = worker.service.runs.submit_tool_outputs(
        waiting, SubmitToolOutputs(tool_outputs=[{"tool_call_id": asked.id, "output": "the user says yes"}])
    )
    assert resumed.status is TaskStatus.PROCESSING
    worker.deliver()
    done = worker.task(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert "tool result 2" in done.result  # the last tool output, read back by the model
    assert mock_llm.stats.calls == 4  # four model steps, none made twice
    assert len(tool.calls) == 2

    # Then its steps are the model calls and tool calls in order, with each model call's usage
    steps = worker.service.runs.steps(done, limit=50, cursor=None).steps
    assert [(s.type, s.tool_source) for s in steps] == [
        ("model_call", None),
        ("tool_call", "endpoint"),
        ("model_call", None),
        ("tool_call", "client"),
        ("model_call", None),
        ("tool_call", "endpoint"),
        ("model_call", None),
    ]
    assert steps[3].tool_output == "the user says yes"
    summed = sum(step.usage.total_tokens for step in steps if step.usage)
    assert done.usage.total_tokens == summed > 0
    # A page of two, and the next from its cursor
    page = worker.service.runs.steps(done, limit=2, cursor=None)
    assert [s.step for s in page.steps] == [0, 1]
    assert page.next_cursor == "2"
    rest = worker.service.runs.steps(done, limit=50, cursor=page.next_cursor)
    assert [s.step for s in rest.steps] == [2, 3, 4, 5, 6]
    assert rest.next_cursor is None


def read_output(worker: RunWorker, task_id: str) -> list[OutputChunk]:
    """Every chunk of the task's output so far, in order."""
    chunks: list[OutputChunk] = []
    while True:
        page = worker.service.output("default", task_id, after=chunks[-1].sequence if chunks else 0)
        chunks += page.chunks
        if page.final or not page.chunks:
            return chunks


def events_of(chunks: list[OutputChunk]) -> list[StepEvent]:
    return [chunk.event for chunk in chunks if chunk.event is not None]


def test_a_run_s_output_shows_its_steps_in_order_among_its_text_and_counts_them(
    worker: RunWorker, endpoint: tuple[ToolEndpoint, str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a run that calls its endpoint, then stops for its client's function
    _, url = endpoint
    task_id = worker.submit_run("plan it [mock:agent-steps=3]", [lookup(url), ASK_USER], max_steps=10)
    worker.deliver()

    # Then its output so far holds its steps' events, in order, ending with the wait
    paused = events_of(read_output(worker, task_id))
    assert [(e.type, e.step) for e in paused] == [
        ("model_call", 0),
        ("tool_call", 1),
        ("model_call", 2),
        ("requires_action", 2),
    ]
    asked, called, _, waiting = paused
    assert [call.function.name for call in asked.tool_calls or []] == ["lookup"]
    assert asked.usage is not None
    assert asked.usage.total_tokens > 0
    assert asked.usage.cost_usd is not None
    assert called.tool_call is not None
    assert (called.tool_call.function.name, called.tool_source) == ("lookup", "endpoint")
    assert (called.tool_output, called.tool_error) == ("tool result 1", False)
    assert [call.function.name for call in waiting.tool_calls or []] == ["ask_user"]

    # When the client answers, the run's next claim shows the client's output, then goes on
    task = worker.task(task_id)
    [call] = task.required_action.tool_calls
    outputs = SubmitToolOutputs(tool_outputs=[{"tool_call_id": call.id, "output": "the user says yes"}])
    worker.service.runs.submit_tool_outputs(task, outputs)
    worker.deliver()
    done = worker.task(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    chunks = read_output(worker, task_id)
    events = events_of(chunks)
    assert [(e.type, e.step) for e in events[4:]] == [
        ("tool_call", 3),
        ("model_call", 4),
        ("tool_call", 5),
        ("model_call", 6),
    ]
    answered = events[4]
    assert (answered.tool_source, answered.tool_output) == ("client", "the user says yes")
    # Each event's chunk has no text; the text after the last tool call's event is the answer
    assert all(chunk.text == "" for chunk in chunks if chunk.event is not None)
    last_tool = max(i for i, chunk in enumerate(chunks) if chunk.event and chunk.event.type == "tool_call")
    assert "".join(chunk.text for chunk in chunks[last_tool + 1 :]) == done.result
    # The model calls' usage adds up to the task's
    assert done.usage is not None
    assert sum(e.usage.total_tokens for e in events if e.usage) == done.usage.total_tokens

    # And each step was counted once, by kind; the tool calls by who answered them
    emf = emf_records(capsys.readouterr().out)
    kinds = Counter(record["kind"] for record in emf["RunSteps"])
    assert kinds == {"model_call": 4, "tool_call": 3}
    assert Counter(record["source"] for record in emf["ToolCalls"]) == {"endpoint": 2, "client": 1}
    assert "ToolCallErrors" not in emf


def test_a_failed_tool_call_is_shown_and_counted_as_one(
    worker: RunWorker, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given an endpoint that refuses its call
    tool = ToolEndpoint(answers=[400])
    with serve(tool.app()) as url:
        task_id = worker.submit_run("look [mock:agent-steps=1]", [lookup(url + "/tool")], max_steps=5)
        worker.deliver()
    assert worker.task(task_id).status is TaskStatus.COMPLETED
    # Then its event says it failed, and ToolCallErrors counts it, the tool named in the record
    [failed] = [e for e in events_of(read_output(worker, task_id)) if e.type == "tool_call"]
    assert failed.tool_error is True
    assert (failed.tool_output or "").startswith("error: the tool 'lookup' failed")
    out = capsys.readouterr().out
    [error] = emf_records(out)["ToolCallErrors"]
    assert error["source"] == "endpoint"
    records = [json.loads(line) for line in out.splitlines() if line.startswith('{"_aws"')]
    assert [r["tool"] for r in records if "ToolCallErrors" in r] == ["lookup"]


def test_the_overview_shows_a_run_s_steps_and_its_wait_on_its_timeline(
    worker: RunWorker, endpoint: tuple[ToolEndpoint, str], handler: Any
) -> None:
    # Given a run that called its endpoint and waits for its client
    _, url = endpoint
    task_id = worker.submit_run("plan it [mock:agent-steps=2]", [lookup(url), ASK_USER], max_steps=5)
    worker.deliver()
    count_tasks(worker.aws, handler)  # the counters the overview finds the busiest tenants by
    # Then the overview's timeline of it (the console's, `llmtasks stats`') has its steps' facts
    view = overview(worker.aws.dynamodb, worker.aws.sqs, local_deployment(worker.aws.sqs), now=time.time())
    [run] = [task for task in view["recent"] if task["task_id"] == task_id]
    assert (run["run"], run["status"], run["waiting_for"]) == (True, "requires_action", ["ask_user"])
    first, called, second = run["steps"]
    assert (first["type"], first["model"], first["calls"]) == ("model_call", "mock-model", ["lookup"])
    assert first["tokens"] > 0
    assert first["cost_usd"] is not None
    assert (called["tool"], called["source"], called["error"]) == ("lookup", "endpoint", False)
    assert second["calls"] == ["ask_user"]
    # And a task that is not a run has none
    plain = worker.submit("one call")
    worker.deliver()
    count_tasks(worker.aws, handler)
    view = overview(worker.aws.dynamodb, worker.aws.sqs, local_deployment(worker.aws.sqs), now=time.time())
    [one] = [task for task in view["recent"] if task["task_id"] == plain]
    assert (one["run"], one["steps"], one["waiting_for"]) == (False, None, [])


class UsageMidRun:
    """The LLM, reading the task (as GET /tasks/{id} does) before each model call after the first."""

    def __init__(self, llm: OpenAIChat, worker: RunWorker) -> None:
        self.llm, self.worker = llm, worker
        self.seen: list[tuple[TaskStatus, int]] = []
        self.task_id = ""

    async def complete(self, request: LLMRequest, **kwargs: Any) -> Completion:
        if len(request.messages or []) > 1:
            task = await asyncio.to_thread(self.worker.service.get, "default", self.task_id)
            self.seen.append((task.status, task.usage.total_tokens if task.usage else 0))
        return await self.llm.complete(request, **kwargs)


def test_a_processing_run_s_usage_sums_its_model_calls_so_far(
    worker: RunWorker, endpoint: tuple[ToolEndpoint, str]
) -> None:
    # Given a run of three model calls, its task read before the second and the third
    _, url = endpoint
    llm = UsageMidRun(OpenAIChat(base_url=worker.llm_url, api_key=None, default_model="mock-model"), worker)
    llm.task_id = worker.submit_run("go [mock:agent-steps=2]", [lookup(url)], max_steps=5)
    worker.run(worker.queued(), llm=llm)
    done = worker.task(llm.task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    # Then each read showed the usage of the model calls made by then, while it was processing
    steps = worker.service.runs.steps(done, limit=50, cursor=None).steps
    made = [step.usage.total_tokens for step in steps if step.usage]
    assert llm.seen == [(TaskStatus.PROCESSING, made[0]), (TaskStatus.PROCESSING, made[0] + made[1])]


class CrashAfter:
    """The mock over HTTP for `calls` model calls, then a crash before the next one leaves."""

    def __init__(self, llm: OpenAIChat, calls: int) -> None:
        self.llm, self.left = llm, calls

    async def complete(self, request: LLMRequest, **kwargs: Any) -> Completion:
        if self.left == 0:
            return await CrashingLLM().complete(request, **kwargs)
        self.left -= 1
        return await self.llm.complete(request, **kwargs)


def test_a_redelivery_resumes_the_run_at_its_first_unfinished_step(
    worker: RunWorker, endpoint: tuple[ToolEndpoint, str], mock_llm: RunningMock
) -> None:
    # Given a run whose worker died after two model calls and a tool call were recorded
    tool, url = endpoint
    task_id = worker.submit_run("research [mock:agent-steps=3]", [lookup(url)])
    [message] = worker.queued()
    real = OpenAIChat(base_url=worker.llm_url, api_key=None, default_model="mock-model")
    worker.run([message], llm=CrashAfter(real, 2))
    assert worker.task(task_id).status is TaskStatus.PROCESSING
    assert mock_llm.stats.calls == 2

    # When its message comes again, the run resumes after its recorded steps
    worker.run([redelivered(message, 2)])
    done = worker.task(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    # Then no model step ran twice: four in all, as the agent takes
    assert mock_llm.stats.calls == 4
    assert len(tool.calls) == 3
    steps = worker.service.runs.steps(done, limit=50, cursor=None).steps
    assert [s.step for s in steps] == list(range(7))
    # Its output shows each step once, in order, across the two deliveries
    assert [event.step for event in events_of(read_output(worker, task_id))] == list(range(7))


def test_a_run_past_its_max_steps_fails(
    worker: RunWorker, endpoint: tuple[ToolEndpoint, str], mock_llm: RunningMock
) -> None:
    _, url = endpoint
    task_id = worker.submit_run("loop [mock:agent-steps=9]", [lookup(url)], max_steps=2)
    worker.deliver()
    failed = worker.task(task_id)
    assert failed.status is TaskStatus.FAILED
    assert failed.error_code == MAX_STEPS_EXCEEDED
    assert mock_llm.stats.calls == 2
    assert failed.usage is not None
    assert failed.usage.total_tokens > 0


class ClockAfterFirstCall:
    """The LLM, with the worker's clock moved on `by_s` once its first call answers."""

    def __init__(self, llm: Any, worker: RunWorker, by_s: float) -> None:
        self.llm, self.worker, self.by_s = llm, worker, by_s
        self.shift = 0.0
        worker.clock = lambda: time.time() + self.shift

    async def complete(self, request: LLMRequest, **kwargs: Any) -> Completion:
        done = await self.llm.complete(request, **kwargs)
        self.shift = self.by_s
        return done


def test_a_run_s_deadline_bounds_each_of_its_model_calls_not_the_first_alone(
    worker: RunWorker, endpoint: tuple[ToolEndpoint, str], mock_llm: RunningMock
) -> None:
    # Given a run of 60 s whose first model call, as the clock reads it, ends past that
    tool, url = endpoint
    task_id = worker.submit_run("slow [mock:agent-steps=3]", [lookup(url)], timeout_s=60)
    real = OpenAIChat(base_url=worker.llm_url, api_key=None, default_model="mock-model")
    llm = ClockAfterFirstCall(real, worker, by_s=61)
    # When the claim goes on to its next model call
    worker.run(worker.queued(), llm=llm)
    # Then that call is not made: the run fails at its deadline, its first step kept
    failed = worker.task(task_id)
    assert failed.status is TaskStatus.FAILED
    assert failed.error_code == "deadline_exceeded"
    assert mock_llm.stats.calls == 1
    assert len(tool.calls) == 1
    steps = worker.service.runs.steps(failed, limit=50, cursor=None).steps
    assert [s.type for s in steps] == ["model_call", "tool_call"]


def test_tool_outputs_are_taken_only_from_a_waiting_run_for_exactly_its_calls(
    worker: RunWorker, mock_llm: RunningMock
) -> None:
    task_id = worker.submit_run("ask [mock:agent-steps=1]", [ASK_USER], max_steps=3)
    outputs = SubmitToolOutputs(tool_outputs=[{"tool_call_id": "call_x", "output": "o"}])
    with pytest.raises(TaskConflict):  # pending: it waits for nothing yet
        worker.service.runs.submit_tool_outputs(worker.task(task_id), outputs)
    worker.deliver()
    waiting = worker.task(task_id)
    assert waiting.status is TaskStatus.REQUIRES_ACTION
    with pytest.raises(InvalidInput):  # an id it did not ask for
        worker.service.runs.submit_tool_outputs(waiting, outputs)
    assert worker.task(task_id).status is TaskStatus.REQUIRES_ACTION
    [asked] = waiting.required_action.tool_calls
    answer = SubmitToolOutputs(tool_outputs=[{"tool_call_id": asked.id, "output": "42"}])
    worker.service.runs.submit_tool_outputs(waiting, answer)
    with pytest.raises(TaskConflict):  # answered once: the second is refused
        worker.service.runs.submit_tool_outputs(waiting, answer)
    worker.deliver()
    assert worker.task(task_id).status is TaskStatus.COMPLETED
    assert mock_llm.stats.calls == 2


def test_a_waiting_run_can_be_cancelled(worker: RunWorker) -> None:
    task_id = worker.submit_run("ask [mock:agent-steps=1]", [ASK_USER], max_steps=3)
    worker.deliver()
    assert worker.task(task_id).status is TaskStatus.REQUIRES_ACTION
    assert worker.service.cancel("default", task_id).status is TaskStatus.CANCELLED


def test_a_tool_url_must_pass_the_ssrf_guard(worker: RunWorker) -> None:
    with pytest.raises(InvalidInput, match="tool 'lookup'"):
        worker.submit_run("x", [lookup("https://10.0.0.1/tool")])
    with pytest.raises(ValueError, match="max_steps"):
        SubmitTaskRequest.model_validate({"prompt": "x", "max_steps": 3})


def test_a_task_with_client_tools_alone_is_a_run_that_waits_for_their_outputs(
    worker: RunWorker, mock_llm: RunningMock
) -> None:
    task_id = worker.submit_run("one call [mock:call-tools]", [ASK_USER])
    worker.deliver()
    waiting = worker.task(task_id)
    assert waiting.is_run
    assert waiting.max_steps == DEFAULT_MAX_STEPS
    assert waiting.status is TaskStatus.REQUIRES_ACTION
    assert waiting.required_action is not None
    assert [call.function.name for call in waiting.required_action.tool_calls] == ["ask_user"]


def test_the_provider_never_sees_a_tool_s_url() -> None:
    body = SubmitTaskRequest.model_validate({"prompt": "x", "tools": [lookup("https://tools.example/t")]})
    sent = body.llm_request().parameters()["tools"]
    assert sent == [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    assert body.tool_urls == {"lookup": "https://tools.example/t"}
    assert body.run_steps == 20


# --- the next move, from the steps done ---------------------------------------------------------


def model_step(number: int, calls: list[str], text: str = "") -> RunStep:
    tool_calls = [{"id": c, "type": "function", "function": {"name": "f", "arguments": "{}"}} for c in calls]
    usage = Usage(prompt_tokens=2, completion_tokens=1, total_tokens=3)
    completion = Completion(text=text, model="m", usage=usage, tool_calls=tool_calls or None)
    return RunStep(step=number, type="model_call", started_at=0, ended_at=0, completion=completion)


def tool_step(number: int, call_id: str) -> RunStep:
    call = {"id": call_id, "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return RunStep(step=number, type="tool_call", started_at=0, ended_at=0, tool_call=call, output="out")


def test_a_step_s_event_trims_its_texts_and_tells_a_failed_call() -> None:
    long = "x" * (EVENT_TEXT_CHARS + 50)
    call = ToolCall(id="c1", function=FunctionCall(name="search", arguments=long))
    step = RunStep(
        step=1, type="tool_call", started_at=0, ended_at=1, tool_call=call, output=long, source="endpoint"
    )
    event = StepEvent.of(step)
    assert event.tool_call is not None
    assert len(event.tool_call.function.arguments) == len(event.tool_output or "") == EVENT_TEXT_CHARS
    assert (event.tool_output or "").endswith("\u2026")
    assert step.tool_call is not None
    assert step.tool_call.function.arguments == long  # the step itself is whole
    assert event.tool_error is False
    # The worker's error text from an endpoint, and a name no tool has, are failures; a client's is its own
    failed = step.model_copy(update={"output": "error: the tool 'search' failed: no answer within 30 s"})
    assert StepEvent.of(failed).tool_error is True
    assert StepEvent.of(step.model_copy(update={"source": "unknown", "output": "x"})).tool_error is True
    assert StepEvent.of(failed.model_copy(update={"source": "client"})).tool_error is False
    # A model call's event: its usage and the calls it asked for, no text
    asked = StepEvent.of(model_step(0, ["c1", "c2"], text="thinking"))
    assert (asked.type, asked.usage, asked.tool_output) == (
        "model_call",
        Usage(prompt_tokens=2, completion_tokens=1, total_tokens=3),
        None,
    )
    assert [c.id for c in asked.tool_calls or []] == ["c1", "c2"]


def test_the_next_move_follows_from_the_steps_done() -> None:
    assert next_move([]) == CallModel(step=0, model_steps=0)
    asked = model_step(0, ["a", "b"])
    move = next_move([asked, tool_step(2, "b")])  # b answered, a not: a gap at 1
    assert isinstance(move, CallTools)
    assert [(n, c.id) for n, c in move.pending] == [(1, "a")]
    assert next_move([asked, tool_step(1, "a"), tool_step(2, "b")]) == CallModel(step=3, model_steps=1)
    steps = [asked, tool_step(1, "a"), tool_step(2, "b"), model_step(3, [], text="done")]
    answer = next_move(steps)
    assert isinstance(answer, Answer)
    assert answer.completion.text == "done"
    assert answer.completion.usage.total_tokens == 6
    sent = conversation(LLMRequest(prompt="go"), steps[:3])
    assert [m.role for m in sent.messages or []] == ["user", "assistant", "tool", "tool"]
    assert json.loads(sent.messages[1].model_dump_json())["tool_calls"][0]["id"] == "a"  # type: ignore[index]


def test_a_step_past_the_item_s_room_keeps_its_text_in_the_bucket_and_is_written_once(
    worker: RunWorker,
) -> None:
    journal = worker.store.journal(blobs(worker.settings))
    big = "x" * 150_000
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    step = RunStep(step=1, type="tool_call", started_at=1, ended_at=2, tool_call=call, output=big)
    assert journal.record("t1", step, expires_at=2**31) == step
    again = step.model_copy(update={"output": "another delivery's"})
    assert journal.record("t1", again, expires_at=2**31).output == big  # the first one stands
    [read] = journal.steps("t1")
    assert read.output == big
    assert read.text_ref is not None


def test_a_run_short_of_time_hands_on_to_another_invocation_and_goes_on_there(
    worker: RunWorker, endpoint: tuple[ToolEndpoint, str], aws: Aws, mock_llm: RunningMock
) -> None:
    # Given an invocation with 20 s left: a model call, but no room for what follows
    tool, url = endpoint
    task_id = worker.submit_run("two turns [mock:agent-steps=2]", [lookup(url)])
    worker.context = lambda_context(aws.function("WorkerFunction"), timeout_s=20)
    worker.deliver()
    handed = worker.task(task_id)
    assert handed.status is TaskStatus.PENDING
    assert handed.last_error_code == "continued"
    assert handed.attempts == 0  # a hand-off costs the run none of its retries
    assert mock_llm.stats.calls == 1
    assert not tool.calls

    # When its continuation message comes to an invocation with time, the run goes on to its end
    worker.context = lambda_context(aws.function("WorkerFunction"))
    worker.deliver()
    done = worker.task(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert mock_llm.stats.calls == 3  # three model steps, the first not made again
    assert len(tool.calls) == 2


def test_an_endpoint_is_tried_again_after_a_5xx_but_not_after_a_refusal(
    endpoint: tuple[ToolEndpoint, str],
) -> None:
    tool, url = endpoint
    tools = EndpointTools(allowed_hosts=frozenset({"127.0.0.1"}), resolve=no_lookups, sleep=no_sleep)
    call = ToolCall(id="call_1", function=FunctionCall(name="lookup", arguments='{"q": 1}'))
    tool.answers = [503]
    assert asyncio.run(tools.call(url, call, secrets=[new_webhook_secret()])) == "tool result 2"
    assert [c.body for c in tool.calls] == [b'{"q": 1}'] * 2
    assert tool.calls[0].headers["webhook-id"] == tool.calls[1].headers["webhook-id"] == "call_1"
    tool.answers = [404]
    refused = asyncio.run(tools.call(url, call, secrets=[new_webhook_secret()]))
    assert refused == "error: the tool 'lookup' failed: the endpoint answered 404"
    assert len(tool.calls) == 3
    # A url the guard refuses is never called
    inside = asyncio.run(tools.call("https://10.0.0.1/tool", call, secrets=[new_webhook_secret()]))
    assert inside.startswith("error: the tool's url is refused")
    assert len(tool.calls) == 3


async def no_sleep(_: float) -> None:
    return None


def test_a_forced_tool_choice_holds_for_the_run_s_first_model_call_only() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    request = LLMRequest.model_validate({"prompt": "x", "tools": [tool], "tool_choice": "required"})
    assert conversation(request, []).tool_choice == "required"
    after = conversation(request, [model_step(0, ["a"]), tool_step(1, "a")])
    assert after.tool_choice == "auto"  # else the model could never answer


def test_a_refusal_is_the_assistant_s_turn_in_the_conversation() -> None:
    usage = Usage(prompt_tokens=2, completion_tokens=1, total_tokens=3)
    refused = Completion(text="", model="m", usage=usage, refusal="I cannot help with that.")
    step = RunStep(step=0, type="model_call", started_at=0, ended_at=0, completion=refused)
    [_, turn] = conversation(LLMRequest(prompt="x"), [step]).messages or []
    assert (turn.role, turn.content) == ("assistant", "I cannot help with that.")
