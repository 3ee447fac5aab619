"""Per-key limits: requests a second, tasks in flight, and per tenant its running calls (LimitsTable).

The authorizer passes the caller's key, tenant and limits in its context (domain/caller.py);
API Gateway caches that answer, so the limits are counted here, by the functions, on every
request. Each counter is one item of LimitsTable (no stream, so counting costs no stream reads):

- `rate#<key id>#<second>`: the requests of one key in one second (a fixed window), refused
  past the key's `rps`; the item expires a minute later.
- `flight#<key id>`: what the key holds, one attribute per task (`t_<id>`) or batch (`b_<id>`,
  weighing its item count) and their total `n`. A submit adds its entry only while the total
  leaves room. Nothing removes an entry when its work ends: the worker, the cancel and the
  batch counters stay as they are. Instead, when a submit finds no room, the entries whose work
  has ended (or never got stored, or reads as dead-lettered) are removed first, and the submit
  tries once more. The cost of a full key is then one batch read of what it holds.
- `running#<tenant>`: the tenant's LLM calls running now (RunningCalls), for the worker's cap
  (TenantMaxRunning, a key's max_running).
- `webhook#<endpoint>`: the deliveries one webhook endpoint has open (the same RunningCalls),
  under WebhookEndpointConcurrency: an endpoint that hangs holds that many, no more.
- `budget#<key id>`: the key's spend and reservations this UTC day and month (budgets.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from llmtasks.aws.dynamo import deserialize, dynamodb_errors, is_condition_failure, serialize
from llmtasks.domain.caller import Caller
from llmtasks.domain.errors import InvalidInput, TooManyRequests

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from llmtasks.aws.batch_store import BatchStore
    from llmtasks.aws.store import TaskStore

RATE_WINDOW_TTL_S = 60
# When a full key may try again: tasks take from seconds to minutes.
IN_FLIGHT_RETRY_AFTER_S = 10
# An entry whose task or batch is not stored yet may be a submit still under way.
UNSTORED_GRACE_S = 120


@dataclass(frozen=True)
class Held:
    """One entry of a key's in-flight item."""

    kind: str  # "t" a task, "b" a batch
    work_id: str
    weight: int
    since: float


# Which of the held entries have ended (or were never stored past the grace).
Ended = Callable[[list[Held], float], list[Held]]


