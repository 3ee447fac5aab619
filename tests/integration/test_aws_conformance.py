"""What the local stack emulates of AWS, one behaviour a test, each stated in its docstring.

Every test runs the emulator's own parts (the event-source pollers, the Lambda runtime, the TTL
sweeper, the redrive API) against the local stack's AWS endpoint over HTTP: the moto server
`llmtasks up` embeds, or with scripts/localstack-tests, SQS served by a real LocalStack. Where a
setting matters, it is read from template.yaml, as `llmtasks up` reads it. The docs' local stack page
(docs/local-stack.md) lists what is not emulated.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from llmtasks.aws.queues import Queue
from llmtasks.domain.messages import TaskMessage
from llmtasks_local.emulator import hot_reload
from llmtasks_local.emulator.hot_reload import CodeWatch
from llmtasks_local.emulator.lambda_api import EventInvocations, EventSourceMappings, LambdaApi
from llmtasks_local.emulator.runtime import FunctionRuntime
from llmtasks_local.emulator.sources import (
    INITIAL_SQS_POLLERS,
    POLL_WAIT_S,
    STREAM_IDLE_S,
    QueueActivity,
    SqsPoller,
    StreamActivity,
    StreamPoller,
    queue_destination,
)
from llmtasks_local.emulator.ttl import TtlSweeper, TtlTable
from llmtasks_local.sam.function_spec import EventInvokeConfig, SqsSource, StreamSource
from llmtasks_local.sam.provision import LocalResources
from llmtasks_local.sam.template import Template
from tests.helpers import HANG_S, TEMPLATE, eventually, local_client, process_exists, serve, toy_function

pytestmark = pytest.mark.integration

RECORDER = """
    import json, os, time
    def handler(event, context):
        records = event["Records"]
        with open(__file__ + ".calls", "a") as calls:
            calls.write(json.dumps({"at": time.time(), "n": len(records),
                                    "bodies": [r.get("body") for r in records]}) + "\\n")
        time.sleep(float(os.environ.get("HOLD_S", "0")))
        return None
"""


def calls_of(directory: Path) -> list[dict[str, Any]]:
    path = directory / "app.py.calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def template_functions(resources: LocalResources) -> dict[str, Any]:
    return Template.load(TEMPLATE).functions(resources.refs, resources.attributes)


def queue(remote: dict[str, Any], logical_id: str) -> tuple[str, str]:
    resources = remote["resources"]
    return resources.queue_urls[logical_id], resources.attributes[(logical_id, "Arn")]


def send(remote: dict[str, Any], url: str, *bodies: str) -> None:
    for body in bodies:
        remote["sqs"].send_message(QueueUrl=url, MessageBody=body)


def visible(remote: dict[str, Any], url: str) -> list[str]:
    """The bodies of a queue's visible messages (received with no visibility timeout)."""
    found: list[str] = []
    for _ in range(5):
        reply = remote["sqs"].receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0)
        found += [m["Body"] for m in reply.get("Messages", [])]
    return sorted(set(found))


def run_pollers(
    poller: SqsPoller | StreamPoller, stop: threading.Event, until: Any, timeout_s: float = HANG_S
) -> None:
    if poller.threads[0].ident is None:  # not started yet
        poller.start()
    try:
        eventually(until, bool, timeout_s=timeout_s, what="the invocations")
    finally:
        stop.set()
        for thread in poller.threads:
            thread.join(timeout=5)


# --- SQS event sources --------------------------------------------------------------------------


def test_event_sources_are_read_from_template_yaml(remote: dict[str, Any]) -> None:
    """Each SQS and stream event source is read from template.yaml: queue, BatchSize, window, concurrency, reports, filters, retries, destination."""
    functions = template_functions(remote["resources"])
    _, task_queue_arn = queue(remote, "TaskQueue")
    [from_tasks] = [s for s in functions["WorkerFunction"].sqs_sources if s.queue_arn == task_queue_arn]
    assert (from_tasks.batch_size, from_tasks.report_batch_item_failures) == (10, True)
    assert from_tasks.maximum_concurrency == 10  # WorkerMaxConcurrency's default
    [relay] = functions["WebhookFunction"].stream_sources
    assert relay.stream_arn == remote["resources"].attributes[("TasksTable", "StreamArn")]
    assert (relay.starting_position, relay.maximum_retry_attempts, relay.bisect_on_error) == (
        "TRIM_HORIZON",
        100,
        True,
    )
    assert relay.filter_patterns
    assert relay.on_failure_arn == queue(remote, "WebhookRelayDLQ")[1]


