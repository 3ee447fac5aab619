"""Unblocking TasksTable's stream consumers (`llmtasks streams skip`): a record they cannot read
is marked, and they pass it over at their next retry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmtasks.aws.stream_skips import SkipMark, StreamSkips

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


def skip_record(
    dynamodb: DynamoDBClient, tasks_table: str, sequence_number: str, *, reason: str, now: float
) -> SkipMark:
    return StreamSkips(tasks_table, dynamodb).mark(sequence_number, reason=reason, now=now)
