"""The one codec of the API's page cursors (task listings, batch results): opaque to clients,
bound to what they page through (a tenant's tasks, one batch's items), and checked on the way
back in, so a cursor that is not one this API made for that scope is a 422, never a query error."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from llmtasks.domain.errors import InvalidInput


def encode_cursor(scope: str, position: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps({"scope": scope, "at": position}).encode()).decode()


def decode_cursor(cursor: str, scope: str, valid: Callable[[Any], bool]) -> Any:
    """The position `cursor` carries, once it is of `scope` and `valid` holds of it."""
    try:
        decoded = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        position = decoded["at"]
        ok = decoded["scope"] == scope and valid(position)
    except (ValueError, TypeError, KeyError, AttributeError):
        ok = False
    if not ok:
        raise InvalidInput("cursor is not one this API returned.", field="cursor")
    return position
