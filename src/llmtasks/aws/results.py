"""ResultsBucket: results too large to sit in the task's DynamoDB item (400 KB per item, and the
prompt may take half of that) are stored in S3; readers get the text either way. A batch's items
wait here too (its manifest, one JSON line an item) until they are fanned out into tasks, and so
do the OpenAI surface's files (a batch's input, output and error files), under their tenant."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.domain.batches import StoredFile
from llmtasks.domain.errors import BackendError
from llmtasks.domain.models import Task

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


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
            self._given = boto3.session.Session().client("s3")  # a session per client is thread-safe
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
        key = f"batches/{batch_id}.jsonl"
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

    def put_file(self, tenant_id: str, file_id: str, data: bytes, *, filename: str, purpose: str) -> None:
        with _s3("put"):
            self._client.put_object(
                Bucket=self.bucket,
                Key=self._file_key(tenant_id, file_id),
                Body=data,
                ContentType="application/jsonl",
                Metadata={"filename": filename, "purpose": purpose},
            )

    def file(self, tenant_id: str, file_id: str) -> StoredFile | None:
        """The tenant's file, or None (another tenant's files are none of its own)."""
        with _s3("head"):
            try:
                head = self._client.head_object(Bucket=self.bucket, Key=self._file_key(tenant_id, file_id))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise
        return StoredFile(
            file_id=file_id,
            filename=head["Metadata"].get("filename", file_id),
            purpose=head["Metadata"].get("purpose", "batch"),
            size=head["ContentLength"],
            created_at=head["LastModified"].timestamp(),
        )

    def file_content(self, tenant_id: str, file_id: str) -> bytes:
        with _s3("get"):
            return self._client.get_object(Bucket=self.bucket, Key=self._file_key(tenant_id, file_id))[
                "Body"
            ].read()
