"""Provisioning the template on an endpoint that already has its resources (a kept state
directory, a second `llmtasks up`): adopted as they are, brought to the template where a stack
update would change them."""

from __future__ import annotations

import boto3
import pytest

from llmtasks.aws.store import TENANT_INDEX, TaskStore
from llmtasks.domain.models import TaskStatus
from llmtasks_local.sam.provision import provision
from tests.conftest import Aws
from tests.helpers import pending_task

pytestmark = pytest.mark.unit
NOW = 1_800_000_000.0


def test_a_kept_table_gets_the_template_s_indexes_and_its_items_are_listed_through_them(aws: Aws) -> None:
    dynamodb = aws.dynamodb
    # Given TasksTable as an earlier template made it (the old listing index, and one the template
    # no longer has), with a task
    name = aws.resources.table_names["TasksTable"]
    dynamodb.delete_table(TableName=name)
    dynamodb.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "tenant_id", "AttributeType": "S"},
            {"AttributeName": "created_at", "AttributeType": "N"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by_tenant",
                "KeySchema": [
                    {"AttributeName": "tenant_id", "KeyType": "HASH"},
                    {"AttributeName": "created_at", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
            {
                "IndexName": "by_created_at",
                "KeySchema": [{"AttributeName": "created_at", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
    )
    store = TaskStore(name, dynamodb)
    store.create(pending_task("a" * 32, now=NOW))

    def provisioned() -> list[dict[str, object]]:
        provision(aws.template, dynamodb=dynamodb, sqs=aws.sqs, s3=boto3.client("s3"))
        indexes: list[dict[str, object]] = dynamodb.describe_table(TableName=name)["Table"][
            "GlobalSecondaryIndexes"
        ]
        return indexes

    # When the template is provisioned on that endpoint
    indexes = provisioned()
    # Then the table has the template's indexes, not the other one, and the kept task lists by status
    by_name = {index["IndexName"]: index for index in indexes}
    assert sorted(by_name) == ["by_tenant", TENANT_INDEX]
    assert by_name[TENANT_INDEX]["Projection"] == {
        "ProjectionType": "INCLUDE",
        "NonKeyAttributes": ["status"],
    }
    page, _ = store.tenant_tasks("default", limit=10, statuses=frozenset({TaskStatus.PENDING}))
    assert [task.task_id for task in page] == ["a" * 32]
    # And provisioning again changes nothing
    assert provisioned() == indexes
