"""Whether an answer is what its request asked for: JSON for `json_object`, JSON that fits the
schema for `json_schema`. An answer that is not is retried as a transient error (the model may
well answer right the next time), and after the last retry fails the task as `invalid_output`."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from llmtasks.domain.llm_request import LLMRequest


def answer_problem(request: LLMRequest, text: str, *, refused: bool, called_tools: bool) -> str | None:
    """Why `text` does not answer `request`'s response_format, in a sentence; None when it does
    (or when the model refused, or answered with tool calls: then there is no answer to check)."""
    if not request.wants_json or refused or called_tools:
        return None
    try:
        value: Any = json.loads(text)
    except ValueError:
        return "The model's answer is not JSON."
    schema = request.json_schema
    if schema is None:
        return None if isinstance(value, dict) else "The model's answer is JSON, but not an object."
    try:
        error = next(iter(Draft202012Validator(schema).iter_errors(value)), None)
    except SchemaError as exc:
        return f"The response_format's schema is not a valid JSON Schema: {exc.message}"
    if error is None:
        return None
    where = "/".join(str(part) for part in error.absolute_path) or "the answer"
    return f"The model's answer does not fit the schema at {where}: {error.message[:300]}"
