"""Where one deployment's tables and queues are: a `sam deploy`ed stack (its Outputs) or the
stack `llmtasks up` provisioned. The operator commands (`llmtasks dlq`, `llmtasks keys`) start here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import boto3

if TYPE_CHECKING:
    from mypy_boto3_cloudformation import CloudFormationClient
    from mypy_boto3_sqs import SQSClient

QueueName = Literal["tasks", "webhooks"]


@dataclass(frozen=True)
class Deployment:
    """Where one deployment's tables and queues are."""

    tasks_table: str
    api_keys_table: str
    queue_urls: dict[QueueName, str]
    dlq_urls: dict[QueueName, str]

    @classmethod
    def of_stack(cls, stack_name: str, cloudformation: CloudFormationClient | None = None) -> Deployment:
        """A `sam deploy`ed stack, from its Outputs."""
        client = cloudformation or boto3.client("cloudformation")
        [stack] = client.describe_stacks(StackName=stack_name)["Stacks"]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        return cls(
            tasks_table=outputs["TasksTableName"],
            api_keys_table=outputs["ApiKeysTableName"],
            queue_urls={"tasks": outputs["TaskQueueUrl"], "webhooks": outputs["WebhookQueueUrl"]},
            dlq_urls={"tasks": outputs["TaskDLQUrl"], "webhooks": outputs["WebhookDLQUrl"]},
        )

    @classmethod
    def local(cls, sqs: SQSClient) -> Deployment:
        """The stack `llmtasks up` provisioned on its endpoint (moto or LocalStack)."""
        from llmtasks.local.provision import local_name

        def url(logical_id: str) -> str:
            return sqs.get_queue_url(QueueName=local_name(logical_id))["QueueUrl"]

        return cls(
            tasks_table=local_name("TasksTable"),
            api_keys_table=local_name("ApiKeysTable"),
            queue_urls={"tasks": url("TaskQueue"), "webhooks": url("WebhookQueue")},
            dlq_urls={"tasks": url("TaskDLQ"), "webhooks": url("WebhookDLQ")},
        )