class KeyLimits:
    def __init__(
        self, table_name: str, client: DynamoDBClient, *, ended: Ended, clock: Callable[[], float] = time.time
    ) -> None:
        self.table_name = table_name
        self._client = client
        self._ended = ended
        self._clock = clock
        # Keys whose current second is known to be full, and until when: the rest of a flood is
        # refused from memory, without a write each (a sandbox's own view, so it errs to counting).
        self._full_until: dict[str, float] = {}

    def count_request(self, caller: Caller) -> None:
        """One more request of the caller's key this second; TooManyRequests past its rps."""
        if caller.rps is None or caller.key_id is None:
            return
        now = self._clock()
        if now < self._full_until.get(caller.key_id, 0.0):
            raise self._over_rate(caller)
        try:
            counter_update(
                self._client,
                self.table_name,
                f"rate#{caller.key_id}#{int(now)}",
                "SET #n = if_not_exists(#n, :zero) + :one, expires_at = :expires",
                "attribute_not_exists(#n) OR #n < :rps",
                {":zero": 0, ":one": 1, ":rps": caller.rps, ":expires": int(now) + RATE_WINDOW_TTL_S},
            )
        except CounterRefused:
            if len(self._full_until) > 10_000:
                self._full_until.clear()
            self._full_until[caller.key_id] = int(now) + 1
            raise self._over_rate(caller) from None

    @staticmethod
    def _over_rate(caller: Caller) -> TooManyRequests:
        return TooManyRequests(f"This API key allows {caller.rps} request(s) a second.", retry_after_s=1)

    def hold(self, caller: Caller, kind: str, work_id: str, *, weight: int = 1) -> None:
        """Counts a task (`kind` "t") or a batch of `weight` items ("b") as in flight for the
        caller's key; TooManyRequests when the key's max_in_flight has no room for it."""
        cap, key_id = caller.max_in_flight, caller.key_id
        if cap is None or key_id is None:
            return
        if weight > cap:
            raise InvalidInput(
                f"{weight} items are more than this API key may have in flight ({cap}).", field="items"
            )
        for attempt in range(2):
            try:
                self._in_flight(
                    key_id,
                    f"{kind}_{work_id}",
                    "SET #entry = :entry, #n = if_not_exists(#n, :zero) + :weight",
                    "attribute_not_exists(#entry) AND (attribute_not_exists(#n) OR #n <= :room)",
                    {":entry": [weight, self._clock()], ":zero": 0, ":weight": weight, ":room": cap - weight},
                )
                return
            except CounterRefused:
                held = self.held(key_id)
                if any((h.kind, h.work_id) == (kind, work_id) for h in held):
                    return  # held already: the same batch submitted again under its Idempotency-Key
                if attempt == 0 and self._release_ended(key_id, held):
                    continue
                break
        raise TooManyRequests(
            f"This API key has {cap} task(s) in flight, its limit: submit again when some have ended.",
            retry_after_s=IN_FLIGHT_RETRY_AFTER_S,
        )

    def reweigh(self, key_id: str, cap: int, work_id: str, *, weight: int) -> bool:
        """A batch held at submit with a weight of 1 (its items unknown: a file not read yet) now
        weighs its `weight` items; False when the key's max_in_flight (`cap`) has no room."""
        for attempt in range(2):
            try:
                self._in_flight(
                    key_id,
                    f"b_{work_id}",
                    "SET #entry = :entry, #n = #n + :more",
                    "attribute_exists(#entry) AND #n <= :room",
                    {":entry": [weight, self._clock()], ":more": weight - 1, ":room": cap - (weight - 1)},
                )
                return True
            except CounterRefused:
                held = self.held(key_id)
                mine = [h for h in held if (h.kind, h.work_id) == ("b", work_id)]
                if not mine or mine[0].weight == weight:
                    return True  # released already (ended), or weighed by an earlier read
                if weight > cap:
                    return False
                if attempt == 0 and self._release_ended(key_id, held):
                    continue
        return False

    def _in_flight(
        self, key_id: str, entry: str, update: str, condition: str, values: dict[str, Any]
    ) -> None:
        """One conditional write of the key's in-flight item, on its count and `entry` (#entry);
        CounterRefused when `condition` does not hold."""
        counter_update(
            self._client,
            self.table_name,
            f"flight#{key_id}",
            update,
            condition,
            values,
            names={"#entry": entry},
        )

    def held(self, key_id: str) -> list[Held]:
        with dynamodb_errors("LimitsTable read"):
            item = self._client.get_item(
                TableName=self.table_name, Key={"pk": {"S": f"flight#{key_id}"}}, ConsistentRead=True
            ).get("Item")
        entries = deserialize(item) if item else {}
        return [
            Held(kind=name[0], work_id=name[2:], weight=int(value[0]), since=float(value[1]))
            for name, value in entries.items()
            if name[:2] in ("t_", "b_")
        ]

    def _release_ended(self, key_id: str, held: list[Held]) -> bool:
        """Removes the entries whose work has ended; whether it removed any."""
        released = [entry for entry in self._ended(held, self._clock()) if self._release(key_id, entry)]
        return bool(released)

    def _release(self, key_id: str, entry: Held) -> bool:
        try:
            self._in_flight(
                key_id,
                f"{entry.kind}_{entry.work_id}",
                "REMOVE #entry SET #n = #n - :weight",
                "attribute_exists(#entry)",
                {":weight": entry.weight},
            )
        except CounterRefused:
            return False  # another submit removed it first
        return True


