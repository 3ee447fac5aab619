"""A batch input file read as OpenAI's Batch API reads it while the batch is `validating`: its
request lines, or the errors that fail the batch, in OpenAI's codes with their line numbers
(`empty_file`, `too_many_tasks`, `invalid_json_line`, `missing_required_parameter`,
`duplicate_custom_id`, `invalid_method`, `url_mismatch`, `model_mismatch`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ERRORS_SHOWN = 100  # the validation errors a failed batch lists


class _Invalid(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.error = {"code": code, "message": message, "param": param}


@dataclass
class BatchInput:
    lines: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (custom_id, body)
    model: str | None = None  # the first line's
    errors: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's BatchError objects


def read_input(data: bytes, endpoint: str, *, max_requests: int) -> BatchInput:
    """The file's lines (none when it has errors) and its errors."""
    read = BatchInput()
    raw = [line for line in data.split(b"\n") if line.strip()]
    if not raw:
        message = "The batch input file is empty."
        read.errors.append({"code": "empty_file", "message": message, "param": None, "line": None})
        return read
    if len(raw) > max_requests:
        message = f"The batch input file has {len(raw)} requests; a batch may hold at most {max_requests}."
        read.errors.append({"code": "too_many_tasks", "message": message, "param": None, "line": None})
        return read
    seen: set[str] = set()
    for number, text in enumerate(raw, start=1):
        try:
            read.lines.append(_line(read, text, endpoint, seen))
        except _Invalid as invalid:
            if len(read.errors) < ERRORS_SHOWN:
                read.errors.append({**invalid.error, "line": number})
    if read.errors:
        read.lines = []
    return read


def _line(read: BatchInput, text: bytes, endpoint: str, seen: set[str]) -> tuple[str, dict[str, Any]]:
    try:
        line = json.loads(text)
    except ValueError:
        raise _Invalid("invalid_json_line", "This line is not parseable as valid JSON.") from None
    if not isinstance(line, dict):
        raise _Invalid("invalid_json_line", "This line is not a JSON object.")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _Invalid("missing_required_parameter", "Missing required parameter: 'custom_id'.", "custom_id")
    if custom_id in seen:
        raise _Invalid(
            "duplicate_custom_id",
            "The custom_id for this request is a duplicate of another request. The custom_id"
            " parameter must be unique for each request in a batch.",
            "custom_id",
        )
    seen.add(custom_id)
    if line.get("method") != "POST":
        raise _Invalid("invalid_method", "The method of each request must be POST.", "method")
    if line.get("url") != endpoint:
        raise _Invalid(
            "url_mismatch", f"The url of this request does not match the batch's endpoint, {endpoint}.", "url"
        )
    body = line.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise _Invalid(
            "missing_required_parameter", "Missing required parameter: 'body.model'.", "body.model"
        )
    if read.model is None:
        read.model = body["model"]
    elif body["model"] != read.model:
        raise _Invalid(
            "model_mismatch",
            f"The model of this request, {body['model']}, is not the batch's model, {read.model}: a batch"
            " holds requests to one model.",
            "body.model",
        )
    return custom_id, body
