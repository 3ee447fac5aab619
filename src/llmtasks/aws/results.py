"""ResultsBucket: results too large to sit in the task's DynamoDB item (400 KB per item, and the
prompt may take half of that) are stored in S3; readers get the text either way. A batch's items
wait here too (its manifest, one JSON line an item) until they are fanned out into tasks, and so
do the OpenAI surface's files (a batch's input, output and error files), under their tenant."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.aws.clients import new_client
from llmtasks.domain.batches import FileUpload, StoredFile
from llmtasks.domain.errors import BackendError
from llmtasks.domain.input_files import INPUT_PURPOSES, FileFacts, InputFile, facts_of
from llmtasks.domain.models import Task
from llmtasks.observability import logger

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef


def manifest_key(batch_id: str) -> str:
    """Where a batch's items wait as JSON lines until they are fanned out."""
    return f"batches/{batch_id}.jsonl"


# An upload's parts are looked up this many at once: S3 answers each in about 0.1 s.
HEAD_THREADS = 8


def _missing(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


@contextmanager
def _s3(action: str) -> Iterator[None]:
    """S3's failures as the domain's BackendError: nothing above this adapter sees botocore."""
    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        raise BackendError(f"S3 {action} failed: {exc}") from exc


class ResultBlobs:
    def __init__(self, bucket: str, client: S3Client | None = None) -> None:
        self.bucket = bucket
        self._given = client

    @property
    def _client(self) -> S3Client:
        # Created on first use: most tasks never need S3, so cold starts do not pay for it.
        if self._given is None:
            self._given = new_client("s3")
        return self._given

    def put(self, task_id: str, text: str) -> str:
        """Stores the text; returns the key the task item keeps as `result_ref`."""
        key = f"results/{task_id}.txt"
        with _s3("put"):
            self._client.put_object(
                Bucket=self.bucket, Key=key, Body=text.encode(), ContentType="text/plain; charset=utf-8"
            )
        return key

    def get(self, key: str) -> str:
        with _s3("get"):
            return self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()

    def hydrate(self, task: Task) -> Task:
        """The task with its result text, fetched from the bucket when the item only has the key."""
        if task.result_ref and task.result is None:
            return task.model_copy(update={"result": self.get(task.result_ref)})
        return task

    def put_manifest(self, batch_id: str, lines: list[bytes]) -> str:
        """Stores a batch's items, one JSON line each; returns the object's key."""
        key = manifest_key(batch_id)
        with _s3("put"):
            self._client.put_object(
                Bucket=self.bucket, Key=key, Body=b"".join(lines), ContentType="application/jsonl"
            )
        return key

    def manifest_lines(self, key: str, start: int, end: int) -> list[bytes]:
        """The lines between two byte offsets of a manifest (one ranged GET, not the whole object)."""
        if end <= start:
            return []
        with _s3("get"):
            body = self._client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            return body["Body"].read().splitlines()

    def _file_key(self, tenant_id: str, file_id: str) -> str:
        return f"files/{tenant_id}/{file_id}"

    def presign_upload(self, tenant_id: str, file_id: str, *, expires_s: int) -> str:
        """A URL that PUTs the tenant's file (up to S3's 5 GB a PUT) straight into the bucket:
        its bytes never pass through the API or a function."""
        with _s3("presign"):
            return self._client.generate_presigned_url(
                "put_object",
                Params={"Bucket": self.bucket, "Key": self._file_key(tenant_id, file_id)},
                ExpiresIn=expires_s,
            )

    def presign_download(self, tenant_id: str, file_id: str, *, expires_s: int, filename: str) -> str:
        """A URL that GETs the tenant's file from the bucket, whatever its size."""
        with _s3("presign"):
            return self._client.generate_presigned_url(
                "get_object",
                Params={
                    "Bucket": self.bucket,
                    "Key": self._file_key(tenant_id, file_id),
                    "ResponseContentDisposition": f'attachment; filename="{filename}"',
                },
                ExpiresIn=expires_s,
            )

    def _object_chunks(self, key: str) -> Iterator[bytes]:
        """An object as it streams from S3, a mebibyte at a time (never whole)."""
        with _s3("get"):
            body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
        with _s3("get"), closing(body):
            yield from body.iter_chunks(1024 * 1024)

    def file_chunks(self, tenant_id: str, file_id: str) -> Iterator[bytes]:
        """The tenant's file as it streams from S3."""
        return self._object_chunks(self._file_key(tenant_id, file_id))

    def file_head(self, tenant_id: str, file_id: str, size: int) -> bytes:
        """The first `size` bytes of the tenant's file (one ranged GET)."""
        with _s3("get"):
            body = self._client.get_object(
                Bucket=self.bucket, Key=self._file_key(tenant_id, file_id), Range=f"bytes=0-{size - 1}"
            )
            return body["Body"].read()

    def file_writer(
        self, tenant_id: str, file_id: str, *, filename: str, purpose: str, **described: str
    ) -> ObjectWriter:
        """A writer of the tenant's file, in parts as it grows (see ObjectWriter); `described`
        adds to its metadata (an input file's mime_type, its pages, set before close)."""
        return ObjectWriter(
            self._client,
            self.bucket,
            self._file_key(tenant_id, file_id),
            metadata={"filename": filename, "purpose": purpose, **described},
        )

    def manifest_writer(self, batch_id: str) -> ObjectWriter:
        """A writer of a batch's manifest (the put_manifest of a batch read from a file)."""
        return ObjectWriter(self._client, self.bucket, manifest_key(batch_id))

    # OpenAI's Uploads API: an upload's record and its parts wait under uploads/ (which expires
    # after a day: an upload never completed costs a day's storage of what was sent, at most).

    def _upload_key(self, tenant_id: str, upload_id: str, name: str) -> str:
        return f"uploads/{tenant_id}/{upload_id}/{name}"

    def put_upload(self, upload: FileUpload) -> None:
        with _s3("put"):
            self._client.put_object(
                Bucket=self.bucket,
                Key=self._upload_key(upload.tenant_id, upload.upload_id, "upload.json"),
                Body=upload.model_dump_json().encode(),
                ContentType="application/json",
            )

    def upload(self, tenant_id: str, upload_id: str) -> FileUpload | None:
        """The tenant's upload, or None (another tenant's uploads are none of its own)."""
        with _s3("get"):
            try:
                body = self._client.get_object(
                    Bucket=self.bucket, Key=self._upload_key(tenant_id, upload_id, "upload.json")
                )["Body"].read()
            except ClientError as exc:
                if _missing(exc):
                    return None
                raise
        return FileUpload.model_validate_json(body)

    def put_part(self, tenant_id: str, upload_id: str, part_id: str, data: bytes) -> None:
        with _s3("put"):
            self._client.put_object(
                Bucket=self.bucket, Key=self._upload_key(tenant_id, upload_id, part_id), Body=data
            )

    def part_sizes(self, tenant_id: str, upload_id: str, part_ids: list[str]) -> list[int | None]:
        """Each part's size, in the given order; None for a part the upload does not have."""

        def size(part_id: str) -> int | None:
            with _s3("head"):
                try:
                    head = self._client.head_object(
                        Bucket=self.bucket, Key=self._upload_key(tenant_id, upload_id, part_id)
                    )
                except ClientError as exc:
                    if _missing(exc):
                        return None
                    raise
            return head["ContentLength"]

        with ThreadPoolExecutor(max_workers=HEAD_THREADS) as pool:
            return list(pool.map(size, part_ids))

    def part_chunks(self, tenant_id: str, upload_id: str, part_ids: list[str]) -> Iterator[bytes]:
        """The parts' bytes in the given order, streamed."""
        for part_id in part_ids:
            yield from self._object_chunks(self._upload_key(tenant_id, upload_id, part_id))

    def put_file(
        self, tenant_id: str, file_id: str, data: bytes, *, filename: str, purpose: str, **described: str
    ) -> None:
        with _s3("put"):
            self._client.put_object(
                Bucket=self.bucket,
                Key=self._file_key(tenant_id, file_id),
                Body=data,
                ContentType="application/jsonl",
                Metadata={"filename": filename, "purpose": purpose, **described},
            )

    def file(self, tenant_id: str, file_id: str) -> StoredFile | None:
        """The tenant's file, or None (another tenant's files are none of its own)."""
        with _s3("head"):
            try:
                head = self._client.head_object(Bucket=self.bucket, Key=self._file_key(tenant_id, file_id))
            except ClientError as exc:
                if _missing(exc):
                    return None
                raise
        described = head["Metadata"]
        pages = described.get("pages", "")
        return StoredFile(
            file_id=file_id,
            filename=described.get("filename", file_id),
            purpose=described.get("purpose", "batch"),
            size=head["ContentLength"],
            created_at=head["LastModified"].timestamp(),
            mime_type=described.get("mime_type"),
            pages=int(pages) if pages.isdigit() else None,
        )

    def input_file(self, tenant_id: str, file_id: str) -> InputFile | None:
        """The tenant's image or document (purpose user_data or vision) with its bytes, for one
        call; None when it has none such."""
        stored = self.file(tenant_id, file_id)
        if stored is None or stored.purpose not in INPUT_PURPOSES:
            return None
        return InputFile(
            data=self.file_content(tenant_id, file_id), filename=stored.filename, mime_type=stored.mime_type
        )

    def file_facts(self, tenant_id: str, file_id: str) -> FileFacts | None:
        """What bounds the cost of the tenant's file (its size, a PDF's pages); None when it has none."""
        stored = self.file(tenant_id, file_id)
        if stored is None:
            return None
        head = functools.partial(self.file_head, tenant_id, file_id, 1024)
        return facts_of(stored.size, stored.pages, head)

    def describe_file(self, tenant_id: str, file_id: str, **described: str) -> None:
        """Adds to a stored file's metadata (what was learnt as it was written, such as a PDF's
        pages): S3 keeps metadata as written, so the object is copied onto itself."""
        key = self._file_key(tenant_id, file_id)
        with _s3("copy"):
            head = self._client.head_object(Bucket=self.bucket, Key=key)
            self._client.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource={"Bucket": self.bucket, "Key": key},
                MetadataDirective="REPLACE",
                ContentType=head.get("ContentType", "application/octet-stream"),
                Metadata={**head["Metadata"], **described},
            )

    def file_content(self, tenant_id: str, file_id: str) -> bytes:
        with _s3("get"):
            return self._client.get_object(Bucket=self.bucket, Key=self._file_key(tenant_id, file_id))[
                "Body"
            ].read()


