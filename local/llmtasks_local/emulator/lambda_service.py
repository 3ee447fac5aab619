"""The template's functions as the Lambda service runs them on the local stack: a runtime (its
sandboxes) per function, the event source mappings that poll its queues and streams, where its
failed invocations' records go, warm containers, hot reload and the retiring of idle sandboxes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3

from llmtasks_local.emulator import hot_reload
from llmtasks_local.emulator.hot_reload import WATCH_EVERY_S, CodeWatch
from llmtasks_local.emulator.runtime import COLD_START_SLOTS, FunctionRuntime
from llmtasks_local.emulator.sources import (
    QueueActivity,
    SqsPoller,
    StreamActivity,
    StreamPoller,
    StreamPositions,
    queue_destination,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient

    from llmtasks_local.emulator.log_groups import LogsSink
    from llmtasks_local.emulator.metrics import MetricsSink
    from llmtasks_local.sam.function_spec import FunctionSpec, StreamSource
    from llmtasks_local.sam.provision import LocalResources

HTTP_CONCURRENCY = 16  # sandboxes per HTTP function: enough for long-polls beside submits


def say(line: str) -> None:
    print(line, flush=True)


@dataclass
class Sinks:
    """Where the functions' invocations are told of: Lambda's metrics and the log groups."""

    metrics: MetricsSink
    logs: LogsSink


@dataclass
class EventSources:
    """How the pollers read their queues and streams, and keep their streams' positions."""

    streams: DynamoDBStreamsClient
    stream_activity: StreamActivity | None = None
    queue_activity: QueueActivity | None = None
    positions: StreamPositions | None = None
    stuck_after_s: float | None = None  # the template's StreamLagAlarmSeconds


class LambdaFunctions:
    def __init__(
        self, functions: dict[str, FunctionSpec], resources: LocalResources, stop: threading.Event
    ) -> None:
        self.functions = functions
        self.resources = resources
        self._stop = stop
        self.runtimes: dict[str, FunctionRuntime] = {}
        self.sqs_pollers: list[SqsPoller] = []
        self.stream_pollers: dict[str, StreamPoller] = {}

    @property
    def pollers(self) -> list[SqsPoller | StreamPoller]:
        return [*self.sqs_pollers, *self.stream_pollers.values()]

    def http_functions(self) -> set[str]:
        """The functions that answer HTTP: those with routes, and their authorizers."""
        routed = {name for name, spec in self.functions.items() if spec.routes}
        return routed | {
            route.authorizer.function_id
            for spec in self.functions.values()
            for route in spec.routes
            if route.authorizer is not None
        }

    def create(
        self, sinks: Sinks, sources: EventSources, *, report: bool, record_aws_calls: Path | None = None
    ) -> None:
        """Each function's runtime, and a poller for each of its event sources (not started)."""
        http = self.http_functions()
        for spec in self.functions.values():
            concurrency = (HTTP_CONCURRENCY if spec.logical_id in http else 0) + len(spec.stream_sources)
            concurrency += sum(s.maximum_concurrency or 5 for s in spec.sqs_sources)
            runtime = self.runtimes[spec.logical_id] = FunctionRuntime(
                spec,
                concurrency=max(1, concurrency),
                report=report,
                record_aws_calls=record_aws_calls,
                metrics=sinks.metrics,
                logs=sinks.logs,
            )
            # Every event source has its poller; a disabled one (Enabled: false, or paused through
            # the Lambda API) takes nothing until it is enabled.
            for sqs_source in spec.sqs_sources:
                url = self.resources.queue_url_of_arn(sqs_source.queue_arn)
                self.sqs_pollers.append(
                    SqsPoller(
                        sqs_source, runtime, boto3.client("sqs"), url, self._stop, sources.queue_activity
                    )
                )
            positions = sources.positions
            for stream_source in spec.stream_sources:
                name = f"{spec.logical_id}.{stream_source.name}"
                self.stream_pollers[name] = StreamPoller(
                    stream_source,
                    runtime,
                    sources.streams,
                    self._stop,
                    self._failure_sink(stream_source),
                    checkpoints=positions.of(name) if positions else None,
                    on_checkpoint=positions.keeper(name) if positions else None,
                    metrics=sinks.metrics,
                    stuck_after_s=sources.stuck_after_s,
                    activity=sources.stream_activity,
                )

    def event_destination(self, spec: FunctionSpec) -> Callable[[dict[str, Any]], None] | None:
        """Where a function's failed asynchronous invocations go: its EventInvokeConfig's SQS
        on-failure destination (any other kind is said once per failure, and not sent)."""
        config = spec.event_invoke
        if config.on_failure_arn is None:
            return None
        if config.on_failure_type != "SQS":
            say(
                f"[{spec.logical_id}] the local stack sends a failed Event invocation's record to an SQS"
                f" destination only, not {config.on_failure_type} ({config.on_failure_arn})"
            )
            return None
        return queue_destination(boto3.client("sqs"), self.resources.queue_url_of_arn(config.on_failure_arn))

    def _failure_sink(self, source: StreamSource) -> Callable[[dict[str, Any]], None] | None:
        if not source.on_failure_arn:
            return None
        return queue_destination(boto3.client("sqs"), self.resources.queue_url_of_arn(source.on_failure_arn))

    def warm_up(self) -> threading.Thread:
        """One sandbox of each function started now, while the rest of the start goes on
        (--warm-containers eager, SAM CLI's EAGER): the first task then pays no cold start.
        HTTP functions first; each reported as the cold start it is. An invocation that arrives
        meanwhile waits for that sandbox instead of starting a second one."""
        http = self.http_functions()
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
                        say(f"warm container: {name} (Init Duration: {init_s * 1000:.2f} ms)")

        thread = threading.Thread(target=warm_all, name="warm-containers", daemon=True)
        thread.start()
        return thread

    def watch_code(self) -> threading.Thread:
        """Hot reload (a function's code changed: its next invocation cold-starts on the new
        code), and idle sandboxes retired after a while, as Lambda retires them."""
        watcher = CodeWatch(self.functions)

        def watch() -> None:
            while not self._stop.wait(WATCH_EVERY_S):
                hot_reload.watch(watcher, lambda name: self.runtimes[name].reload(), say)
                for runtime in self.runtimes.values():
                    runtime.reap()

        thread = threading.Thread(target=watch, name="code-watch", daemon=True)
        thread.start()
        return thread
