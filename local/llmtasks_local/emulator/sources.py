"""Event source mappings, as Lambda runs them: SQS queues and DynamoDB streams polled into
functions, read from the template's Events (batch size, batching window, partial batch
responses, maximum concurrency, filters, retries, on-failure destination).

Long because both event source kinds (SQS, DynamoDB streams) are here, sharing the activity
that scales their pollers and the failure handling Lambda gives both."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from llmtasks_local.emulator.journal import read_kept, write_kept
from llmtasks_local.emulator.metrics import MetricsSink
from llmtasks_local.emulator.moto_server import RECEIVABLE_QUEUES_PATH, STREAM_RECORDS_PATH
from llmtasks_local.emulator.payload_limits import fitting_batches
from llmtasks_local.emulator.queue_calls import SourceQueue
from llmtasks_local.emulator.runtime import FunctionRuntime, Invocation
from llmtasks_local.sam.events import pattern_matcher, sqs_record, wire_stream_record
from llmtasks_local.sam.function_spec import SqsSource, StreamSource

if TYPE_CHECKING:
    from mypy_boto3_dynamodbstreams import DynamoDBStreamsClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

# Without ScalingConfig, Lambda scales SQS pollers far beyond what one machine should run.
DEFAULT_SQS_CONCURRENCY = 5
# Lambda's scaling of a standard queue's pollers (its documented rules): five concurrent batches
# when messages are available, then up to 300 more a minute while messages remain (five a
# second here), back to five when traffic is low.
INITIAL_SQS_POLLERS = 5
SQS_POLLERS_ADDED_PER_S = 5
# Long-poll slices: short enough that a stop is quick, long enough not to spin.
POLL_WAIT_S = 1
# While a batching window is open, how long the poller waits between receives that fill it.
FILL_STEP_S = 0.25
STREAM_IDLE_S = 0.25
# How long the embedded endpoint holds each long poll of its streams' counts and its receivable
# queues (StreamActivity, QueueActivity) before it answers with nothing new.
ACTIVITY_WAIT_S = 2


def failed_ids(invocation: Invocation, *, report_failures: bool, all_ids: list[str]) -> set[str]:
    """Which records go back to the source, by Lambda's rules for a reply."""
    if not invocation.ok:
        return set(all_ids)  # an error or a timeout returns the whole batch
    if not report_failures or not isinstance(invocation.payload, dict):
        return set()
    failures = invocation.payload.get("batchItemFailures") or []
    ids = {str(f.get("itemIdentifier", "")) for f in failures if isinstance(f, dict)}
    # An empty or unknown itemIdentifier makes Lambda treat the whole batch as failed.
    if any(not i or i not in all_ids for i in ids) or len(ids) != len(failures):
        return set(all_ids)
    return ids


