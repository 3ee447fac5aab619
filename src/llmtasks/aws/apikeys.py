"""API keys: each maps to a tenant, and only its SHA-256 is stored (ApiKeysTable).

A key reads `lt_<key id>_<secret>` and comes in `Authorization: Bearer`. The key id is the
item's key and is safe to show (`llmtasks keys list`, logs); the secret never leaves the
response that created it. Keys are 256-bit
random, so a plain SHA-256 is enough to store them (as GitHub and Stripe do); a slow password
hash would only slow every request down.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, Field

from llmtasks.aws.dynamo import deserialize, is_condition_failure, serialize
from llmtasks.domain.budgets import Budget
from llmtasks.domain.caller import authorizer_context

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

PREFIX = "lt_"
# What a key holds in flight is kept in one LimitsTable item (limits.py), about 55 bytes an entry:
# this keeps it well under DynamoDB's 400 KB.
MAX_IN_FLIGHT = 5000
# Why a key is refused (the authorizer logs it; API Gateway answers 403 whatever it is).
Refusal = Literal["missing", "malformed", "unknown", "revoked"]


class ApiKey(BaseModel):
    key_id: str
    tenant_id: str
    name: str = ""
    created_at: float
    revoked_at: float | None = None
    # The key's limits (None: none): requests a second, and tasks submitted with it that have not
    # ended (a batch's items count until the batch ends).
    rps: float | None = Field(default=None, gt=0)
    max_in_flight: int | None = Field(default=None, ge=1, le=MAX_IN_FLIGHT)
    # LLM calls of its tasks running at once, whatever is queued (TenantMaxRunning caps them all).
    max_running: int | None = Field(default=None, ge=1, le=MAX_IN_FLIGHT)
    # LLM tokens a minute its tenant's calls may use, of the provider keys' own (a share).
    tpm: int | None = Field(default=None, ge=1)
    # What its tasks may cost (USD) a UTC day and a UTC month: submits past it are refused.
    budget: Budget | None = None

    def authorizer_context(self) -> dict[str, Any]:
        """What the authorizer hands the functions for this key (domain/caller.py reads it)."""
        return authorizer_context(
            self.tenant_id,
            self.key_id,
            rps=self.rps,
            max_in_flight=self.max_in_flight,
            max_running=self.max_running,
            tpm=self.tpm,
            budget=self.budget,
        )


class Authentication(BaseModel):
    key: ApiKey | None = None  # the valid key presented, else why there is none
    refusal: Refusal | None = None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: `Authorization: Bearer <key>` (the API's identity source; the
    OpenAI SDK sends its key so too)."""
    lowered = {name.lower(): value for name, value in headers.items()}
    scheme, _, credentials = lowered.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return None


class ApiKeys:
    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table_name = table_name
        self._client = client

    def create(
        self,
        tenant_id: str,
        *,
        name: str = "",
        rps: float | None = None,
        max_in_flight: int | None = None,
        max_running: int | None = None,
        tpm: int | None = None,
        budget: Budget | None = None,
        now: float | None = None,
    ) -> tuple[str, ApiKey]:
        """A new key for `tenant_id`: the key itself (shown once) and what is stored of it."""
        record = ApiKey(
            key_id=secrets.token_hex(6),
            tenant_id=tenant_id,
            name=name,
            created_at=now or time.time(),
            rps=rps,
            max_in_flight=max_in_flight,
            max_running=max_running,
            tpm=tpm,
            budget=budget if budget is not None and budget.bounded else None,
        )
        key = f"{PREFIX}{record.key_id}_{secrets.token_urlsafe(32)}"
        self._client.put_item(
            TableName=self.table_name,
            Item=serialize({**record.model_dump(mode="json", exclude_none=True), "key_hash": _digest(key)}),
            ConditionExpression="attribute_not_exists(key_id)",
        )
        return key, record

    def all(self) -> list[ApiKey]:
        """Every key, newest first (a scan: the table holds one small item per key)."""
        items = []
        for page in self._client.get_paginator("scan").paginate(TableName=self.table_name):
            items += [ApiKey.model_validate(deserialize(item)) for item in page.get("Items", [])]
        return sorted(items, key=lambda k: k.created_at, reverse=True)

    def revoke(self, key_id: str, *, now: float | None = None) -> ApiKey | None:
        """Marks the key revoked (kept, so `list` still shows it); None when there is no such key."""
        try:
            reply = self._client.update_item(
                TableName=self.table_name,
                Key={"key_id": {"S": key_id}},
                UpdateExpression="SET revoked_at = if_not_exists(revoked_at, :now)",
                ConditionExpression="attribute_exists(key_id)",
                ExpressionAttributeValues=serialize({":now": now or time.time()}),
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if is_condition_failure(exc):
                return None
            raise
        return ApiKey.model_validate(deserialize(reply["Attributes"]))

    def authenticate(self, key: str | None) -> Authentication:
        if not key:
            return Authentication(refusal="missing")
        prefix, _, rest = key.partition(PREFIX)
        key_id, _, secret = rest.partition("_")
        if prefix or not key_id or not secret or len(key) > 200:
            return Authentication(refusal="malformed")
        item = self._client.get_item(
            TableName=self.table_name, Key={"key_id": {"S": key_id}}, ConsistentRead=True
        ).get("Item")
        if not item or not hmac.compare_digest(item["key_hash"]["S"], _digest(key)):
            return Authentication(refusal="unknown")
        record = ApiKey.model_validate(deserialize(item))
        if record.revoked_at is not None:
            return Authentication(refusal="revoked")
        return Authentication(key=record)
