"""The spend counters in TasksTable: per tenant and UTC day (`usage#day#<tenant>#<day>`, the
day's totals under each model and each API key) and per batch (`usage#batch#<id>`).

The worker adds each billed call as its answer arrives, before it stores the task's outcome:
the provider billed the call whether or not the task still wants its answer. Plain ADDs, never
a transaction, so concurrent calls of one tenant or batch never conflict on the counter item.
Attribute names are `<kind>|<name>|<field>` (kind model, key or all): each ADD creates its
attribute, so the first call of a new model needs no other write.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from llmtasks.aws.dynamo import BATCH_GET_KEYS, batch_get, deserialize, dynamodb_errors
from llmtasks.domain.usage import KEPT_DAYS, NO_KEY, BatchSpend, DayTotals, UsageTotals, days_between

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

    from llmtasks.domain.models import Task, Usage

# A tenant's daily counters outlive its tasks: a year's reports, and this month's budget.
RETENTION_S = KEPT_DAYS * 86_400
_FIELDS = tuple(UsageTotals.model_fields)


def _day_key(tenant_id: str, day: date) -> str:
    return f"usage#day#{tenant_id}#{day.isoformat()}"


def _batch_key(batch_id: str) -> str:
    return f"usage#batch#{batch_id}"


def utc_day(epoch: float) -> date:
    return datetime.fromtimestamp(epoch, tz=UTC).date()


class UsageCounters:
    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table_name = table_name
        self._client = client

    def charge(self, task: Task, usage: Usage, *, model: str, now: float) -> None:
        """One call the provider billed for `task`, added to its tenant's day (under the model
        and the task's key) and to its batch."""
        call = UsageTotals.of_call(usage)
        groups = [("model", model), ("key", task.key_id or NO_KEY)]
        self._add(_day_key(task.tenant_id, utc_day(now)), groups, call, expires_at=int(now) + RETENTION_S)
        if task.batch_id is not None:
            self._add(_batch_key(task.batch_id), [("all", "batch")], call, expires_at=task.expires_at)

    def _add(self, pk: str, groups: list[tuple[str, str]], call: UsageTotals, *, expires_at: int) -> None:
        names: dict[str, str] = {}
        values: dict[str, Any] = {":expires": {"N": str(expires_at)}}
        adds = []
        for g, (kind, name) in enumerate(groups):
            for f, field in enumerate(_FIELDS):
                amount = getattr(call, field)
                if not amount:
                    continue
                names[f"#g{g}f{f}"] = f"{kind}|{name}|{field}"
                values[f":g{g}f{f}"] = {
                    "N": str(Decimal(repr(amount)) if isinstance(amount, float) else amount)
                }
                adds.append(f"#g{g}f{f} :g{g}f{f}")
        with dynamodb_errors("usage update"):
            self._client.update_item(
                TableName=self.table_name,
                Key={"pk": {"S": pk}},
                UpdateExpression="SET expires_at = if_not_exists(expires_at, :expires) ADD "
                + ", ".join(adds),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )

    def days(self, tenant_id: str, first: date, last: date) -> dict[date, DayTotals]:
        """The tenant's counters of each day from `first` to `last` that had a billed call."""
        wanted = days_between(first, last)
        found: dict[date, DayTotals] = {}
        for start in range(0, len(wanted), BATCH_GET_KEYS):
            chunk = wanted[start : start + BATCH_GET_KEYS]
            with dynamodb_errors("usage read"):
                items = batch_get(
                    self._client, self.table_name, [{"pk": {"S": _day_key(tenant_id, d)}} for d in chunk]
                )
            for day in chunk:
                item = items.get(_day_key(tenant_id, day))
                if item is not None:
                    found[day] = {
                        (kind, name): totals
                        for (kind, name), totals in _groups(deserialize(item)).items()
                        if kind in ("model", "key")
                    }
        return found

    def count_over_budget(self, batch_id: str, items: int, *, expires_at: int) -> None:
        """`items` of the batch created failed: its key's budget had no room for them."""
        with dynamodb_errors("usage update"):
            self._client.update_item(
                TableName=self.table_name,
                Key={"pk": {"S": _batch_key(batch_id)}},
                UpdateExpression="SET expires_at = if_not_exists(expires_at, :expires) ADD over_budget :n",
                ExpressionAttributeValues={":expires": {"N": str(expires_at)}, ":n": {"N": str(items)}},
            )

    def of_batch(self, batch_id: str) -> BatchSpend:
        """What the batch's items' billed calls used and cost (None before the first), and how
        many items its key's budget refused."""
        with dynamodb_errors("usage read"):
            reply = self._client.get_item(TableName=self.table_name, Key={"pk": {"S": _batch_key(batch_id)}})
        fields = deserialize(reply.get("Item") or {})
        totals = _groups(fields).get(("all", "batch"))
        return BatchSpend(
            usage=totals.as_usage() if totals else None,
            budget_exhausted=int(fields.get("over_budget", 0)),
        )


def _groups(item: dict[str, Any]) -> dict[tuple[Any, str], UsageTotals]:
    """The item's `<kind>|<name>|<field>` attributes as totals by (kind, name); a name may hold
    `|` (the kind is before the first, the field after the last)."""
    fields: dict[tuple[Any, str], dict[str, Any]] = {}
    for attribute, value in item.items():
        kind, _, rest = attribute.partition("|")
        name, _, field = rest.rpartition("|")
        if kind in ("model", "key", "all") and field in _FIELDS:
            fields.setdefault((kind, name), {})[field] = value
    return {group: UsageTotals(**values) for group, values in fields.items()}