def test_sqs_long_polling_delivers_a_message_sent_during_the_wait(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """A poller's receive waits (WaitTimeSeconds) and returns as soon as a message arrives, instead of polling empty."""
    url, arn = queue(remote, "WebhookQueue")
    receives = Counter[str]()
    remote["sqs"].meta.events.register("before-call.sqs.ReceiveMessage", lambda **_: receives.update(["r"]))
    poller = SqsPoller(
        SqsSource("F", "S", arn),
        FunctionRuntime(toy_function(tmp_path, RECORDER)),
        remote["sqs"],
        url,
        threading.Event(),
    )
    threading.Timer(0.5, send, (remote, url, "late")).start()
    batch = poller.next_batch()
    assert [m["Body"] for m in batch] == ["late"]
    assert receives["r"] == 1  # the one receive waited for the late message: no empty poll first


def test_sqs_an_idle_source_receives_again_only_once_its_queue_holds_a_message(
    endpoint_url: str, tmp_path: Path
) -> None:
    """With the embedded endpoint's word on which queues hold a message to receive
    (QueueActivity), a quiet source (its receives came back empty, nothing running) sends no
    receive until its queue holds one, instead of one a second; then it gets it, and a delayed
    message once its delay is over. (The queue is the embedded endpoint's even when the suite
    runs SQS on LocalStack: this is what the embedded endpoint adds.)"""
    sqs = local_client("sqs", endpoint_url)
    url = sqs.create_queue(QueueName=f"idle-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    receives = Counter[str]()
    sqs.meta.events.register("before-call.sqs.ReceiveMessage", lambda **_: receives.update(["r"]))
    stop = threading.Event()
    activity = QueueActivity(endpoint_url, stop)
    activity.thread.start()
    recorder = FunctionRuntime(toy_function(tmp_path, RECORDER))
    poller = SqsPoller(SqsSource("F", "S", arn), recorder, sqs, url, stop, activity)
    poller.start()
    # The five pollers' first receives come back empty, and the source is quiet.
    eventually(
        lambda: receives["r"] >= INITIAL_SQS_POLLERS, bool, timeout_s=HANG_S, what="the first receives"
    )
    time.sleep(2 * POLL_WAIT_S)
    quiet = receives["r"]
    time.sleep(2 * POLL_WAIT_S)  # two receives without the endpoint's word
    assert receives["r"] == quiet
    sqs.send_message(QueueUrl=url, MessageBody="sent while idle")
    sqs.send_message(QueueUrl=url, MessageBody="delayed", DelaySeconds=1)

    def delivered() -> list[str]:
        return [body for call in calls_of(tmp_path) for body in call["bodies"]]

    run_pollers(poller, stop, lambda: sorted(delivered()) == ["delayed", "sent while idle"])
    assert delivered()[0] == "sent while idle"


def test_sqs_batch_size_caps_the_records_of_an_invocation(remote: dict[str, Any], tmp_path: Path) -> None:
    """An invocation gets at most BatchSize records; the rest go to the next invocations."""
    url, arn = queue(remote, "WebhookQueue")
    send(remote, url, *[f"m{i}" for i in range(7)])
    stop = threading.Event()
    source = SqsSource("F", "S", arn, batch_size=3, maximum_concurrency=1)
    poller = SqsPoller(source, FunctionRuntime(toy_function(tmp_path, RECORDER)), remote["sqs"], url, stop)
    run_pollers(poller, stop, lambda: sum(c["n"] for c in calls_of(tmp_path)) == 7)
    assert max(c["n"] for c in calls_of(tmp_path)) == 3
    assert sorted(b for c in calls_of(tmp_path) for b in c["bodies"]) == sorted(f"m{i}" for i in range(7))


def test_sqs_a_batch_over_six_mb_sends_what_fits_and_leaves_the_rest_for_the_next(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """An invocation's records stay within Lambda's 6 MB payload: of ten messages of 1 MB (SQS
    takes up to 1 MiB), those that do not fit are visible again at once and come in the next
    invocations, each once."""
    url, arn = queue(remote, "WebhookQueue")
    send(remote, url, *[f"{i}" + "x" * 999_999 for i in range(10)])
    sizes = """
        import json
        def handler(event, context):
            with open(__file__ + ".calls", "a") as calls:
                calls.write(json.dumps({"n": len(event["Records"]),
                                        "bodies": [r["body"][0] for r in event["Records"]]}) + "\\n")
    """
    stop = threading.Event()
    source = SqsSource("F", "S", arn, batch_size=10, maximum_concurrency=1)
    # A cap only a hang reaches: at 1 s, a run beside another test run timed out on every try
    # (a cold start and 6 MB of records to parse), and the records never came through.
    function = toy_function(tmp_path, sizes, timeout_s=30)
    poller = SqsPoller(source, FunctionRuntime(function), remote["sqs"], url, stop)
    run_pollers(poller, stop, lambda: sum(c["n"] for c in calls_of(tmp_path)) >= 10)
    assert sorted(b for c in calls_of(tmp_path) for b in c["bodies"]) == [str(i) for i in range(10)]
    assert max(c["n"] for c in calls_of(tmp_path)) <= 6


def test_sqs_batching_window_gathers_a_trickle_into_one_batch(remote: dict[str, Any], tmp_path: Path) -> None:
    """With MaximumBatchingWindowInSeconds, a poller waits up to the window to fill its batch, with few receives."""
    url, arn = queue(remote, "WebhookQueue")
    send(remote, url, "first")

    def trickle() -> None:
        for i in range(4):
            time.sleep(0.15)
            send(remote, url, f"then {i}")

    sender = threading.Thread(target=trickle)
    sender.start()
    receives = Counter[str]()
    remote["sqs"].meta.events.register("before-call.sqs.ReceiveMessage", lambda **_: receives.update(["r"]))
    source = SqsSource("F", "S", arn, batch_size=10, batching_window_s=1)
    poller = SqsPoller(
        source, FunctionRuntime(toy_function(tmp_path, RECORDER)), remote["sqs"], url, threading.Event()
    )
    started = time.monotonic()
    batch = poller.next_batch()
    sender.join()
    assert sorted(m["Body"] for m in batch) == ["first", "then 0", "then 1", "then 2", "then 3"]
    # The window is a minimum wait (real time, and never flaky: it cannot end sooner)
    assert time.monotonic() - started >= 1.0
    assert receives["r"] <= 1 + 4  # a receive a quarter second at most, not one per message


def held_poller(
    remote: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    messages: int,
    hold_s: float,
    **source: Any,
) -> tuple[SqsPoller, threading.Event]:
    """A poller of WebhookQueue holding `messages` messages, into a recorder that holds each
    invocation `hold_s`; and the event that stops it."""
    url, arn = queue(remote, "WebhookQueue")
    send(remote, url, *[f"m{i}" for i in range(messages)])
    monkeypatch.setenv("HOLD_S", str(hold_s))
    stop = threading.Event()
    runtime = FunctionRuntime(toy_function(tmp_path, RECORDER, timeout_s=5), concurrency=20)
    return SqsPoller(SqsSource("F", "S", arn, **source), runtime, remote["sqs"], url, stop), stop


def test_sqs_maximum_concurrency_caps_invocations_each_with_its_own_batch(
    remote: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ScalingConfig.MaximumConcurrency: at most that many invocations at once, each with a batch of its own."""
    poller, stop = held_poller(remote, tmp_path, monkeypatch, 12, 0.6, batch_size=2, maximum_concurrency=3)
    assert len(poller.threads) == 3
    run_pollers(poller, stop, lambda: sum(c["n"] for c in calls_of(tmp_path)) == 12)
    calls = calls_of(tmp_path)
    bodies = [b for c in calls for b in c["bodies"]]
    assert sorted(bodies) == sorted(f"m{i}" for i in range(12))  # each message in one batch only
    starts = sorted(c["at"] for c in calls)
    # Never more than three running: any four starts span at least one hold of 0.6 s
    assert all(starts[i + 3] - starts[i] >= 0.55 for i in range(len(starts) - 3))


def test_sqs_pollers_start_at_five_add_five_a_second_while_messages_remain_then_scale_back(
    remote: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lambda's scaling of a standard queue: five concurrent batches when messages are available,
    up to 300 more a minute while messages remain (capped by MaximumConcurrency), back to five
    when the queue is drained."""
    poller, stop = held_poller(remote, tmp_path, monkeypatch, 60, 1.0, batch_size=1, maximum_concurrency=12)
    assert poller.active == 5
    seen: list[tuple[float, int]] = []  # (monotonic time, pollers active)
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            seen.append((time.monotonic(), poller.active))
            watching.wait(0.05)

    watcher = threading.Thread(target=watch)
    began = time.monotonic()
    watcher.start()
    try:
        poller.start()
        eventually(
            lambda: sum(c["n"] for c in calls_of(tmp_path)) == 60, bool, timeout_s=HANG_S, what="60 calls"
        )
        eventually(
            lambda: poller.active, lambda active: active == 5, timeout_s=HANG_S, what="a scale back to 5"
        )
    finally:
        watching.set()
        watcher.join()
        stop.set()
        for thread in poller.threads:
            thread.join(timeout=5)
    assert max(active for _, active in seen) == 12  # grown to MaximumConcurrency, never past it
    # The first step up comes a second after work began: none before, whatever the machine's
    # load (read on the pollers' own count; the calls' start times also carry each sandbox's
    # cold start, and a loaded run's first five started later than a sixth).
    assert all(active == 5 for at, active in seen if at < began + 0.95)


def test_sqs_partial_batch_response_returns_only_the_reported_records(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """ReportBatchItemFailures: only the records listed in batchItemFailures return to the queue; the rest are deleted."""
    spec = toy_function(
        tmp_path,
        """
        def handler(event, context):
            return {"batchItemFailures": [
                {"itemIdentifier": r["messageId"]} for r in event["Records"] if r["body"] == "bad"]}
        """,
        timeout_s=5,
    )
    url, arn = queue(remote, "WebhookQueue")
    send(remote, url, "good", "bad", "good")
    source = SqsSource("F", "S", arn, batch_size=10, batching_window_s=0.5, report_batch_item_failures=True)
    poller = SqsPoller(source, FunctionRuntime(spec), remote["sqs"], url, threading.Event())
    batch = poller.next_batch()
    assert len(batch) == 3
    poller.deliver(batch)
    release(remote, url, batch)
    assert visible(remote, url) == ["bad"]


def release(remote: dict[str, Any], url: str, batch: list[Any]) -> None:
    """Makes a batch's messages that are still in the queue visible now, instead of after the
    queue's visibility timeout (deleted ones are gone and their receipts fail quietly)."""
    remote["sqs"].change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for i, m in enumerate(batch)
        ],
    )


def test_sqs_a_function_error_returns_the_whole_batch(remote: dict[str, Any], tmp_path: Path) -> None:
    """A function error (an exception) returns every record of the batch to the queue, reported failures or not."""
    spec = toy_function(tmp_path, "def handler(event, context):\n    raise RuntimeError('boom')\n")
    url, arn = queue(remote, "WebhookQueue")
    send(remote, url, "a", "b")
    source = SqsSource("F", "S", arn, batch_size=10, batching_window_s=0.5, report_batch_item_failures=True)
    poller = SqsPoller(source, FunctionRuntime(spec), remote["sqs"], url, threading.Event())
    batch = poller.next_batch()
    assert not poller.deliver(batch).ok
    release(remote, url, batch)
    assert visible(remote, url) == ["a", "b"]


def test_sqs_a_timed_out_invocation_s_messages_reappear_and_its_late_writes_never_land(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """The function's Timeout is enforced: at the deadline the sandbox is stopped (what the
    handler would have written next never lands), and the batch reappears after the visibility
    timeout."""
    spec = toy_function(
        tmp_path,
        """
        import os, time
        def handler(event, context):
            open(__file__ + ".pid", "w").write(str(os.getpid()))
            time.sleep(1.5)  # the handler's work, past its 1 s Timeout
            open(__file__ + ".late", "w").write("written after the timeout")
        """,
        timeout_s=1,
    )
    url, arn = queue(remote, "WebhookQueue")
    remote["sqs"].set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "2"})
    send(remote, url, "slow")
    with FunctionRuntime(spec) as runtime:
        poller = SqsPoller(SqsSource("F", "S", arn), runtime, remote["sqs"], url, threading.Event())
        started = time.monotonic()
        invocation = poller.deliver(poller.next_batch())
    assert invocation.timed_out
    assert invocation.error == "Task timed out after 1.00 seconds"
    # Real time is the point: the invocation ended at its 1 s Timeout, before the handler's 1.5 s
    assert invocation.duration_s < 1.5
    # The sandbox's process is gone: nothing of it runs on to write the file.
    pid = int((tmp_path / "app.py.pid").read_text())
    eventually(lambda: not process_exists(pid), bool, timeout_s=HANG_S, what="the timed-out sandbox stopped")
    assert not (tmp_path / "app.py.late").exists()
    # The message stayed invisible through the timeout: the long poll, begun as soon as the
    # invocation ended, gets it back no sooner than its visibility timeout after it was received.
    # (Not a read for "still invisible" at once: a CPU-starved run got there after the 2 s.)
    [back] = remote["sqs"].receive_message(QueueUrl=url, WaitTimeSeconds=3)["Messages"]
    assert back["Body"] == "slow"
    assert time.monotonic() - started >= 1.9  # not before the 2 s visibility timeout (a minimum)


def dead_letter(remote: dict[str, Any], task_id: str) -> None:
    """A TaskQueue message received maxReceiveCount times (each made visible again at once)."""
    url, _ = queue(remote, "TaskQueue")
    sqs = remote["sqs"]
    Queue(url, sqs).send(TaskMessage(task_id=task_id), group="acme")
    for _ in range(5):
        [message] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
        Queue(url, sqs).retry_later(message["ReceiptHandle"], 0)
    # The next receive finds nothing: SQS moves the message as a receive reaches it
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages", []) == []


def test_sqs_max_receive_count_moves_a_message_to_the_dlq(remote: dict[str, Any]) -> None:
    """The queue's RedrivePolicy (maxReceiveCount 5 for TaskQueue) moves a message received that often to its DLQ."""
    dlq_url, _ = queue(remote, "TaskDLQ")
    dead_letter(remote, "poison")
    [dead] = remote["sqs"].receive_message(QueueUrl=dlq_url, WaitTimeSeconds=1, VisibilityTimeout=0)[
        "Messages"
    ]
    assert TaskMessage.model_validate_json(dead["Body"]).task_id == "poison"


def test_sqs_redrive_start_and_list_message_move_tasks(remote: dict[str, Any]) -> None:
    """StartMessageMoveTask moves a DLQ's messages back to the queue they came from, each in its MessageGroupId (its tenant); ListMessageMoveTasks reports it."""
    url, _ = queue(remote, "TaskQueue")
    _, dlq_arn = queue(remote, "TaskDLQ")
    sqs = remote["sqs"]
    dead_letter(remote, "dead")
    sqs.start_message_move_task(SourceArn=dlq_arn)
    give_up = time.monotonic() + 30
    while (move := sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"][0])["Status"] == "RUNNING":
        assert time.monotonic() < give_up
        time.sleep(0.5)
    assert (move["Status"], move["ApproximateNumberOfMessagesMoved"]) == ("COMPLETED", 1)
    [back] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, MessageSystemAttributeNames=["All"])[
        "Messages"
    ]
    assert TaskMessage.model_validate_json(back["Body"]).task_id == "dead"
    assert back["Attributes"]["MessageGroupId"] == "acme"


def test_sqs_concurrent_receives_hand_each_message_to_one_poller(remote: dict[str, Any]) -> None:
    """Within its visibility timeout a message goes to one receiver only, however many poll at once, and no send is lost."""
    url, _ = queue(remote, "TaskQueue")
    sent = 300
    received: list[str] = []
    errors: list[BaseException] = []
    sqs = remote["sqs"]

    def send_some(first: int) -> None:
        for start in range(first, sent, 30):
            sqs.send_message_batch(
                QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{start + i}"} for i in range(10)]
            )

    def receive_and_delete() -> None:
        try:
            idle = 0
            while idle < 3:
                batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=120).get(
                    "Messages", []
                )
                idle = 0 if batch else idle + 1
                received.extend(m["Body"] for m in batch)
                for m in batch:
                    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=send_some, args=(first,)) for first in range(0, 30, 10)]
    threads += [threading.Thread(target=receive_and_delete) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=HANG_S)
    assert not [thread for thread in threads if thread.is_alive()]
    received += visible(remote, url)
    assert errors == []
    assert {body for body, n in Counter(received).items() if n > 1} == set()
    assert set(received) == {f"m{i}" for i in range(sent)}


