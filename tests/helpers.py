"""Shared test helpers: real HTTP servers on 127.0.0.1, event files, handler loading."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import json
import os
import random
import socket
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest
import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmtasks.aws.queues import Queue, TaskLanes
from llmtasks.aws.results import ResultBlobs
from llmtasks.domain.batches import Batch, BatchStatus
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.domain.rules import Lane
from llmtasks.settings import Settings
from llmtasks_local import KEEP_ALIVE_S
from llmtasks_local.sam.function_spec import FunctionSpec

T = TypeVar("T")
# A claim's dead_letter_at in tests about other rules: the task never counts as dead-lettered.
NEVER = float(2**40)

ROOT = Path(__file__).resolve().parent.parent
EVENTS = ROOT / "events"
TEMPLATE = ROOT / "template.yaml"
# The cap on a wait for something that does happen (a task ending, a log line, a reply): one only
# a real hang reaches. The waits end on their event, so the cap costs a passing test nothing; on
# CI's loaded two cores a cold start has taken over 10 s and a whole suite twice its quiet time,
# so caps set near the quiet times failed runs that had nothing wrong (issue 36: no flake).
HANG_S = 120.0


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on now (for the tests' own servers)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def load_example(name: str) -> Any:
    """A script of examples/, imported as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_event(name: str) -> dict[str, Any]:
    """One of the sample events in events/ (shared with `sam local invoke`)."""
    return json.loads((EVENTS / name).read_text())


def eventually(
    read: Callable[[], T],
    until: Callable[[T], bool],
    *,
    timeout_s: float,
    every_s: float = 0.1,
    what: str = "",
) -> T:
    """Reads until `until` holds of what was read, and returns that; fails the test after
    `timeout_s`, saying `what` it waited for and the last value read."""
    give_up = time.monotonic() + timeout_s
    while not until(value := read()):
        assert time.monotonic() < give_up, f"{what} not within {timeout_s:g} s; last read: {value!r}"[:1000]
        time.sleep(every_s)
    return value


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Serve an ASGI app on 127.0.0.1 in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            timeout_keep_alive=KEEP_ALIVE_S,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    give_up = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < give_up, "test server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# Every flag keeps Chromium off the network: no updates, sync, metrics or QUIC probes.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--window-size=1400,1600",
)


@contextmanager
def chromium(user_data_dir: Path) -> Iterator[webdriver.Chrome]:
    """Debian's headless Chromium driven by Selenium through its chromedriver (the browser tests)."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail(
            "the browser tests need Debian's chromium and chromium-driver"
            " (apt-get install chromium chromium-driver; scripts/system-packages installs them)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookReceiver:
    """A webhook endpoint that records what it gets and answers from a script of status codes."""

    answers: list[int] = field(default_factory=list)  # consumed in order; then 200
    hang_s: float = 0.0
    answer_headers: dict[str, str] = field(default_factory=dict)  # sent with every answer
    deliveries: list[Delivery] = field(default_factory=list)
    open: int = 0  # requests being answered now
    most_open: int = 0  # the most at once
    # Each request is held (up to hang_s, in place of it) until this many have been open at once:
    # a test of overlap ends on that event, not on a hold long enough for a loaded machine.
    hold_until_open: int = 0
    _enough_open: asyncio.Event | None = field(default=None, init=False, repr=False)

    async def _receive(self, request: Request) -> Response:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            self.deliveries.append(Delivery(dict(request.headers), await request.body()))
            if self.hold_until_open:
                self._enough_open = self._enough_open or asyncio.Event()
                if self.most_open >= self.hold_until_open:
                    self._enough_open.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._enough_open.wait(), self.hang_s)
            elif self.hang_s:
                await asyncio.sleep(self.hang_s)
            status = self.answers.pop(0) if self.answers else 200
            return Response(status_code=status, headers=self.answer_headers)
        finally:
            self.open -= 1

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/hook", self._receive, methods=["POST"])])

    def wait_for(self, count: int, timeout_s: float = HANG_S) -> list[Delivery]:
        # The wait ends on the deliveries; the cap is for a hang (a first delivery waits for the
        # task's run and two cold starts, past 20 s on a loaded clean-clone run).
        return eventually(
            lambda: self.deliveries, lambda d: len(d) >= count, timeout_s=timeout_s, every_s=0.05
        )


@dataclass
class ToolEndpoint:
    """A run's function endpoint: records each call (headers, arguments) and answers with a
    text naming the call's number, after a script of failing status codes."""

    answers: list[int] = field(default_factory=list)  # consumed in order; then 200
    calls: list[Delivery] = field(default_factory=list)

    async def _call(self, request: Request) -> Response:
        self.calls.append(Delivery(dict(request.headers), await request.body()))
        status = self.answers.pop(0) if self.answers else 200
        text = f"tool result {len(self.calls)}" if status == 200 else "failing"
        return Response(text, status_code=status, media_type="text/plain")

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/tool", self._call, methods=["POST"])])


