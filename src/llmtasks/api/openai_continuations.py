"""`POST /v1/responses` with `previous_response_id`: a response continued, as OpenAI's SDK does
it after a response that called functions, or to go on with a conversation.

- The previous response waits for its function calls' outputs (a run in requires_action, which
  reads as `completed` with function_call items): the input's function_call_output items are
  the run's tool outputs, taken as POST /tasks/{id}/tool_outputs takes them
  (RunService.submit_tool_outputs), and the run goes on. The answer is the same response (the
  run's id), `in_progress` again: `responses.retrieve(answer.id)` until it completes gives the
  run's next wait or its answer, and its webhook event carries that id too.
- It completed: a new response (a new task) whose messages are its conversation (its input, then
  a run's steps or its answer), then this input; this request's own fields apply to it (OpenAI
  carries neither the instructions nor the tools over).
- The outputs a run already took for one of its waits, sent again (the SDK retries a request
  whose reply it lost): the same response, as it is now.
- Anything else is a 400 saying why: one still queued or in progress, failed or cancelled.
A previous response that is not the caller's, or not there, is a 404.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from llmtasks.api.openai_inputs import FunctionCallOutputItem
from llmtasks.api.openai_requests import CreateResponse
from llmtasks.api.openai_responses import answered_waits, resumed_after
from llmtasks.domain.caller import Caller
from llmtasks.domain.errors import ApiError, InvalidInput, TaskConflict, TaskNotFound
from llmtasks.domain.events import task_id_of
from llmtasks.domain.llm_request import ChatMessage
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.services.tasks import TaskService

_FIELD = "previous_response_id"


class PreviousResponseNotFound(ApiError):
    status, title, slug = 404, "Previous response not found", "previous-response-not-found"

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Previous response with id '{response_id[:80]}' not found.")
        self.field = _FIELD


@dataclass(frozen=True)
class Continued:
    task: Task
    # Where its events start for a reader who read the previous response's to its end.
    starting_after: int


def continue_response(
    service: TaskService, caller: Caller, body: CreateResponse, *, idempotency_key: str | None
) -> Continued:
    previous_id = body.previous_response_id or ""
    try:
        previous = service.get(caller.tenant_id, task_id_of(previous_id))
    except TaskNotFound:
        raise PreviousResponseNotFound(previous_id) from None
    replayed = _replayed(service, previous, body)
    if replayed is not None:
        return replayed
    if previous.status is TaskStatus.REQUIRES_ACTION:
        outputs = body.tool_outputs()
        runs = service.runs
        with _as_continuation(previous):
            resumed = runs.submit_tool_outputs(previous, outputs)
        return Continued(resumed, resumed_after(resumed, runs.recorded(resumed)))
    if previous.status is TaskStatus.COMPLETED:
        request = body.task_request(history=service.runs.history(previous))
        _answers_open_calls(request.messages or [])
        submission = service.submit(caller.tenant_id, request, idempotency_key=idempotency_key, caller=caller)
        return Continued(submission.task, -1)
    raise InvalidInput(
        f"Previous response with id '{previous_id[:80]}' is {_said(previous)}: a response continues"
        " once it has completed, or while it waits for its function calls' outputs.",
        field=_FIELD,
    )


def _replayed(service: TaskService, previous: Task, body: CreateResponse) -> Continued | None:
    """The outputs a run already took for one of its waits, sent again (the SDK retries a request
    whose reply it lost): the response as it is now, as the first request answered it. None when
    the input is not exactly such outputs."""
    if not previous.is_run or isinstance(body.input, str):
        return None
    items = body.input
    if not all(isinstance(item, FunctionCallOutputItem) for item in items):
        return None
    given = {item.call_id: item.chat().content for item in items if isinstance(item, FunctionCallOutputItem)}
    steps = service.runs.recorded(previous)
    taken = {
        step.tool_call.id: step.output
        for step in steps
        if step.source == "client" and step.tool_call is not None
    }
    waiting = previous.action_step if previous.status is TaskStatus.REQUIRES_ACTION else None
    for model_step, calls in answered_waits(previous, steps):
        answered = {call.id for call in calls}
        if (
            model_step != waiting
            and answered == set(given)
            and all(taken.get(i) == given[i] for i in answered)
        ):
            return Continued(previous, resumed_after(previous, steps, model_step))
    return None


def _answers_open_calls(messages: list[ChatMessage]) -> None:
    """Each function_call_output answers a call made before it and not answered yet (a completed
    run's calls all are: their outputs went to the run)."""
    asked: set[str] = set()
    answered: set[str] = set()
    for message in messages:
        asked |= {call.id for call in message.tool_calls or []}
        if message.tool_call_id is None:
            continue
        if message.tool_call_id not in asked - answered:
            raise InvalidInput(
                f"No function call awaiting its output has the call_id '{message.tool_call_id[:80]}'"
                " of a function_call_output item.",
                field="input",
            )
        answered.add(message.tool_call_id)


def _said(task: Task) -> str:
    return {TaskStatus.PENDING: "queued", TaskStatus.PROCESSING: "in progress"}.get(
        task.status, task.status.value
    )


@contextlib.contextmanager
def _as_continuation(previous: Task) -> Iterator[None]:
    """The run's refusals in the request's terms: its outputs are the input's items, and a run
    that stopped waiting meanwhile (another continuation took it on) is a response not waiting."""
    try:
        yield
    except InvalidInput as refused:
        action = previous.required_action
        asked = [call.id for call in action.tool_calls] if action else []
        asked += [request.id for request in action.mcp_approval_requests or []] if action else []
        raise InvalidInput(
            "The function_call_output and mcp_approval_response items must answer the calls the"
            f" response waits for, each once ({', '.join(asked)}): {refused.detail}",
            field="input",
        ) from None
    except TaskConflict:
        raise InvalidInput(
            f"Previous response with id 'resp_{previous.task_id}' no longer waits for function call outputs.",
            field=_FIELD,
        ) from None