def counter_update(
    client: DynamoDBClient,
    table_name: str,
    pk: str,
    update: str,
    condition: str,
    values: dict[str, Any],
    *,
    names: dict[str, str] | None = None,
) -> None:
    """One counter's conditional update; CounterRefused when its condition says no."""
    request: dict[str, Any] = {
        "TableName": table_name,
        "Key": {"pk": {"S": pk}},
        "UpdateExpression": update,
        "ConditionExpression": condition,
        "ExpressionAttributeValues": serialize(values),
        # `#n` in the expressions is the count (spelled out, so no reserved word can bite)
        "ExpressionAttributeNames": {**({"#n": "n"} if "#n" in update + condition else {}), **(names or {})},
        # A refusal carries the item as it stood (RunningCalls reads the places from it).
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    with dynamodb_errors("LimitsTable update"):
        try:
            client.update_item(**request)
        except ClientError as exc:
            if is_condition_failure(exc):
                raise CounterRefused(exc.response.get("Item")) from None  # type: ignore[arg-type]
            raise


@dataclass(frozen=True)
class Take:
    """A take's answer: the place is the caller's, or (refused) who holds the places, each
    until when."""

    taken: bool
    held: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.taken


def _places(item: Mapping[str, Any] | None) -> dict[str, float]:
    entries = deserialize(item) if item else {}
    return {name[2:]: float(value) for name, value in entries.items() if name.startswith("t_")}


class RunningCalls:
    """A tenant's LLM calls running at once, kept under a cap: one LimitsTable item per tenant
    (`running#<tenant>`), an attribute per running task (`t_<id>`: until when its lease holds it)
    and their count `n`. The worker takes an entry before its call and gives it back after. An
    entry whose lease has lapsed (its sandbox died mid-call) is cleared by the next take that
    finds the cap full, so a crash holds a place no longer than the lease it held.

    With another `prefix`, the same places count other things in flight: `webhook#<endpoint>`,
    the deliveries one webhook endpoint has open (`endpoint_places`)."""

    def __init__(
        self,
        table_name: str,
        client: DynamoDBClient,
        *,
        clock: Callable[[], float] = time.time,
        prefix: str = "running#",
    ) -> None:
        self.table_name = table_name
        self._client = client
        self._clock = clock
        self._prefix = prefix

    def take(self, tenant_id: str, task_id: str, *, cap: int, until: float) -> Take:
        """Whether the task may call now: a place under `cap` is its own until `until`, or was
        already (a redelivery of the same task takes its place over). A refusal says who holds
        the places (the item as the refused write found it: no read after it)."""
        for attempt in range(2):
            try:
                self._write(
                    tenant_id,
                    "SET #entry = :until, #n = if_not_exists(#n, :zero) + :one",
                    "attribute_not_exists(#entry) AND (attribute_not_exists(#n) OR #n < :cap)",
                    {":until": until, ":zero": 0, ":one": 1, ":cap": cap},
                    task_id,
                )
                return Take(taken=True)
            except CounterRefused as refused:
                held = _places(refused.item)
                if task_id in held:
                    self._write(
                        tenant_id,
                        "SET #entry = :until",
                        "attribute_exists(#entry)",
                        {":until": until},
                        task_id,
                    )
                    return Take(taken=True)
                now = self._clock()
                lapsed = [other for other, held_until in held.items() if held_until < now]
                if attempt == 0 and sum(self._remove(tenant_id, other) for other in lapsed):
                    continue
                return Take(taken=False, held=held)
        raise AssertionError("unreachable: the second attempt returns")

    def give_back(self, tenant_id: str, task_id: str) -> None:
        self._remove(tenant_id, task_id)

    def hand_over(self, tenant_id: str, from_id: str, to_id: str, *, until: float) -> bool:
        """`from_id`'s place becomes `to_id`'s until `until`, in one write (the count stays):
        what a give-back and a take would do in two. False, and nothing written, when `from_id`
        holds no place (its entry lapsed and was cleared) or `to_id` holds one already."""
        try:
            self._write(
                tenant_id,
                "REMOVE #entry SET #to = :until",
                "attribute_exists(#entry) AND attribute_not_exists(#to)",
                {":until": until},
                from_id,
                {"#to": f"t_{to_id}"},
            )
        except CounterRefused:
            return False
        return True

    def running(self, tenant_id: str) -> dict[str, float]:
        """The tenant's running tasks, each with until when it holds its place."""
        with dynamodb_errors("LimitsTable read"):
            item = self._client.get_item(
                TableName=self.table_name,
                Key={"pk": {"S": f"{self._prefix}{tenant_id}"}},
                ConsistentRead=True,
            ).get("Item")
        return _places(item)

    def _remove(self, tenant_id: str, task_id: str) -> bool:
        try:
            self._write(
                tenant_id,
                "REMOVE #entry SET #n = #n - :one",
                "attribute_exists(#entry)",
                {":one": 1},
                task_id,
            )
        except CounterRefused:
            return False  # given back already, or cleared by another take
        return True

    def _write(
        self,
        tenant_id: str,
        update: str,
        condition: str,
        values: dict[str, Any],
        task_id: str,
        names: dict[str, str] | None = None,
    ) -> None:
        counter_update(
            self._client,
            self.table_name,
            f"{self._prefix}{tenant_id}",
            update,
            condition,
            values,
            names={"#entry": f"t_{task_id}", **(names or {})},
        )


def endpoint_places(table_name: str, client: DynamoDBClient) -> RunningCalls:
    """The webhook deliveries each endpoint (scheme, host and port) has open, by webhook-id."""
    return RunningCalls(table_name, client, prefix="webhook#")


def work_ended(tasks: TaskStore, batches: BatchStore) -> Ended:
    """Which held entries have ended: a task that reads as ended (dead-lettered ones too), a
    batch that has ended, or either gone (expired, or never stored past the grace)."""

    def ended(held: list[Held], now: float) -> list[Held]:
        found = tasks.get_many([h.work_id for h in held if h.kind == "t"])
        gone = []
        for entry in held:
            if entry.kind == "t":
                task = found.get(entry.work_id)
                over = task.is_expired(now) or task.as_read(now).status.is_terminal if task else None
            else:
                batch = batches.get(entry.work_id, now=now)
                over = batch.status.is_terminal if batch else None
            if over or (over is None and now - entry.since > UNSTORED_GRACE_S):
                gone.append(entry)
        return gone

    return ended


class CounterRefused(Exception):
    """A counter's condition said no; `item` is the counter as it stood then."""

    def __init__(self, item: Mapping[str, Any] | None) -> None:
        super().__init__("condition failed")
        self.item = item
