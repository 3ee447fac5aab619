"""llmtasks-client: the Python SDK of llmtasks' HTTP API.

`Client` and `AsyncClient` submit, read, wait on and cancel tasks and batches; `image_part` and
`file_part` make a message's content parts; a pydantic model given as `response_format` asks for
an answer that fits it and parses it; `verify_webhook` checks a delivery's Standard Webhooks
signature. It depends on httpx, pydantic and
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
    FileObject,
    McpApprovalRequest,
    OutputChunk,
    OutputMessage,
    RequiredAction,
    Step,
    StepEvent,
    StepList,
    TaskList,
    TaskOutputPage,
    TaskStatus,
    TaskView,
    ToolCall,
    Usage,
    UsageReport,
    UsageRow,
    UsageTotals,
    WebhookAttempt,
    WebhookEvent,
    WebhookReplay,
)
from llmtasks_client.parts import INLINE_BYTES, LocalFile, file_part, image_part, text_part
from llmtasks_client.structured import json_schema_format, strict_json_schema
from llmtasks_client.task_options import TaskOptions

# The SDK's release (semantic versioning, CHANGELOG.md); its pyproject.toml reads it from here.
__version__ = "0.2.0"

__all__ = [
    "DEFAULT_URL",
    "INLINE_BYTES",
    "AsyncClient",
    "BatchEvent",
    "BatchEventPage",
    "BatchResult",
    "BatchStatus",
    "BatchView",
    "BatchWaitTimeoutError",
    "Client",
    "FileObject",
    "LocalFile",
    "McpApprovalRequest",
    "OutputChunk",
    "OutputMessage",
    "ProblemError",
    "RequiredAction",
    "Step",
    "StepEvent",
    "StepList",
    "TaskFailedError",
    "TaskList",
    "TaskOptions",
    "TaskOutputPage",
    "TaskStatus",
    "TaskView",
    "ToolCall",
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
    "file_part",
    "image_part",
    "json_schema_format",
    "strict_json_schema",
    "text_part",
    "verify_webhook",
]