def test_sqs_messages_keep_their_aws_trace_header_sent_alone_or_in_a_batch(remote: dict[str, Any]) -> None:
    """AWSTraceHeader, a message system attribute, comes back on receive whether the message went by SendMessage or SendMessageBatch."""
    url, _ = queue(remote, "WebhookQueue")
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"
    Queue(url, remote["sqs"]).send(TaskMessage(task_id="alone"), trace_header=header)
    Queue(url, remote["sqs"]).send_many(
        [TaskMessage(task_id=f"batched {i}") for i in range(3)], trace_header=header
    )
    received = remote["sqs"].receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"]
    )
    messages = received["Messages"]
    while len(messages) < 4:
        more = remote["sqs"].receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"]
        )
        messages += more.get("Messages", [])
    assert {m["Attributes"].get("AWSTraceHeader") for m in messages} == {header}


# --- SQS fair queues ----------------------------------------------------------------------------
# The embedded endpoint hands a standard queue's messages out as a fair queue does. LocalStack
# (2026.3) takes and returns MessageGroupId on a standard queue but hands messages out in arrival
# order: where the tests below run against it, they assert that instead (so a LocalStack that
# learns fair queues fails them, and the docs' note is updated).
FAIR = not os.environ.get("AWS_ENDPOINT_URL_SQS")


def send_as(remote: dict[str, Any], url: str, tenant: str, count: int) -> None:
    for start in range(0, count, 10):
        entries = [
            {"Id": str(i), "MessageBody": f"{tenant} {start + i}", "MessageGroupId": tenant}
            for i in range(min(10, count - start))
        ]
        remote["sqs"].send_message_batch(QueueUrl=url, Entries=entries)


def take(remote: dict[str, Any], url: str, count: int, *, visibility_s: int = 300) -> list[dict[str, Any]]:
    """`count` messages received (each in flight for `visibility_s`), in the order handed out."""
    taken: list[dict[str, Any]] = []
    for _ in range(count * 2):
        if len(taken) >= count:
            break
        reply = remote["sqs"].receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=min(10, count - len(taken)),
            VisibilityTimeout=visibility_s,
            MessageSystemAttributeNames=["All"],
        )
        taken += reply.get("Messages", [])
    return taken


def tenants(messages: list[dict[str, Any]]) -> list[str]:
    return [m["Body"].split()[0] for m in messages]


