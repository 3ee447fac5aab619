"""The local endpoint's CloudWatch: metrics (emulator/metrics.py: Lambda's own per invocation, the
functions' EMF lines, a stream source's IteratorAge, and the stuck source said once) and logs
(emulator/log_groups.py: a log stream per sandbox, Lambda's START, END and REPORT lines in it)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit
from moto import mock_aws

from llmtasks.ops.deployment import Deployment
from llmtasks.ops.stats import function_health
from llmtasks_local.emulator.log_groups import LogsSink
from llmtasks_local.emulator.metrics import MetricsSink
from llmtasks_local.emulator.runtime import FunctionRuntime
from llmtasks_local.emulator.sources import StreamPoller
from llmtasks_local.sam.function_spec import StreamSource
from tests.helpers import metric_statistics, toy_function

pytestmark = pytest.mark.unit


@pytest.fixture
def cloudwatch() -> Any:
    with mock_aws():
        yield boto3.client("cloudwatch", region_name="us-east-1")


@pytest.fixture
def logs() -> Any:
    with mock_aws():
        yield boto3.client("logs", region_name="us-east-1")


def emf_line(capsys: pytest.CaptureFixture[str], name: str, value: float, **dimensions: str) -> str:
    """The line Powertools' Metrics writes for one metric (the service's own EMF writer)."""
    metrics = Metrics(namespace="llmtasks", service="llmtasks")
    for key, dimension in dimensions.items():
        metrics.add_dimension(name=key, value=dimension)
    capsys.readouterr()
    metrics.add_metric(name=name, unit=MetricUnit.Milliseconds, value=value)
    metrics.flush_metrics()
    [line] = capsys.readouterr().out.splitlines()
    return line


def test_emf_lines_and_invocations_become_the_metrics_cloudwatch_would_hold(
    cloudwatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = MetricsSink(cloudwatch)
    for value in (120.0, 80.0):
        sink.line(emf_line(capsys, "LlmLatency", value, model="m"))
    sink.line("START RequestId: 1 Version: $LATEST")  # not EMF: nothing
    sink.line('{"level": "INFO", "message": "no _aws here"}')
    sink.invoked("WorkerFunction", ok=True, duration_ms=30)
    sink.invoked("WorkerFunction", ok=False, duration_ms=50)
    sink.flush()
    assert metric_statistics(cloudwatch, "llmtasks", "LlmLatency", {"service": "llmtasks", "model": "m"}) == {
        "SampleCount": 2,
        "Sum": 200.0,
        "Maximum": 120.0,
    }
    worker = {"FunctionName": "WorkerFunction"}
    assert metric_statistics(cloudwatch, "AWS/Lambda", "Invocations", worker)["Sum"] == 2
    assert metric_statistics(cloudwatch, "AWS/Lambda", "Errors", worker)["Sum"] == 1
    assert metric_statistics(cloudwatch, "AWS/Lambda", "Duration", worker)["Maximum"] == 50
    # What was sent is not sent again
    sink.flush()
    assert metric_statistics(cloudwatch, "AWS/Lambda", "Invocations", worker)["Sum"] == 2


def test_a_stream_record_that_keeps_failing_is_said_stuck_once_and_its_age_is_the_iterator_age(
    cloudwatch: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = toy_function(
        tmp_path,
        """
        def handler(event, context):
            raise RuntimeError("cannot count it")
        """,
    )
    sink = MetricsSink(cloudwatch)
    source = StreamSource("F", "Progress", "arn:stream", maximum_retry_attempts=2)
    skipped: list[dict[str, Any]] = []
    # A record the stream took 90 s ago, past a lag alarm of 60 s
    record = {"dynamodb": {"SequenceNumber": "7", "ApproximateCreationDateTime": time.time() - 90}}
    with FunctionRuntime(spec) as runtime:
        poller = StreamPoller(
            source,
            runtime,
            None,
            threading.Event(),
            skipped.append,
            metrics=sink,
            stuck_after_s=60,  # type: ignore[arg-type]
        )
        capsys.readouterr()
        assert poller.deliver([record]) is True  # retried twice, then given up on
    output = capsys.readouterr().out
    assert output.count("is stuck") == 1
    [warning] = [line for line in output.splitlines() if "is stuck" in line]
    assert warning.startswith("Warning: F's stream source Progress is stuck: its failing record is 9")
    assert "StreamLagAlarmSeconds: 60 s" in warning
    assert len(skipped) == 1
    sink.flush()
    age = metric_statistics(cloudwatch, "AWS/Lambda", "IteratorAge", {"FunctionName": "F"})
    assert age["SampleCount"] == 3  # the first try and two retries
    assert age["Maximum"] >= 90_000


def test_a_record_younger_than_the_lag_alarm_is_not_said_stuck(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = toy_function(tmp_path, "def handler(event, context):\n    raise RuntimeError('no')\n")
    source = StreamSource("F", "Progress", "arn:stream", maximum_retry_attempts=1)
    record = {"dynamodb": {"SequenceNumber": "7", "ApproximateCreationDateTime": time.time()}}
    with FunctionRuntime(spec) as runtime:
        poller = StreamPoller(source, runtime, None, threading.Event(), stuck_after_s=60)  # type: ignore[arg-type]
        capsys.readouterr()
        poller.deliver([record])
    assert "is stuck" not in capsys.readouterr().out


def test_stats_reads_each_function_s_errors_and_throttles_and_each_consumer_s_lag(cloudwatch: Any) -> None:
    sink = MetricsSink(cloudwatch)
    sink.invoked("WorkerFunction", ok=False, duration_ms=10)
    sink.invoked("WorkerFunction", ok=False, duration_ms=10)
    sink.invoked("BatchFunction", ok=True, duration_ms=10)
    sink.iterator_age("BatchFunction", 4_000)
    sink.iterator_age("BatchFunction", 12_500)
    sink.flush()
    deployment = Deployment("t", "k", {}, {}, functions={f: f for f in ("WorkerFunction", "BatchFunction")})
    assert function_health(cloudwatch, deployment, now=time.time()) == {
        "WorkerFunction": {"errors": 2, "throttles": 0},
        "BatchFunction": {"errors": 0, "throttles": 0, "lag_s": 12.5},
    }


def test_each_sandbox_writes_its_own_log_stream_with_lambda_s_lines_around_each_invocation(
    logs: Any, tmp_path: Path
) -> None:
    spec = toy_function(
        tmp_path,
        """
        import os
        def handler(event, context):
            print(f"handling {event['n']} in {os.getpid()} to {context.log_stream_name}")
            return event["n"]
        """,
    )
    sink = LogsSink(logs)
    with FunctionRuntime(spec, logs=sink) as runtime:
        first = runtime.invoke({"n": 1}, request_id="r1")
        second = runtime.invoke({"n": 2}, request_id="r2")  # the warm sandbox again
    assert (first.payload, second.payload) == (1, 2)
    sink.flush()
    [stream] = logs.describe_log_streams(logGroupName="/aws/lambda/F")["logStreams"]
    assert re.fullmatch(r"\d{4}/\d{2}/\d{2}/\[\$LATEST\][0-9a-f]{32}", stream["logStreamName"])
    events = logs.get_log_events(logGroupName="/aws/lambda/F", logStreamName=stream["logStreamName"])[
        "events"
    ]
    lines = [event["message"] for event in events]
    # Each invocation's START, then its END and REPORT, and the handler's line after its START (its
    # output is read from the process as it comes: it may land after END, as a late line would)
    reports = [line for line in lines if line.startswith("REPORT RequestId: ")]
    assert [line.split("\t")[:2] for line in reports] == [
        ["REPORT RequestId: r1", "Function: F"],
        ["REPORT RequestId: r2", "Function: F"],
    ]
    for request_id, n in (("r1", 1), ("r2", 2)):
        start = lines.index(f"START RequestId: {request_id} Version: $LATEST")
        end = lines.index(f"END RequestId: {request_id}")
        report = next(
            i for i, line in enumerate(lines) if line.startswith(f"REPORT RequestId: {request_id}\t")
        )
        handled = next(i for i, line in enumerate(lines) if line.startswith(f"handling {n} in "))
        assert start < end < report
        assert start < handled
        # The sandbox's context names the stream its lines go to, as Lambda's does
        assert lines[handled].endswith(f" to {stream['logStreamName']}")
    # Lines sent later go to the same stream, which is not made again
    sink.line("/aws/lambda/F", stream["logStreamName"], "later")
    sink.flush()
    events = logs.get_log_events(logGroupName="/aws/lambda/F", logStreamName=stream["logStreamName"])[
        "events"
    ]
    assert events[-1]["message"] == "later"


def test_the_groups_made_at_start_are_there_before_any_line_and_take_their_lines(logs: Any) -> None:
    # One of them there already, as on an endpoint the stack did not start
    logs.create_log_group(logGroupName="/aws/lambda/Made")
    sink = LogsSink(logs)
    sink.create_groups(["/aws/lambda/Made", "/aws/lambda/New"])
    made = logs.describe_log_groups(logGroupNamePrefix="/aws/lambda/")["logGroups"]
    assert {g["logGroupName"] for g in made} == {"/aws/lambda/Made", "/aws/lambda/New"}
    assert logs.describe_log_streams(logGroupName="/aws/lambda/New")["logStreams"] == []
    sink.line("/aws/lambda/New", "s", "first")
    sink.flush()
    [event] = logs.get_log_events(logGroupName="/aws/lambda/New", logStreamName="s")["events"]
    assert event["message"] == "first"
