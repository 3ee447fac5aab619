"""OpenAI batch files line by line, as BatchFunction reads and writes them: a request line of an
input file read as a batch item (`line_parser`), and an ended batch's output and error files
written a page of results at a time (`OpenAIBatchFiles`), in OpenAI's formats. The routes that
serve these files are openai_batches.py's.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, get_args

from pydantic import ValidationError

from llmtasks.api.openai_objects import chat_completion, response_object
from llmtasks.api.openai_requests import CreateResponse, Endpoint
from llmtasks.domain.batch_input import LineParser, first_error
from llmtasks.domain.batches import Batch, BatchFiles, BatchItem, BatchResult
from llmtasks.domain.errors import InvalidInput
from llmtasks.domain.llm_request import PARAMETERS
from llmtasks.domain.models import Task, TaskStatus
from llmtasks.services.batch_outcomes import BatchOutcomes

ENDPOINTS: tuple[str, ...] = get_args(Endpoint)
RESULTS_PAGE = 1000


def _line_item(line: Any, endpoint: str) -> BatchItem:
    """One input line as a batch item; ValueError says why it cannot be served."""
    if not isinstance(line, dict):
        raise ValueError("a line must be a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise ValueError("custom_id is missing")
    if line.get("method", "POST") != "POST":
        raise ValueError("method must be POST")
    if line.get("url") != endpoint:
        raise ValueError(f"url must be the batch's endpoint, {endpoint}")
    body = line.get("body")
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    try:
        if endpoint == "/v1/responses":
            for name in ("webhook_url", "stream"):  # a batch has one webhook, and writes answers whole
                if name in body:
                    raise ValueError(f"unsupported parameter '{name}'")
            asked = CreateResponse.model_validate({**body, "background": True}).task_request()
            # A batch item's fields alone: a task body's own (its run's, its provider's background
            # mode) have no place in a batch, whose items are one call each.
            kept = asked.model_dump(exclude_none=True, include=set(BatchItem.model_fields))
            return BatchItem(custom_id=custom_id, **kept)
        return _chat_item(custom_id, body)
    except (ValidationError, InvalidInput) as invalid:
        raise ValueError(
            str(invalid).splitlines()[0] if isinstance(invalid, InvalidInput) else first_error(invalid)
        ) from invalid


def line_parser(endpoint: str) -> LineParser:
    """How a batch's input file of OpenAI request lines for `endpoint` is read (BatchFunction)."""
    return functools.partial(_line_item, endpoint=endpoint)


# A chat line's body: OpenAI's Chat Completions request for one generation (n and stream are
# checked, then dropped).
_CHAT_FIELDS = frozenset({"model", "messages", "n", "stream", *PARAMETERS})


def _chat_item(custom_id: str, body: dict[str, Any]) -> BatchItem:
    unsupported = sorted(set(body) - _CHAT_FIELDS)
    if unsupported:
        raise ValueError(f"unsupported parameter '{unsupported[0]}'")
    if body.get("n", 1) != 1 or isinstance(body.get("n"), bool):
        raise ValueError("unsupported parameter 'n': a request is answered once (n=1)")
    if body.get("stream") not in (None, False):
        raise ValueError("unsupported parameter 'stream': a batch writes each answer whole")
    if "messages" not in body:
        raise ValueError("'messages' is missing")
    asked = {name: value for name, value in body.items() if name not in ("n", "stream")}
    return BatchItem.model_validate({**asked, "custom_id": custom_id})


class OpenAIBatchFiles:
    """An ended batch's outcomes in OpenAI's output and error files, written by BatchFunction
    before the batch ends (BatchEnds), a page of results at a time (neither file is ever whole
    in memory): its ids derive from the batch's, and a retried batch's end has files of its own
    (its items' latest outcomes)."""

    def __init__(self, outcomes: BatchOutcomes, *, clock: Any = time.time) -> None:
        self._outcomes = outcomes
        self._clock = clock

    def write(self, batch: Batch) -> BatchFiles:
        tenant = batch.tenant_id
        output_id, error_id = file_ids(batch)
        endpoint = (batch.metadata or {})["openai"]["endpoint"]
        ended_at = int(self._clock())
        outputs = self._outcomes.open_file(tenant, output_id, filename="output.jsonl", purpose="batch_output")
        errors = self._outcomes.open_file(tenant, error_id, filename="errors.jsonl", purpose="batch_output")
        try:
            for line in self._refused_lines(batch):
                errors.write(line)
            for row, task in self._outcomes.every(batch, page_size=RESULTS_PAGE):
                if row.status is TaskStatus.COMPLETED and task is not None:
                    outputs.write(_json_line(_output_line(row, task, endpoint, ended_at)))
                    continue
                code = (
                    "batch_cancelled"
                    if row.status is TaskStatus.CANCELLED
                    else (row.error_code or "server_error")
                )
                errors.write(
                    _json_line(_error_line(row.custom_id, code, row.error or "The request was not run."))
                )
            has_errors = errors.size > 0
            if has_errors:
                errors.close()
            else:
                errors.abort()
            outputs.close()
        except BaseException:
            outputs.abort()
            errors.abort()
            raise
        return BatchFiles(output_file_id=output_id, error_file_id=error_id if has_errors else None)

    def _refused_lines(self, batch: Batch) -> Iterator[bytes]:
        """The input's lines that were not served, as error lines: read from the batch's refused
        lines (by line number)."""
        if batch.input is None or not batch.input.refused:
            return
        for refused in self._outcomes.refused(batch):
            yield _json_line(
                _error_line(refused.custom_id, "invalid_request", f"line {refused.line}: {refused.error}")
            )


def file_ids(batch: Batch) -> tuple[str, str]:
    """The ids of the batch's output and error files, derived from its id: a retried batch's end
    has files of its own."""
    ending = f"-retry{batch.retries}" if batch.retries else ""
    return f"file-{batch.batch_id}-output{ending}", f"file-{batch.batch_id}-errors{ending}"


def _json_line(line: dict[str, Any]) -> bytes:
    return json.dumps(line).encode() + b"\n"


def _error_line(custom_id: Any, code: str, message: str) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def _output_line(row: BatchResult, task: Task, endpoint: str, ended_at: int) -> dict[str, Any]:
    """A completed request's line: its Response object, or its chat.completion (with the usage
    every billed attempt used)."""
    body = (
        response_object(task) if endpoint == "/v1/responses" else chat_completion(task, row.usage, ended_at)
    )
    return {
        "id": f"batch_req_{row.task_id}",
        "custom_id": row.custom_id,
        "response": {"status_code": 200, "request_id": row.task_id, "body": body},
        "error": None,
    }
