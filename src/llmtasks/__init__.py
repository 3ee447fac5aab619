"""llmtasks: long LLM calls run asynchronously on AWS serverless.

The client side is importable from here: `Client`, `AsyncClient`, `verify_webhook`.
"""

__version__ = "0.1.0"

# After __version__: the package's modules read it.
from llmtasks.client import (
    AsyncClient,
    Client,
    ProblemError,
    TaskFailedError,
    WaitTimeoutError,
    verify_webhook,
)

__all__ = [
    "AsyncClient",
    "Client",
    "ProblemError",
    "TaskFailedError",
    "WaitTimeoutError",
    "__version__",
    "verify_webhook",
]
