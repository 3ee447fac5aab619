"""Fixtures shared by every suite. Unit tests use moto in-process; nothing leaves 127.0.0.1."""

from __future__ import annotations

import copy
import functools
import os
import pickle
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.session
import pytest
from moto import mock_aws

from llmtasks.settings import (
    ApiResources,
    AuthorizerResources,
    BatchResources,
    Settings,
    WebhookResources,
    WorkerResources,
)
from llmtasks_local import moto_backends, moto_patches
from llmtasks_local.mock_llm import MockConfig, MockLLM, MockStats
from llmtasks_local.sam.function_spec import FunctionSpec
from llmtasks_local.sam.provision import LocalResources, provision
from llmtasks_local.sam.template import Template
from tests.helpers import TEMPLATE, HandlerContext, WebhookReceiver, load_handler, serve

# A test run started in the background by a shell script (make test's side-by-side steps, `nohup
# ... &`) inherits SIGINT ignored, and so does every process it starts: a test's Ctrl-C (SIGINT)
# then left a plain Python server running (the docs' webhook receiver outlived its test's two
# Ctrl-Cs, and the test waited 35 s for it). Python's own handler here is reset to the default at
# each exec, as in a run started from a terminal.
signal.signal(signal.SIGINT, signal.default_int_handler)
# The in-process moto behaves as the local stack's moto server does (and as AWS, where it matters).
moto_patches.install()
# mock_aws gives each test a fresh boto3 session, whose loader read botocore's JSON models again
# (endpoints.json alone: 0.2 s of CPU), a third of a unit test's setup: one loader serves every
# session of the run, as one loader serves every client of a Lambda sandbox's session.
botocore.session.create_loader = functools.cache(botocore.session.create_loader)


@pytest.fixture(scope="session", autouse=True)
def _temp_files_under_pytest_s_base_temp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """What a test process makes with tempfile (each stack's log from the launcher, a docs
    walk's state dir...) goes under pytest's base temp, which pytest removes three runs later,
    instead of staying in /tmp: each make test left 22 MB of stack logs there (372 MB in a day)."""
    previous = tempfile.tempdir
    tempfile.tempdir = str(tmp_path_factory.mktemp("tempfile"))
    yield
    tempfile.tempdir = previous


@dataclass
class Aws:
    dynamodb: Any
    sqs: Any
    streams: Any
    resources: LocalResources
    template: Template

    def queue_url(self, logical_id: str) -> str:
        return self.resources.queue_urls[logical_id]

    def messages(self, logical_id: str, *, wait_s: int = 0) -> list[dict[str, Any]]:
        """Every visible message of a queue (received, so now in flight)."""
        found: list[dict[str, Any]] = []
        while True:
            reply = self.sqs.receive_message(
                QueueUrl=self.queue_url(logical_id),
                MaxNumberOfMessages=10,
                WaitTimeSeconds=wait_s,
                MessageSystemAttributeNames=["All"],
            )
            batch = reply.get("Messages", [])
            if not batch:
                return found
            found += batch

    def function(self, logical_id: str) -> FunctionSpec:
        return self._functions[logical_id]

    @functools.cached_property
    def _functions(self) -> dict[str, FunctionSpec]:
        # Resolved once a test: the unit API tests look up the routes at each call (7 ms of CPU).
        return self.template.functions(self.resources.refs, self.resources.attributes)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Aws]:
    """moto in-process with every table and queue of template.yaml."""
    for name in list(os.environ):
        if name.startswith("AWS_ENDPOINT_URL") or name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # moto's in-process DynamoDB Streams need this (measured; its server mode does not).
    monkeypatch.setenv("AWS_ACCOUNT_ID_ENDPOINT_MODE", "disabled")
    with mock_aws():
        dynamodb, sqs = boto3.client("dynamodb"), boto3.client("sqs")
        resources = _provisioned()
        yield Aws(dynamodb, sqs, boto3.client("dynamodbstreams"), resources, _template())


@functools.cache
def _template() -> Template:
    return Template.load(TEMPLATE)


@functools.cache
def _provisioned_state() -> tuple[bytes, LocalResources]:
    """template.yaml's tables, buckets and queues provisioned in moto once a test process, and
    its backends pickled: through boto3 they took 53 ms of CPU, 60% of a unit test's setup
    (about 640 tests take this fixture); loading the pickle takes ms."""
    resources = provision(
        _template(), dynamodb=boto3.client("dynamodb"), sqs=boto3.client("sqs"), s3=boto3.client("s3")
    )
    return pickle.dumps(moto_backends.state()), resources


def _provisioned() -> LocalResources:
    """In this test's fresh moto: every resource of template.yaml, as provision() made them."""
    state, resources = _provisioned_state()
    moto_backends.install(pickle.loads(state))
    return copy.deepcopy(resources)


@pytest.fixture(scope="session")
def mock_llm_server() -> Iterator[tuple[MockLLM, str]]:
    mock = MockLLM()
    with serve(mock.app()) as url:
        yield mock, url


@dataclass
class RunningMock:
    server: MockLLM
    url: str  # the OpenAI-style base URL, .../v1

    def configure(self, **knobs: Any) -> None:
        self.server.configure(MockConfig(**knobs), reseed="seed" in knobs)

    @property
    def stats(self) -> MockStats:
        return self.server.stats


