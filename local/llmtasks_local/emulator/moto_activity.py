"""The embedded endpoint's activity long polls: when a table's stream or a queue has something new;
and the items of a TTL table that have expired.

Lambda's pollers read each stream shard four times a second and receive from each queue with or
without messages; the local stack's pollers ask these first (sources.StreamActivity,
sources.QueueActivity) and read only when there is something to read, so an idle stack's
moto does almost nothing. Both count through hooks on moto's models, installed with the moto
patches only; on stock moto the paths answer 404 and the pollers read as Lambda does. Likewise
the TTL sweep (ttl.TtlSweeper) asks ExpiredItems which items to delete, instead of scanning each
table, and scans when the path answers 404.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs

from llmtasks_local import moto_patches

# How many records each table's stream has taken (GET ?after=N&wait_s=S: once their sum passes N,
# or S seconds on): what lets the stack's stream pollers skip reads of a stream with nothing new.
STREAM_RECORDS_PATH = "/_llmtasks/streams/records"
# The queues holding a message a receive would take now (GET ?after=VERSION&wait_s=S: once that
# set's version differs from VERSION, or S seconds on): what lets an idle queue's poller wait
# without receiving.
RECEIVABLE_QUEUES_PATH = "/_llmtasks/queues/receivable"
# The keys of a TTL table's items whose TTL has passed (GET ?table=NAME&region=R&attribute=A
# &now=EPOCH&limit=N), from moto_patches.ttl_index: what the TTL sweep deletes.
TTL_EXPIRED_PATH = "/_llmtasks/ttl/expired"
ACTIVITY_WAIT_MAX_S = 5.0  # the longest either holds a request (its wait_s) before answering


class StreamRecords:
    """The records DynamoDB streams have taken since the endpoint started, by table, and a wait
    for the next. Lambda reads each shard four times a second, with or without records; in the
    local stack those empty reads were most of an idle stack's CPU, and the test suite keeps
    several stacks idle at once. A poller whose last read was empty reads again once its table's
    count has moved (sources.StreamActivity): the same records, in the same order, as soon."""

    def __init__(self) -> None:
        self._added = threading.Condition()
        self.by_table: Counter[str] = Counter()
        self.total = 0

    def install(self) -> None:
        """Counts each record moto's streams append (StreamShard.add, after the item's write)."""
        if not moto_patches.enabled():  # not the moto version it was written for
            return
        # StreamShard.add imports moto's Lambda (and with it Kinesis) on a table's first record,
        # to look for event source mappings of moto's own, which the first task after Ready paid
        # for in its submit. Imported with the server instead.
        import moto.awslambda.utils  # noqa: F401
        from moto.dynamodb.models.table import StreamShard

        add = StreamShard.add

        def add_and_count(shard: StreamShard, old: Any, new: Any) -> None:
            add(shard, old, new)
            with self._added:
                self.by_table[shard.table.name] += 1
                self.total += 1
                self._added.notify_all()

        StreamShard.add = add_and_count  # type: ignore[method-assign,assignment]

    def answer(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        asked = _long_poll_query(environ, after_default="-1")
        if asked is None or not asked[0].removeprefix("-").isdigit():
            start_response("400 Bad Request", [("Content-Type", "application/json")])
            return [b'{"error": "after is an integer, wait_s a number of seconds"}']
        after, wait_s = int(asked[0]), asked[1]
        with self._added:
            self._added.wait_for(lambda: self.total > after, timeout=wait_s)
            body = json.dumps({"total": self.total, "by_table": dict(self.by_table)})
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body.encode()]


def _long_poll_query(environ: dict[str, Any], after_default: str) -> tuple[str, float] | None:
    """`after` and `wait_s` (capped at ACTIVITY_WAIT_MAX_S) of an activity endpoint's query."""
    query = parse_qs(environ.get("QUERY_STRING", ""))
    try:
        wait_s = min(ACTIVITY_WAIT_MAX_S, max(0.0, float(query.get("wait_s", ["0"])[0])))
    except ValueError:
        return None
    return query.get("after", [after_default])[0], wait_s


