"""Batches in TasksTable: the batch item (`batch#<id>`) and its counters.

The counters move by transactions that also mark, per task, the last status change they
include (an item `counted#<task id>` holding that revision), so a change is counted once
however often its stream record is processed: retries, duplicate deliveries and redrives leave
the counts exact. The mark is an item of its own, not an attribute of the task: it stays small
(a write costs by the item's size, and a task's prompt may be 200 KiB), and its writes do not
come back on the stream as changes of the task.

Long because BatchStore is every write on a batch's items (the batch, its counters, events and
marks): their layout and the transactions that keep the counts exact are read in one place.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.aws.dynamo import (
    batch_get,
    deserialize,
    dynamodb_errors,
    from_json_text,
    is_condition_failure,
    json_text,
    numbered_items,
    serialize,
    stream_change,
    updated_if,
)
from llmtasks.aws.task_items import task_change, task_key
from llmtasks.aws.usage import UsageCounters
from llmtasks.aws.webhook_records import outcome_update
from llmtasks.domain.batches import (
    ITEM_COUNTS,
    Batch,
    BatchCounts,
    BatchEvent,
    BatchEventItem,
    BatchFiles,
    BatchInput,
    BatchStatus,
)
from llmtasks.domain.errors import BackendError
from llmtasks.domain.models import Task, TaskStatus, WebhookAttempt, WebhookStatus
from llmtasks.domain.usage import BatchSpend

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef, TransactWriteItemTypeDef


def batch_key(batch_id: str) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"batch#{batch_id}"}}


def _mark_key(task_id: str) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"counted#{task_id}"}}


def _events(batch_id: str) -> str:
    """The keys of the batch's events: this, then each one's number."""
    return f"events#{batch_id}#"


def _event_key(batch_id: str, sequence: int) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"{_events(batch_id)}{sequence}"}}


def _event_of(sequence: int, fields: dict[str, Any]) -> BatchEvent:
    return BatchEvent(
        sequence=sequence,
        items=[BatchEventItem.model_validate(item) for item in fields["items"]],
        counts=BatchCounts.model_validate(fields["counts"]),
        at=datetime.fromtimestamp(float(fields["at"]), UTC),
    )


# The item names its tenant `owner_tenant`, not `tenant_id`: TasksTable's by_tenant index
# (GET /tasks) holds every item with a tenant_id and a created_at, and it lists tasks.
_TENANT = "owner_tenant"


def batch_from_item(item: Mapping[str, Any]) -> Batch:
    return _batch_of(deserialize(item))


def _batch_of(fields: dict[str, Any]) -> Batch:
    fields["tenant_id"] = fields.pop(_TENANT)
    if "metadata" in fields:
        fields["metadata"] = from_json_text(fields["metadata"])
    return Batch.model_validate(fields)


def batches_by_id(client: DynamoDBClient, table: str, batch_ids: list[str], fields: list[str]) -> list[Batch]:
    """The batches among these ids (at most a hundred) that exist, with the given fields only
    (pk among them: the overview)."""
    with dynamodb_errors("read"):
        items = batch_get(client, table, [batch_key(batch_id) for batch_id in batch_ids], fields=fields)
    return [_batch_of(deserialize(item)) for item in items.values()]


def change_of(record: Mapping[str, Any]) -> tuple[Task | None, Task] | tuple[Batch | None, Batch]:
    """What one TasksTable stream record (NEW_AND_OLD_IMAGES) changed, before and after: a batch
    (its item's key says so) or a task."""
    if str(record["dynamodb"]["NewImage"].get("pk", {}).get("S", "")).startswith("batch#"):
        return stream_change(record, batch_from_item)
    return task_change(record)


@dataclass(frozen=True)
class CountedChange:
    """What one task's status did across the revisions `since`..`revision` (stream records)."""

    task_id: str
    since: int
    revision: int
    old: TaskStatus
    new: TaskStatus
    expires_at: int  # the task's: the mark goes with it
    index: int = 0  # the item's place in its batch
    custom_id: str | None = None

    @property
    def moves(self) -> bool:
        return self.old is not self.new


class CountsRefused(Exception):
    """The transaction did not apply. `counted` has, for each task whose mark refused it, the
    revision the counters already include (None: not told); `conflict` says another
    transaction touched the same items (DynamoDB's TransactionConflict): try again."""

    def __init__(self, counted: dict[str, int | None], *, conflict: bool, batch_gone: bool) -> None:
        super().__init__("batch counts refused")
        self.counted = counted
        self.conflict = conflict
        self.batch_gone = batch_gone


class BatchExists(Exception):
    def __init__(self, batch: Batch) -> None:
        super().__init__("batch exists")
        self.batch = batch


class BatchStore:
    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table_name = table_name
        self._client = client

    def create(self, batch: Batch) -> None:
        """Raises BatchExists with the stored batch when its id is taken (a retried submit)."""
        # As for a task: unset fields are left out, the client's metadata is kept exactly.
        fields = batch.model_dump(mode="json", exclude_none=True) | {"metadata": json_text(batch.metadata)}
        fields[_TENANT] = fields.pop("tenant_id")
        item = serialize({"pk": f"batch#{batch.batch_id}", **fields})
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item=item,
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            old: Mapping[str, Any] | None = exc.response.get("Item")  # type: ignore[assignment]
            if is_condition_failure(exc) and old:
                raise BatchExists(batch_from_item(old)) from exc
            raise BackendError(f"DynamoDB put failed: {exc}") from exc
        except BotoCoreError as exc:
            raise BackendError(f"DynamoDB put failed: {exc}") from exc

    def _get_item(
        self,
        key: dict[str, AttributeValueTypeDef],
        *,
        fields: list[str] | None = None,
        consistent: bool = True,
    ) -> dict[str, Any] | None:
        projection: dict[str, Any] = {}
        if fields:
            projection = {
                "ProjectionExpression": ", ".join(f"#f{i}" for i in range(len(fields))),
                "ExpressionAttributeNames": {f"#f{i}": name for i, name in enumerate(fields)},
            }
        try:
            reply = self._client.get_item(
                TableName=self.table_name, Key=key, ConsistentRead=consistent, **projection
            )
        except (BotoCoreError, ClientError) as exc:
            raise BackendError(f"DynamoDB read failed: {exc}") from exc
        item = reply.get("Item")
        return dict(item) if item else None

    def spend(self, batch_id: str) -> BatchSpend:
        """The same table's spend counter of the batch (aws/usage.py): its items' billed calls,
        and the items its key's budget refused."""
        return UsageCounters(self.table_name, self._client).of_batch(batch_id)

    def get(self, batch_id: str, *, now: float, consistent: bool = True) -> Batch | None:
        """The batch, or None when there is none or it has expired."""
        item = self._get_item(batch_key(batch_id), consistent=consistent)
        if item is None:
            return None
        batch = batch_from_item(item)
        return None if batch.is_expired(now) else batch

    def request_cancel(self, batch_id: str, *, tenant_id: str, now: float) -> Batch | None:
        """pending (as stored: `processing` is only read) -> cancelling; None when the batch is
        not the tenant's, or is expired, cancelling or ended already (the caller reads it to say
        which)."""
        return self._update(
            batch_id,
            update="SET #status = :cancelling, cancel_requested_at = :now",
            condition=f"{_TENANT} = :tenant AND expires_at > :now AND #status IN (:pending, :validating)",
            values={
                ":cancelling": BatchStatus.CANCELLING.value,
                ":pending": BatchStatus.PENDING.value,
                ":validating": BatchStatus.VALIDATING.value,
                ":tenant": tenant_id,
                ":now": now,
            },
        )

    def input_read(
        self, batch_id: str, *, total: int, chunk_offsets: list[int], read: BatchInput
    ) -> Batch | None:
        """A batch whose input file was read: validating -> pending with every item counted; None
        when it is no longer validating (a cancel came while the file was read)."""
        return self._update(
            batch_id,
            update="SET #status = :pending, #total = :total, pending = :total, chunk_offsets = :offsets,"
            " #input = :input",
            condition="#status = :validating",
            values={
                ":pending": BatchStatus.PENDING.value,
                ":validating": BatchStatus.VALIDATING.value,
                ":total": total,
                ":offsets": chunk_offsets,
                ":input": read.model_dump(mode="json", exclude_none=True),
            },
            names={"#input": "input", "#total": "total"},
        )

    def input_refused(self, batch_id: str, *, read: BatchInput, now: float) -> Batch | None:
        """A batch whose input file was refused whole (`read.errors` say why): validating ->
        failed, with no item; None when it is no longer validating."""
        return self._update(
            batch_id,
            update="SET #status = :failed, completed_at = :now, #input = :input",
            condition="#status = :validating",
            values={
                ":failed": BatchStatus.FAILED.value,
                ":validating": BatchStatus.VALIDATING.value,
                ":now": now,
                ":input": read.model_dump(mode="json", exclude_none=True),
            },
            names={"#input": "input"},
        )

    def finish(self, batch: Batch, *, now: float, files: BatchFiles | None = None) -> Batch | None:
        """The batch, read when every item had ended, ended with its final status (and the files
        its outcomes were written to); None when its status or its retries changed since that
        read (another call ended it, a cancel came, a retry was asked). Once every item has ended
        no counter moves again, so the read's counts still hold."""
        update = "SET #status = :final, completed_at = :now"
        values: dict[str, Any] = {
            ":final": batch.final_status().value,
            ":now": now,
            ":seen": batch.status.value,
            ":zero": 0,
            ":retries": batch.retries,
        }
        if files is not None:
            update += ", #files = :files"
            values[":files"] = files.model_dump(mode="json", exclude_none=True)
        return self._update(
            batch.batch_id,
            update=update,
            condition="#status = :seen AND (attribute_not_exists(retrying) OR retrying <= :zero)"
            " AND (attribute_not_exists(retries) OR retries = :retries)",
            values=values,
            names={"#files": "files"} if files is not None else None,
        )

    def record_webhook_outcome(
        self,
        batch_id: str,
        *,
        status: WebhookStatus,
        attempt: WebhookAttempt | None,
        log: list[WebhookAttempt],
    ) -> None:
        """As TaskStore.record_webhook_outcome, for a batch's webhook."""
        update, values = outcome_update(status, attempt, log)
        self._update(batch_id, update=update, condition="attribute_exists(pk)", values=values)

    def counted_revision(self, task_id: str) -> int | None:
        """The last revision of the task the counters include; None when none is."""
        item = self._get_item(_mark_key(task_id))
        return int(deserialize(item)["revision"]) if item else None

    def count_changes(self, batch_id: str, changes: list[CountedChange], *, now: float) -> None:
        """Applies the changes to the batch's counters in one transaction, each task's only if
        its counters do not include any of them yet, with the batch's next event (the items
        whose status moved, the counts after them) when any did. Raises CountsRefused when
        nothing applied."""
        self._transact(changes, self._count_actions(batch_id, changes, now=now))

    def _transact(self, changes: list[CountedChange], actions: list[TransactWriteItemTypeDef]) -> None:
        """One transaction whose first actions are `changes`' marks (CountsRefused reads its
        refusal so)."""
        try:
            self._client.transact_write_items(TransactItems=actions)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise BackendError(f"DynamoDB transaction failed: {exc}") from exc
            raise self._refusal(changes, exc) from exc
        except BotoCoreError as exc:
            raise BackendError(f"DynamoDB transaction failed: {exc}") from exc

    def _count_actions(
        self, batch_id: str, changes: list[CountedChange], *, now: float, retried: int = 0
    ) -> list[TransactWriteItemTypeDef]:
        """Each change's mark, then the batch's counters and its next event when any moved."""
        delta: Counter[str] = Counter()
        actions: list[TransactWriteItemTypeDef] = []
        for change in changes:
            delta[change.old.value] -= 1
            delta[change.new.value] += 1
            actions.append(
                {
                    "Update": {
                        "TableName": self.table_name,
                        "Key": _mark_key(change.task_id),
                        "UpdateExpression": "SET revision = :revision, expires_at = :expires",
                        "ConditionExpression": "attribute_not_exists(pk) OR revision < :since",
                        "ExpressionAttributeValues": serialize(
                            {
                                ":revision": change.revision,
                                ":since": change.since,
                                ":expires": change.expires_at,
                            }
                        ),
                        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                    }
                }
            )
        if retried:
            delta["retrying"] -= retried  # moved back by a retry (its batch counts them down)
        if any(change.moves for change in changes):
            actions.extend(self._counted_event(batch_id, changes, delta, now=now))
        return actions

    def request_retry(self, batch: Batch, statuses: list[TaskStatus], *, now: float) -> Batch | None:
        """An ended batch (as read: `batch`) back to pending, to run its items of `statuses`
        again; its webhook is due again. None when it changed since that read (another retry
        came first)."""
        webhook = {":webhook": WebhookStatus.PENDING.value, ":zero": 0} if batch.wants_webhook() else {}
        return self._update(
            batch.batch_id,
            update=(
                "SET #status = :pending, retries = :retries, retry_statuses = :statuses,"
                " retry_requested_at = :now, retrying = :retrying"
                + (", webhook_status = :webhook, webhook_attempts = :zero" if webhook else "")
                + " REMOVE completed_at, cancel_requested_at"
            ),
            # (A batch stored before retries has none: it was never retried.)
            condition="#status = :seen AND expires_at > :now"
            " AND (retries = :seen_retries OR attribute_not_exists(retries))",
            values={
                ":pending": BatchStatus.PENDING.value,
                ":retries": batch.retries + 1,
                ":seen_retries": batch.retries,
                ":statuses": [status.value for status in statuses],
                ":retrying": sum(getattr(batch, status.value) for status in statuses),
                ":seen": batch.status.value,
                ":now": now,
                **webhook,
            },
        )

    def retry_items(self, batch_id: str, tasks: list[Task], *, now: float) -> None:
        """The tasks (ended, as read), each back to pending as a new attempt, in one transaction
        with the batch's counters and its event (each task's mark set past the change, so the
        stream's record of it is not counted again). Raises CountsRefused when any task changed
        since it was read (a copy of this retry ran first)."""
        changes = [
            CountedChange(
                task.task_id,
                task.revision + 1,
                task.revision + 1,
                task.status,
                TaskStatus.PENDING,
                task.expires_at,
                index=task.batch_index or 0,
                custom_id=task.custom_id,
            )
            for task in tasks
        ]
        actions = self._count_actions(batch_id, changes, now=now, retried=len(tasks))
        for task in tasks:
            actions.append(
                {
                    "Update": {
                        "TableName": self.table_name,
                        "Key": task_key(task.task_id),
                        "UpdateExpression": (
                            "SET #status = :pending, revision = :revision, retried_at = :now,"
                            " attempts_before_retry = :attempts"
                            " REMOVE #error, error_code, completed_at, next_attempt_at, dead_letter_at"
                        ),
                        "ConditionExpression": "#status = :seen AND revision = :seen_revision",
                        "ExpressionAttributeNames": {"#status": "status", "#error": "error"},
                        "ExpressionAttributeValues": serialize(
                            {
                                ":pending": TaskStatus.PENDING.value,
                                ":revision": task.revision + 1,
                                ":now": now,
                                ":attempts": task.attempts,
                                ":seen": task.status.value,
                                ":seen_revision": task.revision,
                            }
                        ),
                    }
                }
            )
        self._transact(changes, actions)

    def _counted_event(
        self, batch_id: str, changes: list[CountedChange], delta: Counter[str], *, now: float
    ) -> list[TransactWriteItemTypeDef]:
        """The batch's update (its counters moved by `delta`, its last event the next one) and
        that event's item. The update holds only while the batch's last event is the one read
        here, so the counts read with it are the counts the event starts from: a transaction
        that counted meanwhile makes this one a conflict, read again."""
        seen = self._get_item(batch_key(batch_id), fields=[*ITEM_COUNTS, "events", "expires_at"])
        if seen is None:
            raise CountsRefused({}, conflict=False, batch_gone=True)
        fields = deserialize(seen)
        last = int(fields.get("events", 0))
        counts = {name: int(fields.get(name, 0)) + delta[name] for name in ITEM_COUNTS}
        moved = {name: count for name, count in delta.items() if count}
        update = "SET #events = :sequence"
        if moved:
            update += " ADD " + ", ".join(f"#{name} :{name}" for name in moved)
        moving = sorted((change for change in changes if change.moves), key=lambda change: change.index)
        items = [
            {"index": c.index, "task_id": c.task_id, "status": c.new.value}
            | ({"custom_id": c.custom_id} if c.custom_id is not None else {})
            for c in moving
        ]
        return [
            {
                "Update": {
                    "TableName": self.table_name,
                    "Key": batch_key(batch_id),
                    "UpdateExpression": update,
                    # A batch stored before it had events has none (read as 0).
                    "ConditionExpression": (
                        "attribute_exists(pk) AND (#events = :last OR attribute_not_exists(#events))"
                    ),
                    "ExpressionAttributeNames": {"#events": "events"} | {f"#{name}": name for name in moved},
                    "ExpressionAttributeValues": serialize(
                        {":sequence": last + 1, ":last": last} | {f":{name}": n for name, n in moved.items()}
                    ),
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
            {
                "Put": {
                    "TableName": self.table_name,
                    "Item": serialize(
                        {
                            **deserialize(_event_key(batch_id, last + 1)),
                            "items": items,
                            "counts": counts,
                            "at": now,
                            "expires_at": int(fields["expires_at"]),
                        }
                    ),
                }
            },
        ]

    def events(self, batch_id: str, first: int, last: int) -> list[BatchEvent]:
        """Events `first`..`last` (at most a hundred), in order, up to the first one missing
        (an event exists once the batch counts it, so only its TTL makes one missing)."""
        found = numbered_items(self._client, self.table_name, _events(batch_id), first, last)
        return [_event_of(sequence, fields) for sequence, fields in found]

    @staticmethod
    def _refusal(changes: list[CountedChange], exc: ClientError) -> CountsRefused:
        reasons: list[Any] = list(exc.response.get("CancellationReasons") or [])
        counted: dict[str, int | None] = {}
        conflict = False
        for index, reason in enumerate(reasons):
            code = reason.get("Code")
            if code == "TransactionConflict":
                conflict = True
            elif code == "ConditionalCheckFailed" and index >= len(changes):
                # The batch's last event moved since it was read, or the batch is gone: the next
                # attempt's read of it says which.
                conflict = True
            elif code == "ConditionalCheckFailed":
                old = reason.get("Item")
                counted[changes[index].task_id] = int(deserialize(old)["revision"]) if old else None
        if not reasons:
            conflict = True  # no reasons given: treat as contention and try again
        return CountsRefused(counted, conflict=conflict, batch_gone=False)

    def _update(
        self,
        batch_id: str,
        *,
        update: str,
        condition: str,
        values: Mapping[str, Any],
        names: Mapping[str, str] | None = None,
    ) -> Batch | None:
        """One conditional UpdateItem on a batch: the batch after it, or None when the condition
        did not hold."""
        all_names = {"#status": "status"} if "#status" in update + condition else {}
        all_names |= names or {}
        item = updated_if(
            self._client,
            self.table_name,
            batch_key(batch_id),
            update,
            condition=condition,
            values=values,
            names=all_names,
        )
        return None if item is None else batch_from_item(item)


# Batches whose cancel state one worker sandbox remembers before it forgets them all.
CACHED_BATCHES = 1000


class BatchCancellations:
    """Whether a batch is being cancelled, as the worker asks before each item's call: read at
    most every `ttl_s` per batch and process, so the ten items of an invocation cost one read."""

    def __init__(self, store: BatchStore, *, ttl_s: float = 0.5) -> None:
        self._store = store
        self._ttl_s = ttl_s
        self._seen: dict[str, tuple[float, bool]] = {}

    def cancelled(self, batch_id: str, *, now: float) -> bool:
        read_at, cancelled = self._seen.get(batch_id, (-math.inf, False))
        if now - read_at >= self._ttl_s:
            batch = self._store.get(batch_id, now=now)
            cancelled = batch is not None and batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
            if len(self._seen) > CACHED_BATCHES:
                self._seen.clear()
            self._seen[batch_id] = (now, cancelled)
        return cancelled