@contextmanager
def moto_endpoint() -> Iterator[str]:
    """A moto server in its own process, as the local stack embeds it; yields its URL."""
    from llmtasks_local.emulator.processes import listen_on, spawn_moto_server, stop

    listener = listen_on("127.0.0.1", 0, "--moto-port", "a test's moto server")
    port = listener.getsockname()[1]
    server = spawn_moto_server(listener)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(server)


def stored_batch(
    batch_id: str, *, now: float, status: BatchStatus = BatchStatus.PENDING, **fields: Any
) -> Batch:
    """A batch item as submit stores it (its manifest's place only named), for tests that
    write batches directly."""
    defaults: dict[str, Any] = {
        "tenant_id": "default",
        "total": 1,
        "manifest_ref": f"batches/{batch_id}.jsonl",
        "chunk_size": 100,
        "chunk_offsets": [0, 1],
        "created_at": now,
        "expires_at": int(now + 3600),
    }
    return Batch(batch_id=batch_id, status=status, **(defaults | fields))


def pending_task(
    task_id: str, *, tenant: str = "default", now: float, ttl_s: int = 60, **fields: Any
) -> Task:
    """A task as submit stores it, for tests that write items directly."""
    return Task(
        task_id=task_id,
        tenant_id=tenant,
        status=TaskStatus.PENDING,
        request=fields.pop("request", LLMRequest(prompt="p")),
        created_at=now,
        expires_at=int(now + ttl_s),
        **fields,
    )


def toy_function(
    directory: Path, body: str, *, timeout_s: int = 1, requirements: tuple[str, ...] = ()
) -> FunctionSpec:
    """A function `F` whose handler (`app.handler`) is `body`, for the emulator's own tests; the
    packages it imports beyond the runtime's own (boto3) named in its requirements.txt."""
    (directory / "app.py").write_text(textwrap.dedent(body))
    if requirements:
        (directory / "requirements.txt").write_text("".join(f"{name}\n" for name in requirements))
    return FunctionSpec("F", directory, "app.handler", timeout_s, 128, {})


def emf_records(output: str) -> dict[str, list[dict[str, Any]]]:
    """The EMF records in captured stdout, by metric name: each with its dimensions and value."""
    found: dict[str, list[dict[str, Any]]] = {}
    for line in output.splitlines():
        if not line.startswith('{"_aws"'):
            continue
        record = json.loads(line)
        [directive] = record["_aws"]["CloudWatchMetrics"]
        assert directive["Namespace"] == "llmtasks"
        # The service alone (alarms and totals read it), then the detailed set, if any
        overall, *detailed = directive["Dimensions"]
        assert overall == ["service"]
        dimensions = detailed[0] if detailed else overall
        for metric in directive["Metrics"]:
            values = {name: record[name] for name in dimensions}
            [value] = record[metric["Name"]]  # one value a record: each metric is written as it happens
            found.setdefault(metric["Name"], []).append({**values, "value": value})
    return found


def emf_units(output: str) -> dict[str, set[str]]:
    """The units the EMF records in captured stdout declare, by metric name."""
    units: dict[str, set[str]] = {}
    for line in output.splitlines():
        if line.startswith('{"_aws"'):
            for metric in json.loads(line)["_aws"]["CloudWatchMetrics"][0]["Metrics"]:
                units.setdefault(metric["Name"], set()).add(metric["Unit"])
    return units


def metric_statistics(
    cloudwatch: Any, namespace: str, name: str, dimensions: dict[str, str]
) -> dict[str, float]:
    """One metric's SampleCount, Sum and Maximum over the last hour (zeros without datapoints),
    as GetMetricStatistics gives them."""
    now = datetime.now(UTC)
    points = cloudwatch.get_metric_statistics(
        Namespace=namespace,
        MetricName=name,
        Dimensions=[{"Name": key, "Value": value} for key, value in dimensions.items()],
        StartTime=now - timedelta(hours=1),
        EndTime=now + timedelta(minutes=1),
        Period=3900,
        Statistics=["SampleCount", "Sum", "Maximum"],
    )["Datapoints"]
    return {
        "SampleCount": float(sum(p["SampleCount"] for p in points)),
        "Sum": float(sum(p["Sum"] for p in points)),
        "Maximum": max((float(p["Maximum"]) for p in points), default=0.0),
    }


