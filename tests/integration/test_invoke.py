"""`llmtasks invoke`, the Docker-free `sam local invoke`: every sample event in events/ is invoked
against an AWS endpoint over HTTP (the moto server the local stack embeds), and each reply is what
that event should get. The samples name one task and one batch, so they are run in an order that
makes each meaningful: the task is written first, then the worker runs it, the webhook function
relays and delivers its ending, and so on.

One event of each function goes through the command in a process of its own, as a user runs it
(its arguments, its env-vars file, stdout and stderr as SAM's); the others through the function
behind it (emulator/invoke.py: the same template, overrides, env-vars, provisioning and sandbox),
in this process, whose sandboxes are forked from a server that has imported their libraries. The
command adds nothing an event could change, and a process of its own costs about 0.55 s of CPU
an event: 26 of them were make test-fast's longest tests (36 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from llmtasks.aws.store import TaskStore
from llmtasks.domain.llm_request import LLMRequest
from llmtasks_client import verify_webhook
from llmtasks_local.cli.options import parse_overrides
from llmtasks_local.emulator.endpoints import resolved
from llmtasks_local.emulator.invoke import (
    InvokeResult,
    function_environment,
    ignored_variables,
    invoke,
    read_env_vars,
)
from llmtasks_local.emulator.runtime import Invocation
from llmtasks_local.mock_llm import reply_text
from llmtasks_local.sam.provision import local_name
from llmtasks_local.sam.template import Template
from tests.conftest import RunningMock
from tests.helpers import (
    EVENTS,
    HANG_S,
    ROOT,
    TEMPLATE,
    WebhookReceiver,
    endpoint_or_moto,
    eventually,
    local_client,
    pending_task,
    process_exists,
    serve,
)

pytestmark = pytest.mark.integration

TASK_ID = "0f8fad5bd9cb469fa16570867728950e"  # the task the samples name
BATCH_ID = "6345e22008ea521e88cfe5f8e5304a30"  # the batch submit_batch.json's Idempotency-Key makes


# The events each walk sends through the command itself: one of each function.
THROUGH_THE_COMMAND = {
    "health.json",
    "worker_sqs.json",
    "webhook_delivery.json",
    "submit_task.json",
    "batch_fanout.json",
    "authorizer_request.json",
}


def command_environment() -> dict[str, str]:
    """No real account's credentials; a per-service endpoint (a LocalStack's SQS) stays."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("AWS_") or k.startswith("AWS_ENDPOINT_URL_")
    }
    return env | {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


class Invoker:
    """Runs sample events: those in THROUGH_THE_COMMAND through `llmtasks invoke` in a child
    process, the others through the function behind it; remembers which it ran."""

    def __init__(self, endpoint_url: str, env_vars: Path, overrides: str) -> None:
        self.endpoint_url = endpoint_url
        self.env_vars = env_vars
        self.overrides = overrides
        self.invoked: set[str] = set()

    def run(self, function_id: str, event_file: str, *extra: str) -> subprocess.CompletedProcess[str]:
        self.invoked.add(event_file)
        command = [
            sys.executable,
            "-m",
            "llmtasks_local.cli",
            "invoke",
            function_id,
            "-e",
            str(EVENTS / event_file),
        ]
        command += ["--endpoint-url", self.endpoint_url, "--env-vars", str(self.env_vars)]
        command += ["--parameter-overrides", self.overrides, *extra]
        return subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=command_environment(),
            check=False,
        )

    def __call__(self, function_id: str, event_file: str) -> Any:
        if event_file not in THROUGH_THE_COMMAND:
            return self.run_here(function_id, event_file)
        done = self.run(function_id, event_file)
        assert done.returncode == 0, done.stderr
        # As sam local invoke: the return value alone on stdout, Lambda's lines on stderr.
        assert "START RequestId: " in done.stderr
        assert "REPORT RequestId: " in done.stderr
        return json.loads(done.stdout)

    def run_here(self, function_id: str, event_file: str) -> Any:
        """What the command does with these arguments (cli/local.py's invoke), in this process."""
        self.invoked.add(event_file)
        with mock.patch.dict(os.environ, command_environment(), clear=True):
            done = invoke(
                TEMPLATE,
                function_id,
                json.loads((EVENTS / event_file).read_text()),
                env_vars=read_env_vars(self.env_vars),
                parameter_overrides=parse_overrides((self.overrides,)),
                endpoint_url=resolved(self.endpoint_url, "dynamodb"),
            )
        assert done.invocation.ok, done.reply()
        return done.reply()


def body_of(reply: dict[str, Any]) -> Any:
    return json.loads(reply["body"])


