"""What TasksTable keeps of webhooks beside the tasks and batches themselves.

- A task's or batch's own item holds its webhook's status, its attempt count and its delivery
  log (`webhook_log`, each HTTP attempt, the newest MAX_WEBHOOK_LOG): `outcome_update` is the
  one write that records them, for both stores; the log expires with its item.
- `endpoint#<tenant>#<hash of the URL>`: one tenant's webhook URL while it fails (since when,
  the last error) and once it is disabled (`WebhookEndpoints`). A URL that works has no item;
  a failing one's item expires when it has not failed for the disable period; a disabled one
  stays until its tenant enables it again. The stream consumers' filters pass over these items
  (their pk is neither `task#` nor `batch#`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmtasks.aws.dynamo import deserialize, dynamodb_errors, updated_if
from llmtasks.domain.models import WebhookAttempt, WebhookStatus

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

# Scheduled attempts are at most the retry schedule's length plus one a delivery (a redrive
# starts it again), replays one each: a hundred is many events' whole story, in a few KB.
MAX_WEBHOOK_LOG = 100


def outcome_update(
    status: WebhookStatus, attempt: WebhookAttempt | None, log: list[WebhookAttempt]
) -> tuple[str, dict[str, Any]]:
    """The UpdateExpression and values that set a webhook's status and, with an attempt, count
    it and append it to the log (`log` as last read: at MAX_WEBHOOK_LOG the oldest entries make
    room). Counting (not setting) keeps the total right across duplicate deliveries."""
    update = "SET webhook_status = :status"
    values: dict[str, Any] = {":status": status.value}
    if attempt is None:
        return update, values
    entry = attempt.model_dump(mode="json", exclude_none=True)
    if len(log) < MAX_WEBHOOK_LOG:
        update += ", webhook_log = list_append(if_not_exists(webhook_log, :no_log), :entry)"
        values |= {":no_log": [], ":entry": [entry]}
    else:
        kept = [old.model_dump(mode="json", exclude_none=True) for old in log[-(MAX_WEBHOOK_LOG - 1) :]]
        update += ", webhook_log = :log"
        values[":log"] = [*kept, entry]
    return update + " ADD webhook_attempts :one", values | {":one": 1}


@dataclass(frozen=True)
class EndpointHealth:
    """One tenant's webhook URL as its deliveries left it; a URL with no item is healthy."""

    url: str
    failing_since: float | None = None
    last_error: str | None = None
    disabled_at: float | None = None

    @property
    def disabled(self) -> bool:
        return self.disabled_at is not None


class WebhookEndpoints:
    """Each tenant's failing and disabled webhook URLs (Svix's endpoint health)."""

    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table_name = table_name
        self._client = client

    def health(self, tenant_id: str, url: str) -> EndpointHealth:
        """Read once a delivery, eventually consistent (half a read unit): a URL disabled or
        enabled a moment ago may read as it was, for that moment."""
        with dynamodb_errors("read"):
            item = self._client.get_item(TableName=self.table_name, Key=_endpoint_key(tenant_id, url)).get(
                "Item"
            )
        return _health(item, url)

    def failed(self, tenant_id: str, url: str, *, error: str, now: float, disable_after_s: float) -> bool:
        """One more failed attempt at the URL; True when it disabled the URL (it had been failing
        for `disable_after_s`, with no success between). One caller disables it, once."""
        key = _endpoint_key(tenant_id, url)
        item = self._update(
            key,
            "SET #url = :url, tenant_id = :tenant, last_error = :error,"
            " failing_since = if_not_exists(failing_since, :now), expires_at = :forget",
            # A disabled URL keeps its item (no expiry) until it is enabled.
            condition="attribute_not_exists(disabled_at)",
            values={
                ":url": url,
                ":tenant": tenant_id,
                ":error": error[:500],
                ":now": now,
                ":forget": int(now + disable_after_s) + 1,
            },
            names={"#url": "url"},
        )
        health = _health(item, url)
        if item is None or health.failing_since is None or now - health.failing_since < disable_after_s:
            return False  # disabled already, or not failing for long enough
        # None: another delivery disabled it first, or it was enabled meanwhile.
        disabled = self._update(
            key,
            "SET disabled_at = :now REMOVE expires_at",
            condition="attribute_exists(pk) AND attribute_not_exists(disabled_at)",
            values={":now": now},
        )
        return disabled is not None

    def recovered(self, tenant_id: str, url: str) -> None:
        """A delivery to a failing (not disabled) URL succeeded: its streak ends (TTL removes the
        item; a read meanwhile finds it healthy)."""
        self._update(
            _endpoint_key(tenant_id, url),
            "REMOVE failing_since, last_error SET expires_at = :gone",
            condition="attribute_exists(pk) AND attribute_not_exists(disabled_at)",
            values={":gone": 0},
        )

    def enable(self, tenant_id: str, url: str) -> None:
        """The URL as a healthy one: deliveries to it are attempted again (its tenant's call)."""
        self._update(
            _endpoint_key(tenant_id, url),
            "REMOVE disabled_at, failing_since, last_error SET expires_at = :gone",
            condition="attribute_exists(pk)",
            values={":gone": 0},
        )

    def _update(
        self,
        key: dict[str, AttributeValueTypeDef],
        update: str,
        *,
        condition: str,
        values: dict[str, Any],
        names: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:
        return updated_if(
            self._client, self.table_name, key, update, condition=condition, values=values, names=names
        )


def _health(item: Mapping[str, Any] | None, url: str) -> EndpointHealth:
    if not item:
        return EndpointHealth(url=url)
    fields = deserialize(item)
    return EndpointHealth(
        url=url,
        failing_since=fields.get("failing_since"),
        last_error=fields.get("last_error"),
        disabled_at=fields.get("disabled_at"),
    )


def _endpoint_key(tenant_id: str, url: str) -> dict[str, AttributeValueTypeDef]:
    digest = hashlib.sha256(url.encode()).hexdigest()[:40]
    return {"pk": {"S": f"endpoint#{tenant_id}#{digest}"}}
