"""What keeps stock moto right where the moto patches are off (another moto version, or
LLMTASKS_MOTO_PATCHES=off): requests served one at a time where moto's own code does not
serialise them, around moto's WSGI app, without touching moto.

- Each DynamoDB request is served alone, so a conditional write is checked and applied as one
  step, as DynamoDB does (moto applies an UpdateItem's clauses one by one: two writers could
  both pass a condition only one should).
- Each SQS change of messages is served alone, so a delete does not drop a message sent
  meanwhile (moto rebuilds the queue's list on a delete).
- A receive is served alone too, so two pollers never both take one message; a long poll is
  served as short polls, each alone, until a message comes or its wait is over, so it never
  holds the lock while it waits.

The locks are moto_patches.atomic's own, which a snapshot of the state dir takes too.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any
from urllib.parse import urlsplit

from llmtasks_local.emulator.moto_counts import operation_of

# The SQS operations that change a queue's messages.
_SQS_MESSAGE_WRITES = frozenset(
    {
        "SendMessage",
        "SendMessageBatch",
        "DeleteMessage",
        "DeleteMessageBatch",
        "ChangeMessageVisibility",
        "ChangeMessageVisibilityBatch",
        "PurgeQueue",
    }
)
_JSON = ("application/x-amz-json-1.0", "application/x-amz-json-1.1")
SHORT_POLL_EVERY_S = 0.1  # how often a long poll looks again, between short polls


def one_at_a_time(moto_app: Any) -> Any:
    """`moto_app` with the requests above served one at a time."""
    from llmtasks_local.moto_patches.atomic import sqs_lock, write_lock

    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        service, _, operation = operation_of(environ).partition(".")
        if service in ("dynamodb", "dynamodbstreams"):
            lock = write_lock()
        elif service == "sqs" and operation in _SQS_MESSAGE_WRITES:
            lock = sqs_lock()
        elif service == "sqs" and operation == "ReceiveMessage" and environ.get("CONTENT_TYPE") in _JSON:
            return _receive_alone(moto_app, environ, start_response, sqs_lock())
        else:
            return moto_app(environ, start_response)
        with lock:
            return [b"".join(moto_app(environ, start_response))]

    return serve


def _receive_alone(moto_app: Any, environ: dict[str, Any], start_response: Any, lock: Any) -> list[bytes]:
    """A ReceiveMessage as short polls under `lock`, until one gives messages or its wait (the
    request's WaitTimeSeconds, else the queue's ReceiveMessageWaitTimeSeconds) is over."""
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    request = json.loads(body or b"{}")
    wait_s = float(request.get("WaitTimeSeconds", _queue_wait_s(str(request.get("QueueUrl", "")))))
    short = json.dumps({**request, "WaitTimeSeconds": 0}).encode()
    deadline = time.monotonic() + wait_s
    answered: list[Any] = []

    def keep(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answered[:] = [status, headers]
        return lambda _data: None

    while True:
        poll = environ | {"wsgi.input": io.BytesIO(short), "CONTENT_LENGTH": str(len(short))}
        with lock:
            reply = b"".join(moto_app(poll, keep))
        if b'"Messages"' in reply or not answered[0].startswith("200") or time.monotonic() >= deadline:
            break
        time.sleep(min(SHORT_POLL_EVERY_S, max(0.0, deadline - time.monotonic())))
    start_response(*answered)
    return [reply]


def _queue_wait_s(queue_url: str) -> float:
    """The queue's ReceiveMessageWaitTimeSeconds (0 when it cannot be read)."""
    from moto.sqs.models import sqs_backends

    parts = urlsplit(queue_url).path.strip("/").split("/")
    if len(parts) < 2:
        return 0.0
    account, name = parts[-2], parts[-1]
    for found_account, _region, backend in list(sqs_backends.iter_backends()):
        queue = backend.queues.get(name) if found_account == account else None  # type: ignore[attr-defined]
        if queue is not None:
            return float(getattr(queue, "receive_message_wait_time_seconds", 0) or 0)
    return 0.0
