"""`llmtasks up`: the whole application on one machine, from template.yaml.

moto (or any endpoint such as LocalStack) holds the tables and queues; the template's HttpApi
routes are served on 127.0.0.1; its SQS and DynamoDB stream event sources are polled into the
same handler code that runs in Lambda; the mock LLM answers unless LLM_BASE_URL is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import uvicorn

from llmtasks.apikeys import ApiKeys
from llmtasks.local.gateway import HttpGateway
from llmtasks.local.processes import spawn_moto_server, spawn_python, stop
from llmtasks.local.provision import LocalResources, provision
from llmtasks.local.runtime import FunctionRuntime
from llmtasks.local.sources import SqsPoller, StreamPoller
from llmtasks.local.template import PSEUDO_PARAMETERS, FunctionSpec, StreamSource, Template, TemplateError

HTTP_CONCURRENCY = 16  # sandboxes per HTTP function: enough for long-polls beside submits


@dataclass
class StackOptions:
    template: Path = Path("template.yaml")
    host: str = "127.0.0.1"
    port: int = 3000
    endpoint_url: str | None = None  # None: start the embedded moto server
    moto_port: int = 4566
    llm_base_url: str | None = None  # None: start the mock LLM
    mock_port: int = 8800
    mock_latency_s: float = 0.0
    parameter_overrides: dict[str, str] = field(default_factory=dict)
    quiet_children: bool = True
    auth: bool = True  # False: `--no-auth`, every request is the default tenant
    report_invocations: bool = False  # `--report`: Lambda's REPORT line after each invocation


def merged_environment(functions: Mapping[str, FunctionSpec]) -> dict[str, str]:
    """All functions share this process, so they must agree on every variable they set."""
    merged: dict[str, str] = {}
    owner: dict[str, str] = {}
    for spec in functions.values():
        for name, value in spec.environment.items():
            if name in merged and merged[name] != value:
                raise TemplateError(
                    f"{spec.logical_id} and {owner[name]} set {name} differently; the local stack runs"
                    " every function in one process and needs one value"
                )
            merged[name], owner[name] = value, spec.logical_id
    return merged


class LocalStack:
    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self._children: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._server: uvicorn.Server | None = None
        self._threads: list[threading.Thread] = []
        self.resources: LocalResources | None = None
        self.functions: dict[str, FunctionSpec] = {}
        self.runtimes: dict[str, FunctionRuntime] = {}
        self.endpoint_url = options.endpoint_url
        self.llm_base_url = options.llm_base_url
        self.dev_key: str | None = None

    @property
    def api_url(self) -> str:
        return f"http://{self.options.host}:{self.options.port}"

    def _start_endpoint(self) -> None:
        if self.endpoint_url is None:
            port = self.options.moto_port
            self._children.append(spawn_moto_server(port, quiet=self.options.quiet_children))
            self.endpoint_url = f"http://127.0.0.1:{port}"
            # Never let the embedded stack pick up a real account's credentials.
            os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")  # noqa: S106 - moto's
            os.environ.pop("AWS_SESSION_TOKEN", None)
            os.environ.pop("AWS_PROFILE", None)
        os.environ["AWS_ENDPOINT_URL"] = self.endpoint_url
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        os.environ["AWS_DEFAULT_REGION"] = PSEUDO_PARAMETERS["AWS::Region"]

    def _start_llm(self) -> None:
        if self.llm_base_url is None:
            port = self.options.mock_port
            child = spawn_python(
                "-m",
                "llmtasks.cli",
                "mock-llm",
                "--port",
                str(port),
                "--latency",
                str(self.options.mock_latency_s),
                ready_port=port,
                quiet=self.options.quiet_children,
            )
            self._children.append(child)
            self.llm_base_url = f"http://127.0.0.1:{port}/v1"

    def start(self) -> LocalStack:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self._start_endpoint()
        self._start_llm()
        assert self.llm_base_url is not None
        overrides = {
            "LlmBaseUrl": self.llm_base_url,
            # The local receivers live on this machine; the SSRF guard lets them through here only.
            "WebhookAllowedHosts": "127.0.0.1,localhost",
            **self.options.parameter_overrides,
        }
        template = Template.load(self.options.template, overrides)
        self.resources = resources = provision(
            template, dynamodb=boto3.client("dynamodb"), sqs=boto3.client("sqs"), s3=boto3.client("s3")
        )
        self.functions = template.functions(resources.refs, resources.attributes)
        os.environ.update(merged_environment(self.functions))
        os.environ["AUTH_REQUIRED"] = str(self.options.auth).lower()
        # X-Ray has no daemon here; the Tracer would only warn.
        os.environ["POWERTOOLS_TRACE_DISABLED"] = "true"
        # Lambda sets it, and libraries read it to tell Lambda apart: Powertools' async batch
        # processing then keeps one event loop per sandbox across invocations, as in AWS,
        # instead of a new loop (and new HTTP clients) per invocation.
        os.environ["LAMBDA_TASK_ROOT"] = str(template.root)
        if self.options.auth:
            self.dev_key = self._create_dev_key()
        pollers: list[SqsPoller | StreamPoller] = []
        streams = boto3.client("dynamodbstreams")
        authorizers = {route.authorizer for spec in self.functions.values() for route in spec.routes}
        for spec in self.functions.values():
            serves_http = bool(spec.routes) or spec.logical_id in authorizers
            concurrency = (HTTP_CONCURRENCY if serves_http else 0) + len(spec.stream_sources)
            concurrency += sum(s.maximum_concurrency or 5 for s in spec.sqs_sources)
            runtime = self.runtimes[spec.logical_id] = FunctionRuntime(
                spec, concurrency=max(1, concurrency), report=self.options.report_invocations
            )
            for sqs_source in spec.sqs_sources:
                if sqs_source.enabled:
                    url = resources.queue_url_of_arn(sqs_source.queue_arn)
                    pollers.append(SqsPoller(sqs_source, runtime, boto3.client("sqs"), url, self._stop))
            for stream_source in spec.stream_sources:
                if stream_source.enabled:
                    pollers.append(
                        StreamPoller(
                            stream_source, runtime, streams, self._stop, self._failure_sink(stream_source)
                        )
                    )
        routes = [route for spec in self.functions.values() for route in spec.routes]
        self._serve_http(HttpGateway(routes, self.runtimes, authorize=self.options.auth))
        for poller in pollers:
            poller.start()
            self._threads.extend(poller.threads)

    def _create_dev_key(self) -> str | None:
        """A key for this run, tenant `dev`, when the template has an authorizer with a keys table."""
        table = os.environ.get("API_KEYS_TABLE_NAME")
        if not table:
            return None
        key, _ = ApiKeys(table, boto3.client("dynamodb")).create("dev", name="llmtasks up")
        return key

    def _failure_sink(self, source: StreamSource) -> Callable[[dict[str, Any]], None] | None:
        """The stream's on-failure destination (an SQS queue): a note of each skipped batch."""
        if not source.on_failure_arn or self.resources is None:
            return None
        url = self.resources.queue_url_of_arn(source.on_failure_arn)
        sqs = boto3.client("sqs")

        def send(note: dict[str, Any]) -> None:
            sqs.send_message(QueueUrl=url, MessageBody=json.dumps(note))

        return send

    def _serve_http(self, gateway: HttpGateway) -> None:
        config = uvicorn.Config(
            gateway.app(),
            host=self.options.host,
            port=self.options.port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        thread = threading.Thread(target=self._server.run, name="http-api", daemon=True)
        thread.start()
        self._threads.append(thread)
        give_up = time.monotonic() + 15
        while not self._server.started:
            if not thread.is_alive() or time.monotonic() > give_up:
                raise RuntimeError(
                    f"the HTTP API could not listen on {self.options.host}:{self.options.port}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.should_exit = True
        # Pollers first (each finishes its long-poll slice), then the endpoint they talk to.
        for thread in self._threads:
            thread.join(timeout=5)
        for child in self._children:
            stop(child)
        self._children.clear()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