@pytest.fixture
def hook() -> Iterator[tuple[WebhookReceiver, str]]:
    receiver = WebhookReceiver()
    with serve(receiver.app()) as url:
        yield receiver, url + "/hook"


@pytest.fixture
def own_endpoint() -> Iterator[str]:
    """An endpoint of the test's own (a moto server, unless AWS_ENDPOINT_URL names one): the
    samples name one task and one batch, and `llmtasks invoke` writes to the template's own
    tables, so two walks in one process would see each other's tasks."""
    with endpoint_or_moto("AWS_ENDPOINT_URL") as url:
        yield url


# The samples each walk runs; between them, every one in events/. Two walks, not one, so that
# test processes can run them side by side: one walk of all 26, each through the command, was
# the longest test of make test-fast (48 s).
TASK_WALK = {
    "health.json",
    "get_task.json",
    "worker_sqs.json",
    "list_tasks.json",
    "cancel_task.json",
    "webhook_stream.json",
    "get_webhook_secret.json",
    "webhook_delivery.json",
    "task_webhook_attempts.json",
    "replay_task_webhook.json",
    "enable_webhook_endpoint.json",
    "rotate_webhook_secret.json",
    "submit_task.json",
}
BATCH_AND_ROUTES_WALK = {
    "submit_batch.json",
    "batch_fanout.json",
    "batch_stream.json",
    "get_batch.json",
    "batch_results.json",
    "cancel_batch.json",
    "batch_webhook_attempts.json",
    "replay_batch_webhook.json",
    "authorizer_request.json",
    "openapi.json",
    "docs.json",
    "unknown_route.json",
    "foreign_stream.json",
}


def test_the_two_walks_run_every_sample_event() -> None:
    assert {path.name for path in EVENTS.glob("*.json")} == TASK_WALK | BATCH_AND_ROUTES_WALK


@pytest.mark.sample_walk
def test_the_sample_task_s_events_run_through_llmtasks_invoke(
    own_endpoint: str, mock_llm: RunningMock, hook: tuple[WebhookReceiver, str], tmp_path: Path
) -> None:
    endpoint_url = own_endpoint
    receiver, hook_url = hook
    env_vars = tmp_path / "env.json"
    # SAM's env-vars format: "Parameters" for every function, then a function's own section.
    env_vars.write_text(json.dumps({"Parameters": {"LLM_BASE_URL": mock_llm.url}, "WorkerFunction": {}}))
    invoke = Invoker(endpoint_url, env_vars, "WebhookAllowedHosts=127.0.0.1")
    # The sample task, as submit stores it, with its webhook on this machine
    assert invoke("StatusFunction", "health.json")["statusCode"] == 200  # provisions the tables
    dynamodb = local_client("dynamodb", os.environ.get("AWS_ENDPOINT_URL_DYNAMODB", endpoint_url))
    store = TaskStore(local_name("TasksTable"), dynamodb)
    prompt = "Write a haiku about queues."
    task = pending_task(TASK_ID, tenant="dev", now=time.time(), ttl_s=3600, request=LLMRequest(prompt=prompt))
    assert store.create(task.model_copy(update={"webhook_url": hook_url}))

    reply = invoke("StatusFunction", "get_task.json")
    assert (reply["statusCode"], body_of(reply)["status"]) == (200, "pending")
    assert invoke("WorkerFunction", "worker_sqs.json") == {"batchItemFailures": []}
    reply = invoke("StatusFunction", "get_task.json")
    assert (body_of(reply)["status"], body_of(reply)["result"]) == ("completed", reply_text(prompt))
    assert mock_llm.stats.calls == 1  # the LLM_BASE_URL of the env-vars file
    reply = invoke("StatusFunction", "list_tasks.json")
    assert [t["task_id"] for t in body_of(reply)["data"]] == [TASK_ID]
    reply = invoke("SubmitFunction", "cancel_task.json")
    assert (reply["statusCode"], reply["headers"]["Content-Type"]) == (409, "application/problem+json")

    # The webhook function relays the ending from the stream, then delivers it, signed
    assert invoke("WebhookFunction", "webhook_stream.json") == {"batchItemFailures": []}
    secret = body_of(invoke("StatusFunction", "get_webhook_secret.json"))["key"]
    assert invoke("WebhookFunction", "webhook_delivery.json") == {"batchItemFailures": []}
    [delivery] = receiver.deliveries
    event = verify_webhook(delivery.body, delivery.headers, secret)
    assert (event.type, event.data.task_id, event.data.result) == (
        "task.completed",
        TASK_ID,
        reply_text(prompt),
    )
    # Its delivery log holds that one attempt; a replay is queued; its URL enabled (it never failed)
    [attempt] = body_of(invoke("StatusFunction", "task_webhook_attempts.json"))["data"]
    assert (attempt["trigger"], attempt["status_code"], attempt["outcome"]) == ("scheduled", 200, "delivered")
    reply = invoke("SubmitFunction", "replay_task_webhook.json")
    assert (reply["statusCode"], body_of(reply)["webhook_id"]) == (202, delivery.headers["webhook-id"])
    reply = invoke("SubmitFunction", "enable_webhook_endpoint.json")
    assert (reply["statusCode"], body_of(reply)["status"]) == (200, "enabled")
    reply = invoke("SubmitFunction", "rotate_webhook_secret.json")
    assert reply["statusCode"] == 200
    assert body_of(reply)["key"] != secret
    assert body_of(reply)["previous_key_expires_at"]  # the old key stays valid for a while

    reply = invoke("SubmitFunction", "submit_task.json")
    assert (reply["statusCode"], body_of(reply)["status"]) == (202, "pending")
    assert invoke.invoked == TASK_WALK


