"""Each tenant's webhook signing secrets: one TasksTable item per tenant (`tenant#<id>`), the
current secret and, for a while after a rotation, the previous one (both sign meanwhile)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from llmtasks.aws.dynamo import deserialize, dynamodb_errors, is_condition_failure, serialize
from llmtasks.domain.messages import WebhookSecrets

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef


class TenantSecrets:
    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table_name = table_name
        self._client = client

    def secrets(self, tenant_id: str, *, new_secret: str) -> WebhookSecrets:
        """The tenant's signing secrets; `new_secret` is stored if the tenant has none yet."""
        key = _tenant_key(tenant_id)
        with dynamodb_errors("read"):
            item = self._client.get_item(TableName=self.table_name, Key=key, ConsistentRead=True).get("Item")
        if item:
            return WebhookSecrets.model_validate(deserialize(item))
        with dynamodb_errors("put"):
            try:
                self._client.put_item(
                    TableName=self.table_name,
                    Item={**key, "webhook_secret": {"S": new_secret}},
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except ClientError as exc:
                if not is_condition_failure(exc):
                    raise
                created = False  # another request created it first: theirs is the secret
            else:
                created = True
        return (
            WebhookSecrets(webhook_secret=new_secret)
            if created
            else self.secrets(tenant_id, new_secret=new_secret)
        )

    def rotate(self, tenant_id: str, *, new_secret: str, previous_until: float) -> WebhookSecrets:
        """`new_secret` becomes the secret; the one it replaces keeps signing until `previous_until`."""
        current = self.secrets(tenant_id, new_secret=new_secret)
        if current.webhook_secret == new_secret:
            return current  # the tenant had none: this is its first, with nothing to overlap
        with dynamodb_errors("update"):
            reply = self._client.update_item(
                TableName=self.table_name,
                Key=_tenant_key(tenant_id),
                UpdateExpression=(
                    "SET previous_webhook_secret = webhook_secret, previous_secret_until = :until,"
                    " webhook_secret = :new"
                ),
                ExpressionAttributeValues=serialize({":new": new_secret, ":until": previous_until}),
                ReturnValues="ALL_NEW",
            )
        return WebhookSecrets.model_validate(deserialize(reply["Attributes"]))


def _tenant_key(tenant_id: str) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"tenant#{tenant_id}"}}