# S3's smallest part but the last (5 MiB); a writer sends a part each time this much is buffered.
PART_BYTES = 8 * 1024 * 1024


class ObjectWriter:
    """An S3 object written as it grows: its bytes buffered up to PART_BYTES, then sent as one
    part of a multipart upload, so writing a file of any size holds at most one part in memory.
    A small object (one part's worth) is one PutObject; `abort` leaves nothing behind."""

    def __init__(
        self, client: S3Client, bucket: str, key: str, *, metadata: dict[str, str] | None = None
    ) -> None:
        self._client, self._bucket, self.key = client, bucket, key
        self._metadata = metadata or {}
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[CompletedPartTypeDef] = []
        self.size = 0  # bytes written so far

    def write(self, data: bytes) -> None:
        self._buffer += data
        self.size += len(data)
        if len(self._buffer) >= PART_BYTES:
            self._send_part()

    def _send_part(self) -> None:
        with _s3("multipart upload"):
            if self._upload_id is None:
                self._upload_id = self._client.create_multipart_upload(
                    Bucket=self._bucket,
                    Key=self.key,
                    ContentType="application/jsonl",
                    Metadata=self._metadata,
                )["UploadId"]
            number = len(self._parts) + 1
            sent = self._client.upload_part(
                Bucket=self._bucket,
                Key=self.key,
                UploadId=self._upload_id,
                PartNumber=number,
                Body=bytes(self._buffer),
            )
        self._parts.append({"PartNumber": number, "ETag": sent["ETag"]})
        self._buffer.clear()

    def close(self) -> None:
        """Writes what is buffered and makes the object whole."""
        if self._upload_id is None:
            with _s3("put"):
                self._client.put_object(
                    Bucket=self._bucket,
                    Key=self.key,
                    Body=bytes(self._buffer),
                    ContentType="application/jsonl",
                    Metadata=self._metadata,
                )
            return
        if self._buffer:
            self._send_part()
        with _s3("multipart upload"):
            self._client.complete_multipart_upload(
                Bucket=self._bucket,
                Key=self.key,
                UploadId=self._upload_id,
                MultipartUpload={"Parts": self._parts},
            )

    def abort(self) -> None:
        """Drops the parts sent so far, best effort: a part left behind is removed by the bucket's
        lifecycle rule (abort-unfinished-uploads) a day later."""
        if self._upload_id is not None:
            try:
                self._client.abort_multipart_upload(
                    Bucket=self._bucket, Key=self.key, UploadId=self._upload_id
                )
            except (BotoCoreError, ClientError) as exc:
                logger.warning("multipart upload not aborted", key=self.key, error=str(exc))
            self._upload_id = None
