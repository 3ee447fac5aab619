"""template.yaml against the code: handlers exist, settings match, AWS's rules of thumb hold."""

from __future__ import annotations

import re
import tomllib

import pytest

from llmtasks.local.runtime import load_handler
from llmtasks.settings import Settings
from tests.conftest import Aws
from tests.helpers import ROOT

pytestmark = pytest.mark.unit

FUNCTIONS = ("SubmitFunction", "StatusFunction", "WorkerFunction", "WebhookFunction")


def test_the_four_functions_have_a_handler_where_the_template_says(aws: Aws) -> None:
    for logical_id in FUNCTIONS:
        spec = aws.function(logical_id)
        assert spec.code_dir == ROOT / "functions" / logical_id.removesuffix("Function").lower()
        assert callable(load_handler(spec))


def test_every_variable_the_template_sets_is_a_setting_and_every_required_setting_is_set(aws: Aws) -> None:
    known = {name.upper() for name in Settings.model_fields}
    required = {name.upper() for name, field in Settings.model_fields.items() if field.is_required()}
    for logical_id in FUNCTIONS:
        variables = set(aws.function(logical_id).environment)
        ours = {v for v in variables if not v.startswith("POWERTOOLS_")}
        assert ours <= known, f"{logical_id} sets variables no setting reads: {ours - known}"
        assert required <= variables, f"{logical_id} lacks {required - variables}"


def test_runtime_is_python_312_or_newer() -> None:
    runtime = re.search(r"Runtime: python3\.(\d+)", (ROOT / "template.yaml").read_text())
    assert runtime is not None
    assert int(runtime.group(1)) >= 12


def test_queues_follow_the_sqs_event_source_rules(aws: Aws) -> None:
    queues = {
        queue_id: aws.template.resolve(props, aws.resources.refs, aws.resources.attributes)
        for queue_id, props in aws.template.resources("AWS::SQS::Queue").items()
    }
    for logical_id in FUNCTIONS:
        spec = aws.function(logical_id)
        for source in spec.sqs_sources:
            queue_id = aws.resources.logical_id_of_arn(source.queue_arn)
            # AWS: the visibility timeout at least six times the function's timeout.
            assert int(queues[queue_id]["VisibilityTimeout"]) >= 6 * spec.timeout_s, queue_id
            assert int(queues[queue_id]["RedrivePolicy"]["maxReceiveCount"]) >= 1
            assert source.report_batch_item_failures
            assert source.maximum_concurrency is not None
    assert int(queues["TaskQueue"]["RedrivePolicy"]["maxReceiveCount"]) == 5
    # Every function knows the count, so a reader can tell a dead-lettered task.
    for logical_id in FUNCTIONS:
        assert aws.function(logical_id).environment["TASK_MAX_RECEIVE_COUNT"] == "5"
    assert int(queues["TaskDLQ"]["MessageRetentionPeriod"]) == 14 * 24 * 3600


def test_the_table_has_ttl_on_expires_at_and_a_stream_of_both_images(aws: Aws) -> None:
    table = aws.template.resources("AWS::DynamoDB::Table")["TasksTable"]
    assert table["TimeToLiveSpecification"] == {"AttributeName": "expires_at", "Enabled": True}
    assert table["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    name = aws.resources.table_names["TasksTable"]
    ttl = aws.dynamodb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
    assert ttl == {"AttributeName": "expires_at", "TimeToLiveStatus": "ENABLED"}


def test_the_layer_requirements_match_the_package_dependencies() -> None:
    def names(lines: list[str]) -> set[str]:
        return {re.split(r"[<>=\[ ]", line.strip(), maxsplit=1)[0].lower() for line in lines if line.strip()}

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    layer = [
        line
        for line in (ROOT / "src" / "requirements.txt").read_text().splitlines()
        if not line.startswith("#")
    ]
    # boto3 is part of the Lambda runtime; the layer does not ship it.
    assert names(layer) == names(declared) - {"boto3"}


def test_large_results_outlive_their_tasks_by_default(aws: Aws) -> None:
    parameters = aws.template.parameters
    assert int(parameters["ResultRetentionDays"]) * 86400 > int(parameters["TaskTtlSeconds"])
    import boto3

    # The local bucket carries the template's lifecycle rule.
    bucket = aws.resources.bucket_names["ResultsBucket"]
    rules = boto3.client("s3").get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    # Large results, and batch manifests (a batch's items until they are fanned out).
    assert {rule["Filter"].get("Prefix", rule.get("Prefix")) for rule in rules} == {"results/", "batches/"}
    assert {rule["Expiration"]["Days"] for rule in rules} == {int(parameters["ResultRetentionDays"])}
