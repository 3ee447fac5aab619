"""A task's output as it is written: numbered chunks that a reader follows from any point for as
long as the task lives (`GET /tasks/{id}/output?after=N`).

Each progress write of a streaming call adds chunks (numbered from 1: the text the call added
since the last write, the tokens it added, the attempt that wrote it). A retried task's next
attempt writes its text again from its start, in chunks numbered on from the last one: a reader
that shows the text starts over when `attempt` changes. Once the task completes, one more chunk
holds the rest of the result, the part its completing attempt's chunks do not (the whole result
when that attempt streamed nothing), so that attempt's chunks always add up to the result.

A run's chunks also carry its steps as events, in step order (`event`, its text empty): each
model call's text comes in the chunks before its `model_call` event, its tool calls' events
after it, and a `requires_action` event when the run stops for its client. The chunks after a
run's last `model_call` event hold none of its text, and the head's offset counts the last model
call's text alone, so its last chunk holds the rest of the answer as a task's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from llmtasks.domain.models import Task, TaskStatus, Usage
from llmtasks.domain.steps import StepEvent

# A page's chunks: one BatchGetItem's worth, and a body well under Lambda's 6 MB reply (JSON can
# escape a character into six).
MAX_PAGE_CHUNKS = 100
MAX_PAGE_BYTES = 900_000
# How much of a running task's text so far `GET /tasks/{id}` shows as `partial_result`: its first
# 100 KiB, as the task's item held it when progress writes carried it (the rest of the text, and
# each piece as it comes: GET /tasks/{id}/output).
PARTIAL_RESULT_BYTES = 100 * 1024
# A chunk's text at most (characters): an item stays under DynamoDB's 400 KB at four bytes each.
MAX_CHUNK_CHARS = 90_000


class OutputChunk(BaseModel):
    sequence: int = Field(
        ge=1, description="Its place in the task's output, from 1; pass as `after` to read on."
    )
    text: str = Field(
        description="The text the model added (a retried attempt's chunks start its text over)."
    )
    tokens: int = Field(ge=0, description="The tokens it added (about one a streamed piece).")
    attempt: int = Field(
        ge=1, description="The attempt that wrote it: when it changes, the text starts over."
    )
    written_at: datetime = Field(description="When it was written (the last chunk: when the task completed).")
    event: StepEvent | None = Field(
        default=None,
        description="A run's step, or its pause for its client (the chunk's text is then empty).",
    )


@dataclass(frozen=True)
class OutputHead:
    """What a reader polls: the last chunk's number, how far the latest attempt's chunks go, and
    once the task ended, how."""

    tenant_id: str
    last_sequence: int  # 0 before any chunk
    attempt: int
    offset: int  # characters of `attempt`'s text in its chunks
    tokens: int  # and its tokens
    status: TaskStatus | None = None  # set once the task ended
    first_sequence: int | None = None  # `attempt`'s first chunk (None: written before it was kept)
    next_at: float | None = None  # when the next chunk is due (the last one's write + the interval)
    written_at: float | None = None  # when the last chunk was written (None: before it was kept)
    shown_step: int | None = None  # a run's: the last step whose event is written (in step order)
    usage: Usage | None = None  # a run's: its model calls' usage so far, summed

    @property
    def ended(self) -> bool:
        return self.status is not None


class TaskOutputPage(BaseModel):
    """`GET /tasks/{id}/output`: the chunks after `after`, in order."""

    task_id: str
    chunks: list[OutputChunk]
    after: int = Field(
        ge=0, description="The last chunk's sequence number so far: pass it as `after` to read on."
    )
    final: bool = Field(description="No chunk follows: the task ended and this page has its last chunk.")
    status: TaskStatus | None = Field(default=None, description="The task's status, on the final page.")
    error: str | None = Field(default=None, description="Why the task failed, on the final page.")
    error_code: str | None = None


def last_chunk(task: Task, head: OutputHead | None) -> OutputChunk | None:
    """A completed task's last chunk: its result after what its completing attempt's chunks hold.
    None for a task that did not complete, or whose chunks already hold all of it."""
    if task.status is not TaskStatus.COMPLETED or task.result is None:
        return None
    last_sequence = head.last_sequence if head else 0
    # The head's offset counts the completing attempt's chunks only if that attempt wrote it.
    same_attempt = head is not None and head.attempt == task.attempts
    offset, tokens = (head.offset, head.tokens) if head is not None and same_attempt else (0, 0)
    rest = task.result[offset:]
    if not rest:
        return None
    completion_tokens = task.usage.completion_tokens if task.usage else 0
    return OutputChunk(
        sequence=last_sequence + 1,
        text=rest,
        tokens=max(0, completion_tokens - tokens),
        attempt=max(1, task.attempts),
        written_at=datetime.fromtimestamp(task.completed_at or task.created_at, UTC),
    )


def pieces(text: str) -> list[str]:
    """`text` in chunks of at most MAX_CHUNK_CHARS."""
    return [text[i : i + MAX_CHUNK_CHARS] for i in range(0, len(text), MAX_CHUNK_CHARS)] or [""]
