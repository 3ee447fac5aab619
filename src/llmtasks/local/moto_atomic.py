"""DynamoDB's conditional writes made atomic in moto, as they are in DynamoDB.

moto reads the old item (for ReturnValues), checks a ConditionExpression and applies the write
as separate steps with no lock, so two threads (the moto server serves each request on its own
thread; the unit tests run sandboxes in threads too) can both pass a condition only one of them
should, or both be told the same old value. The task lease and the LLM call pace rely on that
atomicity. `install()` serialises moto's handling of each DynamoDB write request behind one lock,
in whatever process runs moto.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from moto.dynamodb.responses import DynamoHandler

_WRITES = ("put_item", "update_item", "delete_item", "transact_write_items", "batch_write_item")
_lock = threading.RLock()


def _atomic(write: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(write)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _lock:
            return write(*args, **kwargs)

    locked.__llmtasks_atomic__ = True  # type: ignore[attr-defined]
    return locked


def install() -> None:
    """Idempotent; must run before moto handles the first request."""
    for name in _WRITES:
        write = getattr(DynamoHandler, name, None)
        if write is not None and not getattr(write, "__llmtasks_atomic__", False):
            setattr(DynamoHandler, name, _atomic(write))