def local_client(service: str, endpoint_url: str) -> Any:
    """A boto3 client of a local endpoint, with moto's fixed keys: never a real account's."""
    return boto3.client(
        service,
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@contextmanager
def endpoint_or_moto(variable: str) -> Iterator[str]:
    """The endpoint the environment variable names, else a moto server of this test's own."""
    given = os.environ.get(variable)
    if given:
        yield given
        return
    with moto_endpoint() as url:
        yield url


def blobs(settings: Settings) -> ResultBlobs:
    """The results bucket's adapter, as wiring builds it, for services the tests build."""
    return ResultBlobs(settings.results_bucket)


def task_lanes(settings: Any, sqs: Any, *, normal: Queue | None = None) -> TaskLanes:
    """The task queues by lane, as wiring builds them; `normal` stands in for TaskQueue's."""
    lanes = TaskLanes.of(settings, sqs)
    return TaskLanes({lane: normal if normal and lane is Lane.NORMAL else lanes[lane] for lane in Lane})


def resource_variables() -> list[str]:
    """This process's variables that name a table, queue or bucket: what the functions' resource
    models read, to be cleared where a test gives a function only its own."""
    return [name for name in os.environ if name.endswith(("_URL", "_NAME", "_BUCKET"))]


class HandlerContext:
    """The attributes and method of Lambda's context that handlers and Powertools read, for a
    handler called in the test's own process."""

    def __init__(self, spec: FunctionSpec, timeout_s: float | None = None) -> None:
        self.function_name = spec.logical_id
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{spec.logical_id}"
        self.memory_limit_in_mb = spec.memory_mb
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{spec.logical_id}"
        self.log_stream_name = f"test/{self.aws_request_id}"
        self._deadline = time.monotonic() + (timeout_s or spec.timeout_s)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


_handler_modules = itertools.count(1)


def load_handler(spec: FunctionSpec) -> Callable[..., Any]:
    """A fresh copy of the function's handler module, imported in the test's own process (the
    unit tests call handlers directly, on in-process moto; the local stack runs them in sandbox
    processes). Its layers go on sys.path after the code, as in Lambda."""
    path = spec.handler_file
    if not path.is_file():
        raise FileNotFoundError(f"{spec.logical_id}: no handler module at {path}")
    for layer in spec.layer_dirs:
        if str(layer) not in sys.path:
            sys.path.append(str(layer))
    name = f"_handler_{spec.logical_id}_{next(_handler_modules)}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    handler: Callable[..., Any] = getattr(module, spec.handler.rsplit(".", 1)[1])
    return handler


def process_exists(pid: int) -> bool:
    """Whether the process runs (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
        # A zombie has ended too. Reaped between the two looks, its /proc entry answers ESRCH
        # (or is gone): it has ended.
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


class SpanJitter(random.Random):
    """Jitter drawn at a known point of its span (`at`: 0 its low end, 1 its high end), with
    the spans each draw asked for."""

    def __init__(self, at: float) -> None:
        super().__init__(0)
        self.at = at
        self.spans: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.spans.append((a, b))
        return a + (b - a) * self.at


def replay_batch_events(events: list[dict[str, Any]], total: int) -> tuple[dict[str, int], dict[int, str]]:
    """A batch's events (GET /batches/{id}/events) from its first, replayed: each must be
    numbered on from the one before, and carry the counts before it moved by its items. The
    counts after the last, and each item's last status, by index."""
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    counts = {"pending": total, "processing": 0, "completed": 0, "failed": 0, "cancelled": 0}
    status_of = dict.fromkeys(range(total), "pending")
    for event in events:
        for item in event["items"]:
            counts[status_of[item["index"]]] -= 1
            counts[item["status"]] += 1
            status_of[item["index"]] = item["status"]
        assert event["counts"] == counts, event
    return counts, status_of


def stream_records(aws: Any) -> list[dict[str, Any]]:
    """Every record of TasksTable's stream so far, from its start, as Lambda hands them over."""
    from llmtasks_local.sam.events import stream_record

    arn = aws.resources.attributes[("TasksTable", "StreamArn")]
    records: list[dict[str, Any]] = []
    for shard in aws.streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]:
        iterator = aws.streams.get_shard_iterator(
            StreamArn=arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            reply = aws.streams.get_records(ShardIterator=iterator)
            if not reply["Records"]:
                break
            records += [stream_record(dict(r), arn) for r in reply["Records"]]
            iterator = reply.get("NextShardIterator")
    return records


def count_tasks(aws: Any, handler: Any, progress: Any = None) -> list[dict[str, Any]]:
    """Every record of TasksTable's stream so far, from its start, handed through
    BatchFunction's filter to its handler as Lambda would (so the task counters take them;
    records seen before come again, as a redelivery does): the records handed. `progress`: the
    batches' counting (one for tasks of no batch without it)."""
    from llmtasks.aws.batch_store import BatchStore
    from llmtasks.aws.stream_skips import StreamSkips
    from llmtasks.aws.task_counts import TaskCounts
    from llmtasks.services.batch_items import BatchEnds, BatchProgress
    from llmtasks.services.task_tally import TaskTally
    from llmtasks_local.sam.events import pattern_matcher

    table = aws.resources.table_names["TasksTable"]
    records = stream_records(aws)
    matches = pattern_matcher(aws.function("BatchFunction").stream_sources[0].filter_patterns)
    chosen = [record for record in records if matches(record)]
    if progress is None:
        batches = BatchStore(table, aws.dynamodb)

        def no_files(*_: Any) -> None:
            raise AssertionError("a batch ended: pass its rig's progress")

        ends = BatchEnds(batches, Queue(aws.queue_url("BatchFanoutQueue"), aws.sqs), files=no_files)
        progress = BatchProgress(batches, ends=ends)
    function, context = handler("BatchFunction")
    if chosen:
        function(
            {"Records": chosen},
            context,
            progress=progress,
            tally=TaskTally(TaskCounts(table, aws.dynamodb)),
            skips=StreamSkips(table, aws.dynamodb),
        )
    return chosen