def test_sqs_fair_queue_a_quiet_tenant_comes_first_while_another_holds_most_in_flight_messages(
    remote: dict[str, Any],
) -> None:
    """A standard queue with MessageGroupIds is a fair queue: a tenant holding over 10% of the in-flight messages and at least 30 is noisy, and the quiet tenants' messages are handed out first, ahead of its backlog; each message says its group."""
    url, _ = queue(remote, "TaskQueue")
    send_as(remote, url, "flood", 80)
    assert tenants(take(remote, url, 35)) == ["flood"] * 35  # 35 in flight, all flood's
    send_as(remote, url, "quiet", 3)
    handed = take(remote, url, 10)
    assert {m["Attributes"]["MessageGroupId"] for m in handed} <= {"flood", "quiet"}
    if FAIR:
        assert tenants(handed) == ["quiet"] * 3 + ["flood"] * 7
    else:
        assert tenants(handed) == ["flood"] * 10
    # Nothing is dropped or held back: the backlog still comes out whole.
    rest = take(remote, url, 80 + 3 - 35 - 10)
    assert Counter(tenants(handed + rest)) == Counter({"flood": 80 - 35, "quiet": 3})


def test_sqs_fair_queue_below_thirty_in_flight_the_time_share_still_decides(remote: dict[str, Any]) -> None:
    """A tenant that took over 10% of the consumers' recent processing time is noisy even with nothing in flight: another tenant's newer messages come first."""
    url, _ = queue(remote, "TaskQueue")
    send_as(remote, url, "slow", 12)
    for message in take(remote, url, 2):
        remote["sqs"].delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    send_as(remote, url, "other", 2)
    handed = tenants(take(remote, url, 4))
    assert handed == (["other"] * 2 + ["slow"] * 2 if FAIR else ["slow"] * 4)


def test_sqs_fair_queue_of_two_noisy_tenants_the_one_with_fewer_in_flight_comes_first(
    remote: dict[str, Any],
) -> None:
    """When several tenants are noisy, the one with the fewest messages in flight is served first."""
    url, _ = queue(remote, "TaskQueue")
    send_as(remote, url, "big", 50)
    assert tenants(take(remote, url, 50)) == ["big"] * 50
    send_as(remote, url, "mid", 32)
    assert tenants(take(remote, url, 32)) == ["mid"] * 32
    send_as(remote, url, "big", 5)  # both noisy now: big 50 in flight, mid 32
    send_as(remote, url, "mid", 5)
    handed = tenants(take(remote, url, 10))
    assert handed == (["mid"] * 5 + ["big"] * 5 if FAIR else ["big"] * 5 + ["mid"] * 5)


# --- DynamoDB streams ---------------------------------------------------------------------------


def streams(remote: dict[str, Any]) -> tuple[Any, str]:
    return boto3.client("dynamodbstreams"), remote["resources"].attributes[("TasksTable", "StreamArn")]


def put(remote: dict[str, Any], pk: str, **attributes: str) -> None:
    item = {"pk": {"S": pk}, **{name: {"S": value} for name, value in attributes.items()}}
    remote["dynamodb"].put_item(TableName=remote["resources"].table_names["TasksTable"], Item=item)


STREAM_RECORDER = """
    import json
    def handler(event, context):
        keys = [r["dynamodb"]["Keys"]["pk"]["S"] for r in event["Records"]]
        with open(__file__ + ".calls", "a") as calls:
            calls.write(json.dumps({"n": len(keys), "keys": keys}) + "\\n")
"""


def stream_keys(directory: Path) -> list[str]:
    return [k for c in calls_of(directory) for k in c["keys"]]


@pytest.mark.parametrize(
    ("position", "expected"), [("TRIM_HORIZON", ["before", "after"]), ("LATEST", ["after"])]
)
def test_streams_starting_position(
    remote: dict[str, Any], tmp_path: Path, position: str, expected: list[str]
) -> None:
    """StartingPosition: TRIM_HORIZON reads the records written before the mapping started; LATEST only later ones."""
    client, arn = streams(remote)
    put(remote, "before")
    stop = threading.Event()
    source = StreamSource("F", "S", arn, starting_position=position)
    poller = StreamPoller(source, FunctionRuntime(toy_function(tmp_path, STREAM_RECORDER)), client, stop)
    reading = threading.Event()  # its first read, once it has taken every shard's iterator
    client.meta.events.register("before-call.dynamodb-streams.GetRecords", lambda **_: reading.set())
    poller.start()
    assert reading.wait(HANG_S)
    put(remote, "after")
    run_pollers(poller, stop, lambda: "after" in stream_keys(tmp_path))
    assert stream_keys(tmp_path) == expected


