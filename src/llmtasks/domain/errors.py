"""Domain errors. The API maps each `ApiError` to one problem+json reply (api.py); the worker
reads `LLMError.transient` to decide between a retry and a failure."""

from __future__ import annotations

# The error code of a provider's 429 (the pace reacts to it).
RATE_LIMITED = "llm_rate_limited"
# ... and of its flex tier's 429 Resource Unavailable: the provider had no flex capacity for the
# call (and billed none). Not the key's limit: the task waits on its queue until its time runs out.
FLEX_UNAVAILABLE = "llm_flex_unavailable"


class ApiError(Exception):
    status: int = 500
    title: str = "Internal error"
    slug: str = "internal"
    retry_after_s: int | None = None  # the reply's Retry-After: the same request may then succeed

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Unauthorized(ApiError):
    status, title, slug = 401, "Unauthorized", "unauthorized"


class TaskNotFound(ApiError):
    status, title, slug = 404, "Task not found", "not-found"

    def __init__(self, task_id: str) -> None:
        super().__init__(f"No task '{task_id}' (unknown, expired, or not yours).")


class BatchNotFound(ApiError):
    status, title, slug = 404, "Batch not found", "not-found"

    def __init__(self, batch_id: str) -> None:
        super().__init__(f"No batch '{batch_id}' (unknown, expired, or not yours).")


class FileNotFound(ApiError):
    status, title, slug = 404, "File not found", "not-found"

    def __init__(self, file_id: str) -> None:
        super().__init__(f"No file '{file_id[:80]}' (unknown, expired, never uploaded, or not yours).")


class RouteNotServed(ApiError):
    """A route this deployment is not configured to serve."""

    status, title, slug = 404, "Not served", "not-found"


class TaskConflict(ApiError):
    status, title, slug = 409, "Conflict", "conflict"


class PayloadTooLarge(ApiError):
    status, title, slug = 413, "Payload too large", "payload-too-large"


class InvalidInput(ApiError):
    status, title, slug = 422, "Invalid input", "invalid-input"

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail)
        self.field = field


class TooManyRequests(ApiError):
    """A key's limit: its requests a second, or its tasks in flight. `retry_after_s` says when."""

    status, title, slug = 429, "Too many requests", "too-many-requests"

    def __init__(self, detail: str, *, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class ServiceUnavailable(ApiError):
    status, title, slug = 503, "Service unavailable", "unavailable"
    retry_after_s = 1  # a backend's hiccup


class BackendError(Exception):
    """DynamoDB, SQS or S3 did not do what was asked (throttled, unreachable, misconfigured)."""


class StaleWrite(Exception):
    """A conditional write lost: the task moved on (cancelled, completed, or claimed by another)."""


class LLMError(Exception):
    """A provider call that did not produce a completion.

    `transient` errors (429, 408, 409, 5xx, timeouts, connection errors) are retried; the rest fail
    the task at once with `code` and a readable message.
    """

    def __init__(self, message: str, *, code: str, transient: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.transient = transient
        self.retry_after = retry_after


class KeysFull(Exception):
    """No provider key has room in its minute for the call (its tokens or one more request):
    the task waits on its queue rather than take a 429. The first key has room in `wait_s` at
    the latest, and in `soonest_s` if the calls running on it use none of what they reserved."""

    def __init__(self, wait_s: float, soonest_s: float | None = None) -> None:
        super().__init__(f"No LLM key has room for the call for {wait_s:.1f} s.")
        self.wait_s = wait_s
        self.soonest_s = wait_s if soonest_s is None else min(soonest_s, wait_s)


class RetryLater(Exception):
    """This queue message must come back after `delay_s`: the record is reported as a batch-item
    failure with its visibility pushed out, so the function never sleeps through a backoff."""

    def __init__(self, delay_s: float, reason: str) -> None:
        super().__init__(reason)
        self.delay_s = delay_s
