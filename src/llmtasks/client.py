"""The client side of llmtasks: what a receiver of its webhooks (and, later, a caller of its
API) imports. Runs anywhere: it needs neither AWS nor the service's settings."""

from __future__ import annotations

from collections.abc import Mapping

from standardwebhooks import Webhook, WebhookVerificationError

from llmtasks.models import WebhookEvent

__all__ = ["WebhookVerificationError", "verify_webhook"]


def verify_webhook(body: bytes | str, headers: Mapping[str, str], secret: str) -> WebhookEvent:
    """The event of one delivery, once its Standard Webhooks signature checks out.

    `body` must be the exact bytes received (not re-serialised JSON); `headers` the request's
    headers, in any case; `secret` the `whsec_...` from `GET /webhooks/secret`. During a
    rotation's overlap a delivery carries a signature per secret, so the old and the new one
    both verify. Raises WebhookVerificationError for a bad signature, a missing header or a
    timestamp more than 5 minutes off (a replay).
    """
    Webhook(secret).verify(body, dict(headers))
    return WebhookEvent.model_validate_json(body)
