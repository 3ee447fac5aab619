"""Lambda's invocation payload limits, applied where AWS applies them
(https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html): a synchronous
invocation's event at most 6 MB, 6,291,456 bytes (Invoke refuses more; API Gateway answers 413
without running the function; an event source sends fewer records); its response at most
6,291,556 bytes (the invocation fails with Function.ResponseSizeTooLarge); an asynchronous
invocation's event at most 1 MB."""

from __future__ import annotations

import json
from typing import Any

REQUEST_BYTES = 6 * 1024 * 1024
RESPONSE_BYTES = REQUEST_BYTES + 100
EVENT_REQUEST_BYTES = 1024 * 1024
RESPONSE_TOO_LARGE = {
    "errorType": "Function.ResponseSizeTooLarge",
    "errorMessage": f"Response payload size exceeded maximum allowed payload size ({RESPONSE_BYTES} bytes).",
}


def event_bytes(event: Any) -> int:
    """The event's size as the sandbox receives it."""
    return len(json.dumps(event).encode())


def request_too_large(body: bytes, event: Any) -> bool:
    """Whether an event made from a request `body` is over REQUEST_BYTES: counted only when the
    body could make it so (JSON escapes a byte into six at most), not on every request."""
    return len(body) * 6 + 65_536 > REQUEST_BYTES and event_bytes(event) > REQUEST_BYTES


def fitting_batches(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The records, in order, cut into batches whose event (`{"Records": [...]}`) stays within
    REQUEST_BYTES, as an event source mapping sends fewer records when a batch would be over
    it (a record alone goes alone)."""
    batches: list[list[dict[str, Any]]] = [[]]
    size = event_bytes({"Records": []})
    for record in records:
        added = event_bytes(record) + 2  # and its separator
        if batches[-1] and size + added > REQUEST_BYTES:
            batches.append([])
            size = event_bytes({"Records": []})
        batches[-1].append(record)
        size += added
    return [batch for batch in batches if batch]
