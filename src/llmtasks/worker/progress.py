"""A streaming call's text so far, written as it comes: the text added since the last write as
the next numbered chunks of its output, and how far it got on their head (readers follow the
chunks from any point with `GET /tasks/{id}/output`; `GET /tasks/{id}` joins the attempt's chunks
as `partial_result` and reads `progress` from the head). The task's own item is not written: an
update is billed by the item's whole size, a long prompt included.

A run's claim writes its steps into the same chunks, as events in step order (`show`), each
model call's text before its event: one ordered stream of text and steps, read as a task's is."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from llmtasks.aws.store import TaskStore
from llmtasks.domain.errors import StaleWrite
from llmtasks.domain.llm_request import ToolCall
from llmtasks.domain.models import Task, TaskStatus, Usage
from llmtasks.domain.output import OutputChunk, pieces
from llmtasks.domain.rules import Clock
from llmtasks.domain.steps import RunStep, StepEvent, usage_of

# The head tells a call of its cancel, but writing it is a cancel's best effort: should that
# write fail, the call learns of the cancel from the task itself, read this often (a read of the
# whole item, where each progress write was a write of it).
TASK_CHECK_S = 30.0


class ProgressWriter:
    """Writes a streaming call's progress, at most once every `interval_s`: the text added since
    the last write as the output's next chunks (a PutItem each), then the head with the tokens so
    far (one UpdateItem of a small item). Each write carries only the new text: a call's writes
    add up to its text once, not to the square of it, whatever its prompt. StaleWrite when the
    head says the task ended (a cancel writes it) or a later attempt writes it, or (read every
    TASK_CHECK_S) the task is no longer this lease's, which ends the call. While the call runs
    its lease holds (it outlives the invocation), so no other delivery can take the task over: a
    cancel is the one way to lose it."""

    def __init__(
        self,
        store: TaskStore,
        task: Task,
        *,
        lease_id: str,
        interval_s: float,
        clock: Clock,
        text: bool = True,
    ) -> None:
        self._store = store
        self._task = task
        self._lease_id = lease_id
        self._interval_s = interval_s
        self._text = text  # False: a run's step events only, no text as it comes
        self._clock = clock
        self._written_at = clock()  # the first write comes one interval into the call
        self._checked_at = self._written_at  # the task as its claim found it
        self._sequence: int | None = None  # the output's last chunk, read at this attempt's first
        self._first: int | None = None  # this attempt's first chunk
        self._shown = -1  # a run's last step whose event is written (read with the sequence)
        self._call_step: int | None = None  # a run's model call in progress in this claim
        self.offset = 0  # characters of this attempt's text in chunks
        self.tokens = 0  # and its tokens

    async def record(self, text: str, tokens: int) -> None:
        now = self._clock()
        if not self._text:
            return
        if now - self._written_at < self._interval_s:
            return
        self._written_at = now
        if now - self._checked_at >= TASK_CHECK_S:
            self._checked_at = now
            await asyncio.to_thread(self._check_lease, now)
        await asyncio.to_thread(self._append, text, tokens, now + self._interval_s)

    def _check_lease(self, now: float) -> None:
        task = self._store.get(self._task.task_id, now=now)
        if task is None or task.status is not TaskStatus.PROCESSING or task.lease_id != self._lease_id:
            raise StaleWrite(self._task.task_id)

    def _load(self) -> None:
        """The output's last chunk and the run's last step shown, read at this attempt's first
        write. Consistent: an earlier attempt's last chunk must not be written over."""
        if self._sequence is not None:
            return
        head = self._store.output.head(self._task.task_id, consistent=True)
        self._sequence = head.last_sequence if head else 0
        self._first = self._sequence + 1
        self._shown = head.shown_step if head is not None and head.shown_step is not None else -1

    def _append(self, text: str, tokens: int, next_at: float) -> None:
        """The text added since the last write, as the next chunks."""
        added = text[self.offset :]
        if not added:
            return
        self._load()
        parts = pieces(added)
        for i, part in enumerate(parts):
            last_part = i == len(parts) - 1
            chunk_tokens = max(0, tokens - self.tokens) if last_part else 0
            self._put(part, chunk_tokens, next_at, offset=self.offset + len(part))

    def _put(
        self,
        text: str,
        tokens: int,
        next_at: float,
        *,
        offset: int,
        event: StepEvent | None = None,
        usage: Usage | None = None,
    ) -> None:
        """One chunk, then the head pointing to it; StaleWrite when the task ended meanwhile (a
        cancel writes the head) or a later attempt wrote it."""
        assert self._sequence is not None
        task = self._task
        chunk = OutputChunk(
            sequence=self._sequence + 1,
            text=text,
            tokens=tokens,
            attempt=max(1, task.attempts),
            written_at=datetime.fromtimestamp(self._clock(), UTC),
            event=event,
        )
        if not self._store.output.append(
            task.task_id,
            chunk,
            tenant_id=task.tenant_id,
            offset=offset,
            tokens=self.tokens + tokens,
            expires_at=task.expires_at,
            next_at=next_at,
            first_sequence=self._first or chunk.sequence,
            shown_step=event.step if event is not None and event.type != "requires_action" else None,
            usage=usage,
        ):
            raise StaleWrite(task.task_id)  # the task ended meanwhile: the call stops
        self._sequence = chunk.sequence
        self.offset, self.tokens = offset, self.tokens + tokens

    # --- a run's steps ---------------------------------------------------------------------

    def new_call(self, step: int) -> None:
        """A run's model call `step` begins: its text is written from its start (the chunks
        after the model call before it hold none of it)."""
        self._call_step = step
        self.offset = self.tokens = 0

    async def show(self, steps: list[RunStep]) -> list[RunStep]:
        """The events of the run's steps after the last one shown, in step order up to the first
        gap (a client's call not yet answered), each after the rest of its text for a model call
        of this claim's; the steps shown now. Each step is shown once, whichever claim records it
        (a client's outputs are shown by the claim that resumes the run)."""
        return await asyncio.to_thread(self._show, steps)

    def _show(self, steps: list[RunStep]) -> list[RunStep]:
        self._load()
        by_number = {step.step: step for step in steps}
        shown: list[RunStep] = []
        next_at = self._clock() + self._interval_s
        while (step := by_number.get(self._shown + 1)) is not None:
            done, usage = step.completion, None
            if done is not None and step.step == self._call_step:
                self._append(done.text, done.usage.completion_tokens, next_at)
            elif done is not None:
                self.offset = self.tokens = 0  # recorded by an earlier claim: none of its text here
            if done is not None:
                usage = usage_of([before for before in steps if before.step <= step.step])
            self._put("", 0, next_at, offset=self.offset, event=StepEvent.of(step), usage=usage)
            self._shown = step.step
            shown.append(step)
        return shown

    async def waiting(self, calls: list[ToolCall], model_step: int) -> None:
        """The run stops for its client: a `requires_action` event with the calls to answer."""

        def put() -> None:
            self._load()
            event = StepEvent.waiting(calls, model_step)
            self._put("", 0, self._clock() + self._interval_s, offset=self.offset, event=event)

        await asyncio.to_thread(put)