@pytest.mark.sample_walk
def test_the_sample_batch_s_and_the_open_routes_events_run_through_llmtasks_invoke(
    own_endpoint: str, tmp_path: Path
) -> None:
    env_vars = tmp_path / "env.json"
    env_vars.write_text(json.dumps({"Parameters": {}}))
    invoke = Invoker(own_endpoint, env_vars, "WebhookAllowedHosts=127.0.0.1")
    # The sample batch: submitted, its first chunk fanned out, counted, read, cancelled
    reply = invoke("SubmitFunction", "submit_batch.json")
    assert (reply["statusCode"], body_of(reply)["batch_id"]) == (202, BATCH_ID)
    assert invoke("BatchFunction", "batch_fanout.json") == {"batchItemFailures": []}
    assert (
        invoke("BatchFunction", "batch_stream.json") is None
    )  # counted in one transaction, or retried whole
    batch = body_of(invoke("StatusFunction", "get_batch.json"))
    assert (batch["total"], batch["pending"], batch["processing"]) == (2, 1, 1)
    rows = invoke("StatusFunction", "batch_results.json")["body"].splitlines()
    assert [json.loads(row)["custom_id"] for row in rows] == ["doc-0", "doc-1"]
    reply = invoke("SubmitFunction", "cancel_batch.json")
    assert (reply["statusCode"], body_of(reply)["status"]) == (200, "cancelling")
    # It has no webhook: no attempt to list, no event to replay
    reply = invoke("StatusFunction", "batch_webhook_attempts.json")
    assert (reply["statusCode"], body_of(reply)["data"]) == (200, [])
    reply = invoke("SubmitFunction", "replay_batch_webhook.json")
    assert (reply["statusCode"], body_of(reply)["detail"]) == (
        409,
        f"Batch '{BATCH_ID}' has no webhook_url: there is no event to replay.",
    )

    # The authorizer denies the sample's placeholder key (API Gateway answers 403); the open
    # routes answer without a key
    assert invoke("AuthorizerFunction", "authorizer_request.json") == {"isAuthorized": False}
    assert invoke("StatusFunction", "openapi.json")["statusCode"] == 200
    assert invoke("StatusFunction", "docs.json")["statusCode"] == 200
    assert invoke("StatusFunction", "unknown_route.json")["statusCode"] == 404

    # SAM CLI's generic stream sample (`sam local generate-event dynamodb update`: another
    # table's records): both stream consumers pass it over rather than fail and hold a shard
    assert invoke("WebhookFunction", "foreign_stream.json") == {"batchItemFailures": []}
    assert invoke("BatchFunction", "foreign_stream.json") is None
    assert invoke.invoked == BATCH_AND_ROUTES_WALK


def test_a_function_error_prints_lambda_s_error_object_and_exits_1(endpoint_url: str, tmp_path: Path) -> None:
    env_vars = tmp_path / "env.json"
    env_vars.write_text("{}")
    not_an_sqs_event = tmp_path / "bad.json"
    not_an_sqs_event.write_text("[1, 2, 3]")
    done = Invoker(endpoint_url, env_vars, "WebhookAllowedHosts=127.0.0.1").run(
        "WorkerFunction", str(not_an_sqs_event)
    )
    assert done.returncode == 1, done.stderr
    error = json.loads(done.stdout)
    assert set(error) == {"errorMessage", "errorType"}
    assert "END RequestId: " in done.stderr


