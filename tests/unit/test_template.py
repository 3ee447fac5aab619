"""template.yaml against the code: handlers exist, settings match, AWS's rules of thumb hold."""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from pathlib import Path

import pytest

from llmtasks.observability import NAMESPACE, Metric
from llmtasks.settings import (
    ApiResources,
    AuthorizerResources,
    BatchResources,
    FunctionResources,
    MissingConfiguration,
    Settings,
    WebhookResources,
    WorkerResources,
    forget_configuration,
)
from llmtasks_local.sam.function_spec import FunctionSpec
from tests.conftest import Aws
from tests.helpers import ROOT, load_handler, resource_variables

pytestmark = pytest.mark.unit

# What Lambda itself sets in every function's environment.
LAMBDA_VARIABLES = {
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_LAMBDA_FUNCTION_NAME",
    "LAMBDA_TASK_ROOT",
    "_X_AMZN_TRACE_ID",
}
# Each function's resource model: what its cold start checks (wiring.cold_start in its handler).
RESOURCES: dict[str, type[FunctionResources]] = {
    "AuthorizerFunction": AuthorizerResources,
    "SubmitFunction": ApiResources,
    "StatusFunction": ApiResources,
    "WorkerFunction": WorkerResources,
    "BatchFunction": BatchResources,
    "WebhookFunction": WebhookResources,
}
ENV_READ = re.compile(r"""os\.(?:environ\.get|getenv|environ\[)\(?\s*["']([A-Z0-9_]+)["']""")


def template_problems(functions: dict[str, FunctionSpec]) -> list[str]:
    """What would fail in Lambda: a handler missing where the template says, a variable set that
    no setting reads (a typo), a variable the function's resources require (its cold start fails
    without it) or one the code reads left unset."""
    models = [Settings, *RESOURCES.values()]
    known = {name.upper() for model in models for name in model.model_fields}
    problems = []
    for logical_id, spec in functions.items():
        model = RESOURCES[logical_id]
        required = {name.upper() for name, field in model.model_fields.items() if field.is_required()}
        forget_configuration()
        try:
            # Imported as Lambda imports it: in the function's own environment and no other.
            with pytest.MonkeyPatch.context() as environment:
                for name in resource_variables():
                    environment.delenv(name)
                for name, value in spec.environment.items():
                    environment.setenv(name, value)
                load_handler(spec)
        except (FileNotFoundError, ImportError, AttributeError) as error:
            problems.append(f"{logical_id}: no handler {spec.handler} in {spec.code_dir} ({error})")
        except MissingConfiguration as error:
            problems.append(f"{logical_id}'s cold start fails: {error}")
        finally:
            forget_configuration()
        variables = set(spec.environment)
        ours = {v for v in variables if not v.startswith("POWERTOOLS_")}
        problems += [f"{logical_id} sets {name}, which no setting reads" for name in sorted(ours - known)]
        problems += [f"{logical_id} lacks {name}" for name in sorted(required - variables)]
        sources = [path for path in (spec.handler_file, *handler_imports()) if path.is_file()]
        read = {name for path in sources for name in ENV_READ.findall(path.read_text())}
        problems += [
            f"{logical_id}'s code reads {name}, which the template does not set"
            for name in sorted(read - variables - LAMBDA_VARIABLES)
        ]
    return problems


def handler_imports() -> list[Path]:
    """The service package, which the layer carries whole: every module a handler may import."""
    return sorted((ROOT / "src" / "llmtasks").rglob("*.py"))


def test_every_function_has_its_handler_and_the_settings_it_needs(aws: Aws) -> None:
    functions = aws.template.functions(aws.resources.refs, aws.resources.attributes)
    assert len(functions) == 6
    assert template_problems(functions) == []


def test_the_template_check_finds_a_missing_handler_and_missing_variables(aws: Aws, tmp_path: Path) -> None:
    functions = aws.template.functions(aws.resources.refs, aws.resources.attributes)
    worker = functions["WorkerFunction"]
    environment = {k: v for k, v in worker.environment.items() if k != "TASKS_TABLE_NAME"}
    code = tmp_path / "worker"
    code.mkdir()
    (code / "app.py").write_text('import os\nTIMEOUT = os.environ.get("LLM_TIMEOUT_OVERRIDE")\n')
    broken = {
        "StatusFunction": dataclasses.replace(functions["StatusFunction"], handler="missing.lambda_handler"),
        "WorkerFunction": dataclasses.replace(
            worker, environment=environment | {"TASK_TABLE_NAME": "typo"}, code_dir=code
        ),
    }
    problems = template_problems(broken)
    assert len(problems) == 5, problems
    assert problems[0].startswith("StatusFunction: no handler missing.lambda_handler in ")
    assert problems[1].startswith(f"WorkerFunction: no handler app.lambda_handler in {code} ")
    assert problems[2:] == [
        "WorkerFunction sets TASK_TABLE_NAME, which no setting reads",
        "WorkerFunction lacks TASKS_TABLE_NAME",
        "WorkerFunction's code reads LLM_TIMEOUT_OVERRIDE, which the template does not set",
    ]