class SqsPoller:
    """One SQS event source: up to `maximum_concurrency` pollers, each invoking with its own
    batch, scaled as Lambda scales them (`active` of them poll)."""

    def __init__(
        self,
        source: SqsSource,
        runtime: FunctionRuntime,
        sqs: SQSClient,
        queue_url: str,
        stop: threading.Event,
        activity: QueueActivity | None = None,
    ) -> None:
        self.source = source
        self._runtime = runtime
        self._queue = SourceQueue(queue_url, sqs)
        self._stop = stop
        self.concurrency = source.maximum_concurrency or DEFAULT_SQS_CONCURRENCY
        self.initial = min(INITIAL_SQS_POLLERS, self.concurrency)
        self.active = self.initial
        self._scaled = threading.Condition()
        self._grown_at = 0.0
        # Nothing found and nothing running: one poller keeps looking for the others, which wait
        # for it to find messages. Lambda's idle pollers cost no one's CPU; here every long poll
        # of an idle stack costs this machine's, and the test suite runs several stacks at once.
        self._quiet = False
        # And that one receives once the endpoint says the queue holds a message it would take
        # (None: it receives a second at a time, as Lambda's long polls do).
        self._activity = activity
        # Receipts of the batch each poller thread is invoking with (what a stop cuts short).
        self._in_flight: dict[int, list[str]] = {}
        self._receiving = 0  # pollers inside a receive: a pause waits for them
        self._started = False
        self.threads: list[threading.Thread] = []
        self._add_pollers(self.concurrency)

    def _add_pollers(self, count: int) -> None:
        """Threads up to `count` (the caller holds `_scaled` once started); running if started."""
        for index in range(len(self.threads), count):
            thread = threading.Thread(
                target=self._poll, args=(index,), name=f"sqs-{self.source.function_id}-{index}", daemon=True
            )
            self.threads.append(thread)
            if self._started:
                thread.start()

    def start(self) -> None:
        self._started = True
        for thread in self.threads:
            thread.start()

    def reconfigure(self, source: SqsSource) -> None:
        """UpdateEventSourceMapping: the next batches are taken by `source`'s settings (batch
        size, batching window, maximum concurrency). A source no longer enabled takes no message
        once this returns (a receive under way is waited for); the batches being invoked finish,
        as Lambda's do."""
        with self._scaled:
            self.source = source
            self.concurrency = source.maximum_concurrency or DEFAULT_SQS_CONCURRENCY
            self.initial = min(INITIAL_SQS_POLLERS, self.concurrency)
            self.active = min(self.concurrency, max(self.active, self.initial))
            self._add_pollers(self.concurrency)
            self._scaled.notify_all()
            while not source.enabled and self._receiving:
                self._scaled.wait()

    def _receive(self, limit: int, wait_s: float) -> list[MessageTypeDef]:
        return self._queue.receive(limit, wait_s=math.ceil(wait_s))

    def next_batch(self) -> list[MessageTypeDef]:
        """Up to BatchSize messages, waiting up to MaximumBatchingWindowInSeconds to fill it.

        After the first message, it takes what has arrived every FILL_STEP_S rather than each
        message as it lands: one receive per message would bill a trickle of tasks for a
        receive each."""
        batch = self._receive(self.source.batch_size, POLL_WAIT_S)
        if not batch:
            return batch
        fill_until = time.monotonic() + self.source.batching_window_s
        while len(batch) < self.source.batch_size and self.source.enabled and not self._stop.is_set():
            left = fill_until - time.monotonic()
            if left <= 0:
                break
            self._stop.wait(min(left, FILL_STEP_S))
            batch += self._receive(self.source.batch_size - len(batch), 0)
        return batch

    def _poll(self, index: int) -> None:
        while not self._stop.is_set():
            if self._quiet and index == 0 and self.source.enabled and not self._may_receive():
                continue
            with self._scaled:
                paused = not self.source.enabled
                if paused or index >= self.active or (index > 0 and self._quiet):
                    self._scaled.wait(POLL_WAIT_S)
                    if not paused:
                        self._grow(about_to_invoke=0)
                    continue
                self._receiving += 1
            try:
                try:
                    batch = self.next_batch()
                finally:
                    with self._scaled:
                        self._receiving -= 1
                        self._scaled.notify_all()
                self._scale(found_messages=bool(batch))
                if batch:
                    self.deliver(batch)
            except Exception as exc:  # a poller outlives a failed call, as Lambda's does
                if self._stop.is_set():
                    return  # the endpoint is going away with the stack
                print(f"[{self.source.function_id}:{self.source.name}] poll failed: {exc!r}", flush=True)
                self._stop.wait(1)

    def _may_receive(self) -> bool:
        """Whether the queue may hold a message to receive, waiting up to POLL_WAIT_S for it."""
        return self._activity is None or self._activity.wait_receivable(self.source.queue_arn, POLL_WAIT_S)

    def _scale(self, *, found_messages: bool) -> None:
        """One poller fewer, down to the initial five, for each receive that comes back empty;
        a receive that finds messages while the others are busy grows the pollers."""
        with self._scaled:
            if not found_messages:
                self.active = max(self.initial, self.active - 1)
                self._quiet = self.active == self.initial and not self._in_flight
                return
            if self._quiet:
                self._quiet = False
                self._scaled.notify_all()  # the waiting pollers look at once
            if not self._in_flight and self.active == self.initial:
                self._grown_at = time.monotonic()  # work starts from idle: a step up is a second away
            self._grow(about_to_invoke=1)

    def _grow(self, *, about_to_invoke: int) -> None:
        """While every active poller is busy with a batch, SQS_POLLERS_ADDED_PER_S more pollers
        a second (the caller holds `_scaled`). Each new one's receive is the probe of whether
        messages remain: an empty one takes it back."""
        now = time.monotonic()
        every_poller_busy = len(self._in_flight) + about_to_invoke >= self.active
        if every_poller_busy and self.active < self.concurrency and now - self._grown_at >= 1:
            self.active = min(self.concurrency, self.active + SQS_POLLERS_ADDED_PER_S)
            self._grown_at = now
            self._scaled.notify_all()

    def deliver(self, batch: list[MessageTypeDef]) -> Invocation:
        records = [sqs_record(m, self.source.queue_arn) for m in batch]
        fitting, *over = fitting_batches(records)
        if over:
            # No event goes over 6 MB (ten SQS messages of 1 MiB would): those that do not fit
            # are visible again at once, for the next batch.
            self._queue.make_visible([r["receiptHandle"] for part in over for r in part])
            records = fitting
        self._in_flight[threading.get_ident()] = [r["receiptHandle"] for r in records]
        try:
            invocation = self._runtime.invoke({"Records": records})
        finally:
            self._in_flight.pop(threading.get_ident(), None)
        if invocation.error:
            print(f"[{self.source.function_id}] {invocation.error}", flush=True)
        ids = [r["messageId"] for r in records]
        keep = failed_ids(invocation, report_failures=self.source.report_batch_item_failures, all_ids=ids)
        done = [r for r in records if r["messageId"] not in keep]
        self._queue.delete_many([r["receiptHandle"] for r in done])
        return invocation

    def in_flight(self) -> list[str]:
        """The receipt handles of the messages its invocations are running now."""
        return [handle for handles in list(self._in_flight.values()) for handle in handles]

    def release(self, receipts: list[str]) -> int:
        """Makes the messages of invocations a stop cut short (their receipts, `in_flight()` as
        the stop began to cut them) visible again at once, so that after a restart they are
        delivered again now, not after the queue's visibility timeout (hours for TaskQueue). The
        next delivery of such a message takes its task over at once (the lease names the
        message). Returns how many: a message whose invocation ended meanwhile and deleted it
        is not one."""
        return self._queue.make_visible(receipts)


