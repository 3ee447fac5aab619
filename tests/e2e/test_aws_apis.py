"""The AWS APIs a user's own tools call, answered by the running stack's AWS endpoint: Lambda
(its functions and event sources), CloudWatch Logs (each function's log group) and CloudWatch
metrics, driven with boto3 and the AWS CLI as users drive them, `--endpoint-url` the stack's."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from llmtasks_local.sam.template import Template
from tests.e2e.conftest import RunningStack, wait_terminal
from tests.helpers import HANG_S, TEMPLATE, eventually

pytestmark = pytest.mark.e2e

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def aws(stack: RunningStack, tmp_path: Path, *args: str) -> str:
    """The AWS CLI v2 (Debian's, scripts/system-packages) against the stack's endpoint; its output."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
        **AWS_ENV,
        # No one's own profile or config file reaches the stack
        "AWS_CONFIG_FILE": str(tmp_path / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-credentials"),
    }
    done = subprocess.run(
        ["/usr/bin/aws", *args, "--endpoint-url", stack.endpoint, "--output", "json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=HANG_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def client(stack: RunningStack, service: str) -> Any:
    return boto3.client(service, endpoint_url=stack.endpoint, region_name="us-east-1", **_keys())


def _keys() -> dict[str, str]:
    return {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def test_the_functions_are_listed_invoked_and_their_logs_and_metrics_read_with_the_aws_cli(
    stack: RunningStack, tmp_path: Path
) -> None:
    declared = Template.load(TEMPLATE).resources("AWS::Serverless::Function")
    listed = json.loads(aws(stack, tmp_path, "lambda", "list-functions"))["Functions"]
    assert sorted(f["FunctionName"] for f in listed) == sorted(declared)
    # Each function's log group is there from the start, so `aws logs tail --follow` of one that
    # has not run yet waits for its lines rather than failing
    groups = json.loads(
        aws(stack, tmp_path, "logs", "describe-log-groups", "--log-group-name-prefix", "/aws/lambda/")
    )
    assert {f"/aws/lambda/{name}" for name in declared} <= {g["logGroupName"] for g in groups["logGroups"]}
    # `aws lambda invoke`: StatusFunction without the authorizer's context answers 401, as API
    # Gateway would never let it
    said = json.loads(
        aws(
            stack,
            tmp_path,
            "lambda",
            "invoke",
            "--function-name",
            "StatusFunction",
            "--payload",
            "{}",
            "--log-type",
            "Tail",
            "reply.json",
        )
    )
    assert (said["StatusCode"], said.get("FunctionError")) == (200, None)
    assert json.loads((tmp_path / "reply.json").read_text())["statusCode"] == 401
    # Its log group has that invocation: `aws logs tail`
    since = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    tailed = eventually(
        lambda: aws(stack, tmp_path, "logs", "tail", "/aws/lambda/StatusFunction", "--since", since),
        lambda text: "REPORT RequestId" in text,
        timeout_s=HANG_S,
        every_s=1,
        what="StatusFunction's REPORT line in its log group",
    )
    assert "START RequestId" in tailed
    # And Lambda's Invocations metric counts it: `aws cloudwatch get-metric-statistics`
    now = datetime.now(UTC)

    def invocations() -> float:
        reply = json.loads(
            aws(
                stack,
                tmp_path,
                "cloudwatch",
                "get-metric-statistics",
                "--namespace",
                "AWS/Lambda",
                "--metric-name",
                "Invocations",
                "--dimensions",
                "Name=FunctionName,Value=StatusFunction",
                "--start-time",
                (now - timedelta(minutes=10)).isoformat(),
                "--end-time",
                (now + timedelta(minutes=10)).isoformat(),
                "--period",
                "60",
                "--statistics",
                "Sum",
            )
        )
        return sum(point["Sum"] for point in reply["Datapoints"])

    eventually(
        invocations, lambda n: n >= 1, timeout_s=HANG_S, every_s=1, what="StatusFunction's Invocations"
    )


def test_a_paused_task_queue_source_takes_no_task_until_it_is_resumed(stack: RunningStack) -> None:
    lambda_ = client(stack, "lambda")
    queue_url = client(stack, "sqs").get_queue_url(QueueName=_task_queue_name(stack))["QueueUrl"]
    queue_arn = client(stack, "sqs").get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    [source] = lambda_.list_event_source_mappings(FunctionName="WorkerFunction", EventSourceArn=queue_arn)[
        "EventSourceMappings"
    ]
    assert source["State"] == "Enabled"
    paused = lambda_.update_event_source_mapping(UUID=source["UUID"], Enabled=False)
    try:
        assert paused["State"] == "Disabled"
        with stack.client() as api:
            task_id = api.post("/tasks", json={"prompt": "wait for the source"}).json()["task_id"]
            # The message waits, visible, in the paused source's queue (a receive would hide it)
            sqs = client(stack, "sqs")

            def waiting() -> int:
                attributes = sqs.get_queue_attributes(
                    QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages"]
                )["Attributes"]
                return int(attributes["ApproximateNumberOfMessages"])

            eventually(waiting, lambda n: n >= 1, timeout_s=HANG_S, what="the task's message in TaskQueue")
            time.sleep(3)  # a few rounds of every poller of the paused source
            assert waiting() >= 1
            assert api.get(f"/tasks/{task_id}").json()["status"] == "pending"
            assert (
                lambda_.update_event_source_mapping(UUID=source["UUID"], Enabled=True)["State"] == "Enabled"
            )
            assert wait_terminal(api, task_id)["status"] == "completed"
    finally:
        lambda_.update_event_source_mapping(UUID=source["UUID"], Enabled=True)


def _task_queue_name(stack: RunningStack) -> str:
    names = [url.rsplit("/", 1)[-1] for url in client(stack, "sqs").list_queues()["QueueUrls"]]
    [name] = [n for n in names if n.endswith("-TaskQueue")]
    return name