def test_streams_a_record_reaches_the_function_as_lambda_sends_it(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """The record as GetRecords' wire has it, as Lambda hands it on: a blob in base64, the
    creation time in epoch seconds, the stream's ARN and region added."""
    client, arn = streams(remote)
    stop = threading.Event()
    source = StreamSource("F", "S", arn, starting_position="TRIM_HORIZON")
    recorder = """
        import json
        def handler(event, context):
            with open(__file__ + ".calls", "a") as calls:
                calls.write(json.dumps({"records": event["Records"]}) + "\\n")
    """
    poller = StreamPoller(source, FunctionRuntime(toy_function(tmp_path, recorder)), client, stop)
    item = {"pk": {"S": "blob"}, "data": {"B": b"\x00\xffbytes"}}
    remote["dynamodb"].put_item(TableName=remote["resources"].table_names["TasksTable"], Item=item)
    run_pollers(poller, stop, lambda: bool(calls_of(tmp_path)))
    [record] = [r for call in calls_of(tmp_path) for r in call["records"]]
    assert record["eventName"] == "INSERT"
    assert record["dynamodb"]["NewImage"]["data"] == {"B": base64.b64encode(b"\x00\xffbytes").decode()}
    assert isinstance(record["dynamodb"]["ApproximateCreationDateTime"], int | float)
    assert (record["eventSourceARN"], record["awsRegion"]) == (arn, "us-east-1")


def test_streams_filter_criteria_pass_only_matching_records(remote: dict[str, Any], tmp_path: Path) -> None:
    """FilterCriteria: only records matching a pattern reach the function; the others are dropped, not retried."""
    client, arn = streams(remote)
    stop = threading.Event()
    pattern = json.dumps({"dynamodb": {"NewImage": {"kind": {"S": ["wanted"]}}}})
    source = StreamSource("F", "S", arn, starting_position="TRIM_HORIZON", filter_patterns=(pattern,))
    poller = StreamPoller(source, FunctionRuntime(toy_function(tmp_path, STREAM_RECORDER)), client, stop)
    for i in range(3):
        put(remote, f"other {i}", kind="other")
        put(remote, f"wanted {i}", kind="wanted")
    run_pollers(poller, stop, lambda: len(stream_keys(tmp_path)) == 3)
    assert stream_keys(tmp_path) == ["wanted 0", "wanted 1", "wanted 2"]


def test_streams_batch_size_caps_the_records_of_an_invocation(remote: dict[str, Any], tmp_path: Path) -> None:
    """A stream invocation gets at most BatchSize records, in order."""
    client, arn = streams(remote)
    for i in range(5):
        put(remote, f"r{i}")
    stop = threading.Event()
    source = StreamSource("F", "S", arn, starting_position="TRIM_HORIZON", batch_size=2)
    poller = StreamPoller(source, FunctionRuntime(toy_function(tmp_path, STREAM_RECORDER)), client, stop)
    run_pollers(poller, stop, lambda: len(stream_keys(tmp_path)) == 5)
    assert stream_keys(tmp_path) == [f"r{i}" for i in range(5)]
    assert [c["n"] for c in calls_of(tmp_path)] == [2, 2, 1]


def test_streams_an_idle_source_reads_again_only_once_its_table_has_taken_a_record(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """With the embedded endpoint's count of its streams' records (StreamActivity), a source
    whose last read found nothing reads the stream again once its table has taken a record, and
    gets that record, instead of reading four times a second for nothing."""
    client, arn = streams(remote)
    table = remote["resources"].table_names["TasksTable"]
    reads = Counter[str]()
    client.meta.events.register("before-call.dynamodbstreams.GetRecords", lambda **_: reads.update(["read"]))
    stop = threading.Event()
    activity = StreamActivity(client.meta.endpoint_url, stop)
    activity.thread.start()
    eventually(
        lambda: activity.count(table) is not None,
        bool,
        timeout_s=HANG_S,
        what="the endpoint's count of its records",
    )
    source = StreamSource("F", "S", arn, starting_position="TRIM_HORIZON")
    recorder = FunctionRuntime(toy_function(tmp_path, STREAM_RECORDER))
    poller = StreamPoller(source, recorder, client, stop, activity=activity)
    poller.start()
    eventually(lambda: reads["read"] > 0, bool, timeout_s=HANG_S, what="the first read")
    time.sleep(4 * STREAM_IDLE_S)  # four more reads without the count
    assert reads["read"] == 1
    put(remote, "written while idle")
    run_pollers(poller, stop, lambda: stream_keys(tmp_path) == ["written while idle"])
    assert reads["read"] <= 3  # the one that found it, and perhaps one that found nothing after


def test_streams_a_batch_over_six_mb_reaches_the_function_in_invocations_within_it(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """A stream batch whose event would be over Lambda's 6 MB invocation payload reaches the
    function in invocations each within it, in order, nothing lost (the records are read
    BatchSize at a time, and sent as fewer when they would not fit)."""
    client, arn = streams(remote)
    table = remote["resources"].table_names["TasksTable"]
    for i in range(20):
        put(remote, f"big{i}", pad="x" * 180_000)
        remote["dynamodb"].update_item(  # a record of two images: about 360 KB
            TableName=table,
            Key={"pk": {"S": f"big{i}"}},
            UpdateExpression="SET #pad = :pad",
            ExpressionAttributeNames={"#pad": "pad"},
            ExpressionAttributeValues={":pad": {"S": "y" * 180_000}},
        )
    stop = threading.Event()
    source = StreamSource("F", "S", arn, starting_position="TRIM_HORIZON", batch_size=100)
    poller = StreamPoller(source, FunctionRuntime(toy_function(tmp_path, STREAM_RECORDER)), client, stop)
    run_pollers(poller, stop, lambda: len(stream_keys(tmp_path)) == 40)
    # Forty records of about 11 MB in all, read as one batch, came in order in more than one
    assert stream_keys(tmp_path) == [key for i in range(20) for key in (f"big{i}", f"big{i}")]
    assert len(calls_of(tmp_path)) >= 2


def test_streams_retries_then_the_on_failure_destination_gets_the_batch(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """MaximumRetryAttempts: a failing batch is retried that often, then its range goes to the OnFailure destination and the shard moves on."""
    spec = toy_function(
        tmp_path,
        """
        import json
        def handler(event, context):
            keys = [r["dynamodb"]["Keys"]["pk"]["S"] for r in event["Records"]]
            with open(__file__ + ".calls", "a") as calls:
                calls.write(json.dumps({"n": len(keys), "keys": keys}) + "\\n")
            if "poison" in keys:
                raise RuntimeError("cannot handle it")
        """,
        timeout_s=5,
    )
    client, arn = streams(remote)
    destination_url, destination_arn = queue(remote, "WebhookDLQ")
    put(remote, "poison")
    stop = threading.Event()
    source = StreamSource(
        "F", "S", arn, "TRIM_HORIZON", batch_size=10, maximum_retry_attempts=2, on_failure_arn=destination_arn
    )
    poller = StreamPoller(
        source, FunctionRuntime(spec), client, stop, queue_destination(remote["sqs"], destination_url)
    )
    poller.start()
    # The first try and two retries
    eventually(lambda: stream_keys(tmp_path).count("poison"), lambda n: n == 3, timeout_s=HANG_S)
    put(remote, "next")
    run_pollers(poller, stop, lambda: "next" in stream_keys(tmp_path))
    assert stream_keys(tmp_path) == ["poison"] * 3 + ["next"]
    [note] = remote["sqs"].receive_message(QueueUrl=destination_url, WaitTimeSeconds=2)["Messages"]
    info = json.loads(note["Body"])
    assert info["requestContext"]["condition"] == "RetryAttemptsExhausted"
    assert (info["DDBStreamBatchInfo"]["streamArn"], info["DDBStreamBatchInfo"]["batchSize"]) == (arn, 1)


def test_streams_bisect_batch_on_function_error_isolates_the_bad_record(tmp_path: Path) -> None:
    """BisectBatchOnFunctionError: a failing batch is split in halves until the bad record stands alone; only it is given up on."""
    spec = toy_function(
        tmp_path,
        """
        import json
        def handler(event, context):
            numbers = [r["dynamodb"]["SequenceNumber"] for r in event["Records"]]
            with open(__file__ + ".calls", "a") as calls:
                calls.write(json.dumps(numbers) + "\\n")
            if "3" in numbers:
                raise RuntimeError("a poison record")
        """,
    )
    skipped: list[dict[str, Any]] = []

    def poller(bisect: bool) -> StreamPoller:
        source = StreamSource("F", "S", "arn:stream", maximum_retry_attempts=1, bisect_on_error=bisect)
        return StreamPoller(source, FunctionRuntime(spec), None, threading.Event(), skipped.append)  # type: ignore[arg-type]

    records = [{"dynamodb": {"SequenceNumber": str(n)}} for n in range(1, 7)]
    calls = tmp_path / "app.py.calls"
    assert poller(bisect=True).deliver(records) is True
    invoked = [json.loads(line) for line in calls.read_text().splitlines()]
    assert invoked == [
        ["1", "2", "3", "4", "5", "6"],
        ["1", "2", "3"],
        ["1"],
        ["2", "3"],
        ["2"],
        ["3"],
        ["3"],
        ["4", "5", "6"],
    ]
    assert [note["DDBStreamBatchInfo"]["startSequenceNumber"] for note in skipped] == ["3"]
    calls.unlink()
    skipped.clear()
    poller(bisect=False).deliver(records)
    assert [note["DDBStreamBatchInfo"]["batchSize"] for note in skipped] == [
        6
    ]  # without it, all six skipped together


# --- DynamoDB TTL -------------------------------------------------------------------------------


def test_ttl_deletes_expired_items_and_the_stream_shows_removes(remote: dict[str, Any]) -> None:
    """TTL: items past their TimeToLiveSpecification attribute are deleted on a schedule and appear on the stream as REMOVE records."""
    resources = remote["resources"]
    table, attribute = resources.table_names["TasksTable"], resources.ttl_attributes["TasksTable"]
    assert attribute == "expires_at"  # as template.yaml declares it
    client, arn = streams(remote)
    shard = client.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = client.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="LATEST")[
        "ShardIterator"
    ]
    now = int(time.time())
    for pk, expires_at in {"task#gone": now - 10, "task#kept": now + 3600}.items():
        remote["dynamodb"].put_item(
            TableName=table, Item={"pk": {"S": pk}, "expires_at": {"N": str(expires_at)}}
        )
    remote["dynamodb"].put_item(TableName=table, Item={"pk": {"S": "tenant#no-ttl"}})
    sweeper = TtlSweeper(remote["dynamodb"], [TtlTable(table, attribute)])
    assert sweeper.sweep() == 1
    assert sweeper.sweep() == 0  # nothing left to do
    left = {item["pk"]["S"] for item in remote["dynamodb"].scan(TableName=table)["Items"]}
    assert left == {"task#kept", "tenant#no-ttl"}
    records = client.get_records(ShardIterator=iterator)["Records"]
    removes = [
        (r["eventName"], r["dynamodb"]["Keys"]["pk"]["S"]) for r in records if r["eventName"] == "REMOVE"
    ]
    assert removes == [("REMOVE", "task#gone")]


# --- DynamoDB conditional writes -----------------------------------------------------------------


def test_dynamodb_a_refused_conditional_update_returns_the_item_as_it_stood(remote: dict[str, Any]) -> None:
    """UpdateItem with ReturnValuesOnConditionCheckFailure ALL_OLD: the ConditionalCheckFailedException carries the item as it was, so a refused take of a place needs no read to learn who holds them (DynamoDB API reference, UpdateItem)."""
    table = remote["resources"].table_names["LimitsTable"]
    held = {"pk": {"S": "webhook#https://h.example"}, "t_msg_1": {"N": "1800000000"}, "n": {"N": "1"}}
    remote["dynamodb"].put_item(TableName=table, Item=held)
    with pytest.raises(remote["dynamodb"].exceptions.ConditionalCheckFailedException) as refused:
        remote["dynamodb"].update_item(
            TableName=table,
            Key={"pk": held["pk"]},
            UpdateExpression="SET #n = #n + :one",
            ConditionExpression="#n < :cap",
            ExpressionAttributeNames={"#n": "n"},
            ExpressionAttributeValues={":one": {"N": "1"}, ":cap": {"N": "1"}},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    assert refused.value.response["Item"] == held


# --- Lambda runtime: sandboxes ------------------------------------------------------------------


def test_lambda_each_function_gets_its_own_environment_from_the_template(tmp_path: Path) -> None:
    """Two functions set one variable differently: each sandbox sees its own function's value
    (the everyday SAM pattern; a process shared by all functions could hold only one)."""
    body = (
        "import os\ndef handler(event, context):\n    return [os.environ['STAGE'], context.function_name]\n"
    )
    (tmp_path / "f").mkdir()
    (tmp_path / "g").mkdir()
    f = dataclasses.replace(toy_function(tmp_path / "f", body), environment={"STAGE": "blue"})
    g = dataclasses.replace(
        toy_function(tmp_path / "g", body), logical_id="G", environment={"STAGE": "green"}
    )
    with FunctionRuntime(f) as first, FunctionRuntime(g) as second:
        assert first.invoke({}).payload == ["blue", "F"]
        assert second.invoke({}).payload == ["green", "G"]


def test_lambda_module_globals_live_as_long_as_their_sandbox_and_are_never_shared(tmp_path: Path) -> None:
    """A warm sandbox keeps its module's globals across invocations; two sandboxes at once are
    two processes, each with its own."""
    spec = toy_function(
        tmp_path,
        """
        import os, time
        calls = []
        def handler(event, context):
            calls.append(1)
            while event.get("hold") and not os.path.exists(event["hold"]):
                time.sleep(0.01)  # held until the test lets go, so both sandboxes are busy at once
            return [len(calls), os.getpid()]
        """,
        timeout_s=30,
    )
    release = tmp_path / "release"
    with FunctionRuntime(spec, concurrency=2) as runtime, ThreadPoolExecutor(2) as pool:
        held = [pool.submit(runtime.invoke, {"hold": str(release)}) for _ in range(2)]
        eventually(lambda: len(runtime.sandboxes) == 2, bool, timeout_s=HANG_S, what="two sandboxes")
        release.touch()
        (count_a, pid_a), (count_b, pid_b) = (future.result().payload for future in held)
        assert (count_a, count_b) == (1, 1)
        assert pid_a != pid_b != os.getpid()
        again = runtime.invoke({}).payload
    assert again in ([2, pid_a], [2, pid_b])  # a warm sandbox, its state kept


def test_lambda_a_sandbox_past_its_memory_size_ends_with_lambda_s_out_of_memory_error(tmp_path: Path) -> None:
    """MemorySize is enforced: a sandbox whose memory grows past it is stopped, the invocation
    ends with Runtime.OutOfMemory, and the next one gets a fresh sandbox."""
    spec = toy_function(
        tmp_path,
        """
        import os, time
        def handler(event, context):
            if event.get("grow"):
                kept = [bytearray(2**20) for _ in range(event["grow"])]  # resident, page by page
                time.sleep(2)  # the handler's work, holding what it took
                open(__file__ + ".late", "w").write("survived")
            return os.getpid()
        """,
        timeout_s=10,
    )
    assert spec.memory_mb == 128
    with FunctionRuntime(spec) as runtime:
        first = runtime.invoke({})
        grown = runtime.invoke({"grow": 300})
        after = runtime.invoke({})
    assert first.ok
    assert after.ok
    assert grown.error == "Runtime.OutOfMemory: Runtime exited with error: signal: killed"
    assert grown.max_memory_mb > 128
    assert after.payload != first.payload  # a new sandbox: the old process is gone
    assert not (tmp_path / "app.py.late").exists()


LOGGING = """
    import os
    from aws_lambda_powertools import Logger
    logger = Logger(service="toy")
    @logger.inject_lambda_context
    def handler(event, context):
        for n in range(20):
            logger.info("step", n=n)
        return context.aws_request_id
"""


def test_lambda_a_response_over_its_limit_fails_the_invocation_and_the_next_gets_a_new_sandbox(
    tmp_path: Path,
) -> None:
    """A synchronous response of at most 6,291,556 bytes is returned; one byte more fails the
    invocation with Function.ResponseSizeTooLarge (the runtime client is refused with a 413 and
    its process ends), and the next invocation starts a new sandbox."""
    spec = toy_function(tmp_path, 'def handler(event, context):\n    return "x" * event["n"]\n', timeout_s=10)
    with FunctionRuntime(spec) as runtime:
        fits = runtime.invoke({"n": 6_291_556 - 2})  # two bytes of JSON quotes
        assert fits.ok
        assert len(fits.payload) == 6_291_554
        over = runtime.invoke({"n": 6_291_556 - 1})
        assert over.error == (
            "Function.ResponseSizeTooLarge: Response payload size exceeded maximum allowed payload"
            " size (6291556 bytes)."
        )
        after = runtime.invoke({"n": 3})
        assert (after.payload, after.init_s is not None) == ("xxx", True)


def test_lambda_log_lines_name_their_own_function_and_request_under_concurrency(tmp_path: Path) -> None:
    """Each sandbox's lines carry its own function's name and its invocation's request id, with
    two functions' sandboxes logging at once."""
    lines: list[str] = []
    functions = {}
    for name in ("F", "G"):
        (tmp_path / name).mkdir()
        toy = toy_function(tmp_path / name, LOGGING, requirements=("aws-lambda-powertools",))
        functions[name] = dataclasses.replace(toy, logical_id=name)
    with (
        FunctionRuntime(functions["F"], concurrency=4, on_line=lines.append) as f,
        FunctionRuntime(functions["G"], concurrency=4, on_line=lines.append) as g,
        ThreadPoolExecutor(8) as pool,
    ):
        runs = [(name, pool.submit((f if name == "F" else g).invoke, {})) for name in "FG" * 8]
        requests = {future.result().payload: name for name, future in runs}
    records = [json.loads(line) for line in lines if line.startswith("{")]
    steps = [record for record in records if record.get("message") == "step"]
    assert len(steps) == 16 * 20
    assert {(record["function_request_id"], record["function_name"]) for record in steps} == set(
        requests.items()
    )


def test_lambda_hot_reload_a_changed_handler_runs_at_the_next_cold_start(tmp_path: Path) -> None:
    """A change under the function's code is seen: idle sandboxes are retired, a busy one ends
    its invocation on the old code, and the next invocation runs the new code."""
    code = """
        import os, time
        def handler(event, context):
            if event.get("hold"):
                open(event["hold"] + ".held", "w").close()  # this sandbox runs this version's code
            while event.get("hold") and not os.path.exists(event["hold"]):
                time.sleep(0.01)  # held until the test lets go: a busy sandbox
            return ["{version}", os.getpid()]
    """
    (tmp_path / "code").mkdir()
    spec = toy_function(tmp_path / "code", code.format(version="v1"), timeout_s=30)
    watcher = CodeWatch({"F": spec})
    said: list[str] = []
    release = tmp_path / "release"
    with FunctionRuntime(spec, concurrency=3) as runtime, ThreadPoolExecutor(1) as pool:
        busy = pool.submit(runtime.invoke, {"hold": str(release)})
        # Its handler running, not only its sandbox started: a cold start that had not imported
        # the module yet when v2 was written (a loaded clean-clone run) ran v2
        held = tmp_path / "release.held"
        eventually(held.exists, bool, timeout_s=HANG_S, what="a busy sandbox in v1's handler")
        assert len(runtime.sandboxes) == 1
        version, idle_pid = runtime.invoke({}).payload  # a second sandbox, idle after this
        assert version == "v1"
        toy_function(tmp_path / "code", code.format(version="v2"))
        hot_reload.watch(watcher, lambda name: runtime.reload(), said.append)
        assert said == [f"Reloaded F: {spec.code_dir} changed; its next invocation starts on the new code"]
        version, new_pid = runtime.invoke({}).payload
        assert (version, process_exists(idle_pid)) == ("v2", False)  # the idle one was retired
        release.touch()
        assert busy.result().payload[0] == "v1"  # it finished on the code it started with
        assert runtime.invoke({}).payload == ["v2", new_pid]  # and was retired, not reused
        assert len(runtime.sandboxes) == 1
    assert watcher.changed() == []  # nothing changed since


# --- The AWS APIs the local endpoint serves beyond moto's -------------------------------------
# Each API, the AWS reference it follows, and where it is tested. Lambda's is the stack's own
# (emulator/lambda_api.py), tested below with boto3's Lambda client; CloudWatch Logs and
# CloudWatch are moto's, fed by the stack (emulator/log_groups.py, emulator/metrics.py), tested
# in tests/local/test_cloudwatch.py and with the AWS CLI in tests/e2e/test_aws_apis.py.
#
# | API | reference |
# |---|---|
# | lambda ListFunctions | https://docs.aws.amazon.com/lambda/latest/api/API_ListFunctions.html |
# | lambda GetFunction | https://docs.aws.amazon.com/lambda/latest/api/API_GetFunction.html |
# | lambda GetFunctionConfiguration | https://docs.aws.amazon.com/lambda/latest/api/API_GetFunctionConfiguration.html |
# | lambda Invoke | https://docs.aws.amazon.com/lambda/latest/api/API_Invoke.html |
# | lambda, asynchronous invocation | https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-error-handling.html |
# | lambda ListEventSourceMappings | https://docs.aws.amazon.com/lambda/latest/api/API_ListEventSourceMappings.html |
# | lambda GetEventSourceMapping | https://docs.aws.amazon.com/lambda/latest/api/API_GetEventSourceMapping.html |
# | lambda UpdateEventSourceMapping | https://docs.aws.amazon.com/lambda/latest/api/API_UpdateEventSourceMapping.html |
# | logs PutLogEvents (the stack), GetLogEvents, FilterLogEvents, `aws logs tail` | https://docs.aws.amazon.com/AmazonCloudWatchLogs/latest/APIReference/API_FilterLogEvents.html |
# | logs, a function's log group and streams | https://docs.aws.amazon.com/lambda/latest/dg/monitoring-cloudwatchlogs.html |
# | cloudwatch PutMetricData (the stack), GetMetricStatistics, GetMetricData | https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_GetMetricStatistics.html |
# | cloudwatch, Lambda's own metrics | https://docs.aws.amazon.com/lambda/latest/dg/monitoring-metrics-types.html |
# | cloudwatch, EMF | https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html |
# | cloudwatch DescribeAlarms (the template's, provisioned) | https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_DescribeAlarms.html |

FLAKY = """
    import json, os
    def handler(event, context):
        with open(__file__ + ".calls", "a") as calls:
            calls.write(json.dumps({"request_id": context.aws_request_id, "event": event}) + "\\n")
        print("handling", json.dumps(event))
        if event.get("fail"):
            raise ValueError("told to fail")
        return {"echo": event}
"""


@contextmanager
def lambda_api(
    runtimes: dict[str, FunctionRuntime],
    pollers: list[SqsPoller | StreamPoller] | None = None,
    *,
    journal: Path | None = None,
    destination: Any = lambda _: None,
    said: list[str] | None = None,
) -> Iterator[Any]:
    """A boto3 Lambda client of the stack's Lambda API over these runtimes and pollers."""
    stop = threading.Event()
    events = EventInvocations(
        runtimes,
        stop,
        retry_base_s=0.05,
        destination=destination,
        say=(said if said is not None else []).append,
    )
    events.start()
    api = LambdaApi(runtimes, EventSourceMappings(pollers or [], journal=journal), events)
    try:
        with serve(api.app()) as url:
            # Unchecked on the client's side: the API's own checks are under test. Credentials of
            # its own: boto3's default session keeps the first it finds, so without them the
            # client signed only after another test had set some (a NoCredentialsError when this
            # test came first in its process).
            unchecked = Config(parameter_validation=False)
            yield boto3.client(
                "lambda",
                endpoint_url=url,
                region_name="us-east-1",
                config=unchecked,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
    finally:
        stop.set()
        for runtime in runtimes.values():
            runtime.close()


def test_lambda_list_functions_and_get_function_configuration_describe_template_yaml(
    remote: dict[str, Any],
) -> None:
    """ListFunctions, GetFunction and GetFunctionConfiguration (by name, ARN or partial ARN)
    return each function's Runtime, Handler, MemorySize, Timeout, Architectures and the
    Environment it is given; an unknown function or version is ResourceNotFoundException."""
    functions = template_functions(remote["resources"])
    with lambda_api({name: FunctionRuntime(spec) for name, spec in functions.items()}) as client:
        listed = client.list_functions()["Functions"]
        assert [f["FunctionName"] for f in listed] == list(functions)
        paged = client.list_functions(MaxItems=2)
        assert len(paged["Functions"]) == 2
        assert client.list_functions(Marker=paged["NextMarker"])["Functions"] == listed[2:]
        worker = functions["WorkerFunction"]
        arn = f"arn:aws:lambda:us-east-1:123456789012:function:{worker.logical_id}"
        for name in (worker.logical_id, arn, f"123456789012:function:{worker.logical_id}"):
            config = client.get_function_configuration(FunctionName=name)
            assert (config["FunctionArn"], config["Runtime"], config["Handler"]) == (
                arn,
                "python3.12",
                worker.handler,
            )
            assert (config["Timeout"], config["MemorySize"]) == (worker.timeout_s, worker.memory_mb)
            assert config["Architectures"] == ["arm64"]
            assert config["Environment"]["Variables"] == worker.environment
        assert client.get_function(FunctionName=arn)["Configuration"]["CodeSha256"] == config["CodeSha256"]
        for missing in ({"FunctionName": "NoSuchFunction"}, {"FunctionName": arn, "Qualifier": "7"}):
            with pytest.raises(client.exceptions.ResourceNotFoundException):
                client.get_function_configuration(**missing)


def test_lambda_invoke_request_response_returns_the_payload_or_the_error_and_tails_the_log(
    tmp_path: Path,
) -> None:
    """Invoke (RequestResponse) returns the handler's reply; a handler that raises answers 200
    with X-Amz-Function-Error: Unhandled and Lambda's error object; LogType Tail returns the
    invocation's log, START to REPORT, base64, at most 4 KB."""
    with lambda_api({"F": FunctionRuntime(toy_function(tmp_path, FLAKY))}) as client:
        reply = client.invoke(FunctionName="F", Payload=json.dumps({"n": 1}), LogType="Tail")
        assert (reply["StatusCode"], reply.get("FunctionError")) == (200, None)
        assert json.loads(reply["Payload"].read()) == {"echo": {"n": 1}}
        request_id = reply["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]
        log = base64.b64decode(reply["LogResult"]).decode().splitlines()
        assert log[0] == f"START RequestId: {request_id} Version: $LATEST"
        assert log[-1].startswith(f"REPORT RequestId: {request_id}")
        assert f"END RequestId: {request_id}" in log
        failed = client.invoke(
            FunctionName="F", Payload=json.dumps({"fail": True, "pad": "x" * 5000}), LogType="Tail"
        )
        assert (failed["StatusCode"], failed["FunctionError"]) == (200, "Unhandled")
        error = json.loads(failed["Payload"].read())
        assert (error["errorType"], error["errorMessage"]) == ("ValueError", "told to fail")
        assert error["stackTrace"]
        tail = base64.b64decode(failed["LogResult"])
        assert len(tail) <= 4096
        assert tail.decode().splitlines()[-1].startswith("REPORT RequestId")
        assert "LogResult" not in client.invoke(FunctionName="F", Payload=b"{}")


def test_lambda_invoke_dry_run_and_bad_input_get_lambda_s_error_codes(tmp_path: Path) -> None:
    """DryRun checks and runs nothing (204); a payload that is not JSON is
    InvalidRequestContentException, one over 6 MB (1 MB for Event) RequestTooLargeException, an
    unknown function ResourceNotFoundException, a LogType Tail on an Event invocation
    InvalidParameterValueException; none runs the function."""
    with lambda_api({"F": FunctionRuntime(toy_function(tmp_path, FLAKY))}) as client:
        assert client.invoke(FunctionName="F", InvocationType="DryRun", Payload=b"{}")["StatusCode"] == 204
        refusals = [
            ("InvalidRequestContentException", {"FunctionName": "F", "Payload": b"{not json"}),
            ("RequestTooLargeException", {"FunctionName": "F", "Payload": b'"' + b"x" * (6 * 2**20) + b'"'}),
            (
                "RequestTooLargeException",
                {"FunctionName": "F", "InvocationType": "Event", "Payload": b'"' + b"x" * 2**20 + b'"'},
            ),
            ("ResourceNotFoundException", {"FunctionName": "G", "Payload": b"{}"}),
            (
                "InvalidParameterValueException",
                {"FunctionName": "F", "InvocationType": "Event", "LogType": "Tail"},
            ),
        ]
        for code, call in refusals:
            with pytest.raises(client.exceptions.ClientError) as refused:
                client.invoke(**call)
            assert refused.value.response["Error"]["Code"] == code, call.keys()
    assert calls_of(tmp_path) == []


def test_lambda_invoke_event_is_retried_twice_then_sent_to_its_on_failure_destination(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """Invoke (Event) answers 202 at once and runs the function in the background; one that
    raises is tried twice more under the same request id (EventInvokeConfig's
    MaximumRetryAttempts), then its record (condition RetriesExhausted) goes to the function's
    SQS on-failure destination; without one, a line says it was dropped."""
    url, arn = queue(remote, "WebhookRelayDLQ")
    spec = dataclasses.replace(toy_function(tmp_path, FLAKY), event_invoke=EventInvokeConfig(2, "SQS", arn))
    sent: list[dict[str, Any]] = []
    said: list[str] = []
    kept = queue_destination(remote["sqs"], url)
    with lambda_api(
        {"F": FunctionRuntime(spec)},
        destination=lambda s: (
            (lambda note: (sent.append(note), kept(note))) if s.event_invoke.on_failure_arn else None
        ),
        said=said,
    ) as client:
        ok = client.invoke(FunctionName="F", InvocationType="Event", Payload=json.dumps({"n": 1}))
        assert ok["StatusCode"] == 202
        failing = client.invoke(FunctionName="F", InvocationType="Event", Payload=json.dumps({"fail": True}))
        request_id = failing["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]
        eventually(lambda: sent, bool, timeout_s=HANG_S, what="the on-failure record")
    tries = [call for call in calls_of(tmp_path) if call["event"].get("fail")]
    assert [call["request_id"] for call in tries] == [request_id] * 3
    [record] = sent
    assert record["requestContext"]["condition"] == "RetriesExhausted"
    assert record["requestContext"]["approximateInvokeCount"] == 3
    assert record["requestPayload"] == {"fail": True}
    assert record["responsePayload"]["errorMessage"] == "told to fail"
    assert [json.loads(body)["requestContext"]["requestId"] for body in visible(remote, url)] == [request_id]
    assert [call["event"] for call in calls_of(tmp_path) if not call["event"].get("fail")] == [{"n": 1}]
    # Without a destination, the failure is said and the record dropped
    (tmp_path / "app.py.calls").unlink()
    with lambda_api({"F": FunctionRuntime(toy_function(tmp_path, FLAKY))}, said=said) as client:
        failing = client.invoke(FunctionName="F", InvocationType="Event", Payload=json.dumps({"fail": True}))
        request_id = failing["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]
        eventually(lambda: said, bool, timeout_s=HANG_S, what="the dropped line")
    assert len(calls_of(tmp_path)) == 3
    assert said == [
        f"[F] Event invocation {request_id} failed 3 time(s) (ValueError: told to fail); dropped: the"
        " function has no SQS on-failure destination"
    ]


def test_lambda_event_source_mapping_paused_takes_no_message_until_resumed(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """ListEventSourceMappings and GetEventSourceMapping show each source's settings;
    UpdateEventSourceMapping with Enabled false pauses it (no message is taken until Enabled
    true), and a new BatchSize reaches the running poller. Bad values are
    InvalidParameterValueException and change nothing."""
    url, arn = queue(remote, "WebhookQueue")
    stop = threading.Event()
    runtime = FunctionRuntime(toy_function(tmp_path, RECORDER))
    poller = SqsPoller(SqsSource("F", "S", arn, maximum_concurrency=2), runtime, remote["sqs"], url, stop)
    with lambda_api({"F": runtime}, [poller]) as client:
        [listed] = client.list_event_source_mappings(FunctionName="F")["EventSourceMappings"]
        assert (listed["EventSourceArn"], listed["State"], listed["BatchSize"]) == (arn, "Enabled", 10)
        assert (
            client.list_event_source_mappings(EventSourceArn="arn:aws:sqs:us-east-1:123456789012:other")[
                "EventSourceMappings"
            ]
            == []
        )
        key = listed["UUID"]
        poller.start()
        try:
            paused = client.update_event_source_mapping(UUID=key, Enabled=False, BatchSize=2)
            assert (paused["State"], paused["BatchSize"]) == ("Disabled", 2)
            send(remote, url, *[f"m{i}" for i in range(5)])
            # Each poller goes around its loop a few times while paused: none receives
            receives = Counter[str]()

            def count(**_: Any) -> None:
                receives.update(["r"])

            remote["sqs"].meta.events.register("before-call.sqs.ReceiveMessage", count)
            time.sleep(3 * POLL_WAIT_S)
            remote["sqs"].meta.events.unregister("before-call.sqs.ReceiveMessage", count)
            assert receives["r"] == 0
            assert calls_of(tmp_path) == []
            assert len(visible(remote, url)) == 5
            for bad in (
                {"BatchSize": 0},
                {"BatchSize": 20},
                {"ScalingConfig": {"MaximumConcurrency": 1}},
                {"Enabled": "yes"},
            ):
                with pytest.raises(client.exceptions.InvalidParameterValueException):
                    client.update_event_source_mapping(UUID=key, **bad)
            assert client.get_event_source_mapping(UUID=key)["State"] == "Disabled"
            with pytest.raises(client.exceptions.ResourceNotFoundException):
                client.get_event_source_mapping(UUID=str(uuid.uuid4()))
            assert client.update_event_source_mapping(UUID=key, Enabled=True)["State"] == "Enabled"
            eventually(
                lambda: sum(c["n"] for c in calls_of(tmp_path)),
                lambda n: n == 5,
                timeout_s=HANG_S,
                what="the five",
            )
        finally:
            stop.set()
    assert max(c["n"] for c in calls_of(tmp_path)) <= 2  # the BatchSize set while paused


def test_lambda_event_source_mapping_changes_are_journaled_across_a_restart(
    remote: dict[str, Any], tmp_path: Path
) -> None:
    """A mapping's UUID is the same at every start, and a change made through the API (a pause)
    is kept in the state dir: the next start's poller begins paused."""
    url, arn = queue(remote, "WebhookQueue")
    journal = tmp_path / "event_source_mappings.json"

    def poller() -> SqsPoller:
        runtime = FunctionRuntime(toy_function(tmp_path, RECORDER))
        return SqsPoller(SqsSource("F", "S", arn), runtime, remote["sqs"], url, threading.Event())

    first = poller()
    with lambda_api({}, [first], journal=journal) as client:
        [listed] = client.list_event_source_mappings()["EventSourceMappings"]
        client.update_event_source_mapping(UUID=listed["UUID"], Enabled=False)
    again = poller()
    assert again.source.enabled
    mappings = EventSourceMappings([again], journal=journal)
    assert mappings.get(listed["UUID"])["State"] == "Disabled"
    assert not again.source.enabled
    # A kept change the source no longer takes (its template changed) is dropped, not fatal
    journal.write_text(json.dumps({listed["UUID"]: {"BatchSize": 50}}))
    assert EventSourceMappings([poller()], journal=journal).get(listed["UUID"])["BatchSize"] == 10
