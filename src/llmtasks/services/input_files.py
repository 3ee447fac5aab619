"""The submit's check of the files a task names by id (images and documents uploaded with
purpose user_data or vision): each is the caller's, of a purpose a task may name, and together
they hold at most MAX_TASK_FILE_BYTES. What it learns (sizes, a PDF's pages) bounds the task's
most cost. Only the files' heads are read: their bytes stay in S3 until the worker's call.
"""

from __future__ import annotations

import functools

from llmtasks.aws.results import ResultBlobs
from llmtasks.domain.batches import StoredFile
from llmtasks.domain.errors import ApiError, InvalidInput
from llmtasks.domain.input_files import INPUT_PURPOSES, MAX_TASK_FILE_BYTES, FileFacts, facts_of
from llmtasks.domain.llm_request import FilePart, ImagePart, LLMRequest


class InputFileNotFound(ApiError):
    status, title, slug = 404, "File not found", "not-found"

    def __init__(self, detail: str, *, field: str) -> None:
        super().__init__(detail)
        self.field = field


def named_files(request: LLMRequest, where: str = "") -> dict[str, str]:
    """Each file id the request names, with the field that first names it."""
    named: dict[str, str] = {}
    prefix = f"{where}." if where else ""
    for m, message in enumerate(request.messages or []):
        if not isinstance(message.content, list):
            continue
        for p, part in enumerate(message.content):
            place = f"{prefix}messages[{m}].content[{p}]"
            if isinstance(part, ImagePart) and part.image_url.file_id is not None:
                named.setdefault(part.image_url.file_id, f"{place}.image_url.file_id")
            elif isinstance(part, FilePart) and part.file.file_id is not None:
                named.setdefault(part.file.file_id, f"{place}.file.file_id")
    return named


class InputFiles:
    """The checks of one submit: a file named again (by another item of a batch) is looked up once."""

    def __init__(self, results: ResultBlobs) -> None:
        self._results = results
        self._seen: dict[tuple[str, str], tuple[StoredFile | None, FileFacts | None]] = {}

    def _look(self, tenant_id: str, file_id: str) -> tuple[StoredFile | None, FileFacts | None]:
        key = (tenant_id, file_id)
        if key not in self._seen:
            stored = self._results.file(tenant_id, file_id)
            facts = None
            if stored is not None and stored.purpose in INPUT_PURPOSES:
                head = functools.partial(self._results.file_head, tenant_id, file_id, 1024)
                facts = facts_of(stored.size, stored.pages, head)
            self._seen[key] = (stored, facts)
        return self._seen[key]

    def check(self, tenant_id: str, request: LLMRequest, *, where: str = "") -> dict[str, FileFacts]:
        """The facts of each file `request` names; 404 for one the tenant does not have, 422
        for one of another purpose or when together they are over MAX_TASK_FILE_BYTES."""
        facts: dict[str, FileFacts] = {}
        total = 0
        for file_id, field in named_files(request, where).items():
            stored, found = self._look(tenant_id, file_id)
            if stored is None:
                raise InputFileNotFound(
                    f"{field}: no file '{file_id}' (unknown, expired, never uploaded, or not yours).",
                    field=field,
                )
            if found is None:
                raise InvalidInput(
                    f"{field}: the file '{file_id}' has purpose '{stored.purpose}'; a task names files"
                    " uploaded with purpose 'user_data' or 'vision'.",
                    field=field,
                )
            total += stored.size
            if total > MAX_TASK_FILE_BYTES:
                raise InvalidInput(
                    f"{field}: the files a task names hold at most {MAX_TASK_FILE_BYTES} bytes in all;"
                    f" these hold {total} so far.",
                    field=field,
                )
            facts[file_id] = found
        return facts

    def known(self, tenant_id: str, request: LLMRequest) -> dict[str, FileFacts]:
        """The facts of the files `request` names that the tenant still has (no check: a file
        gone is bound as the largest a task may name, and its task fails when it runs)."""
        facts = {file_id: self._look(tenant_id, file_id)[1] for file_id in request.file_ids()}
        return {file_id: found for file_id, found in facts.items() if found is not None}