def queue_destination(sqs: SQSClient, queue_url: str) -> Callable[[dict[str, Any]], None]:
    """A stream's on-failure destination (an SQS queue): a note of each skipped batch."""

    def send(note: dict[str, Any]) -> None:
        sqs.send_message(QueueUrl=queue_url, MessageBody=json.dumps(note))

    return send


class _Activity:
    """What an activity endpoint of the embedded moto server says, kept current by one thread's
    long polls (ACTIVITY_WAIT_S each) while the stack runs. Unknown until the endpoint has
    answered, and for good if it cannot (an endpoint of your own): then every poller reads as
    Lambda does."""

    PATH = ""

    def __init__(self, endpoint_url: str, stop: threading.Event, name: str) -> None:
        self._address = urlsplit(endpoint_url)
        self._stop = stop
        self.thread = threading.Thread(target=self._follow, name=name, daemon=True)

    def _after(self) -> str:
        """The `after` of the next long poll: what is known now."""
        raise NotImplementedError

    def _take(self, answer: dict[str, Any] | None) -> None:
        """The endpoint's answer; None: unknown."""
        raise NotImplementedError

    def _follow(self) -> None:
        connection = None
        while not self._stop.is_set():
            try:
                if connection is None:
                    connection = http.client.HTTPConnection(
                        self._address.hostname or "127.0.0.1",
                        self._address.port,
                        timeout=ACTIVITY_WAIT_S + 10,
                    )
                connection.request("GET", f"{self.PATH}?after={self._after()}&wait_s={ACTIVITY_WAIT_S}")
                reply = connection.getresponse()
                body = reply.read()
                if reply.status != 200:
                    self._take(None)
                    connection.close()
                    return  # not the embedded endpoint: the pollers read as Lambda does
                self._take(json.loads(body))
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                self._take(None)  # unknown: read until it answers again
                if connection is not None:
                    connection.close()
                    connection = None
                self._stop.wait(1)


