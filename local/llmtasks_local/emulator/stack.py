"""`llmtasks up`: the whole application on one machine, from template.yaml.

moto (or any endpoint such as LocalStack) holds the tables and queues; the template's HttpApi
routes are served on 127.0.0.1; its SQS and DynamoDB stream event sources are polled into the
same handler code that runs in Lambda; the mock LLM answers unless LLM_BASE_URL is set.

This module starts the parts in order and stops them in reverse; the parts live beside it: the
functions and their event sources (lambda_service.py), the state dir (stack_state.py), the keys
the stack makes (stack_keys.py), and its options (stack_options.py).
"""

from __future__ import annotations

import base64
import os
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import boto3
import uvicorn
from botocore.exceptions import BotoCoreError, ClientError
from starlette.types import ASGIApp

from llmtasks.ops.deadletters import DeadLetters
from llmtasks_local import KEEP_ALIVE_S
from llmtasks_local.emulator import stack_state
from llmtasks_local.emulator.console import CALLS, Console
from llmtasks_local.emulator.gateway import HttpGateway
from llmtasks_local.emulator.lambda_api import (
    EventInvocations,
    EventSourceMappings,
    LambdaApi,
)
from llmtasks_local.emulator.lambda_service import EventSources, LambdaFunctions, Sinks
from llmtasks_local.emulator.log_groups import LogsSink, log_group
from llmtasks_local.emulator.metrics import MetricsSink
from llmtasks_local.emulator.processes import (
    check_answers,
    check_port_free,
    listen_on,
    spawn_moto_server,
    spawn_python,
    stop,
)
from llmtasks_local.emulator.sources import (
    QueueActivity,
    SqsPoller,
    StreamActivity,
    StreamPositions,
)
from llmtasks_local.emulator.stack_keys import StackKeys
from llmtasks_local.emulator.stack_options import StackOptions
from llmtasks_local.emulator.stack_state import EVENT_SOURCE_CHANGES, STREAM_CHECKPOINTS
from llmtasks_local.emulator.ttl import TtlSweeper, TtlTable, expired_on
from llmtasks_local.sam.function_spec import PSEUDO_PARAMETERS, FunctionSpec
from llmtasks_local.sam.provision import LocalResources, local_deployment, provision, provision_alarms
from llmtasks_local.sam.template import Template

ActivityKind = TypeVar("ActivityKind", StreamActivity, QueueActivity)

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient

NO_AUTH_TENANT = "default"  # every request's tenant under `--no-auth`


