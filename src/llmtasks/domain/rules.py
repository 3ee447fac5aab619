"""The rules of a task that the API, batches and the worker share: its id, its size limits,
its metric dimensions, the lane it runs in. No I/O here."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from llmtasks.domain.bedrock_models import Refusal, check_request
from llmtasks.domain.errors import (
    InvalidInput,
    PayloadTooLarge,
)
from llmtasks.domain.models import (
    Task,
    TaskOptions,
)

Clock = Callable[[], float]


def new_task_id() -> str:
    return uuid.uuid4().hex


def is_task_id(text: str) -> bool:
    """The shape new_task_id makes. Anything else cannot name a task, so it is not looked up
    (a 3 KB id would otherwise reach DynamoDB and fail its key-size check)."""
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


@dataclass(frozen=True)
class SizeLimits:
    """How large a task's text and metadata may be (MAX_PROMPT_BYTES, MAX_METADATA_BYTES); on a
    Bedrock stack, its model (LLM_MODEL), whose capabilities a task must fit."""

    max_prompt_bytes: int
    max_metadata_bytes: int
    bedrock_model: str | None = None


def check_limits(body: TaskOptions, limits: SizeLimits, *, where: str = "") -> None:
    """The size limits of one task body, and on Bedrock what its model takes; `where` names its
    place in a bigger body (items[3])."""
    size = body.text_bytes()
    if size > limits.max_prompt_bytes:
        of = f" of {where}" if where else ""
        raise PayloadTooLarge(
            f"The prompt{of} is {size} bytes (its text and inline data: images and documents as data"
            f" URLs count); the limit is {limits.max_prompt_bytes} bytes. Upload larger images and"
            " documents with POST /v1/files or /v1/uploads (purpose user_data) and name them by file_id."
        )
    if body.metadata is not None:
        check_metadata(body.metadata, limits, field=f"{where}.metadata" if where else "metadata")
    if limits.bedrock_model is not None:
        model = body.model or limits.bedrock_model
        try:
            check_request(body, model)
        except Refusal as refused:
            field = f"{where}.{refused.field}" if where else refused.field
            raise InvalidInput(f"{field}: {refused.why} (Bedrock model {model}).", field=field) from None


def check_metadata(metadata: dict[str, Any], limits: SizeLimits, *, field: str = "metadata") -> None:
    size = len(json.dumps(metadata, separators=(",", ":")).encode())
    if size > limits.max_metadata_bytes:
        limit = limits.max_metadata_bytes
        raise InvalidInput(f"{field} is {size} bytes; the limit is {limit}.", field=field)


def dimensions_of(task: Task, default_model: str) -> dict[str, str]:
    """A task's metric dimensions besides the service: few values each, as CloudWatch wants;
    `default_model` is the provider's (LLM_MODEL), for a task that names none."""
    return {"model": task.request.model or default_model, "priority": task.priority}


class Lane(StrEnum):
    """The queue a task's messages travel on, each with invocations of its own."""

    HIGH = "high"  # HighTaskQueue: slots kept for urgent tasks
    NORMAL = "normal"  # TaskQueue
    BACKGROUND = "background"  # BatchTaskQueue: batch items and low-priority tasks


def lane_of(task: Task) -> Lane:
    """High-priority tasks (batch items too) run in their own lane; batch items and low-priority
    tasks in the background lane; the rest in the normal one."""
    if task.priority == "high":
        return Lane.HIGH
    if task.priority == "low" or task.batch_id is not None:
        return Lane.BACKGROUND
    return Lane.NORMAL
