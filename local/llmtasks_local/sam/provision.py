"""Creates the template's tables, buckets and queues on a local endpoint (moto, LocalStack) and returns
what Ref and GetAtt resolve to there."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from llmtasks_local.sam.template import Template, TemplateError

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import TableDescriptionTypeDef
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient

    from llmtasks.ops.deployment import Deployment

_TABLE_ARGUMENTS = (
    "AttributeDefinitions",
    "KeySchema",
    "BillingMode",
    "ProvisionedThroughput",
    "GlobalSecondaryIndexes",
    "LocalSecondaryIndexes",
)
_QUEUE_ATTRIBUTES = (
    "DelaySeconds",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "ReceiveMessageWaitTimeSeconds",
    "VisibilityTimeout",
    "RedrivePolicy",
    "RedriveAllowPolicy",
    "FifoQueue",
    "ContentBasedDeduplication",
)


# Resources without an explicit name are called <prefix>-<LogicalId> on a local endpoint.
LOCAL_PREFIX = "llmtasks-local"


def local_name(logical_id: str, prefix: str = LOCAL_PREFIX) -> str:
    return f"{prefix}-{logical_id}"


def local_deployment(sqs: SQSClient) -> Deployment:
    """The deployment `llmtasks up` provisioned on its endpoint (moto or LocalStack), for the
    operator tools."""
    from llmtasks.ops.deployment import Deployment

    return Deployment.named(sqs, local_name)


@dataclass
class LocalResources:
    """What the template's resources are called on the local endpoint."""

    refs: dict[str, str] = field(default_factory=dict)
    attributes: dict[tuple[str, str], str] = field(default_factory=dict)
    table_names: dict[str, str] = field(default_factory=dict)  # logical id -> name
    queue_urls: dict[str, str] = field(default_factory=dict)  # logical id -> URL
    bucket_names: dict[str, str] = field(default_factory=dict)  # logical id -> name
    ttl_attributes: dict[str, str] = field(default_factory=dict)  # table logical id -> its TTL attribute

    def queue_url_of_arn(self, arn: str) -> str:
        for logical_id, url in self.queue_urls.items():
            if self.attributes[(logical_id, "Arn")] == arn:
                return url
        raise KeyError(arn)

    def logical_id_of_arn(self, arn: str) -> str:
        for (logical_id, attribute), value in self.attributes.items():
            if attribute in ("Arn", "StreamArn") and value == arn:
                return logical_id
        raise KeyError(arn)


def provision(
    template: Template,
    *,
    dynamodb: DynamoDBClient,
    sqs: SQSClient,
    s3: S3Client,
    prefix: str = LOCAL_PREFIX,
) -> LocalResources:
    """Creates what is missing and adopts what exists (a second `llmtasks up` on the same endpoint)."""
    resources = LocalResources()
    for logical_id in template.body.get("Resources") or {}:
        # Layers, the HTTP API and the like have no local counterpart; Ref yields their id.
        resources.refs[logical_id] = logical_id
    for logical_id, props in template.resources("AWS::DynamoDB::Table").items():
        resolved = template.resolve(props, resources.refs, resources.attributes)
        _create_table(resources, dynamodb, logical_id, resolved, prefix)
    for logical_id, props in template.resources("AWS::S3::Bucket").items():
        resolved = template.resolve(props, resources.refs, resources.attributes)
        _create_bucket(resources, s3, logical_id, resolved, prefix)
    pending = dict(template.resources("AWS::SQS::Queue"))
    while pending:
        progressed = False
        for logical_id, props in list(pending.items()):
            try:
                resolved = template.resolve(props, resources.refs, resources.attributes)
            except TemplateError:
                continue  # its dead-letter queue is not created yet
            _create_queue(resources, sqs, logical_id, resolved, prefix)
            del pending[logical_id]
            progressed = True
        if not progressed:
            raise TemplateError(f"queues reference each other or unknown resources: {sorted(pending)}")
    return resources


