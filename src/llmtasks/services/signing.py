"""Standard Webhooks signing: the headers that let a receiver check a request came from llmtasks
(webhook deliveries, and a run's calls of its function endpoints)."""

from __future__ import annotations

from datetime import datetime

from standardwebhooks import Webhook


def signed_headers(secrets: list[str], *, message_id: str, timestamp: datetime, body: str) -> dict[str, str]:
    """Standard Webhooks headers; several secrets give several space-separated signatures."""
    signatures = [Webhook(secret).sign(message_id, timestamp, body) for secret in secrets]
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": " ".join(signatures),
    }
