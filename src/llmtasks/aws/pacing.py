"""A shared pace for LLM calls: at most N calls per second across every worker sandbox.

Each call reserves the next free start time on one TasksTable item, the way GCRA (the generic
cell rate algorithm) spaces cells: `next_at` moves on by SLACK/N per reservation, and the caller
waits until its reserved time. So calls leave evenly spaced, never in bursts, however many
sandboxes run; a provider's requests-per-second limit then answers no 429s, instead of many that
each cost a retry and its backoff. One conditional write per call; none when pacing is off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.aws.dynamo import is_condition_failure
from llmtasks.domain.errors import BackendError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.literals import ReturnValueType
    from mypy_boto3_dynamodb.type_defs import UpdateItemOutputTypeDef

PACER_KEY = {"pk": {"S": "pacer#llm"}}
# Calls leave on time but arrive some milliseconds off it; a provider counting any one second
# would see the pace's last call of a second and its first of the next as too close. Spacing
# them 5% wider leaves 50 ms of slack in every second.
SLACK = 1.05


class CallPacer:
    def __init__(self, table_name: str, client: DynamoDBClient, *, calls_per_second: float) -> None:
        self._table = table_name
        self._client = client
        self.interval_s = SLACK / calls_per_second

    def reserve(self, now: float) -> float:
        """The time (epoch s) at which this call may start: `now` when the pace allows it."""
        for _ in range(10):
            # Busy: take the next slot after the last one reserved.
            reply = self._update(
                "SET next_at = next_at + :interval",
                condition="next_at >= :now",
                values={":interval": self.interval_s, ":now": now},
                returns="UPDATED_OLD",
            )
            if reply is not None:
                return float(reply["Attributes"]["next_at"]["N"])
            # Idle (no slot reserved beyond now): start now, unless another call just did.
            idle = self._update(
                "SET next_at = :next",
                condition="attribute_not_exists(next_at) OR next_at < :now",
                values={":next": now + self.interval_s, ":now": now},
            )
            if idle is not None:
                return now
        raise BackendError("the LLM call pace could not be reserved: too much contention")

    def hold(self, until: float) -> None:
        """No call starts before `until`: the provider said to wait (a 429's Retry-After), and
        it says so to every worker, not only to the one it refused. A pace that already
        reaches beyond `until` stays as it is."""
        self._update(
            "SET next_at = :until",
            condition="attribute_not_exists(next_at) OR next_at < :until",
            values={":until": until},
        )

    def _update(
        self, update: str, *, condition: str, values: dict[str, float], returns: ReturnValueType = "NONE"
    ) -> UpdateItemOutputTypeDef | None:
        """One conditional write to the pace's item: its reply, or None if the condition failed."""
        try:
            return self._client.update_item(
                TableName=self._table,
                Key=PACER_KEY,
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeValues={name: {"N": repr(value)} for name, value in values.items()},
                ReturnValues=returns,
            )
        except ClientError as exc:
            if is_condition_failure(exc):
                return None
            raise BackendError(f"the LLM call pace could not be updated: {exc}") from exc
        except BotoCoreError as exc:
            raise BackendError(f"the LLM call pace could not be updated: {exc}") from exc
