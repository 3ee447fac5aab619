"""OpenAI's Uploads API on the results bucket: a file of any size (up to a batch's input limit;
50 MB for an image or document a task names, purpose user_data or vision) sent in parts, each
within a request's 6 MB, then made one file that `batches.create` or a task reads.

Each part is an object of its own beside the upload's record (uploads/<tenant>/<upload>/...), so
parts may come in any order and at once; `complete` checks that they add up to the bytes the
upload announced, then streams them, in the order its part_ids give, into the file (S3 parts of
8 MiB; one at a time in memory), with their MD5 checked on the way. (S3's own part copy would
spare that pass, but it takes parts of 5 MiB and more, and a request through the gateway carries
about 4.5 MB.) An upload never completed expires after an hour, and its parts go with the
bucket's uploads/ rule a day later."""

from __future__ import annotations

import hashlib
import re
import time
import uuid

from llmtasks.aws.results import ResultBlobs
from llmtasks.domain.batches import (
    MAX_INPUT_FILE_BYTES,
    UPLOAD_TTL_S,
    FileUpload,
    new_file_id,
)
from llmtasks.domain.errors import ApiError, InvalidInput
from llmtasks.domain.input_files import INPUT_PURPOSES, MAX_TASK_FILE_BYTES, PageCounter
from llmtasks.domain.rules import Clock
from llmtasks.observability import logger


class UploadNotFound(ApiError):
    status, title, slug = 404, "Upload not found", "not-found"


# A media type as S3 metadata keeps it (ASCII); any other is not kept (the bytes say what they are).
_MIME = re.compile(r"^[\w.+-]{1,100}/[\w.+-]{1,100}$", re.ASCII)
PURPOSES = ("batch", *sorted(INPUT_PURPOSES))


def check_purpose(purpose: str) -> None:
    """A purpose llmtasks keeps files for: a batch's input, or a task's images and documents."""
    if purpose not in PURPOSES:
        raise InvalidInput(
            "purpose must be 'batch' (a batch's input) or 'user_data' or 'vision' (images and"
            " documents a task names by file_id)",
            field="purpose",
        )


def _upload_id() -> str:
    return f"upload_{uuid.uuid4().hex}"


class FileUploads:
    def __init__(self, results: ResultBlobs, *, clock: Clock = time.time) -> None:
        self._results = results
        self._clock = clock

    def create(
        self, tenant_id: str, *, size: int, filename: str, purpose: str, mime_type: str | None = None
    ) -> FileUpload:
        check_purpose(purpose)
        if purpose in INPUT_PURPOSES and not 0 < size <= MAX_TASK_FILE_BYTES:
            raise InvalidInput(
                f"bytes must be from 1 to {MAX_TASK_FILE_BYTES} (an image or document a task names)",
                field="bytes",
            )
        if not 0 < size <= MAX_INPUT_FILE_BYTES:
            raise InvalidInput(
                f"bytes must be from 1 to {MAX_INPUT_FILE_BYTES} (a batch's input file at most)",
                field="bytes",
            )
        now = self._clock()
        upload = FileUpload(
            upload_id=_upload_id(),
            tenant_id=tenant_id,
            file_id=new_file_id(),
            bytes=size,
            filename=filename,
            purpose=purpose,
            created_at=now,
            expires_at=now + UPLOAD_TTL_S,
            mime_type=mime_type if mime_type and _MIME.match(mime_type) else None,
        )
        self._results.put_upload(upload)
        return upload

    def get(self, tenant_id: str, upload_id: str) -> FileUpload:
        upload = self._results.upload(tenant_id, upload_id) if upload_id.startswith("upload_") else None
        if upload is None:
            raise UploadNotFound(f"No upload found with id '{upload_id[:80]}'.")
        return upload

    def _pending(self, tenant_id: str, upload_id: str) -> FileUpload:
        upload = self.get(tenant_id, upload_id)
        status = upload.status_at(self._clock())
        if status != "pending":
            raise InvalidInput(f"The upload is {status}: it takes no more parts.", field="upload_id")
        return upload

    def add_part(self, tenant_id: str, upload_id: str, data: bytes) -> tuple[str, float]:
        """Stores one part; its id and when it was added."""
        upload = self._pending(tenant_id, upload_id)
        if not data:
            raise InvalidInput("the 'data' field is missing or empty", field="data")
        part_id = f"part_{uuid.uuid4().hex}"
        self._results.put_part(tenant_id, upload.upload_id, part_id, data)
        return part_id, self._clock()

    def complete(self, tenant_id: str, upload_id: str, part_ids: list[str], md5: str | None) -> FileUpload:
        """The parts, in `part_ids`' order, made the upload's file (`file_id`); refused, with
        nothing made, when a part is not the upload's, the sizes do not add up to its bytes, or
        the MD5 given is not the bytes'."""
        upload = self._pending(tenant_id, upload_id)
        if not part_ids or len(set(part_ids)) != len(part_ids):
            raise InvalidInput("part_ids must name each part once, in order", field="part_ids")
        if any(not part_id.startswith("part_") for part_id in part_ids):
            raise InvalidInput("part_ids must be ids this upload's parts were given", field="part_ids")
        sizes = self._results.part_sizes(tenant_id, upload_id, part_ids)
        missing = [part_id for part_id, size in zip(part_ids, sizes, strict=True) if size is None]
        if missing:
            raise InvalidInput(f"No part '{missing[0][:80]}' in this upload.", field="part_ids")
        known = [size or 0 for size in sizes]
        if sum(known) != upload.bytes:
            raise InvalidInput(
                f"The parts hold {sum(known)} bytes; the upload was created for {upload.bytes}.",
                field="part_ids",
            )
        described = {"mime_type": upload.mime_type} if upload.mime_type else {}
        made = self._results.file_writer(
            tenant_id, upload.file_id, filename=upload.filename, purpose=upload.purpose, **described
        )
        digest = hashlib.md5(usedforsecurity=False)
        pages = PageCounter()
        try:
            for chunk in self._results.part_chunks(tenant_id, upload_id, part_ids):
                digest.update(chunk)
                if upload.purpose in INPUT_PURPOSES:
                    pages.feed(chunk)
                made.write(chunk)
            if md5 is not None and digest.hexdigest() != md5.lower():
                raise InvalidInput("The md5 given is not the parts' bytes' MD5.", field="md5")
            made.close()
        except BaseException:
            made.abort()
            raise
        if pages.pages is not None:
            # A PDF's pages bound what a task naming it may cost (media_tokens.py).
            self._results.describe_file(tenant_id, upload.file_id, pages=str(pages.pages))
        completed = upload.model_copy(update={"status": "completed"})
        self._results.put_upload(completed)
        logger.info("upload completed", upload_id=upload_id, file_id=upload.file_id, parts=len(part_ids))
        return completed

    def cancel(self, tenant_id: str, upload_id: str) -> FileUpload:
        upload = self._pending(tenant_id, upload_id)
        cancelled = upload.model_copy(update={"status": "cancelled"})
        self._results.put_upload(cancelled)
        return cancelled