def test_the_env_vars_file_overrides_as_sam_s_does(remote: dict[str, Any]) -> None:
    """ "Parameters" for all functions, then the function's own section; a variable the template
    does not declare for the function is ignored (and named)."""
    resources = remote["resources"]
    spec = Template.load(TEMPLATE).functions(resources.refs, resources.attributes)["WorkerFunction"]
    given = {
        "Parameters": {"LLM_BASE_URL": "http://127.0.0.1:1/v1", "NOT_DECLARED": "x"},
        "WorkerFunction": {"LLM_BASE_URL": "http://127.0.0.1:2/v1"},
        "StatusFunction": {"LLM_MODEL": "elsewhere"},
    }
    variables = function_environment(spec, given)
    assert variables["LLM_BASE_URL"] == "http://127.0.0.1:2/v1"
    assert variables["LLM_MODEL"] == spec.environment["LLM_MODEL"]
    assert "NOT_DECLARED" not in variables
    assert ignored_variables(spec, given) == ["NOT_DECLARED"]


def test_the_reply_is_the_return_value_or_lambda_s_error_object() -> None:
    assert InvokeResult(Invocation(payload={"a": 1}), "r").reply() == {"a": 1}
    failed = InvokeResult(Invocation(error="KeyError: 'x'"), "r").reply()
    assert failed == {"errorMessage": "'x'", "errorType": "KeyError"}
    timed_out = InvokeResult(Invocation(timed_out=True), "r").reply()
    assert timed_out == {"errorMessage": "r Task timed out", "errorType": "TimeoutError"}


TOY_TEMPLATE = """
AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Resources:
  ToyFunction:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: code/
      Handler: app.handler
      Runtime: python3.12
      Timeout: 1
      MemorySize: 128
      Environment:
        Variables:
          TOY_TABLE: !Ref ToyTable
  ToyTable:
    Type: AWS::DynamoDB::Table
    Properties:
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions: [{AttributeName: pk, AttributeType: S}]
      KeySchema: [{AttributeName: pk, KeyType: HASH}]
"""

TOY_HANDLER = """
import os, time
import boto3

# At init, as Lambda's own advice has it: a client's creation (its service model read) is a few
# hundred ms of CPU, which on a loaded machine took the handler past its 1 s Timeout.
dynamodb = boto3.client("dynamodb")

def handler(event, context):
    here = os.path.dirname(__file__)
    if event.get("sleep"):
        open(os.path.join(here, "pid"), "w").write(str(os.getpid()))
        time.sleep(event["sleep"])  # the handler's work, past its 1 s Timeout
        open(os.path.join(here, "late"), "w").write("after the deadline")
    if event.get("grow"):
        kept = [bytearray(2**20) for _ in range(event["grow"])]  # past its 128 MB
        time.sleep(2)
    table = dynamodb.describe_table(TableName=os.environ["TOY_TABLE"])["Table"]
    return {"table": table["TableStatus"], "pid": os.getpid(), "memory": context.memory_limit_in_mb}
"""


@pytest.fixture
def toy_template(tmp_path: Path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "app.py").write_text(TOY_HANDLER)
    (tmp_path / "template.yaml").write_text(TOY_TEMPLATE)
    return tmp_path / "template.yaml"


def test_invoke_runs_the_handler_in_a_sandbox_process_against_its_own_moto(toy_template: Path) -> None:
    """Without an endpoint, the function's resources live on a moto of the command's own, which
    the sandbox (another process) reaches over HTTP."""
    done = invoke(toy_template, "ToyFunction", {})
    reply = done.reply()
    assert reply["table"] == "ACTIVE"
    assert reply["memory"] == "128"  # Lambda gives the context's memory as the variable's text
    assert reply["pid"] != os.getpid()


def test_invoke_stops_a_handler_at_its_timeout_and_its_late_write_never_lands(toy_template: Path) -> None:
    done = invoke(toy_template, "ToyFunction", {"sleep": 1.5})
    assert done.reply() == {"errorMessage": f"{done.request_id} Task timed out", "errorType": "TimeoutError"}
    # The sandbox was killed at the deadline, not left to finish: its process is gone, so
    # nothing of it can write the file.
    pid = int((toy_template.parent / "code" / "pid").read_text())
    eventually(lambda: not process_exists(pid), bool, timeout_s=HANG_S, what="the sandbox's process gone")
    assert not (toy_template.parent / "code" / "late").exists()


def test_invoke_stops_a_handler_past_its_memory_size(toy_template: Path) -> None:
    done = invoke(toy_template, "ToyFunction", {"grow": 300})
    assert done.reply() == {
        "errorMessage": "Runtime exited with error: signal: killed",
        "errorType": "Runtime.OutOfMemory",
    }
