"""The SQS calls of an SQS event source mapping: receive a batch with the attributes Lambda passes
on, delete what the function handled, and make visible again what it did not take."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.type_defs import MessageTypeDef

BATCH = 10  # ReceiveMessage's, DeleteMessageBatch's and ChangeMessageVisibilityBatch's limit


class SourceQueue:
    """One queue, as its event source mapping reads it (boto3's errors go to the poller, which
    outlives them as Lambda's does)."""

    def __init__(self, url: str, sqs: SQSClient) -> None:
        self.url = url
        self._sqs = sqs

    def receive(self, limit: int, *, wait_s: int = 0) -> list[MessageTypeDef]:
        """Up to `limit` messages (at most ten), with every system and message attribute; waits
        up to `wait_s` for the first."""
        reply = self._sqs.receive_message(
            QueueUrl=self.url,
            MaxNumberOfMessages=max(1, min(BATCH, limit)),
            WaitTimeSeconds=max(0, min(20, wait_s)),
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return list(reply.get("Messages") or [])

    def delete_many(self, receipt_handles: Sequence[str]) -> None:
        """Deletes received messages; a receipt that no longer deletes (its message received
        again since) is left to that delivery."""
        for start in range(0, len(receipt_handles), BATCH):
            chunk = receipt_handles[start : start + BATCH]
            self._sqs.delete_message_batch(
                QueueUrl=self.url,
                Entries=[{"Id": str(i), "ReceiptHandle": handle} for i, handle in enumerate(chunk)],
            )

    def make_visible(self, receipt_handles: Sequence[str]) -> int:
        """Received messages visible again at once; returns how many were (a receipt whose
        message was deleted or received again since changes nothing)."""
        visible = 0
        for start in range(0, len(receipt_handles), BATCH):
            chunk = receipt_handles[start : start + BATCH]
            reply = self._sqs.change_message_visibility_batch(
                QueueUrl=self.url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": 0}
                    for i, handle in enumerate(chunk)
                ],
            )
            visible += len(reply.get("Successful", []))
        return visible
