"""The Tracer: X-Ray's recorder where Lambda traces, and none where tracing is off (the local
stack, tests): building it cost each cold start 0.2 s of CPU for nothing there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.unit

PROBE = """
import sys
from llmtasks.observability import tracer

@tracer.capture_lambda_handler
def handler(event, context):
    return tracer_method(event)

@tracer.capture_method
def tracer_method(event):
    tracer.put_annotation("task_id", "t1")
    if event == "fail":
        raise ValueError("the handler's own error")
    return event

print(type(tracer.provider).__name__, tracer.disabled, "aws_xray_sdk.core" in sys.modules)
print(handler("ok", None))
try:
    handler("fail", None)
except ValueError as error:
    print(error)
"""


def probe(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("POWERTOOLS_", "AWS_", "LAMBDA_"))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=clean | {"AWS_DEFAULT_REGION": "us-east-1"} | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    "env",
    [{"POWERTOOLS_TRACE_DISABLED": "true", "LAMBDA_TASK_ROOT": "/var/task"}, {}, {"AWS_SAM_LOCAL": "true"}],
    ids=["disabled", "outside-lambda", "sam-local"],
)
def test_where_tracing_is_off_no_recorder_is_built_and_handlers_run_as_they_would(
    env: dict[str, str],
) -> None:
    assert probe(**env) == ["UntracedProvider True False", "ok", "the handler's own error"]


def test_in_lambda_the_tracer_records_to_x_ray() -> None:
    assert probe(LAMBDA_TASK_ROOT="/var/task")[0] == "AsyncAWSXRayRecorder False True"
