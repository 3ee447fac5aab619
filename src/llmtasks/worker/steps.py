"""A run's steps within one claim of its task: read what the journal holds, list the tools of its
MCP servers if no step has yet, then take the next step, record it, and so on, until the model
answers, the run must wait for its client, its time in this invocation runs short, or its steps
run out (domain/steps.py decides what comes next).

Each step is recorded (a conditional put) before the next starts, so a redelivery after a crash
or a timeout resumes at the first unfinished step and never makes a recorded model call again.
The model calls themselves (reserve, call, charge) are the runner's: it hands in `call_model`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from llmtasks.aws.run_steps import RunJournal
from llmtasks.aws.store import TaskStore
from llmtasks.domain.llm_request import LLMRequest, ToolCall
from llmtasks.domain.mcp_servers import (
    MAX_OFFERED_TOOLS,
    McpApprovalRequest,
    McpListedTool,
    McpServer,
    McpUnavailable,
    listed_tools,
)
from llmtasks.domain.messages import Completion, new_webhook_secret
from llmtasks.domain.models import ProviderCall, Task, Usage
from llmtasks.domain.rules import Clock
from llmtasks.domain.runs import RequiredAction
from llmtasks.domain.steps import Answer, CallModel, CallTools, RunStep, conversation, next_move, usage_of
from llmtasks.observability import logger, task_keys


@dataclass(frozen=True)
class Parked:
    """The model step runs in the provider's background mode: the run is released until
    `look_in_s` from now (or the provider's webhook), when its message claims it again."""

    call: ProviderCall
    look_in_s: float


# A model call's answer; Parked when it runs at the provider in background; None when there is
# none to record (the runner dealt with the error).
ModelCall = Callable[[LLMRequest, int], Awaitable[Completion | Parked | None]]
# Shown the steps so far (the runner writes their events in the task's output stream): called
# with the steps read at the claim's start, then after each step recorded.
ShowSteps = Callable[[list[RunStep]], Awaitable[None]]


class ToolEndpoints(Protocol):
    """Calls a function endpoint (services/tool_calls.py): its output, or an error text."""

    timeout_s: float

    async def call(self, url: str, call: ToolCall, *, secrets: list[str]) -> str: ...


class McpClient(Protocol):
    """Lists and calls MCP servers' tools (services/mcp_tools.py)."""

    timeout_s: float

    async def list_tools(self, server: McpServer) -> list[dict[str, Any]]:
        """The server's tools; raises McpUnavailable (whose `detail` says why) when it cannot."""
        ...

    async def call(self, server: McpServer, tool: str, call: ToolCall) -> str:
        """The tool's output, or an error text."""
        ...


# error_code of a run whose MCP server's tools could not be listed.
MCP_SERVER_UNAVAILABLE = "mcp_server_unavailable"


@dataclass(frozen=True)
class McpFunction:
    """A function the model is offered for an MCP server's tool."""

    server: McpServer
    tool: McpListedTool


@dataclass(frozen=True)
class Finished:
    completion: Completion  # the last answer, with every model step's usage summed


@dataclass(frozen=True)
class Waiting:
    action: RequiredAction
    model_step: int
    usage: Usage


@dataclass(frozen=True)
class Exceeded:
    usage: Usage


@dataclass(frozen=True)
class Failed:
    """The run cannot go on now (an MCP server's tools could not be listed): tried again later
    when `transient`, as after a transient LLM error."""

    why: str
    code: str
    transient: bool


@dataclass(frozen=True)
class HandOff:
    """Too little time left in this invocation for the next step: the run goes on in another."""


@dataclass(frozen=True)
class Stopped:
    """A model call ended with no answer (the runner retried or failed the task), or the task
    moved on (cancelled, or taken over)."""


Outcome = Finished | Waiting | Exceeded | Failed | HandOff | Stopped | Parked


class StepRunner:
    def __init__(
        self,
        store: TaskStore,
        journal: RunJournal,
        tools: ToolEndpoints | None,
        clock: Clock,
        mcp: McpClient | None = None,
    ) -> None:
        self._store = store
        self._journal = journal
        self._tools = tools
        self._clock = clock
        self._mcp = mcp

    async def run(
        self,
        task: Task,
        request: LLMRequest,
        lease_id: str,
        *,
        call_model: ModelCall,
        time_left: Callable[[], float],
        whole_call_s: float,
        show: ShowSteps | None = None,
    ) -> Outcome:
        steps = await asyncio.to_thread(self._journal.steps, task.task_id)
        await _shown(show, steps)  # the client's outputs, and any a crash left unshown
        failed = await self._list_tools(task, request, steps)
        if failed is not None:
            return failed
        await _shown(show, steps)
        functions = self._mcp_functions(task, steps)
        return await self._steps(
            task,
            _offering(request, functions),
            lease_id,
            steps,
            functions,
            call_model=call_model,
            time_left=time_left,
            whole_call_s=whole_call_s,
            show=show,
        )

    async def _steps(
        self,
        task: Task,
        request: LLMRequest,
        lease_id: str,
        steps: list[RunStep],
        functions: dict[str, McpFunction],
        *,
        call_model: ModelCall,
        time_left: Callable[[], float],
        whole_call_s: float,
        show: ShowSteps | None,
    ) -> Outcome:
        """The steps from the first unfinished one, `request` offering the MCP servers' tools."""
        taken = len(steps)  # the steps earlier claims took
        called = False  # a model call made in this claim
        while True:
            move = next_move(steps)
            if isinstance(move, Answer):
                return Finished(move.completion)
            if isinstance(move, CallTools):
                # A claim takes at least one step, however short its invocation: a hand-off
                # before any would come back to the same too-short time, again and again.
                fresh = not called and len(steps) == taken
                outcome = await self._tool_calls(
                    task, move, steps, time_left, functions, fresh=fresh, show=show
                )
                if outcome is not None:
                    return outcome
                continue
            assert isinstance(move, CallModel)
            if move.model_steps >= (task.max_steps or 0):
                return Exceeded(usage_of(steps))
            if called:
                if time_left() < whole_call_s:
                    return HandOff()
                if not await self._still_ours(task, lease_id):
                    return Stopped()
            started = self._started_at(task, move.step)
            completion = await call_model(conversation(request, steps), move.step)
            if completion is None or isinstance(completion, Parked):
                return completion or Stopped()
            called = True
            step = RunStep(
                step=move.step,
                type="model_call",
                started_at=started,
                ended_at=self._clock(),
                completion=completion,
            )
            steps.append(await self._record(task, step))
            logger.info("run step", step=move.step, kind="model_call", **task_keys(task))
            await _shown(show, steps)

    def _started_at(self, task: Task, step: int) -> float:
        """When the model step began: now, or when its background call was started."""
        running = task.provider_call
        return running.started_at if running is not None and running.step == step else self._clock()

    async def _list_tools(self, task: Task, request: LLMRequest, steps: list[RunStep]) -> Failed | None:
        """The tools of each MCP server no step has listed yet, listed and recorded (the i-th
        server's list is step i, before the first model call); Failed when one cannot be."""
        listed = {step.server_label for step in steps if step.type == "mcp_list_tools"}
        room = MAX_OFFERED_TOOLS - len(request.tools or [])
        room -= sum(len(step.tools or []) for step in steps if step.type == "mcp_list_tools")
        for number, server in enumerate(task.mcp_servers or []):
            if server.server_label in listed:
                continue
            started = self._clock()
            if self._mcp is None:
                return Failed("This deployment calls no MCP servers.", MCP_SERVER_UNAVAILABLE, False)
            try:
                given = await self._mcp.list_tools(server)
            except McpUnavailable as exc:
                return Failed(exc.detail, MCP_SERVER_UNAVAILABLE, exc.transient)
            offered = listed_tools(server, given, room=room)
            room -= len(offered)
            step = RunStep(
                step=number,
                type="mcp_list_tools",
                started_at=started,
                ended_at=self._clock(),
                server_label=server.server_label,
                tools=offered,
            )
            steps.append(await self._record(task, step))
            steps.sort(key=lambda done: done.step)
            logger.info("run step", step=number, kind="mcp_list_tools", tools=len(offered), **task_keys(task))
        return None

    @staticmethod
    def _mcp_functions(task: Task, steps: list[RunStep]) -> dict[str, McpFunction]:
        """The functions the model is offered for the MCP servers' tools, by name, from the lists."""
        servers = {server.server_label: server for server in task.mcp_servers or []}
        functions: dict[str, McpFunction] = {}
        for step in steps:
            server = servers.get(step.server_label or "")
            if step.type == "mcp_list_tools" and server is not None:
                for tool in step.tools or []:
                    functions.setdefault(tool.function_name, McpFunction(server, tool))
        return functions

    async def _tool_calls(
        self,
        task: Task,
        move: CallTools,
        steps: list[RunStep],
        time_left: Callable[[], float],
        functions: dict[str, McpFunction],
        *,
        fresh: bool = False,
        show: ShowSteps | None = None,
    ) -> Outcome | None:
        """The pending calls of the endpoints and MCP tools, each recorded; the outcome that ends
        this claim (the run waits for its client's outputs or approvals, or hands off), None when
        the model is next. A `fresh` claim (no step taken yet) makes its first call whatever time
        it has left."""
        urls = task.tool_urls or {}
        names = {tool.function.name for tool in task.request.tools or []}
        approved = set(task.approved_calls or [])
        clients: list[ToolCall] = []
        approvals: list[McpApprovalRequest] = []
        for number, call in move.pending:
            name = call.function.name
            if name in names and name not in urls:
                clients.append(call)
                continue
            mcp = functions.get(name)
            if mcp is not None and mcp.server.needs_approval(mcp.tool) and call.id not in approved:
                approvals.append(
                    McpApprovalRequest(
                        id=call.id,
                        server_label=mcp.server.server_label,
                        name=mcp.tool.name,
                        arguments=call.function.arguments,
                    )
                )
                continue
            caller = self._mcp if mcp is not None else self._tools
            if not fresh and caller is not None and time_left() < 2 * caller.timeout_s:
                return HandOff()
            fresh = False
            started = self._clock()
            label = None
            if mcp is not None:
                label = mcp.server.server_label
                output, source = await self._call_mcp(mcp, call), "mcp"
            elif name in urls and self._tools is None:
                output, source = "error: this deployment calls no function endpoints", "endpoint"
            elif name in urls and self._tools is not None:
                output, source = (
                    await self._tools.call(urls[name], call, secrets=await self._secrets(task)),
                    "endpoint",
                )
            else:
                output, source = f"error: no tool is named {name!r}", "unknown"
            step = RunStep(
                step=number,
                type="tool_call",
                started_at=started,
                ended_at=self._clock(),
                tool_call=call,
                source=source,
                output=output,
                server_label=label,
            )
            steps.append(await self._record(task, step))
            steps.sort(key=lambda done: done.step)
            logger.info("run step", step=number, kind="tool_call", tool=name, **task_keys(task))
            await _shown(show, steps)
        if clients or approvals:
            action = RequiredAction(tool_calls=clients, mcp_approval_requests=approvals or None)
            return Waiting(action, move.model_step, usage_of(steps))
        return None

    async def _call_mcp(self, mcp: McpFunction, call: ToolCall) -> str:
        if self._mcp is None:
            return "error: this deployment calls no MCP servers"
        return await self._mcp.call(mcp.server, mcp.tool.name, call)

    async def _record(self, task: Task, step: RunStep) -> RunStep:
        return await asyncio.to_thread(self._journal.record, task.task_id, step, expires_at=task.expires_at)

    async def _secrets(self, task: Task) -> list[str]:
        secrets = await asyncio.to_thread(
            self._store.tenants.secrets, task.tenant_id, new_secret=new_webhook_secret()
        )
        return secrets.signing(self._clock())

    async def _still_ours(self, task: Task, lease_id: str) -> bool:
        """The task is still this claim's (not cancelled, nor taken over): checked before each
        model call after the first, so a cancelled run spends no more tokens."""
        current = await asyncio.to_thread(self._store.get, task.task_id, now=self._clock())
        return current is not None and current.lease_id == lease_id


async def _shown(show: ShowSteps | None, steps: list[RunStep]) -> None:
    if show is not None:
        await show(steps)


def _offering(request: LLMRequest, functions: dict[str, McpFunction]) -> LLMRequest:
    """The task's request with the MCP servers' tools offered as functions after its own."""
    if not functions:
        return request
    offered = [function.tool.function_tool() for function in functions.values()]
    return request.model_copy(update={"tools": [*(request.tools or []), *offered]})
