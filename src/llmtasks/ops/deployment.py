"""Where one deployment's tables and queues are: a `sam deploy`ed stack (its Outputs), or a stack
whose resources are named from their logical ids (the local stack's). The operator tools start
here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import boto3

if TYPE_CHECKING:
    from mypy_boto3_cloudformation import CloudFormationClient
    from mypy_boto3_sqs import SQSClient

QueueName = Literal["tasks", "high", "batches", "fanout", "webhooks"]
# Each queue name's queue and dead-letter queue (logical ids in template.yaml).
QUEUES: dict[QueueName, tuple[str, str]] = {
    "tasks": ("TaskQueue", "TaskDLQ"),
    "high": ("HighTaskQueue", "HighTaskDLQ"),
    "batches": ("BatchTaskQueue", "BatchTaskDLQ"),
    "fanout": ("BatchFanoutQueue", "BatchFanoutDLQ"),
    "webhooks": ("WebhookQueue", "WebhookDLQ"),
}

# The template's functions (logical ids), and those that read TasksTable's stream.
FUNCTIONS = (
    "AuthorizerFunction",
    "SubmitFunction",
    "StatusFunction",
    "WorkerFunction",
    "WebhookFunction",
    "BatchFunction",
)
STREAM_CONSUMERS = ("WebhookFunction", "BatchFunction")


@dataclass(frozen=True)
class Deployment:
    """Where one deployment's tables and queues are, and its functions' names (CloudWatch's
    FunctionName dimension) by logical id."""

    tasks_table: str
    api_keys_table: str
    queue_urls: dict[QueueName, str]
    dlq_urls: dict[QueueName, str]
    functions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_stack(cls, stack_name: str, cloudformation: CloudFormationClient | None = None) -> Deployment:
        """A `sam deploy`ed stack, from its Outputs."""
        client = cloudformation or boto3.client("cloudformation")
        [stack] = client.describe_stacks(StackName=stack_name)["Stacks"]
        outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
        return cls(
            tasks_table=outputs["TasksTableName"],
            api_keys_table=outputs["ApiKeysTableName"],
            queue_urls={name: outputs[f"{queue}Url"] for name, (queue, _) in QUEUES.items()},
            dlq_urls={name: outputs[f"{dlq}Url"] for name, (_, dlq) in QUEUES.items()},
            # A stack deployed before the functions' names were Outputs has none to give
            functions={f: outputs[f"{f}Name"] for f in FUNCTIONS if f"{f}Name" in outputs},
        )

    @classmethod
    def named(cls, sqs: SQSClient, name_of: Callable[[str], str]) -> Deployment:
        """A stack whose resources are named `name_of(logical id)` (the local stack's
        `local_name`), its queues' URLs asked of SQS."""

        def url(logical_id: str) -> str:
            return sqs.get_queue_url(QueueName=name_of(logical_id))["QueueUrl"]

        return cls(
            tasks_table=name_of("TasksTable"),
            api_keys_table=name_of("ApiKeysTable"),
            queue_urls={name: url(queue) for name, (queue, _) in QUEUES.items()},
            dlq_urls={name: url(dlq) for name, (_, dlq) in QUEUES.items()},
            functions={function: function for function in FUNCTIONS},  # named as their logical ids
        )
