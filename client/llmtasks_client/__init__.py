"""llmtasks-client: the Python SDK of llmtasks' HTTP API.

`Client` and `AsyncClient` submit, read, wait on and cancel tasks and batches; `verify_webhook`
checks a delivery's Standard Webhooks signature. It depends on httpx, pydantic and
standardwebhooks alone: nothing of AWS reaches an application that imports it.
"""

from __future__ import annotations

from llmtasks_client.client import (
    DEFAULT_URL,
    AsyncClient,
    BatchWaitTimeoutError,
    Client,
    ProblemError,
    TaskFailedError,
    WaitTimeoutError,
    WebhookVerificationError,
    verify_webhook,
)
from llmtasks_client.models import (
    BatchEvent,
    BatchEventPage,
    BatchResult,
    BatchStatus,
    BatchView,
    OutputChunk,
    TaskList,
    TaskOutputPage,
    TaskStatus,
    TaskView,
    Usage,
    UsageReport,
    UsageRow,
    UsageTotals,
    WebhookAttempt,
    WebhookEvent,
    WebhookReplay,
)

# The SDK's release (semantic versioning, CHANGELOG.md); its pyproject.toml reads it from here.
__version__ = "0.2.0"

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "BatchEvent",
    "BatchEventPage",
    "BatchResult",
    "BatchStatus",
    "BatchView",
    "BatchWaitTimeoutError",
    "Client",
    "OutputChunk",
    "ProblemError",
    "TaskFailedError",
    "TaskList",
    "TaskOutputPage",
    "TaskStatus",
    "TaskView",
    "Usage",
    "UsageReport",
    "UsageRow",
    "UsageTotals",
    "WaitTimeoutError",
    "WebhookAttempt",
    "WebhookEvent",
    "WebhookReplay",
    "WebhookVerificationError",
    "__version__",
    "verify_webhook",
]
