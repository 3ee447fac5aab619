"""What the HTTP API does with a run: take the client's tool outputs and MCP approvals (each output
and denial recorded as its call's step, the approved calls kept on the task for the worker to
make, then the run goes on: a new TaskQueue message), list its steps, give a finished task's
conversation (what a response continued by `previous_response_id` starts from), and wake a run
whose background call the provider's webhook says has ended."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from llmtasks.aws.queues import TaskLanes
from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.store import TaskStore
from llmtasks.domain.errors import InvalidInput, RouteNotServed, TaskConflict, Unauthorized
from llmtasks.domain.llm_request import ChatMessage
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.domain.rules import Clock
from llmtasks.domain.runs import MAX_CLIENT_OUTPUT_BYTES, SubmitToolOutputs
from llmtasks.domain.steps import RunStep, StepList, StepView, conversation
from llmtasks.observability import logger, task_keys

# OpenAI's webhook events that end a background response.
# OpenAI's events of a batch's end: a provider batch's job looked at at once.
BATCH_ENDED_EVENTS = frozenset({"batch.completed", "batch.failed", "batch.expired", "batch.cancelled"})
ENDED_EVENTS = frozenset(
    {"response.completed", "response.failed", "response.cancelled", "response.incomplete"}
)
# The run's message comes this long after the outputs are written (an SQS delay), so that it
# finds the task processing under a lapsed lease; one that comes early looks again
# (runner.RESUME_RECHECK_S).
RESUME_DELAY_S = 1


class RunService:
    def __init__(
        self,
        store: TaskStore,
        lanes: TaskLanes,
        results: ResultBlobs,
        *,
        clock: Clock = time.time,
        openai_webhook_secret: str | None = None,
        job_ended: Callable[[str], bool] | None = None,
    ) -> None:
        self._job_ended = job_ended  # a provider batch's job the provider says ended
        self._store = store
        self._openai_webhook_secret = openai_webhook_secret
        self._lanes = lanes
        self._journal = store.journal(results)
        self._clock = clock

    def submit_tool_outputs(self, task: Task, body: SubmitToolOutputs) -> Task:
        """The client's outputs of the calls `task` (the tenant's, as read) waits for, and its
        approvals of the MCP calls: each output and denial recorded as its call's step, then the
        run processing again (the approved calls on the task) with its message sent. 409 when the task
        waits for nothing; 422 when the answers do not answer exactly the calls it waits for."""
        action, model_step = task.required_action, task.action_step
        if task.status is not TaskStatus.REQUIRES_ACTION or action is None or model_step is None:
            raise TaskConflict(f"Task '{task.task_id}' is {task.status.value}, not waiting for tool outputs.")
        asked = [call.id for call in action.tool_calls]
        given = {output.tool_call_id: output.output for output in body.tool_outputs}
        if set(given) != set(asked):
            raise InvalidInput(
                "tool_outputs must answer exactly the calls required_action.tool_calls lists:"
                f" {', '.join(asked) or 'none'}.",
                field="tool_outputs",
            )
        to_approve = [request.id for request in action.mcp_approval_requests or []]
        approvals = {approval.approval_request_id: approval for approval in body.mcp_approvals}
        if set(approvals) != set(to_approve):
            raise InvalidInput(
                "mcp_approvals must answer exactly the requests required_action.mcp_approval_requests"
                f" lists: {', '.join(to_approve) or 'none'}.",
                field="mcp_approvals",
            )
        denied = {
            call_id: approval.denial() for call_id, approval in approvals.items() if not approval.approve
        }
        if any(len(output.encode()) > MAX_CLIENT_OUTPUT_BYTES for output in given.values()):
            raise InvalidInput(
                f"a tool output is over {MAX_CLIENT_OUTPUT_BYTES:,} bytes of UTF-8.", field="tool_outputs"
            )
        asking = self._journal.get(task.task_id, model_step)
        calls = asking.completion.tool_calls or [] if asking and asking.completion else []
        now = self._clock()
        servers = {request.id: request.server_label for request in action.mcp_approval_requests or []}
        for index, call in enumerate(calls):
            if call.id in given or call.id in denied:
                step = RunStep(
                    step=model_step + 1 + index,
                    type="tool_call",
                    started_at=now,
                    ended_at=now,
                    tool_call=call,
                    source="client" if call.id in given else "mcp",
                    output=given.get(call.id, denied.get(call.id)),
                    server_label=servers.get(call.id),
                )
                self._journal.record(task.task_id, step, expires_at=task.expires_at)
        # The message first, then the write: a run written pending always has its message.
        self._lanes.send(task, delay_s=RESUME_DELAY_S)
        approved = [call_id for call_id, approval in approvals.items() if approval.approve]
        resumed = self._store.resume(
            task.task_id, tenant_id=task.tenant_id, model_step=model_step, now=now, approved=approved
        )
        logger.info(
            "tool outputs taken",
            calls=len(given),
            approved=len(approved),
            denied=len(denied),
            **task_keys(task),
        )
        return resumed

    def steps(self, task: Task, *, limit: int, cursor: str | None) -> StepList:
        """A page of the run's steps (the tenant's task, as read), in order, from `cursor`."""
        first = int(cursor) if cursor is not None else 0
        page = self._journal.steps(task.task_id, first=first, limit=limit + 1)
        more = len(page) > limit
        page = page[:limit]
        return StepList(
            steps=[StepView.of(step) for step in page],
            next_cursor=str(page[-1].step + 1) if more and page else None,
        )

    def provider_event(self, payload: str, headers: Mapping[str, str]) -> bool:
        """OpenAI's webhook event, verified by its signature: when it ends a run's background
        call, the run is woken (its lease lapsed, its message sent) to read the answer now. True
        when a run was woken. RouteNotServed when no secret is configured; Unauthorized when the
        signature does not verify."""
        if not self._openai_webhook_secret:
            raise RouteNotServed(
                "This deployment takes no OpenAI webhook (OPENAI_WEBHOOK_SECRET is not set)."
            )
        from standardwebhooks import Webhook, WebhookVerificationError

        try:
            event = Webhook(self._openai_webhook_secret).verify(payload, dict(headers))
        except (WebhookVerificationError, ValueError) as exc:
            raise Unauthorized(f"The webhook's signature does not verify ({exc}).") from None
        kind, data = event.get("type"), event.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            return False
        if kind in BATCH_ENDED_EVENTS and self._job_ended is not None:
            return self._job_ended(data["id"])
        if kind not in ENDED_EVENTS:
            return False
        response_id = data["id"]
        task_id = self._store.task_of_provider_call(response_id)
        if task_id is None or not self._store.wake(task_id, response_id=response_id, now=self._clock()):
            return False
        task = self._store.get(task_id, now=self._clock())
        if task is None:
            return False
        self._lanes.send(task)
        logger.info("woken by the provider's webhook", event=kind, **task_keys(task))
        return True

    def recorded(self, task: Task) -> list[RunStep]:
        """Every step the run (the tenant's task, as read) has recorded, in order."""
        return self._journal.steps(task.task_id) if task.is_run else []

    def history(self, task: Task) -> list[ChatMessage]:
        """The conversation of a completed task (the tenant's, as read, its result hydrated): its
        messages (its prompt as the user's), then a run's steps as messages, or the one answer."""
        if task.is_run:
            messages = conversation(task.request, self.recorded(task)).messages
            return list(messages or [])
        asked = task.request.messages or [ChatMessage(role="user", content=task.request.prompt)]
        answered = bool(task.tool_calls) or task.refusal is not None
        answer = ChatMessage(
            role="assistant",
            content=task.result or (None if answered else ""),
            refusal=task.refusal,
            tool_calls=task.tool_calls or None,
        )
        return [*asked, answer]
