"""A file as an HTTP reply: its bytes, or a redirect to them in storage when too large."""

from __future__ import annotations

import base64
from typing import Any

from aws_lambda_powertools.event_handler import Response


def file_reply(data: bytes | None, link: str | None, *, content_type: str) -> Response[Any]:
    """A file's bytes (base64-encoded for API Gateway, whatever they hold), or a redirect to a
    presigned URL of a file too large for a Lambda reply (clients such as httpx and the openai
    SDK follow it, and drop their Authorization header on the way: S3 takes the URL's)."""
    if link is not None:
        return Response(status_code=307, headers={"Location": link}, body="")
    reply: Response[Any] = Response(
        status_code=200, content_type=content_type, body=base64.b64encode(data or b"").decode()
    )
    reply.base64_encoded = True
    return reply
