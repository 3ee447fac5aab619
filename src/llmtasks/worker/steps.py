"""A run's steps within one claim of its task: read what the journal holds, then take the next
step, record it, and so on, until the model answers, the run must wait for its client, its time
in this invocation runs short, or its steps run out (domain/steps.py decides what comes next).

Each step is recorded (a conditional put) before the next starts, so a redelivery after a crash
or a timeout resumes at the first unfinished step and never makes a recorded model call again.
The model calls themselves (reserve, call, charge) are the runner's: it hands in `call_model`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from llmtasks.aws.run_steps import RunJournal
from llmtasks.aws.store import TaskStore
from llmtasks.domain.llm_request import LLMRequest, ToolCall
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
class HandOff:
    """Too little time left in this invocation for the next step: the run goes on in another."""


@dataclass(frozen=True)
class Stopped:
    """A model call ended with no answer (the runner retried or failed the task), or the task
    moved on (cancelled, or taken over)."""


Outcome = Finished | Waiting | Exceeded | HandOff | Stopped | Parked


class StepRunner:
    def __init__(
        self, store: TaskStore, journal: RunJournal, tools: ToolEndpoints | None, clock: Clock
    ) -> None:
        self._store = store
        self._journal = journal
        self._tools = tools
        self._clock = clock

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
                outcome = await self._tool_calls(task, move, steps, time_left, fresh=fresh, show=show)
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

    async def _tool_calls(
        self,
        task: Task,
        move: CallTools,
        steps: list[RunStep],
        time_left: Callable[[], float],
        *,
        fresh: bool = False,
        show: ShowSteps | None = None,
    ) -> Outcome | None:
        """The pending calls of the endpoints, each recorded; the outcome that ends this claim
        (the run waits for its client's outputs, or hands off), None when the model is next. A
        `fresh` claim (no step taken yet) makes its first call whatever time it has left."""
        urls = task.tool_urls or {}
        names = {tool.function.name for tool in task.request.tools or []}
        clients: list[ToolCall] = []
        for number, call in move.pending:
            name = call.function.name
            if name in names and name not in urls:
                clients.append(call)
                continue
            if not fresh and self._tools is not None and time_left() < 2 * self._tools.timeout_s:
                return HandOff()
            fresh = False
            started = self._clock()
            if name in urls and self._tools is None:
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
            )
            steps.append(await self._record(task, step))
            steps.sort(key=lambda done: done.step)
            logger.info("run step", step=number, kind="tool_call", tool=name, **task_keys(task))
            await _shown(show, steps)
        if clients:
            return Waiting(RequiredAction(tool_calls=clients), move.model_step, usage_of(steps))
        return None

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
