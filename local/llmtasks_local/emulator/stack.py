"""`llmtasks up`: the whole application on one machine, from template.yaml.

moto (or any endpoint such as LocalStack) holds the tables and queues; the template's HttpApi
routes are served on 127.0.0.1; its SQS and DynamoDB stream event sources are polled into the
same handler code that runs in Lambda; the mock LLM answers unless LLM_BASE_URL is set.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import boto3
import httpx
import uvicorn
from botocore.exceptions import BotoCoreError, ClientError
from starlette.types import ASGIApp

from llmtasks.ops.deadletters import DeadLetters
from llmtasks.ops.keys import Keys
from llmtasks_local import KEEP_ALIVE_S
from llmtasks_local.emulator import hot_reload
from llmtasks_local.emulator.console import Console
from llmtasks_local.emulator.gateway import HttpGateway
from llmtasks_local.emulator.hot_reload import WATCH_EVERY_S, CodeWatch
from llmtasks_local.emulator.journal import state_files
from llmtasks_local.emulator.lambda_api import (
    EVENT_RETRY_BASE_S,
    EventInvocations,
    EventSourceMappings,
    LambdaApi,
)
from llmtasks_local.emulator.log_groups import LogsSink, log_group
from llmtasks_local.emulator.metrics import MetricsSink
from llmtasks_local.emulator.moto_server import STATE_PATH
from llmtasks_local.emulator.processes import (
    check_answers,
    check_port_free,
    listen_on,
    spawn_moto_server,
    spawn_python,
    stop,
)
from llmtasks_local.emulator.runtime import COLD_START_SLOTS, FunctionRuntime
from llmtasks_local.emulator.sources import (
    QueueActivity,
    SqsPoller,
    StreamActivity,
    StreamPoller,
    StreamPositions,
    queue_destination,
)
from llmtasks_local.emulator.ttl import DEFAULT_SWEEP_S, TtlSweeper, TtlTable
from llmtasks_local.sam.function_spec import PSEUDO_PARAMETERS, FunctionSpec, StreamSource
from llmtasks_local.sam.provision import LocalResources, local_deployment, provision, provision_alarms
from llmtasks_local.sam.template import Template
from llmtasks_local.tool_errors import ToolError

ActivityKind = TypeVar("ActivityKind", StreamActivity, QueueActivity)

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient

STATE_WATCH_S = 1.0  # how often the endpoint is asked whether its state dir takes changes
HTTP_CONCURRENCY = 16  # sandboxes per HTTP function: enough for long-polls beside submits
NO_AUTH_TENANT = "default"  # every request's tenant under `--no-auth`


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
    auth: bool = True  # False: `--no-auth`, the gateway makes every request NO_AUTH_TENANT's
    report_invocations: bool = False  # `--report`: Lambda's START, END and REPORT lines
    # `--record-aws-calls`: each AWS call of each function, as IAM authorizes it (aws_calls.py)
    record_aws_calls: Path | None = None
    # Where tables, queues, objects and stream positions are kept across restarts (None: nowhere).
    state_dir: Path | None = None
    reset: bool = False  # start empty, whatever state_dir holds
    # How long a stop lets the invocations in flight finish (Celery's warm shutdown).
    grace_s: float = 30.0
    ttl_sweep_s: float = DEFAULT_SWEEP_S  # how often expired items are deleted (DynamoDB TTL)
    # SAM CLI's --warm-containers: "eager" starts a sandbox of every function before the stack is
    # Ready (`_warm_up`); "lazy" starts each at its first invocation.
    warm_containers: Literal["eager", "lazy"] = "lazy"
    # The Lambda API's own port (`sam local start-lambda`'s convention); None: a free one, which
    # Lambda calls reach through the embedded AWS endpoint.
    lambda_port: int | None = None
    # Lambda waits a minute before trying a failed asynchronous invocation again, then two.
    event_retry_base_s: float = EVENT_RETRY_BASE_S


def default_state_dir(template: Path) -> Path:
    """Where a stack keeps its state unless told otherwise: .llmtasks/state beside the template."""
    return template.resolve().parent / ".llmtasks" / "state"


STREAM_CHECKPOINTS = "streams.json"
EVENT_SOURCE_CHANGES = "event_source_mappings.json"
DEV_KEY = "dev-key"
KEYS_TABLE = "API_KEYS_TABLE_NAME"  # the authorizer's variable: where the dev key is stored


class LocalStack:
    def __init__(self, options: StackOptions) -> None:
        self.options = options
        self._children: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.resources: LocalResources | None = None
        self.functions: dict[str, FunctionSpec] = {}
        self.runtimes: dict[str, FunctionRuntime] = {}
        self.endpoint_url = options.endpoint_url
        self.llm_base_url = options.llm_base_url
        self.dev_key: str | None = None
        # The console's data shows every tenant: it needs this token, printed in its URL.
        self.console_token = secrets.token_urlsafe(24)
        self._sqs_pollers: list[SqsPoller] = []
        self._stream_pollers: dict[str, StreamPoller] = {}
        self._lambda_listener: socket.socket | None = None
        self._servers: list[uvicorn.Server] = []
        self.hurry = threading.Event()  # a second Ctrl-C: stop without waiting for calls in flight
        self._console_keys: dict[str, str | None] = {}  # by tenant: the console's calls to the API
        self._console_keys_lock = threading.Lock()

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

    def _prepare_state(self) -> None:
        state_dir = self.options.state_dir
        if state_dir is None:
            return
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            probe = state_dir / ".writable"
            probe.write_text("")
            probe.unlink()
        except OSError as error:
            raise ToolError(
                f"the state dir cannot be written: {error.strerror}",
                where=str(state_dir),
                fix="give a writable folder with --state-dir, or keep nothing with --no-state",
            ) from error
        if self.options.reset:
            kept = (STREAM_CHECKPOINTS, DEV_KEY, EVENT_SOURCE_CHANGES)
            for path in (*state_files(state_dir), *(state_dir / name for name in kept)):
                path.unlink(missing_ok=True)

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
            child = spawn_python(
                "-m",
                "llmtasks_local.cli",
                "mock-llm",
                "--port",
                str(port),
                "--latency",
                str(self.options.mock_latency_s),
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
            **self.options.parameter_overrides,
        }
        # The template first: a mistake in it is said before anything starts.
        template = Template.load(self.options.template, overrides)
        template.check()
        self._preflight()
        self._prepare_state()
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
        if self.options.auth:
            self.dev_key = self._create_dev_key()
        streams, sqs = boto3.client("dynamodbstreams"), boto3.client("sqs")
        activity = self._activity(StreamActivity, streams.meta.endpoint_url)
        queue_activity = self._activity(QueueActivity, sqs.meta.endpoint_url)
        positions = self._stream_positions()
        metrics, logs = self._start_cloudwatch(cloudwatch)
        lag_alarm = template.parameters.get("StreamLagAlarmSeconds")
        http = self._http_functions()
        for spec in self.functions.values():
            serves_http = spec.logical_id in http
            concurrency = (HTTP_CONCURRENCY if serves_http else 0) + len(spec.stream_sources)
            concurrency += sum(s.maximum_concurrency or 5 for s in spec.sqs_sources)
            runtime = self.runtimes[spec.logical_id] = FunctionRuntime(
                spec,
                concurrency=max(1, concurrency),
                report=self.options.report_invocations,
                record_aws_calls=self.options.record_aws_calls,
                metrics=metrics,
                logs=logs,
            )
            # Every event source has its poller; a disabled one (Enabled: false, or paused through
            # the Lambda API) takes nothing until it is enabled.
            for sqs_source in spec.sqs_sources:
                url = resources.queue_url_of_arn(sqs_source.queue_arn)
                self._sqs_pollers.append(
                    SqsPoller(sqs_source, runtime, boto3.client("sqs"), url, self._stop, queue_activity)
                )
            for stream_source in spec.stream_sources:
                name = f"{spec.logical_id}.{stream_source.name}"
                self._stream_pollers[name] = StreamPoller(
                    stream_source,
                    runtime,
                    streams,
                    self._stop,
                    self._failure_sink(stream_source),
                    checkpoints=positions.of(name) if positions else None,
                    on_checkpoint=positions.keeper(name) if positions else None,
                    metrics=metrics,
                    stuck_after_s=float(lag_alarm) if lag_alarm else None,
                    activity=activity,
                )
        pollers: list[SqsPoller | StreamPoller] = [*self._sqs_pollers, *self._stream_pollers.values()]
        self._serve_lambda_api(EventSourceMappings(pollers, journal=self._state(EVENT_SOURCE_CHANGES)))
        warming = self._warm_up()
        self._start_ttl(resources)
        self._watch_state()
        self._watch_code()
        routes = [route for spec in self.functions.values() for route in spec.routes]
        gateway = HttpGateway(
            routes, self.runtimes, fixed_tenant=None if self.options.auth else NO_AUTH_TENANT
        )
        self._serve(
            self._console(cloudwatch).around(gateway.app()), "http-api", self.options.host, self.options.port
        )
        for poller in pollers:
            poller.start()
        if warming is not None:
            warming.join()  # Ready once every function has its warm sandbox, as SAM CLI's EAGER

    def _serve_lambda_api(self, mappings: EventSourceMappings) -> None:
        """The Lambda API (emulator/lambda_api.py) on its listener, with its queue of
        asynchronous invocations."""
        events = EventInvocations(
            self.runtimes,
            self._stop,
            retry_base_s=self.options.event_retry_base_s,
            destination=self._event_destination,
            say=lambda line: print(line, flush=True),
        )
        events.start()
        self._threads.append(events.thread)
        assert self._lambda_listener is not None
        self._serve(
            LambdaApi(self.runtimes, mappings, events).app(), "lambda-api", sockets=[self._lambda_listener]
        )

    def _event_destination(self, spec: FunctionSpec) -> Callable[[dict[str, Any]], None] | None:
        """Where a function's failed asynchronous invocations go: its EventInvokeConfig's SQS
        on-failure destination (any other kind is said once per failure, and not sent)."""
        config = spec.event_invoke
        if config.on_failure_arn is None or self.resources is None:
            return None
        if config.on_failure_type != "SQS":
            print(
                f"[{spec.logical_id}] the local stack sends a failed Event invocation's record to an SQS"
                f" destination only, not {config.on_failure_type} ({config.on_failure_arn})",
                flush=True,
            )
            return None
        return queue_destination(boto3.client("sqs"), self.resources.queue_url_of_arn(config.on_failure_arn))

    def _provision_alarms(
        self, template: Template, resources: LocalResources, cloudwatch: CloudWatchClient
    ) -> None:
        """The template's alarms on the endpoint's CloudWatch (listed, not evaluated). An
        endpoint without CloudWatch gets a line saying so, and the stack runs without them."""
        try:
            provision_alarms(template, resources, cloudwatch)
        except (BotoCoreError, ClientError) as error:
            print(f"The template's alarms are not on the endpoint: {error}", flush=True)

    def _start_cloudwatch(self, cloudwatch: CloudWatchClient) -> tuple[MetricsSink, LogsSink]:
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
        return metrics, logs

    def _start_ttl(self, resources: LocalResources) -> None:
        tables = [
            TtlTable(resources.table_names[logical_id], attribute)
            for logical_id, attribute in resources.ttl_attributes.items()
        ]
        if not tables or self.options.ttl_sweep_s <= 0:
            return
        sweeper = TtlSweeper(boto3.client("dynamodb"), tables, interval_s=self.options.ttl_sweep_s)
        thread = threading.Thread(target=sweeper.run, args=(self._stop,), name="ttl", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _watch_state(self) -> None:
        """Says when the state dir stops taking changes (a full or read-only disk: the endpoint
        then refuses them, and submits answer 503) and when it takes them again."""
        if not self._keeps_endpoint_state:
            return

        def watch() -> None:
            said: str | None = None
            # One client for the watch's life: httpx.get makes a client a call, and a client's
            # TLS context alone took 44 ms of CPU, a second, for as long as the stack ran.
            with httpx.Client(timeout=5) as endpoint:
                while not self._stop.wait(STATE_WATCH_S):
                    try:
                        problem = endpoint.get(f"{self.endpoint_url}{STATE_PATH}").json()["problem"]
                    except (httpx.HTTPError, ValueError, KeyError):
                        continue
                    if problem and problem != said:
                        print(
                            f"Error: the state dir cannot be written: {problem}: changes are refused and"
                            " submits answer 503 until it can (free some space, or make it writable)",
                            flush=True,
                        )
                    elif said and not problem:
                        print(f"The state dir can be written again ({self.options.state_dir})", flush=True)
                    said = problem

        thread = threading.Thread(target=watch, name="state-watch", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _http_functions(self) -> set[str]:
        """The functions that answer HTTP: those with routes, and their authorizers."""
        routed = {name for name, spec in self.functions.items() if spec.routes}
        return routed | {
            route.authorizer.function_id
            for spec in self.functions.values()
            for route in spec.routes
            if route.authorizer is not None
        }

    def _warm_up(self) -> threading.Thread | None:
        """With --warm-containers eager: one sandbox of each function started as soon as the
        functions are known, while the rest of the start goes on, and the stack is Ready once
        they are (SAM CLI's EAGER loads them "at startup"): the first task then pays no cold
        start. HTTP functions first; each reported as the cold start it is. An invocation that
        arrives meanwhile waits for that sandbox instead of starting a second one."""
        if self.options.warm_containers != "eager":
            return None
        http = self._http_functions()
        # The user's first request meets the authorizer, then SubmitFunction, then the worker:
        # HTTP functions first, in the template's order, then the event sources'.
        order = sorted(self.runtimes, key=lambda name: name not in http)

        def warm_all() -> None:
            # As many at once as cold starts may run (a core each), in that order.
            with ThreadPoolExecutor(max_workers=COLD_START_SLOTS, thread_name_prefix="warm") as pool:
                for name, init_s in zip(
                    order, pool.map(lambda n: self.runtimes[n].prewarm(), order), strict=True
                ):
                    if init_s is not None:
                        print(f"warm container: {name} (Init Duration: {init_s * 1000:.2f} ms)", flush=True)

        thread = threading.Thread(target=warm_all, name="warm-containers", daemon=True)
        thread.start()
        return thread

    def _watch_code(self) -> None:
        """Hot reload (a function's code changed: its next invocation cold-starts on the new
        code), and idle sandboxes retired after a while, as Lambda retires them."""
        watcher = CodeWatch(self.functions)

        def watch() -> None:
            while not self._stop.wait(WATCH_EVERY_S):
                hot_reload.watch(
                    watcher, lambda name: self.runtimes[name].reload(), lambda line: print(line, flush=True)
                )
                for runtime in self.runtimes.values():
                    runtime.reap()

        thread = threading.Thread(target=watch, name="code-watch", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _keys(self) -> Keys | None:
        """The operator's keys tool on the authorizer's keys table, when the template has one."""
        table = next(
            (
                spec.environment[KEYS_TABLE]
                for spec in self.functions.values()
                if KEYS_TABLE in spec.environment
            ),
            None,
        )
        return Keys(table, boto3.client("dynamodb")) if table else None

    def _create_dev_key(self) -> str | None:
        """A key for this run, tenant `dev`, when the template has an authorizer with a keys table;
        with a state dir, the one it kept (its table is kept too)."""
        keys = self._keys()
        if keys is None:
            return None
        kept = self._state(DEV_KEY)
        if kept is not None and kept.exists():
            return kept.read_text().strip()
        key, _ = keys.create("dev", name="llmtasks up")
        if kept is not None:
            kept.write_text(key)
        return key

    def _console_key(self, tenant: str) -> str | None:
        """A key of `tenant` for the console's calls to the API, made at its first call and
        kept for the run (None under `--no-auth`, or without a keys table)."""
        with self._console_keys_lock:
            if tenant not in self._console_keys:
                keys = self._keys() if self.options.auth else None
                self._console_keys[tenant] = (
                    None if keys is None else keys.create(tenant, name="llmtasks console")[0]
                )
            return self._console_keys[tenant]

    def _failure_sink(self, source: StreamSource) -> Callable[[dict[str, Any]], None] | None:
        if not source.on_failure_arn or self.resources is None:
            return None
        return queue_destination(boto3.client("sqs"), self.resources.queue_url_of_arn(source.on_failure_arn))

    def _console(self, cloudwatch: CloudWatchClient) -> Console:
        """The console, over the AWS endpoint (the operator's tools) and the stack's own API."""
        sqs, dynamodb = boto3.client("sqs"), boto3.client("dynamodb")
        deployment = local_deployment(sqs)
        return Console(
            dynamodb,
            sqs,
            deployment,
            DeadLetters(deployment, dynamodb=dynamodb, sqs=sqs),
            cloudwatch=cloudwatch,
            api_url=f"http://{self._local_host}:{self.options.port}",
            key_of=self._console_key,
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
        for runtime in self.runtimes.values():
            runtime.cut_to(give_up)  # what is in flight has the grace: the worker takes no more
        pollers: list[SqsPoller | StreamPoller] = [*self._sqs_pollers, *self._stream_pollers.values()]
        for thread in [*self._threads, *(thread for poller in pollers for thread in poller.threads)]:
            while thread.is_alive() and time.monotonic() < give_up and not self.hurry.is_set():
                thread.join(timeout=0.2)
        # What is still running is cut short below: its messages, taken before the cut (a poller
        # forgets an invocation's messages once it has ended, killed or not).
        cut_short = [(poller, poller.in_flight()) for poller in self._sqs_pollers]
        for runtime in self.runtimes.values():
            runtime.close()  # the sandboxes end; an invocation still running is cut short
        if self._children:
            self._keep_state(cut_short)
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
        if not self._keeps_endpoint_state:
            return
        reply = httpx.post(f"{self.endpoint_url}{STATE_PATH}", timeout=60)
        reply.raise_for_status()
        print(f"State kept in {self.options.state_dir} ({reply.json()['bytes']} bytes)", flush=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