class StreamActivity(_Activity):
    """How many records each table's stream has taken, as the embedded endpoint counts them
    (moto_activity.StreamRecords): a stream poller whose last read found nothing reads again once
    its table's count has moved, instead of four empty reads a second."""

    PATH = STREAM_RECORDS_PATH

    def __init__(self, endpoint_url: str, stop: threading.Event) -> None:
        super().__init__(endpoint_url, stop, "stream-activity")
        self._total = -1
        self.by_table: dict[str, int] | None = None

    def count(self, table: str) -> int | None:
        counts = self.by_table
        return None if counts is None else counts.get(table, 0)

    def _after(self) -> str:
        return str(self._total)

    def _take(self, answer: dict[str, Any] | None) -> None:
        if answer is None:
            self.by_table = None
            return
        self._total, self.by_table = answer["total"], answer["by_table"]


class QueueActivity(_Activity):
    """Which queues hold a message a receive would take now, as the embedded endpoint sees them
    (moto_activity.ReceivableQueues): a quiet SQS poller receives once its queue is among them,
    instead of a receive a second for nothing."""

    PATH = RECEIVABLE_QUEUES_PATH

    def __init__(self, endpoint_url: str, stop: threading.Event) -> None:
        super().__init__(endpoint_url, stop, "queue-activity")
        self._version = ""
        self._receivable: frozenset[str] | None = None
        self._changed = threading.Condition()

    def wait_receivable(self, queue_arn: str, timeout_s: float) -> bool:
        """Whether the queue may hold a message to receive, waiting up to `timeout_s` for it to
        be so; True when unknown."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._receivable is None or queue_arn in self._receivable, timeout=timeout_s
            )

    def _after(self) -> str:
        return self._version

    def _take(self, answer: dict[str, Any] | None) -> None:
        with self._changed:
            if answer is None:
                self._version, self._receivable = "", None
            else:
                self._version, self._receivable = answer["version"], frozenset(answer["receivable"])
            self._changed.notify_all()


def _table_of(stream_arn: str) -> str:
    """arn:aws:dynamodb:REGION:ACCOUNT:table/NAME/stream/LABEL -> NAME"""
    return stream_arn.split(":table/", 1)[-1].split("/stream/", 1)[0]


class StreamPoller:
    """One DynamoDB stream event source: shards read in order, batches retried, then skipped."""

    def __init__(
        self,
        source: StreamSource,
        runtime: FunctionRuntime,
        streams: DynamoDBStreamsClient,
        stop: threading.Event,
        on_failure: Callable[[dict[str, Any]], None] | None = None,
        checkpoints: dict[str, str] | None = None,
        on_checkpoint: Callable[[dict[str, str]], None] | None = None,
        metrics: MetricsSink | None = None,
        stuck_after_s: float | None = None,
        activity: StreamActivity | None = None,
    ) -> None:
        self.source = source
        self._activity = activity  # None: every read goes to the stream
        self._table = _table_of(source.stream_arn)
        self._metrics = metrics  # each invocation's IteratorAge, as Lambda measures it
        # A record failing for longer than this is said once (the template's StreamLagAlarmSeconds:
        # the alarm that would fire in AWS); None says nothing.
        self._stuck_after_s = stuck_after_s
        self._runtime = runtime
        self._streams = streams
        self._stop = stop
        self._on_failure = on_failure
        self._matches = pattern_matcher(source.filter_patterns)
        # The last record handled per shard, as Lambda's event source mapping keeps it: a
        # restarted stack with its state goes on from there (`checkpoints` given back).
        self.checkpoints: dict[str, str] = dict(checkpoints or {})
        self._on_checkpoint = on_checkpoint  # told each new position, to keep it on disk
        self.threads = [threading.Thread(target=self._poll, name=f"stream-{source.function_id}", daemon=True)]
        if streams is not None:  # (a test's poller that only delivers has none)
            streams.meta.events.register(
                "before-parse.dynamodb-streams.GetRecords", _records_as_sent, unique_id=_RECORDS_AS_SENT
            )

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def reconfigure(self, source: StreamSource) -> None:
        """UpdateEventSourceMapping: the next read and batch follow `source` (batch size,
        retries, bisection, partial batch responses); one no longer enabled reads no record
        after the batch it is handling."""
        self.source = source

    def _iterators(self) -> dict[str, str]:
        shards = self._streams.describe_stream(StreamArn=self.source.stream_arn)["StreamDescription"][
            "Shards"
        ]
        return {shard["ShardId"]: self._iterator(shard["ShardId"]) for shard in shards}

    def _iterator(self, shard_id: str) -> str:
        after = self.checkpoints.get(shard_id)
        position: dict[str, Any] = (
            {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": after}
            if after
            else {"ShardIteratorType": self.source.starting_position}
        )
        iterator: str = self._streams.get_shard_iterator(
            StreamArn=self.source.stream_arn, ShardId=shard_id, **position
        )["ShardIterator"]
        return iterator

    def _nothing_new(self, empty_at: int | None) -> bool:
        """Whether the stream has taken no record since the count at the start of the last read,
        which found none: the count is taken before a read, so a record written during it
        moves the count past `empty_at` whether that read saw it or not."""
        return (
            empty_at is not None
            and self._activity is not None
            and self._activity.count(self._table) == empty_at
        )

    def _poll(self) -> None:
        iterators: dict[str, str] = {}
        empty_at: int | None = None  # the table's count when the last read, which found nothing, began
        while not self._stop.is_set():
            if not self.source.enabled or self._nothing_new(empty_at):
                self._stop.wait(STREAM_IDLE_S)
                continue
            try:
                if not iterators:
                    iterators = self._iterators()
                before = None if self._activity is None else self._activity.count(self._table)
                busy = False
                for shard_id, iterator in list(iterators.items()):
                    reply = self._streams.get_records(ShardIterator=iterator, Limit=self.source.batch_size)
                    iterators[shard_id] = reply.get("NextShardIterator") or iterator
                    sent: list[dict[str, Any]] = cast(dict[str, Any], reply)[_RECORDS_AS_SENT]
                    records = [wire_stream_record(r, self.source.stream_arn) for r in sent]
                    busy = busy or bool(records)
                    chosen = [r for r in records if self._matches(r)]
                    if not all(self.deliver(batch) for batch in fitting_batches(chosen)):
                        break  # stopped before the batch was handled: not checkpointed
                    if records:
                        self.checkpoints[shard_id] = records[-1]["dynamodb"]["SequenceNumber"]
                        if self._on_checkpoint is not None:
                            self._on_checkpoint(dict(self.checkpoints))
                empty_at = None if busy else before
                if not busy:
                    self._stop.wait(STREAM_IDLE_S)
            except Exception as exc:  # keep polling, as Lambda does
                empty_at = None
                if self._stop.is_set():
                    return
                print(
                    f"[{self.source.function_id}:{self.source.name}] stream poll failed: {exc!r}", flush=True
                )
                self._stop.wait(1)

    def deliver(self, records: list[dict[str, Any]]) -> bool:
        """Retries from the first failed record until MaximumRetryAttempts (a function error
        first splits the batch in two, with BisectBatchOnFunctionError); then the on-failure
        destination gets a note of the skipped records and the shard moves on. False when a stop
        came first (the records are read again after a restart)."""
        attempts = 0
        said_stuck = False
        while records and not self._stop.is_set():
            invocation = self._runtime.invoke({"Records": records})
            if self._metrics is not None:
                self._metrics.iterator_age(self.source.function_id, record_age_s(records[-1]) * 1000)
            numbers = [r["dynamodb"]["SequenceNumber"] for r in records]
            failed = failed_ids(
                invocation, report_failures=self.source.report_batch_item_failures, all_ids=numbers
            )
            if not failed:
                return True
            if invocation.error:
                print(f"[{self.source.function_id}] {invocation.error}", flush=True)
            held_s = record_age_s(records[min(numbers.index(n) for n in failed)])
            if not said_stuck and self._stuck_after_s is not None and held_s > self._stuck_after_s:
                said_stuck = True
                source = f"{self.source.function_id}'s stream source {self.source.name}"
                print(
                    f"Warning: {source} is stuck: its failing record is {held_s:.0f} s old"
                    f" (StreamLagAlarmSeconds: {self._stuck_after_s:g} s); the records behind it"
                    " wait, and the function's ERROR lines name it",
                    flush=True,
                )
            if not invocation.ok and self.source.bisect_on_error and len(records) > 1:
                # BisectBatchOnFunctionError: each half is retried on its own (a split does not
                # count toward MaximumRetryAttempts), so one bad record holds up only itself.
                half = len(records) // 2
                return self.deliver(records[:half]) and self.deliver(records[half:])
            first = min(numbers.index(n) for n in failed)
            records = records[first:]
            attempts += 1
            limit = self.source.maximum_retry_attempts
            if limit != -1 and attempts > limit:
                if self._on_failure is not None:
                    self._on_failure(
                        {
                            "requestContext": {"condition": "RetryAttemptsExhausted"},
                            "DDBStreamBatchInfo": {
                                "streamArn": self.source.stream_arn,
                                "startSequenceNumber": records[0]["dynamodb"]["SequenceNumber"],
                                "endSequenceNumber": records[-1]["dynamodb"]["SequenceNumber"],
                                "batchSize": len(records),
                            },
                        }
                    )
                return True
            self._stop.wait(min(30.0, 0.5 * 2**attempts))
        return not records


_RECORDS_AS_SENT = "LlmtasksRecordsAsSent"


def _records_as_sent(
    response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any
) -> None:
    """GetRecords' records taken as the endpoint sent them, before botocore parses the reply:
    that is the form Lambda hands a function, and botocore's parse (every attribute of both
    images walked against the shape, times made datetimes, blobs bytes) was undone at once to
    build the event, a large part of the stack's CPU in a burst. The rest of the reply is parsed
    as ever; an error reply is left whole."""
    if response_dict.get("status_code", 500) >= 300:
        return
    reply = json.loads(response_dict["body"])
    customized_response_dict[_RECORDS_AS_SENT] = reply.pop("Records", [])
    response_dict["body"] = json.dumps(reply).encode()


def record_age_s(record: dict[str, Any]) -> float:
    """How long ago the stream took the record (its ApproximateCreationDateTime)."""
    created = (record.get("dynamodb") or {}).get("ApproximateCreationDateTime")
    return max(0.0, time.time() - float(created)) if isinstance(created, int | float) else 0.0


class StreamPositions:
    """Each stream event source's last handled record per shard, in a file rewritten whole at
    every step: a stack that crashes goes on from there, and delivers again at most the batch it
    was handling (at least once, as Lambda's event source mappings do)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._positions: dict[str, dict[str, str]] = read_kept(path, "the streams' positions") or {}

    def of(self, source: str) -> dict[str, str]:
        return dict(self._positions.get(source, {}))

    def keeper(self, source: str) -> Callable[[dict[str, str]], None]:
        def keep(checkpoints: dict[str, str]) -> None:
            with self._lock:
                self._positions[source] = checkpoints
                # A full disk keeps the older position: a crash then delivers a few records
                # again, which at-least-once allows; the stack reports the disk (state watch).
                with contextlib.suppress(OSError):
                    write_kept(self.path, self._positions)

        return keep