class ReceivableQueues:
    """The queues holding a message a receive would take now (visible, not delayed), by ARN, and
    a wait for that set to change. Lambda's idle pollers long-poll each queue, for no one's CPU;
    in the local stack the quiet poller of each of a stack's queues received once a second, most
    of an idle stack's CPU, and the test suite keeps several stacks idle at once. A quiet poller
    receives once its queue is in the set (sources.QueueActivity): a send wakes the wait at
    once; a message whose delay or visibility timeout runs out is seen within RESCAN_S, as moto's
    own long poll sees it within its one-second slices."""

    RESCAN_S = 0.25

    def __init__(self) -> None:
        self._sent = threading.Condition()
        self._sends = 0  # read before each scan: a send during the scan ends the wait after it

    def install(self) -> None:
        """A send (Queue.add_message: SendMessage, its batch, a redrive) wakes the waits."""
        if not moto_patches.enabled():  # not the moto version it was written for
            return
        from moto.sqs.models import Message, Queue

        add = Queue.add_message

        def add_and_wake(queue: Queue, message: Message) -> None:
            add(queue, message)
            with self._sent:
                self._sends += 1
                self._sent.notify_all()

        Queue.add_message = add_and_wake  # type: ignore[method-assign,assignment]

    def _wait_for_send(self, seen: int, timeout_s: float) -> None:
        with self._sent:
            self._sent.wait_for(lambda: self._sends != seen, timeout=timeout_s)

    @staticmethod
    def receivable() -> list[str]:
        from moto.sqs.models import sqs_backends

        from llmtasks_local.moto_patches.atomic import sqs_lock

        with sqs_lock():  # no send, receive or delete changes a queue's messages meanwhile
            return sorted(
                queue.queue_arn
                for _account, _region, backend in sqs_backends.iter_backends()
                for queue in list(backend.queues.values())  # type: ignore[attr-defined]
                if any(message.visible and not message.delayed for message in queue._messages)
            )

    @staticmethod
    def version(arns: list[str]) -> str:
        return hashlib.blake2b("\n".join(arns).encode(), digest_size=8).hexdigest()

    def answer(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        asked = _long_poll_query(environ, after_default="")
        if asked is None:
            start_response("400 Bad Request", [("Content-Type", "application/json")])
            return [b'{"error": "wait_s is a number of seconds"}']
        after, wait_s = asked
        deadline = time.monotonic() + wait_s
        while True:
            sends = self._sends
            arns = self.receivable()
            version = self.version(arns)
            left = deadline - time.monotonic()
            if version != after or left <= 0:
                break
            self._wait_for_send(sends, min(left, self.RESCAN_S))
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps({"version": version, "receivable": arns}).encode()]


class ExpiredItems:
    """The keys of a TTL table's expired items, from the index moto_patches.ttl_index keeps as
    items are written: a sweep reads what has expired, not the table. 404 when the table is not
    there, 409 when `attribute` is not its enabled TTL attribute (as DynamoDB, the sweep then
    deletes nothing by it)."""

    @staticmethod
    def answer(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        from llmtasks_local.moto_patches import ttl_index

        query = {name: values[0] for name, values in parse_qs(environ.get("QUERY_STRING", "")).items()}
        try:
            table_name, region, attribute = query["table"], query["region"], query["attribute"]
            now, limit = float(query["now"]), int(query.get("limit", ttl_index.MAX_KEYS))
        except (KeyError, ValueError):
            return _json(start_response, "400 Bad Request", {"error": "table, region, attribute and now"})
        table = ttl_index.table_of(region, table_name)
        if table is None:
            return _json(start_response, "404 Not Found", {"error": f"no table {table_name} in {region}"})
        keys = ttl_index.expired_keys(table, attribute, now, limit=limit)
        if keys is None:
            return _json(start_response, "409 Conflict", {"error": f"{attribute} is not the table's TTL"})
        return _json(start_response, "200 OK", {"keys": keys})


def _json(start_response: Any, status: str, body: dict[str, Any]) -> list[bytes]:
    start_response(status, [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]