def _create_table(
    resources: LocalResources, dynamodb: DynamoDBClient, logical_id: str, props: dict[str, Any], prefix: str
) -> None:
    name = str(props.get("TableName") or local_name(logical_id, prefix))
    arguments: dict[str, Any] = {key: props[key] for key in _TABLE_ARGUMENTS if key in props}
    stream = props.get("StreamSpecification")
    if stream:
        arguments["StreamSpecification"] = {"StreamEnabled": True, "StreamViewType": stream["StreamViewType"]}
    try:
        description = dynamodb.create_table(TableName=name, **arguments)["TableDescription"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise
        description = dynamodb.describe_table(TableName=name)["Table"]
        _update_indexes(dynamodb, name, description, arguments)
    ttl = props.get("TimeToLiveSpecification")
    if ttl and ttl.get("Enabled"):
        resources.ttl_attributes[logical_id] = str(ttl["AttributeName"])
        current = dynamodb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
        if current.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
            dynamodb.update_time_to_live(
                TableName=name,
                TimeToLiveSpecification={"AttributeName": ttl["AttributeName"], "Enabled": True},
            )
    resources.table_names[logical_id] = name
    resources.refs[logical_id] = name
    resources.attributes[(logical_id, "Arn")] = description["TableArn"]
    if "LatestStreamArn" in description:
        resources.attributes[(logical_id, "StreamArn")] = description["LatestStreamArn"]


def _update_indexes(
    dynamodb: DynamoDBClient, name: str, description: TableDescriptionTypeDef, arguments: dict[str, Any]
) -> None:
    """A table kept from an earlier template (a state directory, a LocalStack that stayed up)
    gets the template's global secondary indexes as a stack update gives them: those it lacks
    created, those the template no longer has deleted. An index is matched by its name, as
    CloudFormation matches it (a changed key or projection comes with a new name)."""
    wanted = {index["IndexName"]: index for index in arguments.get("GlobalSecondaryIndexes", [])}
    present = {index["IndexName"] for index in description.get("GlobalSecondaryIndexes", [])}
    updates: list[dict[str, Any]] = [
        {"Delete": {"IndexName": index}} for index in sorted(present - set(wanted))
    ]
    updates += [{"Create": wanted[index]} for index in sorted(set(wanted) - present)]
    for update in updates:  # one each, as DynamoDB's UpdateTable takes them
        dynamodb.update_table(
            TableName=name,
            AttributeDefinitions=arguments["AttributeDefinitions"],
            GlobalSecondaryIndexUpdates=[update],  # type: ignore[list-item]
        )


def _create_bucket(
    resources: LocalResources, s3: S3Client, logical_id: str, props: dict[str, Any], prefix: str
) -> None:
    name = str(props.get("BucketName") or local_name(logical_id, prefix)).lower()
    try:
        s3.create_bucket(Bucket=name)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
            raise
    rules = (props.get("LifecycleConfiguration") or {}).get("Rules") or []
    # The rules S3 itself applies: expiry by prefix, and unfinished multipart uploads aborted.
    actions = ("ExpirationInDays", "AbortIncompleteMultipartUpload")
    applied: list[Any] = [
        {
            "ID": rule.get("Id", f"rule-{i}"),
            "Status": rule["Status"],
            "Filter": {"Prefix": rule.get("Prefix", "")},
            **({"Expiration": {"Days": int(rule["ExpirationInDays"])}} if "ExpirationInDays" in rule else {}),
            **{name: rule[name] for name in actions[1:] if name in rule},
        }
        for i, rule in enumerate(rules)
        if any(name in rule for name in actions)
    ]
    if applied:
        s3.put_bucket_lifecycle_configuration(Bucket=name, LifecycleConfiguration={"Rules": applied})
    resources.bucket_names[logical_id] = name
    resources.refs[logical_id] = name
    resources.attributes[(logical_id, "Arn")] = f"arn:aws:s3:::{name}"


def _create_queue(
    resources: LocalResources, sqs: SQSClient, logical_id: str, props: dict[str, Any], prefix: str
) -> None:
    name = str(props.get("QueueName") or local_name(logical_id, prefix))
    attributes = {
        key: json.dumps(props[key])
        if isinstance(props[key], dict)
        else str(props[key]).lower()
        if isinstance(props[key], bool)
        else str(props[key])
        for key in _QUEUE_ATTRIBUTES
        if key in props
    }
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    resources.queue_urls[logical_id] = url
    resources.refs[logical_id] = url
    resources.attributes[(logical_id, "Arn")] = arn
    resources.attributes[(logical_id, "QueueName")] = name
    resources.attributes[(logical_id, "QueueUrl")] = url


# What PutMetricAlarm takes of an AWS::CloudWatch::Alarm's properties (its actions aside: the local
# stack has no SNS topic to notify).
_ALARM_PROPERTIES = (
    "AlarmDescription",
    "Namespace",
    "MetricName",
    "Dimensions",
    "Statistic",
    "ExtendedStatistic",
    "Period",
    "Unit",
    "EvaluationPeriods",
    "DatapointsToAlarm",
    "Threshold",
    "ComparisonOperator",
    "TreatMissingData",
    "Metrics",
)


def provision_alarms(
    template: Template, resources: LocalResources, cloudwatch: CloudWatchClient, prefix: str = LOCAL_PREFIX
) -> list[str]:
    """The template's metric alarms on the endpoint's CloudWatch, with their definitions (metrics,
    dimensions naming the local resources, thresholds from the parameters), so `describe-alarms`
    lists them. moto keeps them and does not evaluate them, and has no composite alarms: those
    are left out. Returns the alarms' names."""
    names = []
    for logical_id, props in template.resources("AWS::CloudWatch::Alarm").items():
        resolved = template.resolve(props, resources.refs, resources.attributes)
        alarm = {key: resolved[key] for key in _ALARM_PROPERTIES if key in resolved}
        for key, kind in (("Threshold", float), ("Period", int), ("EvaluationPeriods", int)):
            if key in alarm:
                alarm[key] = kind(alarm[key])
        for query in alarm.get("Metrics") or []:
            if "MetricStat" in query:
                query["MetricStat"]["Period"] = int(query["MetricStat"]["Period"])
        name = str(resolved.get("AlarmName") or local_name(logical_id, prefix))
        cloudwatch.put_metric_alarm(AlarmName=name, **alarm)
        names.append(name)
    return names