def test_runtime_is_python_312_or_newer() -> None:
    runtime = re.search(r"Runtime: python3\.(\d+)", (ROOT / "template.yaml").read_text())
    assert runtime is not None
    assert int(runtime.group(1)) >= 12


def test_queues_follow_the_sqs_event_source_rules(aws: Aws) -> None:
    queues = {
        queue_id: aws.template.resolve(props, aws.resources.refs, aws.resources.attributes)
        for queue_id, props in aws.template.resources("AWS::SQS::Queue").items()
    }
    functions = aws.template.functions(aws.resources.refs, aws.resources.attributes)
    for spec in functions.values():
        for source in spec.sqs_sources:
            queue_id = aws.resources.logical_id_of_arn(source.queue_arn)
            # AWS: the visibility timeout at least six times the function's timeout.
            assert int(queues[queue_id]["VisibilityTimeout"]) >= 6 * spec.timeout_s, queue_id
            assert int(queues[queue_id]["RedrivePolicy"]["maxReceiveCount"]) >= 1
            assert source.report_batch_item_failures
            assert source.maximum_concurrency is not None
    assert int(queues["TaskQueue"]["RedrivePolicy"]["maxReceiveCount"]) == 5
    # Every function knows the count, so a reader can tell a dead-lettered task.
    for spec in functions.values():
        assert spec.environment["TASK_MAX_RECEIVE_COUNT"] == "5", spec.logical_id
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
    # Large results, batch manifests (a batch's items until they are fanned out), files (uploads,
    # outputs), a Bedrock batch job's records and answers expire; the parts of a file written in
    # parts that never completed are dropped.
    expiring = {rule["Filter"].get("Prefix", rule.get("Prefix")) for rule in rules if "Expiration" in rule}
    assert expiring == {"results/", "batches/", "files/", "uploads/", "bedrock-batch/"}
    days = {rule["Filter"]["Prefix"]: rule["Expiration"]["Days"] for rule in rules if "Expiration" in rule}
    assert days.pop("uploads/") == 1  # an upload's parts, a day after it expired
    assert set(days.values()) == {int(parameters["ResultRetentionDays"])}
    [unfinished] = [rule for rule in rules if "AbortIncompleteMultipartUpload" in rule]
    assert unfinished["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}


def test_alarms_watch_the_dlqs_the_backlog_and_the_failed_task_rate(aws: Aws) -> None:
    alarms = aws.template.resources("AWS::CloudWatch::Alarm")
    # An alarm watches one metric (Dimensions) or several in metric math (Metrics' MetricStats).
    metrics = [props for props in alarms.values() if "Dimensions" in props]
    metrics += [
        m["MetricStat"]["Metric"]
        for props in alarms.values()
        for m in props.get("Metrics", [])
        if "MetricStat" in m
    ]
    watched = {
        (metric.get("MetricName"), metric["Dimensions"][0]["Value"]["Fn::GetAtt"][0])
        for metric in metrics
        if metric.get("Dimensions") and "Fn::GetAtt" in metric["Dimensions"][0]["Value"]
    }
    dead_letter_queues = {name for name in aws.template.resources("AWS::SQS::Queue") if name.endswith("DLQ")}
    assert {"TaskDLQ", "HighTaskDLQ", "WebhookDLQ"} <= dead_letter_queues
    assert {("ApproximateNumberOfMessagesVisible", dlq) for dlq in dead_letter_queues} <= watched
    assert ("ApproximateAgeOfOldestMessage", "TaskQueue") in watched
    rate = alarms["FailedTaskRateAlarm"]["Metrics"]
    read = {m["MetricStat"]["Metric"]["MetricName"] for m in rate if "MetricStat" in m}
    assert read == {Metric.FAILED, Metric.COMPLETED}
    assert all(m["MetricStat"]["Metric"]["Namespace"] == NAMESPACE for m in rate if "MetricStat" in m)


def test_the_dashboard_is_json_and_charts_every_metric_the_code_writes(aws: Aws) -> None:
    [dashboard] = aws.template.resources("AWS::CloudWatch::Dashboard").values()
    body, names = dashboard["DashboardBody"]["Fn::Sub"]
    text = re.sub(r"\$\{[^}]+\}", "x", body)  # what Fn::Sub fills in
    widgets = json.loads(text)["widgets"]
    charted = {
        row[1]
        for widget in widgets
        for row in widget["properties"]["metrics"]
        if len(row) > 1 and isinstance(row[1], str) and row[1] != "."
    }
    # A metric with a dimension of many values (tenant) is charted by a SEARCH of its name
    charted |= set(re.findall(r'MetricName=\\"(\w+)\\"', body))
    written = {value for name, value in vars(Metric).items() if not name.startswith("_")}
    assert written <= charted, written - charted
    assert set(names) == {"TaskQueueName", "BatchTaskQueueName", "TaskDLQName", "WebhookDLQName"}


def test_libyaml_reads_the_template_as_the_pure_python_parser_does() -> None:
    # The emulator parses with libyaml for speed (sam/template.py); its result must be the same.
    import yaml

    from llmtasks_local.sam import template

    class PurePython(yaml.SafeLoader):
        pass

    PurePython.add_multi_constructor("!", template._short_form)
    text = (ROOT / "template.yaml").read_text()
    assert template._CfnLoader.__mro__[1] is yaml.CSafeLoader
    assert yaml.load(text, Loader=template._CfnLoader) == yaml.load(text, Loader=PurePython)


# What each AWS namespace's metrics are measured by: the dimension an alarm must name, and the
# kind of resource its value must be. IteratorAge exists only for stream event sources.
ALARMED_NAMESPACES = {
    "AWS/SQS": ("QueueName", "AWS::SQS::Queue"),
    "AWS/Lambda": ("FunctionName", "AWS::Serverless::Function"),
}
LAMBDA_METRICS = {"Errors", "Throttles", "IteratorAge"}
SQS_METRICS = {"ApproximateNumberOfMessagesVisible", "ApproximateAgeOfOldestMessage"}


def alarmed_metrics(alarm: dict[str, object]) -> list[dict[str, object]]:
    """The metrics an alarm reads: its one metric, or each MetricStat of its metric math."""
    if "MetricName" in alarm:
        return [alarm]
    return [m["MetricStat"]["Metric"] for m in alarm["Metrics"] if "MetricStat" in m]  # type: ignore[attr-defined,index]


def test_every_alarm_reads_a_metric_of_a_resource_the_template_has(aws: Aws) -> None:
    template = aws.template
    alarms = template.resources("AWS::CloudWatch::Alarm")
    written = {value for name, value in vars(Metric).items() if not name.startswith("_")}
    for name, alarm in alarms.items():
        assert alarm["AlarmActions"] == {
            "Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]
        }, name
        assert alarm["TreatMissingData"] == "notBreaching", name  # no traffic is no stall
        for metric in alarmed_metrics(alarm):
            namespace, metric_name = metric["Namespace"], metric["MetricName"]
            [dimension] = metric["Dimensions"]  # type: ignore[misc]
            if namespace == NAMESPACE:
                assert metric_name in written, (name, metric_name)
                assert dimension == {"Name": "service", "Value": "llmtasks"}, name
                continue
            dimension_name, kind = ALARMED_NAMESPACES[namespace]  # type: ignore[index]
            assert metric_name in (LAMBDA_METRICS if namespace == "AWS/Lambda" else SQS_METRICS), name
            assert dimension["Name"] == dimension_name, name
            value = dimension["Value"]
            # A queue is named by its QueueName attribute, a function by its Ref (its name)
            logical_id = value["Fn::GetAtt"][0] if kind == "AWS::SQS::Queue" else value["Ref"]
            if kind == "AWS::SQS::Queue":
                assert value["Fn::GetAtt"][1] == "QueueName", name
            assert logical_id in template.resources(kind), (name, logical_id)


def test_each_function_s_errors_and_throttles_and_each_stream_consumer_s_lag_are_alarmed(aws: Aws) -> None:
    template = aws.template
    alarms = template.resources("AWS::CloudWatch::Alarm")
    watched = {
        (metric["MetricName"], metric["Dimensions"][0]["Value"].get("Ref"))  # type: ignore[index]
        for alarm in alarms.values()
        for metric in alarmed_metrics(alarm)
        if metric["Namespace"] == "AWS/Lambda"
    }
    functions = template.resources("AWS::Serverless::Function")
    consumers = {
        name
        for name, props in functions.items()
        if any(event["Type"] in ("DynamoDB", "Kinesis") for event in props.get("Events", {}).values())
    }
    assert consumers == {"WebhookFunction", "BatchFunction"}
    expected = {(metric, name) for name in functions for metric in ("Errors", "Throttles")}
    expected |= {("IteratorAge", name) for name in consumers}
    assert expected <= watched, expected - watched
    assert {name for metric, name in watched if metric == "IteratorAge"} == consumers

    # The composite names alarms of this template: the backlog and every consumer's lag
    [stalled] = template.resources("AWS::CloudWatch::CompositeAlarm").values()
    rule = stalled["AlarmRule"]["Fn::Sub"]
    named = set(re.findall(r'ALARM\("\$\{(\w+)\}"\)', rule))
    assert named <= set(alarms), named - set(alarms)
    lag_alarms = {
        name
        for name, alarm in alarms.items()
        if any(m["MetricName"] == "IteratorAge" for m in alarmed_metrics(alarm))
    }
    assert lag_alarms | {"TaskBacklogAlarm"} <= named
    assert stalled["AlarmActions"]["Fn::If"][0] == "HasAlarmTopic"
