"""The API's page cursors (task listings, batch results): opaque to clients, and exactly what
their pattern in the OpenAPI document says. Each is a position, not a capability: any cursor that
matches the pattern names a place in what the caller pages through (its own tasks, that batch's
items), so a cursor made for another listing is a place in this one, never another's data, and
one a client cannot have been given (a position past the end) reads as an empty last page."""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmtasks.domain.errors import InvalidInput

# A task listing continues after a task: its creation time (as DynamoDB holds the number) and id.
TASKS_CURSOR_PATTERN = r"^[0-9]{1,16}(\.[0-9]{1,20})?-[0-9a-f]{32}$"
# A batch's results continue at an item's index.
RESULTS_CURSOR_PATTERN = r"^(0|[1-9][0-9]{0,8})$"


@dataclass(frozen=True)
class TaskPosition:
    """Where a page of a tenant's tasks (newest first) continues: after this task."""

    created_at: str  # the decimal number as stored, so that the position is exact
    task_id: str

    @property
    def cursor(self) -> str:
        return f"{self.created_at}-{self.task_id}"

    @classmethod
    def of(cls, cursor: str) -> TaskPosition:
        if not re.fullmatch(TASKS_CURSOR_PATTERN, cursor):
            raise InvalidInput("cursor is not one this API returned.", field="cursor")
        created_at, task_id = cursor.rsplit("-", 1)
        return cls(created_at=created_at, task_id=task_id)


def results_cursor(index: int) -> str:
    return str(index)


def results_index(cursor: str) -> int:
    if not re.fullmatch(RESULTS_CURSOR_PATTERN, cursor):
        raise InvalidInput("cursor is not one this API returned.", field="cursor")
    return int(cursor)
