"""TasksTable: the one adapter that talks to DynamoDB.

Every state change is a conditional write, so no transition happens twice or backwards;
`ClientError`s become domain errors here and nowhere else. Items are keyed by `pk`:
`task#<id>` for tasks; the same table's `batch#<id>`, `tenant#<id>` and `usage#...` items have
their own adapters (batch_store.py, tenant_secrets.py, usage.py).

Long because TaskStore is every conditional write on a task's item: the item's layout and the
transitions it allows are read in one place.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.aws.dynamo import (
    BATCH_GET_KEYS,
    batch_get,
    dynamodb_errors,
    is_condition_failure,
    json_text,
    serialize,
)
from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.run_steps import RunJournal
from llmtasks.aws.task_items import TENANT_INDEX, failed_task, task_from_item, task_key
from llmtasks.aws.task_output import TaskOutput
from llmtasks.aws.tenant_secrets import TenantSecrets
from llmtasks.aws.usage import UsageCounters
from llmtasks.aws.webhook_records import WebhookEndpoints, outcome_update
from llmtasks.domain.cursors import TaskPosition
from llmtasks.domain.errors import BackendError, StaleWrite, TaskConflict, TaskNotFound
from llmtasks.domain.fields import STORED
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import (
    DEAD_LETTERED,
    AttemptRecord,
    Lease,
    ProviderCall,
    Task,
    TaskStatus,
    Usage,
    WebhookAttempt,
    WebhookStatus,
)
from llmtasks.domain.runs import RequiredAction

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# What a run leaves on the task while it lasts: its lease, and how far it has streamed
# (partial_result: the text so far, as items written before the text moved to the output's chunks).
_LEASE_FIELDS = (
    "lease_id, lease_until, lease_message_id, lease_receive_count, dead_letter_at,"
    " partial_result, progress_tokens, progress_at, attempt_started_at"
)
RETRY_EARLY_S = 1.0
# New tasks one TransactWriteItems writes (DynamoDB takes 100 actions and 4 MB a transaction:
# a group's items are kept to 3 MB of JSON, above what they take in DynamoDB's own sizes).
TRANSACT_GROUP = 100
TRANSACT_BYTES = 3_000_000
TRANSACT_ATTEMPTS = 8
# Index entries a listing by status looks through a query at most: a hundred bytes each, so
# 100 KB of the 1 MB a query may read, and 25 read units (eventually consistent). Its first query
# looks through twice the page's size (a page of a common status fills from it, as most tasks
# are completed), each next one twice as many as the one before.
STATUS_WINDOW = 1000
FIRST_WINDOW_PAGES = 2
_STATUS = {"#status": "status"}  # a reserved word in DynamoDB expressions
# Every status change counts itself (Task.revision), so batch counters can apply it exactly once.
_REVISE = "revision = if_not_exists(revision, :zero) + :one"


class _ConditionFailed(Exception):
    def __init__(self, old: Task | None) -> None:
        super().__init__("condition failed")
        self.old = old  # the item as it was; None when there was none


class ClaimRefused(Exception):
    """The task cannot be claimed now; `current` says why (None: no item, or an expired one)."""

    def __init__(self, current: Task | None, *, missing: bool = False) -> None:
        super().__init__("claim refused")
        self.current = current
        self.missing = missing  # no item at all: not written yet, or already deleted


class TaskStore:
    def __init__(self, table_name: str, client: DynamoDBClient | None = None) -> None:
        self.table_name = table_name
        self._client: DynamoDBClient = client or boto3.client("dynamodb")

    # --- tasks ---------------------------------------------------------------------------

    def create_many(self, tasks: list[Task]) -> list[Task]:
        """Writes the new tasks, up to a hundred (or 3 MB) a TransactWriteItems, each only if no
        task has its id yet: the ones written. A group is written whole or not at all, so a
        fan-out killed between groups leaves each task made once or not yet; a group refused
        because some of its tasks exist (a repeated fan-out) is written again without them."""
        created: list[Task] = []
        for given in _transact_groups([(task, _new_item(task)) for task in tasks]):
            group = given
            for attempt in range(TRANSACT_ATTEMPTS):
                refused = self._create_together(group)
                if refused is None:
                    created += [task for task, _ in group]
                    break
                group = [pair for pair, exists in zip(group, refused, strict=True) if not exists]
                if not group:
                    break
                if not any(refused):  # a conflict with another transaction: none of them exists
                    time.sleep(0.05 * 2**attempt)
            else:
                raise BackendError(
                    f"DynamoDB: {len(group)} tasks not written after {TRANSACT_ATTEMPTS} tries"
                )
        return created

    def _create_together(self, group: list[tuple[Task, dict[str, Any]]]) -> list[bool] | None:
        """None once the group is written; else which of its tasks exist already (all False: it
        met another transaction)."""
        actions: list[Any] = [
            {
                "Put": {
                    "TableName": self.table_name,
                    "Item": item,
                    "ConditionExpression": "attribute_not_exists(pk)",
                }
            }
            for _, item in group
        ]
        try:
            self._client.transact_write_items(TransactItems=actions)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise BackendError(f"DynamoDB transaction failed: {exc}") from exc
            reasons = exc.response.get("CancellationReasons", [])
            codes = [reason.get("Code", "None") for reason in reasons]
            if len(codes) != len(group) or any(
                code not in ("None", "ConditionalCheckFailed", "TransactionConflict") for code in codes
            ):
                raise BackendError(f"DynamoDB transaction failed: {exc}") from exc
            return [code == "ConditionalCheckFailed" for code in codes]
        except BotoCoreError as exc:
            raise BackendError(f"DynamoDB transaction failed: {exc}") from exc
        return None

    def create(self, task: Task) -> bool:
        """Writes a new task; False when a task with its id exists already (a batch item's id
        follows from its batch and index, so a repeated fan-out finds its own tasks)."""
        item = _new_item(task)
        try:
            self._client.put_item(
                TableName=self.table_name, Item=item, ConditionExpression="attribute_not_exists(pk)"
            )
        except ClientError as exc:
            if is_condition_failure(exc):
                return False
            raise BackendError(f"DynamoDB put failed: {exc}") from exc
        except BotoCoreError as exc:
            raise BackendError(f"DynamoDB put failed: {exc}") from exc
        return True

    def get_many(self, task_ids: list[str]) -> dict[str, Task]:
        """The tasks that exist among `task_ids` (expired ones included: callers decide), by id."""
        found: dict[str, Task] = {}
        for start in range(0, len(task_ids), BATCH_GET_KEYS):
            keys = [task_key(task_id) for task_id in task_ids[start : start + BATCH_GET_KEYS]]
            with dynamodb_errors("read"):
                items = batch_get(self._client, self.table_name, keys)
            for item in items.values():
                task = task_from_item(item)
                found[task.task_id] = task
        return found

    def get(self, task_id: str, *, now: float) -> Task | None:
        """The task, or None when it does not exist or its TTL has passed (DynamoDB deletes late)."""
        with dynamodb_errors("read"):
            reply = self._client.get_item(
                TableName=self.table_name, Key=task_key(task_id), ConsistentRead=True
            )
        item = reply.get("Item")
        if not item:
            return None
        task = task_from_item(item)
        return None if task.is_expired(now) else task

    def tenant_tasks(
        self,
        tenant_id: str,
        *,
        limit: int,
        start: TaskPosition | None = None,
        statuses: frozenset[TaskStatus] | None = None,
        queries_before: int = 0,
    ) -> tuple[list[Task], TaskPosition | None]:
        """One page of a tenant's tasks, newest first, and where the next starts.

        The index holds the keys and each task's status: the page's keys come from it, the tasks
        from one BatchGetItem. With `statuses`, only tasks stored with one of them: the query looks
        through FIRST_WINDOW_PAGES times `limit` entries for them, twice as many for each query the
        listing made before (`queries_before`), up to STATUS_WINDOW; so a page of the status most
        tasks have reads little more than its own entries, and a page of pending tasks among
        thousands of finished ones a few queries and the pending ones only. `start` is a position in
        the index (the previous page's, or any: DynamoDB continues after a key whether or not an
        item has it, and the tenant is always the caller's); expired items are included (DynamoDB
        deletes them late), so callers filter.
        """
        extra: dict[str, Any] = {}
        values: dict[str, Any] = {":tenant": tenant_id}
        if start is not None:
            extra["ExclusiveStartKey"] = {
                **task_key(start.task_id),
                "tenant_id": {"S": tenant_id},
                "created_at": {"N": start.created_at},
            }
        if statuses:
            named = {f":status{i}": status.value for i, status in enumerate(sorted(statuses))}
            values.update(named)
            extra["FilterExpression"] = f"#status IN ({', '.join(named)})"
            extra["ExpressionAttributeNames"] = _STATUS
        with dynamodb_errors("query"):
            reply = self._client.query(
                TableName=self.table_name,
                IndexName=TENANT_INDEX,
                KeyConditionExpression="tenant_id = :tenant",
                ExpressionAttributeValues=serialize(values),
                ScanIndexForward=False,
                Limit=min(STATUS_WINDOW, FIRST_WINDOW_PAGES * limit << queries_before) if statuses else limit,
                **extra,
            )
            entries = reply["Items"]  # a Query's reply always has Items
            following = reply.get("LastEvaluatedKey")
            if len(entries) > limit:  # more matched in the window than the page takes
                entries = entries[:limit]
                following = entries[-1]
            keys = [{"pk": entry["pk"]} for entry in entries]
            items = batch_get(self._client, self.table_name, keys)
        # In the index's order; a task deleted between the query and the read is left out.
        tasks = [task_from_item(items[key["pk"]["S"]]) for key in keys if key["pk"]["S"] in items]
        if not following:
            return tasks, None
        position = TaskPosition(
            created_at=str(following["created_at"]["N"]),
            task_id=str(following["pk"]["S"]).removeprefix("task#"),
        )
        return tasks, position

    def claim(self, task_id: str, lease: Lease, *, now: float) -> Task:
        """pending (and due, when a retry is scheduled) -> processing under a new lease; also
        processing -> processing when the lease is dead, or when it is held by an earlier
        delivery of this same message (that delivery crashed or timed out: SQS redelivers a
        message only after its visibility timeout)."""
        try:
            return self._transition(
                task_id,
                update=(
                    f"SET #status = :processing, {_REVISE}, lease_id = :lease, lease_until = :until,"
                    " lease_message_id = :message, lease_receive_count = :receives, dead_letter_at = :dead,"
                    " attempts = if_not_exists(attempts, :zero) + :one,"
                    " started_at = if_not_exists(started_at, :now), attempt_started_at = :now"
                    " REMOVE next_attempt_at"
                ),
                condition=(
                    "attribute_exists(pk) AND expires_at > :now AND ((#status = :pending AND"
                    " (attribute_not_exists(next_attempt_at) OR next_attempt_at <= :due))"
                    " OR (#status = :processing AND (lease_until < :now OR"
                    " (lease_message_id = :message AND lease_receive_count < :receives))))"
                ),
                names=_STATUS,
                values={
                    ":processing": TaskStatus.PROCESSING.value,
                    ":pending": TaskStatus.PENDING.value,
                    ":lease": lease.lease_id,
                    ":until": lease.until,
                    ":message": lease.message_id,
                    ":receives": lease.receive_count,
                    ":dead": lease.dead_letter_at,
                    ":now": now,
                    # SQS delays are whole seconds, so a retry's message may come a little early.
                    ":due": now + RETRY_EARLY_S,
                    ":zero": 0,
                    ":one": 1,
                },
            )
        except _ConditionFailed as failed:
            if failed.old is None:
                raise ClaimRefused(None, missing=True) from failed
            raise ClaimRefused(None if failed.old.is_expired(now) else failed.old) from failed

    def complete(
        self,
        task_id: str,
        *,
        lease_id: str,
        completion: Completion,
        now: float,
        result_ref: str | None = None,
        attempt: AttemptRecord | None = None,
    ) -> None:
        """processing -> completed, with the text itself or, when it is in ResultsBucket, its key."""
        self._finish(
            task_id,
            lease_id=lease_id,
            status=TaskStatus.COMPLETED,
            attempt=attempt,
            values=_answer_values(completion, result_ref)
            | {
                "usage": completion.usage.model_dump(),
                "llm_key_index": completion.key_index,
                "completed_at": now,
            },
        )

    def fail(
        self,
        task_id: str,
        *,
        lease_id: str,
        error: str,
        error_code: str,
        now: float,
        attempt: AttemptRecord | None = None,
        answer: Completion | None = None,
        result_ref: str | None = None,
        usage: Usage | None = None,
    ) -> None:
        """processing (under this lease) -> failed; with the last `answer`, when it was billed
        but did not fit what was asked, kept as the result; with a run's `usage`, its steps'."""
        kept = _answer_values(answer, result_ref) if answer else {}
        kept |= {"usage": usage.model_dump()} if usage is not None else {}
        self._finish(
            task_id,
            lease_id=lease_id,
            status=TaskStatus.FAILED,
            attempt=attempt,
            values=kept | {"error": error, "error_code": error_code, "completed_at": now},
        )

    def release(
        self,
        task_id: str,
        *,
        lease_id: str,
        error: str,
        error_code: str,
        next_attempt_at: float,
        attempted: bool = True,
        attempt: AttemptRecord | None = None,
    ) -> None:
        """processing -> pending after a transient error, with the time of the next attempt.
        With `attempted` False the claim gives its attempt back: the call never left."""
        self._finish(
            task_id,
            lease_id=lease_id,
            status=TaskStatus.PENDING,
            attempt=attempt if attempted else None,
            values={"last_error": error, "last_error_code": error_code, "next_attempt_at": next_attempt_at},
            uncount_attempt=not attempted,
        )

    def _finish(
        self,
        task_id: str,
        *,
        lease_id: str,
        status: TaskStatus,
        values: Mapping[str, Any],
        uncount_attempt: bool = False,
        attempt: AttemptRecord | None = None,
        keep_lease_until: bool = False,
    ) -> None:
        values = {k: v for k, v in values.items() if v is not None}
        removed = f"{_LEASE_FIELDS}, provider_call"
        if keep_lease_until:  # set among `values`: a parked run's
            removed = removed.replace("lease_until, ", "").replace(", provider_call", "")
        names = {"#status": "status", **{f"#{k}": k for k in values}}
        assignments = ", ".join(f"#{k} = :{k}" for k in values)
        expression_values = {
            ":status": status.value,
            ":processing": TaskStatus.PROCESSING.value,
            ":lease": lease_id,
            ":zero": 0,
            ":one": 1,
            **{f":{k}": v for k, v in values.items()},
        }
        if uncount_attempt:
            expression_values[":uncount"] = -1
        if attempt is not None:
            assignments += ", attempt_log = list_append(if_not_exists(attempt_log, :no_attempts), :attempt)"
            expression_values |= {
                ":no_attempts": [],
                ":attempt": [attempt.model_dump(mode="json", exclude_none=True)],
            }
        try:
            # Nothing returned: the worker that ends a run has no use for the item, whose result is
            # most of it (a reply carrying it costs read bandwidth and serialising).
            self._update(
                task_id,
                returned="NONE",
                update=f"SET #status = :status, {_REVISE}, {assignments} REMOVE {removed}"
                + (" ADD attempts :uncount" if uncount_attempt else ""),
                condition="#status = :processing AND lease_id = :lease",
                names=names,
                values=expression_values,
            )
        except _ConditionFailed as failed:
            raise StaleWrite(task_id) from failed

    def park(self, task_id: str, *, lease_id: str, call: ProviderCall, look_at: float) -> None:
        """processing (under this lease) -> processing with no worker: the run's model step
        `call` runs in the provider's background mode, and the run's message, due at `look_at`,
        claims it then (its lease lapses there). The claim gives its attempt back: no call failed."""
        self._finish(
            task_id,
            lease_id=lease_id,
            status=TaskStatus.PROCESSING,
            values={"provider_call": call.model_dump(mode="json"), "lease_until": look_at},
            uncount_attempt=True,
            keep_lease_until=True,
        )

    def end_provider_item(
        self,
        task_id: str,
        *,
        status: TaskStatus,
        now: float,
        attempt: AttemptRecord,
        completion: Completion | None = None,
        result_ref: str | None = None,
        error: str | None = None,
        error_code: str | None = None,
    ) -> bool:
        """A provider batch's item (processing with no lease, never retried) ended with its job's
        outcome: its answer, or its error; False when it is not so any more (cancelled, ended
        by an earlier look): nothing is written over it."""
        values: dict[str, Any] = _answer_values(completion, result_ref) if completion else {}
        values |= {"usage": completion.usage.model_dump()} if completion else {}
        values |= {"error": error, "error_code": error_code, "completed_at": now}
        values = {k: v for k, v in values.items() if v is not None}
        assignments = ", ".join(f"#{k} = :{k}" for k in values)
        try:
            self._update(
                task_id,
                returned="NONE",
                update=f"SET #status = :status, {_REVISE}, {assignments},"
                " attempt_log = list_append(if_not_exists(attempt_log, :no_attempts), :attempt)"
                f" REMOVE {_LEASE_FIELDS}",
                condition="#status = :processing AND attribute_not_exists(lease_id)"
                " AND attribute_not_exists(retried_at)",
                names={"#status": "status", **{f"#{k}": k for k in values}},
                values={
                    ":status": status.value,
                    ":processing": TaskStatus.PROCESSING.value,
                    ":zero": 0,
                    ":one": 1,
                    ":no_attempts": [],
                    ":attempt": [attempt.model_dump(mode="json", exclude_none=True)],
                    **{f":{k}": v for k, v in values.items()},
                },
            )
        except _ConditionFailed:
            return False
        return True

    def note_provider_call(self, response_id: str, *, task_id: str, expires_at: int) -> None:
        """Which task a background call at the provider is (its webhook names the response
        alone): `providercall#<response id>`, expiring with the task."""
        with dynamodb_errors("write"):
            self._client.put_item(
                TableName=self.table_name,
                Item={
                    "pk": {"S": f"providercall#{response_id}"},
                    "task_id": {"S": task_id},
                    "expires_at": {"N": str(expires_at)},
                },
            )

    def task_of_provider_call(self, response_id: str) -> str | None:
        with dynamodb_errors("read"):
            reply = self._client.get_item(
                TableName=self.table_name, Key={"pk": {"S": f"providercall#{response_id}"}}
            )
        item = reply.get("Item")
        return item["task_id"]["S"] if item else None

    def wake(self, task_id: str, *, response_id: str, now: float) -> bool:
        """A parked run whose provider call `response_id` has ended (the provider's webhook):
        its lease lapses now, so the message sent next claims it at once. False when the task
        is not parked on that call (it has moved on, or a worker holds it)."""
        try:
            self._update(
                task_id,
                returned="NONE",
                update=f"SET lease_until = :now, {_REVISE}",
                condition=(
                    "#status = :processing AND attribute_not_exists(lease_id)"
                    " AND provider_call.response_id = :response"
                ),
                names=_STATUS,
                values={
                    ":now": now,
                    ":processing": TaskStatus.PROCESSING.value,
                    ":response": response_id,
                    ":zero": 0,
                    ":one": 1,
                },
            )
        except _ConditionFailed:
            return False
        return True

    def forget_provider_call(self, task_id: str, *, response_id: str) -> None:
        """A cancelled run's provider call, cancelled there too: not cancelled again."""
        try:
            self._update(
                task_id,
                returned="NONE",
                update="REMOVE provider_call",
                condition="provider_call.response_id = :response",
                values={":response": response_id},
            )
        except _ConditionFailed:
            return

    def await_action(
        self,
        task_id: str,
        *,
        lease_id: str,
        action: RequiredAction,
        model_step: int,
        usage: Usage,
        attempt: AttemptRecord | None = None,
    ) -> None:
        """processing (under this lease) -> requires_action: the run waits, holding no lease,
        for its client's outputs of `action`'s calls, which model step `model_step` asked for."""
        self._finish(
            task_id,
            lease_id=lease_id,
            status=TaskStatus.REQUIRES_ACTION,
            attempt=attempt,
            values={
                "required_action": action.model_dump(mode="json"),
                "action_step": model_step,
                "usage": usage.model_dump(),
            },
        )

    def resume(
        self, task_id: str, *, tenant_id: str, model_step: int, now: float, approved: list[str] | None = None
    ) -> Task:
        """requires_action (waiting on model step `model_step`'s calls) -> processing under a
        lapsed lease, which the run's next message claims, its retries counted afresh from here,
        the MCP calls `approved` added to those the worker may make; TaskConflict when the task
        waits for nothing (or other calls)."""
        approving = (
            ", approved_calls = list_append(if_not_exists(approved_calls, :no_calls), :approved)"
            if approved
            else ""
        )
        extra: dict[str, Any] = {":no_calls": [], ":approved": approved} if approved else {}
        try:
            return self._transition(
                task_id,
                update=(
                    f"SET #status = :processing, {_REVISE}, attempts_before_retry = attempts,"
                    f" lease_until = :now{approving} REMOVE required_action, action_step, next_attempt_at,"
                    " lease_id, lease_message_id, lease_receive_count, dead_letter_at"
                ),
                condition=(
                    "attribute_exists(pk) AND tenant_id = :tenant AND expires_at > :now"
                    " AND #status = :waiting AND action_step = :step"
                ),
                names=_STATUS,
                values={
                    ":zero": 0,
                    ":one": 1,
                    ":processing": TaskStatus.PROCESSING.value,
                    ":waiting": TaskStatus.REQUIRES_ACTION.value,
                    ":tenant": tenant_id,
                    ":step": model_step,
                    ":now": now,
                    **extra,
                },
            )
        except _ConditionFailed as failed:
            current = failed.old
            if current is None or current.tenant_id != tenant_id or current.is_expired(now):
                raise TaskNotFound(task_id) from failed
            raise TaskConflict(
                f"Task '{task_id}' is {current.as_read(now).status.value}, not waiting for tool outputs."
            ) from failed

    def journal(self, results: ResultBlobs) -> RunJournal:
        """The same table's items of each run's steps."""
        return RunJournal(self.table_name, self._client, results)

    def record_discarded(self, task_id: str, attempt: AttemptRecord) -> None:
        """A billed attempt whose answer the task no longer took (cancelled, or taken over while
        the call ran), added to its timeline so that its usage counts in the task's cost."""
        try:
            self._update(
                task_id,
                returned="NONE",
                update="SET attempt_log = list_append(if_not_exists(attempt_log, :no_attempts), :attempt)",
                condition="attribute_exists(pk)",
                values={":no_attempts": [], ":attempt": [attempt.model_dump(mode="json", exclude_none=True)]},
            )
        except _ConditionFailed:
            return  # expired meanwhile: nothing left to tell

    def requeue_dead_lettered(self, task_id: str, *, now: float) -> bool:
        """processing -> pending for a dead-lettered task (see `Task.is_dead_lettered`) whose
        message is being redriven; False when the task is anything else by now."""
        try:
            self._transition(
                task_id,
                update=f"SET #status = :pending, {_REVISE} REMOVE {_LEASE_FIELDS}",
                condition="#status = :processing AND dead_letter_at < :now",
                names=_STATUS,
                values={
                    ":zero": 0,
                    ":one": 1,
                    ":pending": TaskStatus.PENDING.value,
                    ":processing": TaskStatus.PROCESSING.value,
                    ":now": now,
                },
            )
        except _ConditionFailed:
            return False
        return True

    def cancel(self, task_id: str, *, tenant_id: str, now: float) -> Task:
        """pending | processing -> cancelled. A processing task's late result is then discarded,
        because completing needs `status = processing`. A dead-lettered task (see
        `Task.is_dead_lettered`) reads as failed, so it is not cancellable: a redrive changes it.
        Every cancel (the API's, a batch's sweep, a worker's that meets its batch cancelling)
        then writes the output's head, so its readers learn of the end at their next read of it."""
        try:
            cancelled = self._transition(
                task_id,
                update=f"SET #status = :cancelled, {_REVISE}, completed_at = :now REMOVE {_LEASE_FIELDS}",
                condition=(
                    "attribute_exists(pk) AND tenant_id = :tenant AND expires_at > :now"
                    " AND (#status IN (:pending, :waiting)"
                    " OR (#status = :processing AND NOT dead_letter_at < :now))"
                ),
                names=_STATUS,
                values={
                    ":zero": 0,
                    ":one": 1,
                    ":cancelled": TaskStatus.CANCELLED.value,
                    ":pending": TaskStatus.PENDING.value,
                    ":waiting": TaskStatus.REQUIRES_ACTION.value,
                    ":processing": TaskStatus.PROCESSING.value,
                    ":tenant": tenant_id,
                    ":now": now,
                },
            )
        except _ConditionFailed as failed:
            current = failed.old
            if current is None or current.tenant_id != tenant_id or current.is_expired(now):
                raise TaskNotFound(task_id) from failed
            read = current.as_read(now)
            detail = f" ({read.error_code})" if read.error_code == DEAD_LETTERED else ""
            raise TaskConflict(f"Task '{task_id}' is already {read.status.value}{detail}.") from failed
        self.output.ended(cancelled, TaskStatus.CANCELLED)
        return cancelled

    def record_webhook_outcome(
        self,
        task_id: str,
        *,
        status: WebhookStatus,
        attempt: WebhookAttempt | None,
        log: list[WebhookAttempt],
    ) -> Task | None:
        """Its webhook's status and, with an attempt, that attempt counted and logged (`log`: the
        task's as last read). None when the task expired and was deleted meanwhile."""
        update, values = outcome_update(status, attempt, log)
        try:
            return self._transition(task_id, update=update, condition="attribute_exists(pk)", values=values)
        except _ConditionFailed:
            return None

    def _transition(
        self,
        task_id: str,
        *,
        update: str,
        condition: str,
        values: Mapping[str, Any],
        names: Mapping[str, str] | None = None,
    ) -> Task:
        """One conditional UpdateItem on a task: the task as it is after it, or _ConditionFailed
        carrying the item as it was (DynamoDB returns it with the failure, at no extra read)."""
        reply = self._update(
            task_id, returned="ALL_NEW", update=update, condition=condition, values=values, names=names
        )
        return task_from_item(reply["Attributes"])

    def _update(
        self,
        task_id: str,
        *,
        returned: Literal["ALL_NEW", "NONE"],
        update: str,
        condition: str,
        values: Mapping[str, Any],
        names: Mapping[str, str] | None = None,
    ) -> Mapping[str, Any]:
        optional: dict[str, Any] = {"ExpressionAttributeNames": dict(names)} if names else {}
        try:
            return self._client.update_item(
                TableName=self.table_name,
                Key=task_key(task_id),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeValues=serialize(values),
                ReturnValues=returned,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **optional,
            )
        except ClientError as exc:
            if is_condition_failure(exc):
                raise _ConditionFailed(failed_task(exc)) from exc
            raise BackendError(f"DynamoDB update failed: {exc}") from exc
        except BotoCoreError as exc:
            raise BackendError(f"DynamoDB update failed: {exc}") from exc

    @property
    def tenants(self) -> TenantSecrets:
        """The same table's tenant items: each tenant's webhook signing secrets."""
        return TenantSecrets(self.table_name, self._client)

    @property
    def output(self) -> TaskOutput:
        """The same table's items of each task's output chunks and their head."""
        return TaskOutput(self.table_name, self._client)

    @property
    def usage(self) -> UsageCounters:
        """The same table's spend counters: each tenant's by day, each batch's."""
        return UsageCounters(self.table_name, self._client)

    @property
    def endpoints(self) -> WebhookEndpoints:
        """The same table's items of each tenant's failing and disabled webhook URLs."""
        return WebhookEndpoints(self.table_name, self._client)


def _answer_values(completion: Completion, result_ref: str | None) -> dict[str, Any]:
    """The model's answer as the item keeps it: its text (or where it is), model and message."""
    calls = [call.model_dump(mode="json") for call in completion.tool_calls or []]
    return {
        "result": None if result_ref else completion.text,
        "result_ref": result_ref,
        "model": completion.model,
        "finish_reason": completion.finish_reason,
        "refusal": completion.refusal,
        "tool_calls": calls or None,
        "reasoning": completion.reasoning,
    }


def _new_item(task: Task) -> dict[str, Any]:
    """A new task's item. Unset fields are left out, but the client's metadata is kept exactly,
    as text."""
    fields = task.model_dump(mode="json", exclude_none=True, context=STORED)
    fields |= {"metadata": json_text(task.metadata)}
    return serialize({"pk": f"task#{task.task_id}", **fields})


def _transact_groups(
    pairs: list[tuple[Task, dict[str, Any]]],
) -> list[list[tuple[Task, dict[str, Any]]]]:
    """The tasks with their items, in order, in groups one TransactWriteItems takes: at most
    TRANSACT_GROUP, their items at most TRANSACT_BYTES as JSON (DynamoDB's limits: 100 actions
    and 4 MB)."""
    groups: list[list[tuple[Task, dict[str, Any]]]] = []
    size = 0
    for pair in pairs:
        item_size = len(json.dumps(pair[1]))
        if not groups or len(groups[-1]) == TRANSACT_GROUP or size + item_size > TRANSACT_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(pair)
        size += item_size
    return groups
