"""What the worker does with one TaskQueue message: claim the task under a lease, call the LLM
(paced, streaming its progress), and record the outcome, a retry or a dead letter.

Everything here talks to the table and the queues through their adapters, never to boto3, and
takes its clock and randomness from the constructor so tests can pin them.

Long because TaskRunner is one task's whole run under its lease (claim, call, charge, record,
retry or dead letter): its steps share the lease and the clock, and read in the order they run.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from aws_lambda_powertools.metrics import MetricUnit

from llmtasks.aws.batch_store import BatchCancellations
from llmtasks.aws.budgets import BudgetExhausted, KeyBudgets
from llmtasks.aws.key_limits import KeyRates
from llmtasks.aws.limits import RunningCalls
from llmtasks.aws.pacing import CallPacer
from llmtasks.aws.queues import MAX_DELAY_S, TaskLanes
from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.store import ClaimRefused, TaskStore
from llmtasks.domain.answers import answer_problem
from llmtasks.domain.budgets import BUDGET_EXHAUSTED
from llmtasks.domain.errors import (
    FLEX_UNAVAILABLE,
    RATE_LIMITED,
    BackendError,
    KeysFull,
    LLMError,
    RetryLater,
    StaleWrite,
    TaskConflict,
    TaskNotFound,
)
from llmtasks.domain.input_files import (
    INPUT_FILE_MISSING,
    MAX_TASK_FILE_BYTES,
    FileFacts,
    InputFileMissing,
    with_file_data,
)
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import (
    INVALID_OUTPUT,
    AttemptRecord,
    Lease,
    ProviderCall,
    Task,
    TaskStatus,
    Usage,
)
from llmtasks.domain.rate_limits import KeyLimits
from llmtasks.domain.rules import Clock, dimensions_of
from llmtasks.domain.runs import MAX_STEPS_EXCEEDED
from llmtasks.domain.steps import RunStep, is_tool_error
from llmtasks.llm import ENDED_CODE_PREFIX, BackgroundCall, BackgroundCalls, LLMProvider
from llmtasks.observability import Metric, emit, emit_noted, logger, task_keys, tracer
from llmtasks.settings import RunnerSettings
from llmtasks.worker.pace import PaceFull, wait_for_pace
from llmtasks.worker.progress import ProgressWriter
from llmtasks.worker.steps import (
    Exceeded,
    Failed,
    Finished,
    HandOff,
    McpClient,
    Parked,
    StepRunner,
    ToolEndpoints,
    Waiting,
)

# How long a first delivery waits, between looks, for the item submit writes after the message.
ITEM_RECHECKS_S = (0.02, 0.05, 0.1, 0.2, 0.4)
# How soon a message's first delivery looks again at a task whose lease another delivery holds.
HELD_LEASE_RECHECK_S = 3.0
# A call ends this long before the function's timeout, to leave time to write its outcome.
OUTCOME_TIME_S = 10.0
# The bytes of named files an invocation holds for its calls at once: a call's request carries
# them base64-encoded, about five times their size in memory in all, and a function has 512 MB.
# One call always runs, whatever its files (a task names 50 MB at most).
HELD_FILE_BYTES = MAX_TASK_FILE_BYTES
# How soon a message that finds its run still waiting looks again (its tool outputs are being written).
RESUME_RECHECK_S = 2.0
# A run's model calls after its first in a claim reserve under names of their own (budgets.py),
# numbered past any attempt count.
STEP_RESERVATIONS = 10_000
# Each look at a model call in the provider's background mode waits this many times longer than
# the one before (from RunnerSettings.background_first_look_s), up to SQS's longest delay; the
# provider's webhook wakes the run at once.
BACKGROUND_LOOK_GROWTH = 1.5
# The time a start, a look or a cancel of a background call may take at the provider.
BACKGROUND_REQUEST_S = 30.0
# A task whose tenant is at its running cap comes back after this long (to twice it, jittered),
# as the running calls of a tenant end every few seconds to minutes.
CAPPED_RETRY_S = 5.0
KEYS_FULL = "keys_full"  # the error_code of a task waiting for room in its LLM keys' minute
TENANT_TPM = "tenant_tpm"  # ... and of one waiting for its tenant's share of tokens a minute
# The waiting tasks come back over this long at most after their minute may have room: longer
# leaves a key idle while they sleep, shorter sends more of them back to the queue again.
ROOM_SPREAD_S = 5.0


@dataclass(frozen=True)
class Delivery:
    """One receipt of a TaskQueue message, as the worker got it."""

    message_id: str
    receive_count: int  # SQS ApproximateReceiveCount: 1 on the first delivery
    sent_at: float  # epoch s
    # Promised a whole call's time: an event's record when the function's Timeout holds one, or
    # a record the invocation received itself when a slot came free (call_slots.py). Its call
    # starts only if that time is still left after the receive and the claim, else the task goes
    # back to its queue unattempted. A call cut short by the invocation's end is a call the
    # provider bills and nobody gets: under load, an event's last record could wait out most of
    # the invocation on its claim. Without the promise (a Timeout shorter than a whole call) the
    # call gets what is left, at least a second.
    whole_call: bool = False


class TaskRunner:
    """What the worker does with one TaskQueue message: claim, call the LLM, record the outcome."""

    def __init__(
        self,
        settings: RunnerSettings,
        store: TaskStore,
        lanes: TaskLanes,
        llm: LLMProvider,
        *,
        clock: Clock = time.time,
        rng: random.Random | None = None,
        results: ResultBlobs,
        pacer: CallPacer | None = None,
        cancellations: BatchCancellations | None = None,
        running: RunningCalls | None = None,
        budgets: KeyBudgets | None = None,
        held_file_limit: int = HELD_FILE_BYTES,
        tenant_rates: KeyRates | None = None,
        tools: ToolEndpoints | None = None,
        background: BackgroundCalls | None = None,
        mcp: McpClient | None = None,
    ) -> None:
        self._settings = settings
        self._background = background  # the provider's background mode, where it has one
        self._tenant_rates = tenant_rates  # the tenants' tokens a minute (a key's --tpm)
        self._budgets = budgets
        self._held_file_limit = held_file_limit
        self._held_file_bytes = 0  # of the calls running in this invocation (its event loop)
        self._store = store
        self._lanes = lanes
        self._cancellations = cancellations
        self._running = running
        self._llm = llm
        self._pacer = pacer
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not crypto
        self._results = results
        # A run's function endpoints and MCP servers (services/tool_calls.py, mcp_tools.py).
        self._steps = StepRunner(store, store.journal(results), tools, clock, mcp)

    @property
    def whole_call_s(self) -> float:
        """The time an invocation must have left to give a call its whole timeout."""
        return self._settings.llm_timeout_s + OUTCOME_TIME_S

    async def run(self, task_id: str, delivery: Delivery, *, remaining_s: Callable[[], float]) -> None:
        """Runs the delivery within the invocation's time (`remaining_s` reads what is left, as the
        Lambda context does). Raises RetryLater when this delivery must come back later: another
        delivery holds a live lease on the task, or the message arrived before its task's item was
        written."""
        try:
            await self._run(task_id, delivery, remaining_s=remaining_s)
        except BaseException:
            if delivery.receive_count >= self._settings.task_max_receive_count:
                # SQS moves the message to TaskDLQ instead of delivering it again. (A delivery
                # killed by the function's timeout cannot count itself: TaskDLQ's depth alarm does.)
                logger.warning("dead-lettered", task_id=task_id, receive_count=delivery.receive_count)
                emit(Metric.DEAD_LETTERED)
            raise

    async def _run(self, task_id: str, delivery: Delivery, *, remaining_s: Callable[[], float]) -> None:
        now = self._clock()
        lease_id = uuid.uuid4().hex
        lease_until = now + remaining_s() + self._settings.lease_margin_s
        try:
            task = await self._claim(task_id, delivery, lease_id=lease_id, lease_until=lease_until, now=now)
        except ClaimRefused as refused:
            current = refused.current
            if current is not None and current.status is TaskStatus.CANCELLED and current.provider_call:
                await self._cancel_provider_call(current, current.provider_call)
            self._refused(task_id, delivery, refused, now)
            return
        logger.info("claimed", attempt=task.attempts, receive_count=delivery.receive_count, **task_keys(task))
        dimensions = dimensions_of(task, self._settings.llm_model)
        if task.attempts == 1:
            emit(Metric.QUEUE_WAIT, max(0.0, now - task.created_at), MetricUnit.Seconds, **dimensions)
        if task.batch_id and self._cancellations is not None:
            cancelled = await asyncio.to_thread(self._cancellations.cancelled, task.batch_id, now=now)
            if cancelled:
                # Its batch is being cancelled and the sweep has not reached this item yet: no call.
                self._cancel(task)
                return

        unrunnable = await self._unrunnable(task, now)
        if unrunnable is not None:
            if task.provider_call is not None:  # its deadline passed while the provider ran it
                await self._cancel_provider_call(task, task.provider_call)
            self._fail(task, lease_id, *unrunnable)
            return
        if delivery.whole_call and remaining_s() < self.whole_call_s:
            # The receive and the claim ate into the time the refill counted on: no call that
            # the invocation's end would cut; the task waits in the queue, costing no retry.
            why = "The invocation that took the task no longer had the time for a whole call."
            self._schedule_retry(task, lease_id, 0, why, "invocation_ending", attempted=False)
            return
        running, cap = self._running, self._running_cap(task)
        if running is None or cap is None:
            await self._call_and_record(task, lease_id, now, remaining_s)
            return
        if not await asyncio.to_thread(
            running.take, task.tenant_id, task.task_id, cap=cap, until=lease_until
        ):
            # The tenant has `cap` calls running: this one waits in the queue, costing no retry.
            delay = self._rng.uniform(CAPPED_RETRY_S, 2 * CAPPED_RETRY_S)
            why = f"The tenant has {cap} calls running, its cap."
            self._schedule_retry(task, lease_id, delay, why, "tenant_capped", attempted=False)
            return
        try:
            await self._call_and_record(task, lease_id, now, remaining_s)
        finally:
            try:
                await asyncio.to_thread(running.give_back, task.tenant_id, task.task_id)
            except BackendError:
                # The outcome is stored; the place is cleared once its lease lapses.
                logger.warning("running place not given back", **task_keys(task))

    async def _unrunnable(
        self, task: Task, now: float, request: LLMRequest | None = None, *, attempt: int | None = None
    ) -> tuple[str, str] | None:
        """Why the claimed task (or a run's next model call: `request`, `attempt` as in
        `_reserve_again`) fails without a call (its error and code), if it does: its deadline
        passed, or its key's budget has no room for the call."""
        deadline = task.deadline
        if deadline is not None and now >= deadline and task.last_error_code == FLEX_UNAVAILABLE:
            # It waited on its queue for the flex tier, and its message came back too late.
            ran_out = _flex_ran_out(task.timeout_s, self._settings.flex_wait_s)
            return f"{task.last_error} ({ran_out})", FLEX_UNAVAILABLE
        if deadline is not None and now >= deadline:
            return "The task's deadline passed before it could run.", "deadline_exceeded"
        return await self._reserve_again(task, request, attempt=attempt)

    async def _reserve_again(
        self, task: Task, request: LLMRequest | None = None, *, attempt: int | None = None
    ) -> tuple[str, str] | None:
        """A task whose submit's reservation is spent (an attempt was billed) or settled (a batch
        retry ran it again) reserves its most cost again before this call; the submit's covers
        the first call. A run's later model call (`request`, its step's) reserves under its own
        name (`attempt`)."""
        if task.budget is None or task.key_id is None or self._budgets is None:
            return None
        if attempt is None and task.retried_at is None and not task.billed_cost:
            return None
        request = request or task.request
        files = await self._file_facts(task, request)
        model = request.model or self._settings.llm_model
        most = self._settings.price_table.most_cost(request, model, files)
        try:
            await asyncio.to_thread(
                self._budgets.reserve,
                task.key_id,
                task.budget,
                task.task_id,
                most,
                attempt=task.attempts if attempt is None else attempt,
            )
        except BudgetExhausted as exhausted:
            return exhausted.detail, BUDGET_EXHAUSTED
        return None

    def _running_cap(self, task: Task) -> int | None:
        """The tenant's running calls this task may join: the tighter of the stack's cap and its
        key's; None when neither caps it."""
        caps = [c for c in (self._settings.tenant_max_running, task.max_running) if c]
        return min(caps) if caps else None

    async def _call_and_record(
        self, task: Task, lease_id: str, now: float, remaining_s: Callable[[], float]
    ) -> None:
        """The claimed task's LLM call, within its time, and its outcome stored; the files it
        names held in memory meanwhile, within what the invocation may hold."""
        held = await self._hold_files(task, lease_id)
        if held is None:
            return
        try:
            await self._paced_call(task, lease_id, now, remaining_s)
        finally:
            self._held_file_bytes -= held

    async def _hold_files(self, task: Task, lease_id: str) -> int | None:
        """The bytes of the files the task names, now counted as held by this invocation; None
        when the task is dealt with instead: a file is gone (it fails), or the invocation holds
        other calls' files and this one would pass its limit (it waits in its queue)."""
        named = task.request.file_ids()
        if not named:
            return 0
        found = [await asyncio.to_thread(self._results.file, task.tenant_id, file_id) for file_id in named]
        sizes = [stored.size for stored in found if stored is not None]
        if len(sizes) < len(named):
            gone = named[[stored is None for stored in found].index(True)]
            self._fail(task, lease_id, str(InputFileMissing(gone)), INPUT_FILE_MISSING)
            return None
        if self._held_file_bytes and self._held_file_bytes + sum(sizes) > self._held_file_limit:
            delay = self._rng.uniform(CAPPED_RETRY_S, 2 * CAPPED_RETRY_S)
            why = "The invocation holds other calls' files: this one waits for room."
            self._schedule_retry(task, lease_id, delay, why, "files_held", attempted=False)
            return None
        self._held_file_bytes += sum(sizes)
        return sum(sizes)

    async def _paced_call(
        self, task: Task, lease_id: str, now: float, remaining_s: Callable[[], float]
    ) -> None:
        """The call once its pace allows, with the task's files read in, and its outcome."""
        deadline = task.deadline
        # Leave time to write the outcome before the function's own timeout.
        timeout = min(self._settings.llm_timeout_s, max(1.0, remaining_s() - OUTCOME_TIME_S))
        if deadline is not None:
            timeout = min(timeout, deadline - now)
        looking = task.provider_call is not None  # a look at a background call is no new call
        if self._pacer is not None and not looking:
            try:
                timeout -= await wait_for_pace(self._pacer, timeout, self._clock)
            except PaceFull as full:
                # No slot this invocation can still use: the task waits in the queue meanwhile.
                self._schedule_retry(
                    task, lease_id, full.backlog_s, "The LLM call pace is full.", "paced", attempted=False
                )
                return
        tokens = 0 if looking else await self._most_tokens(task)
        if not looking and not await self._take_tenant_share(task, lease_id, tokens):
            return
        used = 0
        try:
            used = await self._read_and_call(
                task, lease_id, call_s=timeout, tokens=tokens, remaining_s=remaining_s
            )
        finally:
            await self._settle_tenant_share(task, tokens, used)

    async def _read_and_call(
        self, task: Task, lease_id: str, *, call_s: float, tokens: int, remaining_s: Callable[[], float]
    ) -> int:
        """The call (a run's steps, for a run) with the task's files read in, and its outcome; the
        tokens it used."""
        try:
            # The files the task names, read in for this call only: the task keeps their ids.
            read = functools.partial(self._results.input_file, task.tenant_id)
            request = await asyncio.to_thread(with_file_data, task.request, read)
        except InputFileMissing as missing:
            self._fail(task, lease_id, str(missing), INPUT_FILE_MISSING)
            return 0
        progress: ProgressWriter | None
        if task.is_run:
            progress = self._run_writer(task, lease_id)
            completion = await self._run_steps(task, request, lease_id, call_s, remaining_s, tokens, progress)
        else:
            progress = self._progress_writer(task, lease_id)
            completion = await self._call(task, request, lease_id, call_s, progress, tokens)
            completion = completion and await self._charge(task, completion)
        if completion is None:
            return 0
        await self._record(task, lease_id, completion, progress)
        return completion.usage.total_tokens

    async def _record(
        self, task: Task, lease_id: str, completion: Completion, progress: ProgressWriter | None
    ) -> None:
        """The answer stored as the task's result, or retried when it is not what was asked."""
        dimensions = dimensions_of(task, self._settings.llm_model)
        problem = answer_problem(
            task.request,
            completion.text,
            refused=completion.refusal is not None,
            called_tools=bool(completion.tool_calls),
        )
        if problem is not None and task.is_run:
            # A run's last answer is recorded: a retry would read it again, not ask anew.
            self._fail(task, lease_id, problem, INVALID_OUTPUT, answer=completion)
            return
        if problem is not None:
            # Billed, but not what was asked: retried like a transient error, the text kept if
            # it is the last.
            error = LLMError(problem, code=INVALID_OUTPUT, transient=True)
            self._after_llm_error(task, lease_id, error, answer=completion)
            return
        result_ref = self._result_ref(task, completion.text)
        try:
            await asyncio.to_thread(
                self._store.complete,
                task.task_id,
                lease_id=lease_id,
                completion=completion,
                now=self._clock(),
                result_ref=result_ref,
                # A run's usage is its steps', summed in the completion: its attempts carry none.
                attempt=self._attempt(task, "completed", usage=None if task.is_run else completion.usage),
            )
        except StaleWrite:
            # Cancelled (or taken over after our lease lapsed) while the call ran: the result is
            # discarded, never written over a terminal state; what it cost stays on the timeline.
            logger.info("result discarded", **task_keys(task))
            await asyncio.to_thread(
                self._store.record_discarded,
                task.task_id,
                self._attempt(task, "discarded", usage=completion.usage),
            )
            return
        offset, tokens = (progress.offset, progress.tokens) if progress else (0, 0)
        await asyncio.to_thread(
            self._store.output.ended, task, TaskStatus.COMPLETED, offset=offset, tokens=tokens
        )
        # pragma: no mutate start, a log line's words, for operators
        logger.info(
            "completed", model=completion.model, total_tokens=completion.usage.total_tokens, **task_keys(task)
        )
        # pragma: no mutate end
        emit(Metric.COMPLETED, **dimensions)
        emit(Metric.LLM_TOKENS, completion.usage.total_tokens, **dimensions)
        emit(Metric.END_TO_END, max(0.0, self._clock() - task.created_at), MetricUnit.Seconds, **dimensions)

    async def _run_steps(
        self,
        task: Task,
        request: LLMRequest,
        lease_id: str,
        first_s: float,
        remaining_s: Callable[[], float],
        first_tokens: int,
        progress: ProgressWriter,
    ) -> Completion | None:
        """A run's steps in this claim (worker/steps.py); its last answer when the model gave it,
        else None once the claim's end is written (a wait, a hand-off, a failure). Its output
        stream gets each model call's text as it comes and each step's event (`progress`)."""
        first = True

        async def call_model(asked: LLMRequest, step: int) -> Completion | Parked | None:
            nonlocal first
            limit = (
                first_s
                if first
                else min(self._settings.llm_timeout_s, max(1.0, remaining_s() - OUTCOME_TIME_S))
            )
            tokens = first_tokens
            if not first:
                now = self._clock()
                refused = await self._unrunnable(task, now, asked, attempt=STEP_RESERVATIONS + step)
                if refused is not None:
                    self._fail(task, lease_id, *refused)
                    return None
                limit = min(limit, task.deadline - now) if task.deadline is not None else limit
                tokens = await self._most_tokens(task, asked)
            first = False
            progress.new_call(step)
            if task.provider_background and self._background is not None:
                return await self._background_step(task, asked, lease_id, step, tokens)
            streamed = progress if self._settings.progress_interval_s > 0 else None
            done = await self._call(task, asked, lease_id, limit, streamed, tokens)
            return done and await self._charge(task, done)

        async def show(steps: list[RunStep]) -> None:
            try:
                shown = await progress.show(steps)
            except (StaleWrite, BackendError) as error:
                # The journal has the steps: the stream is a view of it, and the next claim
                # shows what this one could not (a cancel ends the run before its next call).
                logger.warning("run steps not shown", error=type(error).__name__, **task_keys(task))
                return
            for step in shown:
                self._step_metrics(step)

        outcome = await self._steps.run(
            task,
            request,
            lease_id,
            call_model=call_model,
            time_left=remaining_s,
            whole_call_s=self.whole_call_s,
            show=show,
        )
        if isinstance(outcome, Finished):
            return outcome.completion
        if isinstance(outcome, Waiting):
            try:
                # Shown before the wait is written: once it is, the run is no longer this claim's.
                await progress.waiting(outcome.action.tool_calls, outcome.model_step)
            except (StaleWrite, BackendError) as error:
                logger.warning("run's wait not shown", error=type(error).__name__, **task_keys(task))
            try:
                await asyncio.to_thread(
                    self._store.await_action,
                    task.task_id,
                    lease_id=lease_id,
                    action=outcome.action,
                    model_step=outcome.model_step,
                    usage=outcome.usage,
                )
            except StaleWrite:
                logger.info("cancelled during the run", **task_keys(task))
                return None
            logger.info("requires action", calls=len(outcome.action.tool_calls), **task_keys(task))
        elif isinstance(outcome, Exceeded):
            why = f"The run needed more than its max_steps ({task.max_steps}) model calls."
            self._fail(task, lease_id, why, MAX_STEPS_EXCEEDED, usage=outcome.usage)
        elif isinstance(outcome, Failed):
            # Before any model call: retried (or failed) as a provider's error is.
            unlisted = LLMError(outcome.why, code=outcome.code, transient=outcome.transient)
            self._after_llm_error(task, lease_id, unlisted)
        elif isinstance(outcome, HandOff):
            why = "The invocation's time ran short: the run goes on in another."
            self._schedule_retry(task, lease_id, 0, why, "continued", attempted=False)
        elif isinstance(outcome, Parked):
            await self._park(task, lease_id, outcome)
        return None

    async def _background_step(
        self, task: Task, request: LLMRequest, lease_id: str, step: int, tokens: int
    ) -> Completion | Parked | None:
        """Model step `step` in the provider's background mode: started (the run parks), or
        looked at (parks again while it runs), or its answer, charged; None when an error ended
        the claim (retried or failed as a plain call's is)."""
        assert self._background is not None
        running = task.provider_call if task.provider_call and task.provider_call.step == step else None
        try:
            if running is None:
                call = await self._background.start_background(
                    request, timeout_s=BACKGROUND_REQUEST_S, tokens=tokens
                )
                started = ProviderCall(
                    step=step,
                    response_id=call.response_id,
                    key_index=call.key_index,
                    model=call.model,
                    started_at=self._clock(),
                )
                logger.info("background call started", step=step, **task_keys(task))
                return Parked(started, self._look_in(0))
            done = await self._background.poll_background(
                _background_call(running), timeout_s=BACKGROUND_REQUEST_S
            )
        except LLMError as error:
            if running is not None and error.transient and not error.code.startswith(ENDED_CODE_PREFIX):
                # The look failed, not the call, which may still run there: look again later.
                logger.warning("background call not looked at", error=str(error), **task_keys(task))
                return Parked(running, self._look_in(running.polls))
            self._after_llm_error(task, lease_id, error)
            return None
        except KeysFull as full:
            delay = self._room_delay(full.soonest_s, full.wait_s)
            self._schedule_retry(task, lease_id, delay, str(full), KEYS_FULL, attempted=False)
            return None
        if done is None:
            return Parked(
                running.model_copy(update={"polls": running.polls + 1}), self._look_in(running.polls + 1)
            )
        logger.info("background call ended", step=step, polls=running.polls + 1, **task_keys(task))
        return await self._charge(task, done)

    def _look_in(self, looks: int) -> float:
        """How long after `looks` looks the next look at a background call comes."""
        return min(self._settings.background_first_look_s * BACKGROUND_LOOK_GROWTH**looks, MAX_DELAY_S)

    async def _park(self, task: Task, lease_id: str, parked: Parked) -> None:
        """The run released while its model step runs at the provider: its message first, due
        when the call is next looked at, then the write (as a retry's)."""
        delay = min(math.ceil(parked.look_in_s), MAX_DELAY_S)
        if parked.call.polls == 0:  # just started: its webhook will name the response alone
            await asyncio.to_thread(
                self._store.note_provider_call,
                parked.call.response_id,
                task_id=task.task_id,
                expires_at=task.expires_at,
            )
        sent_at = self._clock()
        self._lanes.send(task, delay_s=delay)
        try:
            await asyncio.to_thread(
                self._store.park,
                task.task_id,
                lease_id=lease_id,
                call=parked.call,
                look_at=sent_at + delay - 1,
            )
        except StaleWrite:
            # Cancelled meanwhile: the call it started is cancelled at the provider too.
            logger.info("cancelled during the run", **task_keys(task))
            await self._cancel_provider_call(task, parked.call)
            return
        logger.info("parked", step=parked.call.step, look_in_s=delay, **task_keys(task))

    async def _cancel_provider_call(self, task: Task, call: ProviderCall) -> None:
        """A cancelled run's background call, cancelled at the provider (once: then forgotten)."""
        if self._background is None:
            return
        try:
            await self._background.cancel_background(_background_call(call), timeout_s=BACKGROUND_REQUEST_S)
        except LLMError as error:
            # It has ended there, or the provider is away: it would bill no more than it has.
            logger.warning("background call not cancelled", error=str(error), **task_keys(task))
        await asyncio.to_thread(self._store.forget_provider_call, task.task_id, response_id=call.response_id)
        logger.info("background call cancelled", step=call.step, **task_keys(task))

    def _run_writer(self, task: Task, lease_id: str) -> ProgressWriter:
        """A run's output writer: its steps' events always, its model calls' text as it comes
        when progress is written."""
        interval = self._settings.progress_interval_s
        return ProgressWriter(
            self._store, task, lease_id=lease_id, interval_s=interval, clock=self._clock, text=interval > 0
        )

    @staticmethod
    def _step_metrics(step: RunStep) -> None:
        """A run's step counted once, as its event is written: RunSteps by kind; a tool call's in
        ToolCalls (and ToolCallErrors, failed) by who answered it, its tool's name kept in the
        record, out of the dimensions (tenants name their tools: a metric each would cost)."""
        emit(Metric.RUN_STEPS, kind=step.type)
        if step.tool_call is None:
            return
        tool = {"tool": step.tool_call.function.name[:128]}
        emit_noted(Metric.TOOL_CALLS, tool, source=step.source)
        if is_tool_error(step):
            emit_noted(Metric.TOOL_CALL_ERRORS, tool, source=step.source)

    def _result_ref(self, task: Task, text: str) -> str | None:
        """Where a text too large for the item is kept (ResultsBucket), else None."""
        if len(text.encode()) <= self._settings.max_inline_result_bytes:
            return None
        # If the task was cancelled meanwhile the object is orphaned; the bucket's lifecycle
        # rule removes it with the rest.
        return self._results.put(task.task_id, text)

    async def _charge(self, task: Task, completion: Completion) -> Completion:
        """The completion priced, and counted in its tenant's and batch's spend before anything
        else is written: the provider billed it whatever becomes of the task."""
        usage = self._settings.price_table.price(completion.usage, completion.model)
        try:
            await asyncio.to_thread(
                self._store.usage.charge, task, usage, model=completion.model, now=self._clock()
            )
        except BackendError:
            # Storing the answer comes first: a retry of the whole delivery would pay for the call again.
            logger.exception("usage not counted", model=completion.model, **task_keys(task))
        emit(
            Metric.LLM_COST,
            usage.cost_usd or 0.0,
            MetricUnit.NoUnit,
            model=completion.model,
            tenant=task.tenant_id,
        )
        return completion.model_copy(update={"usage": usage})

    def _progress_writer(self, task: Task, lease_id: str) -> ProgressWriter | None:
        if self._settings.progress_interval_s <= 0:
            return None
        return ProgressWriter(
            self._store,
            task,
            lease_id=lease_id,
            interval_s=self._settings.progress_interval_s,
            clock=self._clock,
        )

    async def _call(
        self,
        task: Task,
        request: LLMRequest,
        lease_id: str,
        timeout_s: float,
        progress: ProgressWriter | None,
        tokens: int,
    ) -> Completion | None:
        """The LLM's completion of `request` (the task's, its files read in); None when there is
        none to store (the error is dealt with)."""
        started = self._clock()  # the clock the other latencies are read on (and tests set)
        try:
            return await self._complete(task, request, timeout_s, progress, tokens)
        except LLMError as error:
            self._after_llm_error(task, lease_id, error)
        except KeysFull as full:
            # No key has room in its minute: the task waits on its queue until the first may.
            delay = self._room_delay(full.soonest_s, full.wait_s)
            self._schedule_retry(task, lease_id, delay, str(full), KEYS_FULL, attempted=False)
        except StaleWrite:
            # A progress write found the task cancelled (its output's head ended, or the task
            # read so): the call was stopped there, and no more tokens are spent on it.
            logger.info("call stopped: the task moved on", **task_keys(task))
        finally:
            elapsed_ms = max(0.0, self._clock() - started) * 1000
            dimensions = dimensions_of(task, self._settings.llm_model)
            emit(Metric.LLM_LATENCY, elapsed_ms, MetricUnit.Milliseconds, **dimensions)
        return None

    # A subsegment of its own in the trace; its reply (the result text) is never put in it.
    @tracer.capture_method(capture_response=False)
    async def _complete(
        self, task: Task, request: LLMRequest, timeout_s: float, progress: ProgressWriter | None, tokens: int
    ) -> Completion:
        tracer.put_annotation("task_id", task.task_id)
        return await self._llm.complete(
            request, timeout_s=timeout_s, on_progress=progress.record if progress else None, tokens=tokens
        )

    async def _take_tenant_share(self, task: Task, lease_id: str, tokens: int) -> bool:
        """The call's tokens reserved in its tenant's minute (its key's --tpm), so that one
        tenant's large calls leave the provider keys' minute to the others; False when the
        minute has no room and the task waits on its queue instead."""
        if self._tenant_rates is None or task.tpm is None:
            return True
        limits = KeyLimits(tpm=task.tpm)
        reserve = self._tenant_rates.reserve
        now = self._clock()
        wait = await asyncio.to_thread(reserve, task.tenant_id, limits, tokens, now)
        if wait <= 0:
            return True
        soonest = self._tenant_rates.seen[task.tenant_id].soonest_s(limits, tokens, now)
        why = f"The tenant's {task.tpm} tokens a minute are taken: the call waits for its share."
        delay = self._room_delay(soonest, wait)
        self._schedule_retry(task, lease_id, delay, why, TENANT_TPM, attempted=False)
        return False

    def _room_delay(self, soonest_s: float, wait_s: float) -> float:
        """How long a call with no room in a minute waits on its queue: a time drawn from when
        the minute may have room (the running calls give back what they did not use) to when
        it has room for sure, or ROOM_SPREAD_S after the first if that is sooner, plus up to a
        second. So the waiting tasks come back spread out, a few at a time as the minute
        refills, not all at once to be sent back again; and none waits past its sure room."""
        soonest = max(0.0, soonest_s)
        latest = min(max(soonest, wait_s), soonest + ROOM_SPREAD_S)
        return self._rng.uniform(soonest, latest) + self._rng.uniform(0, 1)

    async def _settle_tenant_share(self, task: Task, reserved: int, used: int) -> None:
        """The tenant's minute counts what the call used (nothing, when it made no answer)."""
        if self._tenant_rates is None or task.tpm is None:
            return
        try:
            limits = KeyLimits(tpm=task.tpm)
            await asyncio.to_thread(self._tenant_rates.settle, task.tenant_id, limits, reserved, used)
        except BackendError:
            logger.warning("tenant's minute not settled", **task_keys(task))  # it refills anyway

    async def _most_tokens(self, task: Task, request: LLMRequest | None = None) -> int:
        """The most tokens the call (the task's, or a run's step's `request`) can use, as its
        budget counts them: what the provider's tokens-a-minute limits are reserved with before it."""
        request = request or task.request
        model = request.model or self._settings.llm_model
        return self._settings.price_table.most_tokens(request, model, await self._file_facts(task, request))

    async def _file_facts(self, task: Task, request: LLMRequest) -> dict[str, FileFacts]:
        """The sizes (and pages) of the files a request names, that the estimates bound it by."""
        files: dict[str, FileFacts] = {}
        for file_id in request.file_ids():
            facts = await asyncio.to_thread(self._results.file_facts, task.tenant_id, file_id)
            files |= {file_id: facts} if facts is not None else {}
        return files

    async def _claim(
        self, task_id: str, delivery: Delivery, *, lease_id: str, lease_until: float, now: float
    ) -> Task:
        """The lease on the task; it outlives this invocation, so no other delivery takes the task
        while we may still write, and after a crash or timeout the next delivery takes over once
        it lapses. A first delivery that finds no item looks again for a moment: submit writes
        the item milliseconds after the message, and a message returned to the queue would wait
        seconds."""
        lease = Lease(
            lease_id=lease_id,
            until=lease_until,
            message_id=delivery.message_id,
            receive_count=delivery.receive_count,
            dead_letter_at=self._dead_letter_at(lease_until, delivery.receive_count),
        )
        for recheck_in_s in (*ITEM_RECHECKS_S, None):
            try:
                # In a thread, like the other writes of a run: the batch's other records keep
                # their calls moving (and a paced call leaves on time) while this one waits.
                return await asyncio.to_thread(self._store.claim, task_id, lease, now=now)
            except ClaimRefused as refused:
                if not refused.missing or recheck_in_s is None or delivery.receive_count > 1:
                    raise
                await asyncio.sleep(recheck_in_s)
        raise AssertionError("unreachable: the last recheck raises")

    def _dead_letter_at(self, lease_until: float, receive_count: int) -> float:
        """If this delivery dies, the message comes back one visibility timeout after it was
        received (so before the lease lapses plus that), as long as it has deliveries left. Once
        each of those is past due (with a grace for the pollers) and none has claimed the task,
        even one that died before the handler ran, the message is in TaskDLQ."""
        left = max(0, self._settings.task_max_receive_count - receive_count)
        return lease_until + left * (
            self._settings.task_visibility_timeout_s + self._settings.dead_letter_grace_s
        )

    def _refused(self, task_id: str, delivery: Delivery, refused: ClaimRefused, now: float) -> None:
        """Returns when the message is done with; raises RetryLater when it must come back."""
        max_receives = self._settings.task_max_receive_count
        if refused.missing:
            grace_left = self._settings.unwritten_task_grace_s - (now - delivery.sent_at)
            if grace_left <= 0:
                logger.warning("no task for this message; dropped", task_id=task_id)
                return
            # The item is usually milliseconds behind its message, so the first waits are short;
            # the delivery before the last waits out the grace, so that a late item is never left
            # pending with its message in TaskDLQ.
            if delivery.receive_count >= max_receives - 1:
                raise RetryLater(grace_left + 1, "the task's item is not written yet") from refused
            delay = min(grace_left, 2.0 ** (delivery.receive_count - 1))
            raise RetryLater(delay, "the task's item is not written yet") from refused
        current = refused.current
        if current is None or current.status.is_terminal:
            logger.info("nothing to run", task_id=task_id, status=current and current.status.value)
            return
        if current.status is TaskStatus.REQUIRES_ACTION:
            if delivery.receive_count >= max_receives - 1:
                logger.info("the run waits for its client; message dropped", task_id=task_id)
                return
            # Tool outputs send the run's message just before they write the task processing.
            raise RetryLater(RESUME_RECHECK_S, "the run is resuming") from refused
        if current.status is TaskStatus.PENDING:
            # A retry is scheduled and has its own delayed message: this one (a duplicate, or a
            # redelivery after a lost reply) would only call the provider before its Retry-After.
            logger.info("early delivery dropped; the retry's message runs the task", task_id=task_id)
            return
        # Another message's delivery holds a live lease (a duplicate, or a retry that came early).
        if delivery.receive_count >= max_receives:
            # Returned once more, this copy would only land in TaskDLQ. The holder's own message
            # brings the task back if that delivery dies.
            logger.info("duplicate delivery dropped", task_id=task_id)
            return
        wait = (current.lease_until or now) - now + 1
        if delivery.receive_count == 1:
            # Most often this is the task's own retry message, sent just before the release was
            # written (a write slower than the message's delay): look again soon, not after a
            # lease that is about to be given up. A true copy waits out the lease next time.
            wait = min(wait, HELD_LEASE_RECHECK_S)
        logger.info("lease held elsewhere", task_id=task_id, retry_in_s=round(wait))
        raise RetryLater(wait, "lease held by another delivery") from refused

    def _after_llm_error(
        self, task: Task, lease_id: str, error: LLMError, *, answer: Completion | None = None
    ) -> None:
        """A failed call, or `answer`, billed but not what was asked (error says why): retried
        while retries and time remain; failed otherwise, the answer's text kept."""
        now = self._clock()
        logger.warning("llm error", **task_keys(task), error_code=error.code, transient=error.transient)
        if error.code == FLEX_UNAVAILABLE:
            self._wait_for_flex(task, lease_id, error, now)
            return
        if not error.transient:
            self._fail(task, lease_id, str(error), error.code)
            return
        if task.attempts - task.attempts_before_retry > task.max_retries:
            message = f"{error} (gave up after {task.attempts} attempts)"
            self._fail(task, lease_id, message, error.code, answer=answer)
            return
        delay = self.backoff_s(task.attempts)
        if self._pacer is not None and error.code == RATE_LIMITED and error.retry_after is not None:
            # The pace ran ahead of the provider's own count: every worker waits the Retry-After,
            # and this task's retry takes the pace's next slot after it, without a backoff of its own.
            self._pacer.hold(now + error.retry_after)
            delay = 0
        if error.retry_after is not None:
            if error.retry_after > self._settings.retry_after_cap_s:
                self._fail(
                    task,
                    lease_id,
                    f"{error} (the provider asked to retry in {error.retry_after:.0f} s, beyond the"
                    f" {self._settings.retry_after_cap_s:.0f} s this service waits)",
                    "retry_after_too_long",
                )
                return
            delay = max(delay, error.retry_after)
        deadline = task.deadline
        if deadline is not None and now + delay >= deadline:
            message = f"{error} (no time left for a retry before the deadline)"
            self._fail(task, lease_id, message, "deadline_exceeded", answer=answer)
            return
        usage = answer.usage if answer else None
        self._schedule_retry(task, lease_id, delay, str(error), error.code, usage=usage)

    def _wait_for_flex(self, task: Task, lease_id: str, error: LLMError, now: float) -> None:
        """The provider's flex tier had no capacity for the call (its 429 Resource Unavailable,
        not billed, and not the key's limit): the task goes back on its queue, costing none of
        its retries, until its timeout_s from its submit (else flex_wait_s) runs out; then it
        fails. Each wait is drawn between retry_base_delay_s and the time the task has waited so
        far (so the waits about double), at most retry_max_delay_s, at least a Retry-After."""
        settings = self._settings
        base = settings.retry_base_delay_s
        ceiling = max(base, min(settings.retry_max_delay_s, now - task.created_at))
        delay = self._rng.uniform(base, ceiling)
        if error.retry_after is not None:
            delay = max(delay, min(error.retry_after, settings.retry_after_cap_s))
        deadline = task.deadline
        give_up = deadline if deadline is not None else task.created_at + settings.flex_wait_s
        if now + delay >= give_up:
            why = f"{error} ({_flex_ran_out(task.timeout_s, settings.flex_wait_s)})"
            self._fail(task, lease_id, why, FLEX_UNAVAILABLE)
            return
        self._schedule_retry(task, lease_id, delay, str(error), FLEX_UNAVAILABLE, attempted=False)

    def _schedule_retry(
        self,
        task: Task,
        lease_id: str,
        delay: float,
        error: str,
        error_code: str,
        *,
        attempted: bool = True,
        usage: Usage | None = None,
    ) -> None:
        """The task back to pending with a delayed message of its own; `attempted` False when no
        call left (the pace was full), so the wait costs the task none of its retries."""
        # A new message with a delay, sent before the task is released: if we die in between,
        # the lease makes the new message wait and the old one finds the task already done.
        # SQS delays are whole seconds up to 15 minutes: never earlier than asked, never later
        # than the message can be held back (else it would arrive before next_attempt_at).
        delay = min(math.ceil(delay), MAX_DELAY_S)
        # Due from the send, not from the release: the message is delivered `delay` after it
        # was sent, and a release written over a second later (a loaded table) made the task
        # not yet due when its message came, which then dropped it as an early copy.
        sent_at = self._clock()
        # On the task's own lane, under that lane's concurrency, grouped by its tenant.
        self._lanes.send(task, delay_s=delay)
        try:
            self._store.release(
                task.task_id,
                lease_id=lease_id,
                error=error,
                error_code=error_code,
                next_attempt_at=sent_at + delay,
                attempted=attempted,
                attempt=self._attempt(task, "retry", error_code, usage=usage),
            )
        except StaleWrite:
            logger.info("cancelled during the call", **task_keys(task))
            return
        logger.info("retry scheduled", **task_keys(task), attempt=task.attempts, delay_s=delay)

    def _attempt(
        self,
        task: Task,
        outcome: Literal["completed", "failed", "retry", "discarded"],
        error_code: str | None = None,
        *,
        usage: Usage | None = None,
    ) -> AttemptRecord:
        """The attempt this claim ran, as it ends now (for the task's timeline); with the usage
        the provider billed for it."""
        now = self._clock()
        started = task.attempt_started_at if task.attempt_started_at is not None else now
        return AttemptRecord(
            attempt=task.attempts,
            started_at=started,
            ended_at=now,
            outcome=outcome,
            error_code=error_code,
            usage=usage,
        )

    def backoff_s(self, attempt: int) -> float:
        """Exponential backoff with full jitter (AWS Architecture Blog, 'Exponential Backoff And Jitter')."""
        ceiling = min(
            self._settings.retry_max_delay_s, self._settings.retry_base_delay_s * 2 ** (attempt - 1)
        )
        return self._rng.uniform(0, ceiling)

    def _cancel(self, task: Task) -> None:
        try:
            self._store.cancel(task.task_id, tenant_id=task.tenant_id, now=self._clock())
        except (TaskNotFound, TaskConflict):
            return  # the sweep cancelled it first
        logger.info("cancelled with its batch", **task_keys(task))
        emit(Metric.CANCELLED, **dimensions_of(task, self._settings.llm_model))

    def _fail(
        self,
        task: Task,
        lease_id: str,
        error: str,
        error_code: str,
        *,
        answer: Completion | None = None,
        usage: Usage | None = None,
    ) -> None:
        """The task failed; with the `answer` the provider billed for its last attempt, if any,
        whose text and message are kept (an answer that did not fit its response_format)."""
        try:
            self._store.fail(
                task.task_id,
                lease_id=lease_id,
                error=error,
                error_code=error_code,
                now=self._clock(),
                attempt=self._attempt(task, "failed", error_code, usage=answer.usage if answer else None),
                answer=answer,
                result_ref=self._result_ref(task, answer.text) if answer else None,
                usage=usage,
            )
        except StaleWrite:
            logger.info("cancelled during the call", **task_keys(task))
            return
        self._store.output.ended(task, TaskStatus.FAILED)
        logger.info("failed", **task_keys(task), error_code=error_code)
        emit(Metric.FAILED, error_code=error_code, **dimensions_of(task, self._settings.llm_model))


def _flex_ran_out(timeout_s: float | None, flex_wait_s: float) -> str:
    """Why a flex task that never found flex capacity failed: its time ran out."""
    waited = (
        f"its timeout_s ({timeout_s:g} s)"
        if timeout_s is not None
        else f"the {flex_wait_s:g} s a flex task without a timeout_s waits"
    )
    return f"no flex capacity came before {waited} ran out"


def _background_call(call: ProviderCall) -> BackgroundCall:
    return BackgroundCall(response_id=call.response_id, key_index=call.key_index, model=call.model)
