"""Stream records an operator chose to skip: one TasksTable item per record (`streamskip#<its
sequence number>`) with the reason and when it was marked. A stream consumer holding its shard on
a record it cannot read passes it over once it is marked (records.read_stream_record), and says so
in its log: the operator's way to unblock a consumer that retries until a change applies, in AWS
as locally (`llmtasks streams skip`). A DynamoDB stream keeps a record 24 hours; a mark expires
after SKIP_KEPT_S."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmtasks.aws.dynamo import deserialize, dynamodb_errors

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

SKIP_KEPT_S = 2 * 86_400  # past the stream's own 24 hours


@dataclass(frozen=True)
class SkipMark:
    sequence_number: str
    reason: str
    marked_at: float


class StreamSkips:
    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table_name = table_name
        self._client = client

    def mark(self, sequence_number: str, *, reason: str, now: float) -> SkipMark:
        with dynamodb_errors("put"):
            self._client.put_item(
                TableName=self.table_name,
                Item={
                    "pk": {"S": _key(sequence_number)},
                    "reason": {"S": reason},
                    "marked_at": {"N": repr(now)},
                    "expires_at": {"N": str(int(now + SKIP_KEPT_S))},
                },
            )
        return SkipMark(sequence_number, reason, now)

    def marked(self, sequence_number: str) -> SkipMark | None:
        with dynamodb_errors("read"):
            item = self._client.get_item(
                TableName=self.table_name, Key={"pk": {"S": _key(sequence_number)}}, ConsistentRead=True
            ).get("Item")
        if not item:
            return None
        fields = deserialize(item)
        return SkipMark(sequence_number, str(fields["reason"]), float(fields["marked_at"]))


def _key(sequence_number: str) -> str:
    return f"streamskip#{sequence_number}"