class LocalStack:
    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self._children: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.resources: LocalResources | None = None
        self.functions: dict[str, FunctionSpec] = {}
        self._lambda: LambdaFunctions | None = None  # once the functions are known
        self.endpoint_url = options.endpoint_url
        self.llm_base_url = options.llm_base_url
        self.dev_key: str | None = None
        # The console's data shows every tenant: it needs this token, printed in its URL.
        self.console_token = secrets.token_urlsafe(24)
        # The mock signs its webhooks with it; the API verifies them (OpenAIWebhookSecret).
        self.provider_webhook_secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        self._lambda_listener: socket.socket | None = None
        self._servers: list[uvicorn.Server] = []
        self.hurry = threading.Event()  # a second Ctrl-C: stop without waiting for calls in flight

    @property
    def api_url(self) -> str:
        return f"http://{self.options.host}:{self.options.port}"

    @property
    def lambda_url(self) -> str:
        """The Lambda API's own URL (also reached through the embedded AWS endpoint)."""
        assert self._lambda_listener is not None, "the stack is not started"
        return f"http://{self._local_host}:{self._lambda_listener.getsockname()[1]}"

    @property
    def _local_host(self) -> str:
        """Where this machine reaches the stack's listeners."""
        return "127.0.0.1" if self.options.host in ("0.0.0.0", "::") else self.options.host  # noqa: S104

    @property
    def console_url(self) -> str:
        return f"{self.api_url}/console?token={self.console_token}"

    @property
    def _mock_url(self) -> str:
        return f"http://127.0.0.1:{self.options.mock_port}/v1"

    @property
    def _keeps_endpoint_state(self) -> bool:
        """A state dir with the embedded endpoint (an endpoint of your own keeps its own state)."""
        return self.options.state_dir is not None and self.options.endpoint_url is None

    @property
    def _endpoint_state(self) -> tuple[str, Path] | None:
        """The embedded endpoint's URL and the state dir it keeps, once it runs and if it keeps one."""
        if not self._keeps_endpoint_state or self.endpoint_url is None or self.options.state_dir is None:
            return None
        return self.endpoint_url, self.options.state_dir

    def _state(self, name: str) -> Path | None:
        return None if self.options.state_dir is None else self.options.state_dir / name

    def _preflight(self) -> None:
        """What would fail later with a traceback fails now with one line: a port in use, an
        endpoint that does not answer, a state dir that cannot be written."""
        options = self.options
        ports = [(options.host, options.port, "--port", "the HTTP API")]
        if options.endpoint_url is None:
            ports.append(("127.0.0.1", options.moto_port, "--moto-port", "the embedded moto server"))
        else:
            check_answers(options.endpoint_url)
        for name, url in os.environ.items():
            if name.startswith("AWS_ENDPOINT_URL_"):
                check_answers(url)
        if options.llm_base_url is None:
            ports.append(("127.0.0.1", options.mock_port, "--mock-port", "the mock LLM"))
        for host, port, option, what in ports:
            check_port_free(host, port, option, what)

    def _start_endpoint(self) -> None:
        if self.endpoint_url is None:
            port = self.options.moto_port
            listener = listen_on("127.0.0.1", port, "--moto-port", "the embedded moto server")
            self._children.append(
                spawn_moto_server(
                    listener,
                    quiet=self.options.quiet_children,
                    state_dir=self.options.state_dir,
                    lambda_url=self.lambda_url,
                    say=lambda note: print(note, flush=True),
                )
            )
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
            hooks = f"http://{self._local_host}:{self.options.port}/provider-webhooks/openai"
            child = spawn_python(
                *("-m", "llmtasks_local.cli", "mock-llm", "--port", str(port)),
                *("--latency", str(self.options.mock_latency_s)),
                *("--webhook-url", hooks, "--webhook-secret", self.provider_webhook_secret),
                listener=listen_on("127.0.0.1", port, "--mock-port", "the mock LLM"),
                probe_path="/_mock/stats",
                quiet=self.options.quiet_children,
            )
            self._children.append(child)
            self.llm_base_url = self._mock_url

    def start(self) -> LocalStack:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        overrides = {
            "LlmBaseUrl": self.llm_base_url or self._mock_url,
            # The local receivers live on this machine; the SSRF guard lets them through here only.
            "WebhookAllowedHosts": "127.0.0.1,localhost",
            **({"OpenAIWebhookSecret": self.provider_webhook_secret} if self.llm_base_url is None else {}),
            **self.options.parameter_overrides,
        }
        # The template first: a mistake in it is said before anything starts.
        template = Template.load(self.options.template, overrides)
        template.check()
        self._preflight()
        if self.options.state_dir is not None:
            stack_state.prepare(self.options.state_dir, reset=self.options.reset)
        # Bound before the endpoint starts, which passes Lambda's calls on to it.
        self._lambda_listener = listen_on(
            self.options.host, self.options.lambda_port or 0, "--lambda-port", "the Lambda API"
        )
        self._start_endpoint()
        self._start_llm()
        self.resources = resources = provision(
            template, dynamodb=boto3.client("dynamodb"), sqs=boto3.client("sqs"), s3=boto3.client("s3")
        )
        cloudwatch = boto3.client("cloudwatch")  # the alarms, the metrics sink and the console's health
        self._provision_alarms(template, resources, cloudwatch)
        # Each function's sandboxes get its own Environment (local/sandbox.py), on top of this
        # process's: the endpoint and credentials set above, and what the stack was started with.
        self.functions = template.functions(resources.refs, resources.attributes)
        keys = StackKeys(
            self.functions,
            auth=self.options.auth,
            state_dir=self.options.state_dir,
            keeps_table=self._keeps_endpoint_state,
        )
        self.dev_key = keys.dev_key()
        streams, sqs = boto3.client("dynamodbstreams"), boto3.client("sqs")
        lag_alarm = template.parameters.get("StreamLagAlarmSeconds")
        sources = EventSources(
            streams,
            stream_activity=self._activity(StreamActivity, streams.meta.endpoint_url),
            queue_activity=self._activity(QueueActivity, sqs.meta.endpoint_url),
            positions=self._stream_positions(),
            stuck_after_s=float(lag_alarm) if lag_alarm else None,
        )
        self._lambda = functions = LambdaFunctions(self.functions, resources, self._stop)
        functions.create(
            self._start_cloudwatch(cloudwatch),
            sources,
            report=self.options.report_invocations,
            record_aws_calls=self.options.record_aws_calls,
        )
        pollers = functions.pollers
        self._serve_lambda_api(
            functions, EventSourceMappings(pollers, journal=self._state(EVENT_SOURCE_CHANGES))
        )
        warming = functions.warm_up() if self.options.warm_containers == "eager" else None
        self._start_ttl(resources)
        self._watch_state()
        self._threads.append(functions.watch_code())
        routes = [route for spec in self.functions.values() for route in spec.routes]
        gateway = HttpGateway(
            routes, functions.runtimes, fixed_tenant=None if self.options.auth else NO_AUTH_TENANT
        )
        self._serve(
            self._console(cloudwatch, keys).around(gateway.app()),
            "http-api",
            self.options.host,
            self.options.port,
        )
        for poller in pollers:
            poller.start()
        if warming is not None:
            warming.join()  # Ready once every function has its warm sandbox, as SAM CLI's EAGER

    def _serve_lambda_api(self, functions: LambdaFunctions, mappings: EventSourceMappings) -> None:
        """The Lambda API (emulator/lambda_api.py) on its listener, with its queue of
        asynchronous invocations."""
        events = EventInvocations(
            functions.runtimes,
            self._stop,
            retry_base_s=self.options.event_retry_base_s,
            destination=functions.event_destination,
            say=lambda line: print(line, flush=True),
        )
        events.start()
        self._threads.append(events.thread)
        assert self._lambda_listener is not None
        self._serve(
            LambdaApi(functions.runtimes, mappings, events).app(),
            "lambda-api",
            sockets=[self._lambda_listener],
        )

    def _provision_alarms(
        self, template: Template, resources: LocalResources, cloudwatch: CloudWatchClient
    ) -> None:
        """The template's alarms on the endpoint's CloudWatch (listed, not evaluated). An
        endpoint without CloudWatch gets a line saying so, and the stack runs without them."""
        try:
            provision_alarms(template, resources, cloudwatch)
        except (BotoCoreError, ClientError) as error:
            print(f"The template's alarms are not on the endpoint: {error}", flush=True)

    def _start_cloudwatch(self, cloudwatch: CloudWatchClient) -> Sinks:
        """Lambda's metrics of each function and the functions' EMF lines on the endpoint's
        CloudWatch (emulator/metrics.py), and each sandbox's lines in its function's log group
        (emulator/log_groups.py), each sent every few seconds by a thread of its own."""
        metrics, logs = MetricsSink(cloudwatch), LogsSink(boto3.client("logs"))
        try:
            logs.create_groups(log_group(name) for name in self.functions)
        except (BotoCoreError, ClientError) as error:
            print(f"The functions' log groups are not on the endpoint: {error}", flush=True)
        for name, sink in (("metrics", metrics), ("logs", logs)):
            thread = threading.Thread(target=sink.run, args=(self._stop,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return Sinks(metrics, logs)

    def _start_ttl(self, resources: LocalResources) -> None:
        tables = [
            TtlTable(resources.table_names[logical_id], attribute)
            for logical_id, attribute in resources.ttl_attributes.items()
        ]
        if not tables or self.options.ttl_sweep_s <= 0:
            return
        dynamodb = boto3.client("dynamodb")
        embedded = (
            self.options.endpoint_url is None and dynamodb.meta.endpoint_url.rstrip("/") == self.endpoint_url
        )
        sweeper = TtlSweeper(
            dynamodb,
            tables,
            interval_s=self.options.ttl_sweep_s,
            # the embedded endpoint names the expired items; an endpoint of your own is scanned
            expired=expired_on(dynamodb.meta.endpoint_url, dynamodb.meta.region_name) if embedded else None,
        )
        thread = threading.Thread(target=sweeper.run, args=(self._stop,), name="ttl", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _watch_state(self) -> None:
        if kept := self._endpoint_state:
            self._threads.append(stack_state.watch(*kept, self._stop))

    def _console(self, cloudwatch: CloudWatchClient, keys: StackKeys) -> Console:
        """The console, over the AWS endpoint (the operator's tools, with its clients' short
        timeouts) and the stack's own API."""
        sqs, dynamodb = boto3.client("sqs", config=CALLS), boto3.client("dynamodb", config=CALLS)
        deployment = local_deployment(sqs)
        return Console(
            dynamodb,
            sqs,
            deployment,
            DeadLetters(deployment, dynamodb=dynamodb, sqs=sqs),
            cloudwatch=cloudwatch,
            api_url=f"http://{self._local_host}:{self.options.port}",
            key_of=keys.of_tenant,
            token=self.console_token,
        )

    def _serve(
        self,
        app: ASGIApp,
        name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        sockets: list[socket.socket] | None = None,
    ) -> None:
        """`app` served by uvicorn in a thread, on host:port or on `sockets` already bound;
        returns once it listens."""
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        server = uvicorn.Server(config)
        self._servers.append(server)
        thread = threading.Thread(target=server.run, kwargs={"sockets": sockets}, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
        give_up = time.monotonic() + 15
        while not server.started:
            if not thread.is_alive() or time.monotonic() > give_up:
                raise RuntimeError(f"{name} could not listen on {host}:{port}")
            time.sleep(0.05)

    def stop(self, grace_s: float | None = None) -> None:
        """Stops taking requests and messages, lets the invocations in flight finish (up to
        `grace_s`, or until `hurry` is set), keeps the state, then stops the endpoint."""
        self._stop.set()
        for server in self._servers:
            server.should_exit = True
        # Pollers first (each finishes the invocation it is in), then the endpoint they talk to.
        give_up = time.monotonic() + (self.options.grace_s if grace_s is None else grace_s)
        runtimes = self._lambda.runtimes.values() if self._lambda else []
        pollers = self._lambda.pollers if self._lambda else []
        for runtime in runtimes:
            runtime.cut_to(give_up)  # what is in flight has the grace: the worker takes no more
        for thread in [*self._threads, *(thread for poller in pollers for thread in poller.threads)]:
            while thread.is_alive() and time.monotonic() < give_up and not self.hurry.is_set():
                thread.join(timeout=0.2)
        # What is still running is cut short below: its messages, taken before the cut (a poller
        # forgets an invocation's messages once it has ended, killed or not).
        cut_short = (
            [(poller, poller.in_flight()) for poller in self._lambda.sqs_pollers] if self._lambda else []
        )
        for runtime in runtimes:
            runtime.close()  # the sandboxes end; an invocation still running is cut short
        try:
            if self._children:
                self._keep_state(cut_short)
        finally:  # a snapshot that failed says so, and stops no less: the journal still holds it all
            for child in self._children:
                stop(child)
            self._children.clear()

    def _activity(self, kind: type[ActivityKind], service_url: str) -> ActivityKind | None:
        """What the embedded endpoint says of a service's activity (its streams' records, its
        queues' messages), followed while the stack runs, when the service is the embedded
        endpoint's."""
        if self.options.endpoint_url is not None or service_url.rstrip("/") != self.endpoint_url:
            return None
        activity = kind(service_url, self._stop)
        activity.thread.start()  # not waited for at a stop: it holds nothing, and a read may hang 2 s
        return activity

    def _stream_positions(self) -> StreamPositions | None:
        """Where the streams' positions are kept: with the embedded endpoint's state alone (an
        endpoint of your own keeps its streams as it does)."""
        path = self._state(STREAM_CHECKPOINTS)
        return StreamPositions(path) if path is not None and self._keeps_endpoint_state else None

    def _keep_state(self, cut_short: list[tuple[SqsPoller, list[str]]]) -> None:
        """Messages of invocations the stop cut short become visible again; then the endpoint
        writes a clean stop's snapshot (the streams' positions are on disk already)."""
        released = 0
        for poller, receipts in cut_short:
            try:
                released += poller.release(receipts)
            except Exception as exc:
                print(f"could not release in-flight messages: {exc!r}", flush=True)
        if released:
            print(f"{released} message(s) of unfinished invocations will be delivered again", flush=True)
        if kept := self._endpoint_state:
            stack_state.snapshot(*kept)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
