"""The mock's error answers, shaped as OpenAI's: a refused request's body, a rate limit's or a
server error's, and the flex tier's 429 Resource Unavailable."""

from __future__ import annotations

from starlette.responses import JSONResponse


class OpenAIError(Exception):
    """A request OpenAI refuses, with the body it answers."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.body = {
            "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
        }


def error(
    status: int,
    message: str,
    *,
    retry_after: float | None = None,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> JSONResponse:
    """OpenAI's error answer: its body, and Retry-After when given. A fraction of a second there
    is off-standard but keeps compressed test schedules short; llmtasks reads it."""
    headers = dict(headers or {})
    if retry_after is not None:
        value = f"{retry_after:.0f}" if float(retry_after).is_integer() else f"{retry_after:.3f}"
        headers["Retry-After"] = value
    kind = {429: "rate_limit_exceeded", 500: "server_error"}.get(status, "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status, headers=headers)


def flex_unavailable(headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's answer to a flex call its flex tier has no capacity for: 429 Resource Unavailable,
    not billed (OpenAI's flex guide). OpenAI documents the status and its name, not the body:
    this one is its error shape with the name as the code."""
    message = (
        "Resource Unavailable: flex processing has no capacity for this request right now. You"
        " were not charged; retry later, or send service_tier auto for standard processing (mock)."
    )
    body = {
        "error": {
            "message": message,
            "type": "service_unavailable_error",
            "param": None,
            "code": "resource_unavailable",
        }
    }
    return JSONResponse(body, 429, headers=headers)