@pytest.fixture
def mock_llm(mock_llm_server: tuple[MockLLM, str]) -> RunningMock:
    """The mock LLM over real HTTP on 127.0.0.1, with default knobs and zeroed counters."""
    server, url = mock_llm_server
    server.config = MockConfig()
    server.reset_stats()
    return RunningMock(server, url + "/v1")


@pytest.fixture
def receiver() -> Iterator[tuple[WebhookReceiver, str]]:
    hook = WebhookReceiver()
    with serve(hook.app()) as url:
        yield hook, url + "/hook"


class StackSettings(
    Settings, ApiResources, WorkerResources, BatchResources, WebhookResources, AuthorizerResources
):
    """The settings and every function's resources in one: what the tests build services from."""


@pytest.fixture
def settings(aws: Aws, mock_llm: RunningMock) -> StackSettings:
    return StackSettings(
        tasks_table_name=aws.resources.table_names["TasksTable"],
        task_queue_url=aws.queue_url("TaskQueue"),
        high_task_queue_url=aws.queue_url("HighTaskQueue"),
        batch_task_queue_url=aws.queue_url("BatchTaskQueue"),
        batch_fanout_queue_url=aws.queue_url("BatchFanoutQueue"),
        webhook_queue_url=aws.queue_url("WebhookQueue"),
        webhook_dlq_url=aws.queue_url("WebhookDLQ"),
        idempotency_table_name=aws.resources.table_names["IdempotencyTable"],
        limits_table_name=aws.resources.table_names["LimitsTable"],
        api_keys_table_name=aws.resources.table_names["ApiKeysTable"],
        webhook_resolve_names=False,
        results_bucket=aws.resources.bucket_names["ResultsBucket"],
        llm_base_url=mock_llm.url,
        llm_model="mock-model",
        webhook_allowed_hosts=frozenset({"127.0.0.1"}),
        webhook_timeout_s=2,
    )


def lambda_context(spec: FunctionSpec, timeout_s: float | None = None) -> HandlerContext:
    return HandlerContext(spec, timeout_s)


@pytest.fixture
def handler(aws: Aws) -> Any:
    """handler("WorkerFunction") -> (the handler function as the template names it, a context)."""

    def load(logical_id: str) -> tuple[Any, HandlerContext]:
        spec = aws.function(logical_id)
        # Imported as Lambda imports it: in the function's own environment (its cold start
        # checks its resources there).
        with pytest.MonkeyPatch.context() as environment:
            for name, value in spec.environment.items():
                environment.setenv(name, value)
            return load_handler(spec), lambda_context(spec)

    return load


# The slowest files first, every file of ten seconds or more: longest first. The test command
# runs a file a process (pytest-xdist --dist loadfile --no-loadscope-reorder) in collection
# order, each process taking the next file as it frees, so the long ones start at once on
# different processes instead of meeting on one at the end, and the files left for the end are
# the short ones: the processes end together. (xdist's default order is by the number of tests a
# file has: the README's one test of 80 s, and the contract's two of 96 s, ran last, each with
# the other process idle; and with only the e2e files ordered, the unit files of 25-34 s that
# wait on call slots and timeouts came last and left the cores 36-42% busy for the last 35 s.)
# The crash suite goes last (LAST): started beside the fault suite it overloaded two cores until
# the fault suite's compressed 20 s timeouts cut calls short (seen in CI); by the end the fault
# suite has long finished.
SLOWEST_FIRST = (
    # The load suites first (a phase of their own, each alone), then the others by their time in
    # the tests phase (four processes, 2026-12-06), in seconds.
    "tests/e2e/test_faults.py",
    "tests/e2e/test_batches.py",  # 185
    "tests/e2e/test_contract.py",  # 140
    "tests/e2e/test_local_stack.py",  # 134
    "tests/e2e/test_readme.py",  # 118
    "tests/e2e/test_console.py",  # 59
    "tests/integration/test_aws_conformance.py",  # 57
    "tests/e2e/test_state.py",  # 55
    "tests/e2e/test_auth.py",  # 50
    "tests/e2e/test_openai.py",  # 48
    "tests/e2e/test_iam.py",  # 45
    "tests/e2e/test_client.py",  # 42
    "tests/e2e/test_webhooks.py",  # 39
    "tests/e2e/test_logs.py",  # 39
    "tests/integration/test_invoke.py",  # 38
    "tests/unit/test_call_slots.py",  # 34
    "tests/unit/test_cli_errors.py",  # 33
    "tests/unit/test_worker.py",  # 32
    "tests/unit/test_fast_paths.py",  # 29
    "tests/unit/test_webhooks.py",  # 25
    "tests/unit/test_output.py",  # 25
    "tests/integration/test_durable_state.py",  # 24
    "tests/integration/test_split_endpoints.py",  # 21
    "tests/local/test_views_read_bounded.py",  # 48 alone beside a full suite's run; not yet timed here
    "tests/e2e/test_lifecycle.py",  # 21
    "tests/e2e/test_providers.py",  # 21
    "tests/e2e/test_api_rules.py",  # 16
    "tests/unit/test_batches.py",  # 16
    "tests/e2e/test_baseline.py",  # 14
    "tests/unit/test_api.py",  # 12
)


LAST = ("tests/e2e/test_crash.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: place for place, path in enumerate(SLOWEST_FIRST)}
    rank |= {path: len(SLOWEST_FIRST) + 1 + place for place, path in enumerate(LAST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(SLOWEST_FIRST)))
