"""The tasks' counters in TasksTable: how many tasks the table holds in each status, in all, per
tenant and per priority, on one item (`counts#tasks`), so that a view of them reads one item
however many tasks there are (`llmtasks stats`, the local console).

BatchFunction keeps them from the table's stream, as it keeps each batch's counts (batch_store.py):
each transaction marks, per task, the last status change it includes (an item
`tallied#<task id>` holding that revision), so a change is counted once however often its record
is processed. A task's insert counts it in, its deletion (TTL) counts it out. The mark outlives
its task by the stream's retention, so a deletion's record delivered again finds it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.aws.dynamo import deserialize, dynamodb_errors, serialize
from llmtasks.domain.errors import BackendError
from llmtasks.domain.models import TaskStatus

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef, TransactWriteItemTypeDef

COUNTS_PK = "counts#tasks"
# A mark outlives its task by more than the stream's 24 hours, so a record delivered again
# finds it.
MARK_GRACE_S = 2 * 86_400


def _mark_key(task_id: str) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"tallied#{task_id}"}}


@dataclass(frozen=True)
class Tally:
    """What one task's status did across its revisions `since`..`revision`: from `old` (None:
    the task was not in the table) to `new` (None: deleted)."""

    task_id: str
    tenant_id: str
    priority: str
    since: int
    revision: int
    old: TaskStatus | None
    new: TaskStatus | None
    mark_expires_at: int


@dataclass(frozen=True)
class TaskCountsView:
    """The counters as read: tasks per status, per tenant and status, per priority and status."""

    by_status: dict[str, int]
    by_tenant: dict[str, dict[str, int]]
    by_priority: dict[str, dict[str, int]]


class TallyRefused(Exception):
    """The transaction did not apply. `counted` has, for each task whose mark refused it, the
    revision the counters already include (None: not told); `conflict`: another transaction
    touched the same items, try again."""

    def __init__(self, counted: dict[str, int | None], *, conflict: bool) -> None:
        super().__init__("task counts refused")
        self.counted = counted
        self.conflict = conflict


class TaskCounts:
    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table_name = table_name
        self._client = client

    def apply(self, tallies: list[Tally]) -> None:
        """The tallies' moves added to the counters in one transaction (at most 99 tallies), each
        task's only if the counters include none of its changes yet. Raises TallyRefused when
        nothing applied."""
        actions: list[TransactWriteItemTypeDef] = [self._mark(tally) for tally in tallies]
        delta = _delta(tallies)
        if delta:
            names = {f"#a{i}": name for i, name in enumerate(delta)}
            values = {f":a{i}": amount for i, amount in enumerate(delta.values())}
            actions.append(
                {
                    "Update": {
                        "TableName": self.table_name,
                        "Key": {"pk": {"S": COUNTS_PK}},
                        "UpdateExpression": "ADD " + ", ".join(f"#a{i} :a{i}" for i in range(len(delta))),
                        "ExpressionAttributeNames": names,
                        "ExpressionAttributeValues": serialize(values),
                    }
                }
            )
        try:
            self._client.transact_write_items(TransactItems=actions)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise BackendError(f"DynamoDB transaction failed: {exc}") from exc
            raise _refusal(tallies, exc) from exc
        except BotoCoreError as exc:
            raise BackendError(f"DynamoDB transaction failed: {exc}") from exc

    def _mark(self, tally: Tally) -> TransactWriteItemTypeDef:
        return {
            "Update": {
                "TableName": self.table_name,
                "Key": _mark_key(tally.task_id),
                "UpdateExpression": "SET revision = :revision, expires_at = :expires",
                "ConditionExpression": "attribute_not_exists(pk) OR revision < :since",
                "ExpressionAttributeValues": serialize(
                    {":revision": tally.revision, ":since": tally.since, ":expires": tally.mark_expires_at}
                ),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def tallied_revision(self, task_id: str) -> int | None:
        """The last revision of the task the counters include; None when none is."""
        with dynamodb_errors("read"):
            item = self._client.get_item(
                TableName=self.table_name, Key=_mark_key(task_id), ConsistentRead=True
            )
        found = item.get("Item")
        return int(deserialize(found)["revision"]) if found else None

    def read(self) -> TaskCountsView:
        """The counters: one GetItem, whatever the table holds."""
        with dynamodb_errors("read"):
            reply = self._client.get_item(TableName=self.table_name, Key={"pk": {"S": COUNTS_PK}})
        by_status: dict[str, int] = {status.value: 0 for status in TaskStatus}
        by_tenant: dict[str, dict[str, int]] = {}
        by_priority: dict[str, dict[str, int]] = {}
        for name, value in deserialize(reply.get("Item") or {}).items():
            kind, _, rest = name.partition("|")
            group, _, status = rest.rpartition("|")
            if kind == "status":
                by_status[status] = int(value)
            elif kind == "tenant" and value:
                by_tenant.setdefault(group, {})[status] = int(value)
            elif kind == "priority" and value:
                by_priority.setdefault(group, {})[status] = int(value)
        return TaskCountsView(by_status=by_status, by_tenant=by_tenant, by_priority=by_priority)


def _delta(tallies: list[Tally]) -> dict[str, int]:
    """Each counter's change (attribute names `status|<s>`, `tenant|<id>|<s>`, `priority|<p>|<s>`;
    a tenant id may hold `|`: the status is after the last)."""
    delta: Counter[str] = Counter()
    for tally in tallies:
        for status, step in ((tally.old, -1), (tally.new, 1)):
            if status is None:
                continue
            for name in (
                f"status|{status.value}",
                f"tenant|{tally.tenant_id}|{status.value}",
                f"priority|{tally.priority}|{status.value}",
            ):
                delta[name] += step
    return {name: amount for name, amount in delta.items() if amount}


def _refusal(tallies: list[Tally], exc: ClientError) -> TallyRefused:
    reasons: list[Any] = list(exc.response.get("CancellationReasons") or [])
    counted: dict[str, int | None] = {}
    conflict = not reasons  # no reasons given: treat as contention and try again
    for index, reason in enumerate(reasons):
        code = reason.get("Code")
        if code == "ConditionalCheckFailed" and index < len(tallies):
            old = reason.get("Item")
            counted[tallies[index].task_id] = int(deserialize(old)["revision"]) if old else None
        elif code not in (None, "None"):
            conflict = True
    return TallyRefused(counted, conflict=conflict)
