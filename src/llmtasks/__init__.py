"""llmtasks: long LLM calls run asynchronously on AWS serverless.

The client side is importable from here: `Client`, `AsyncClient`, `verify_webhook`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "ProblemError",
    "TaskFailedError",
    "WaitTimeoutError",
    "__version__",
    "verify_webhook",
]

if TYPE_CHECKING:
    from llmtasks.client import (
        AsyncClient,
        Client,
        ProblemError,
        TaskFailedError,
        WaitTimeoutError,
        verify_webhook,
    )


def __getattr__(name: str) -> Any:
    """The client on first use: the Lambda functions import this package too, and its HTTP
    client's imports would be a fifth of their cold start."""
    if name in __all__:
        from llmtasks import client

        return getattr(client, name)
    raise AttributeError(f"module 'llmtasks' has no attribute {name!r}")
