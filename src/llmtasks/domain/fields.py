"""The value types that a task's request, a batch and OpenAI's bodies share: text, bounded
numbers and free JSON, each with the checks that keep it storable in an item (valid Unicode,
DynamoDB's numbers) and the form the OpenAPI document gives it."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from annotated_types import Ge, GroupedMetadata, Le
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializationInfo,
    ValidationInfo,
    WithJsonSchema,
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _utf8(text: str) -> str:
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from exc
    return text


def dynamodb_number(value: float) -> float:
    """A float of the request that goes into the item as a number: DynamoDB's are finite, and
    0 or between 1e-130 and 1e126 in magnitude (2.2e-311 is a float, not a DynamoDB number)."""
    if not math.isfinite(value) or (value != 0 and not 1e-130 < abs(value) < 1e125):
        raise ValueError("numbers must be finite and between 1e-130 and 1e125")
    return value


def _json_object(value: dict[str, Any]) -> dict[str, Any]:
    """A client's JSON object, kept as JSON text (any key, nesting and number JSON has): only
    what is not JSON is refused, non-finite numbers (NaN, 1e400) and lone surrogates."""
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode()
    except (ValueError, UnicodeEncodeError) as exc:
        raise ValueError("must be JSON: finite numbers, and text without lone surrogates") from exc
    return value


def not_a_bool(value: Any) -> Any:
    """JSON's true is not the number 1, as pydantic's lax mode would take it (the document's
    integers and numbers refuse it)."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


Text = Annotated[str, AfterValidator(_utf8)]
# Whole numbers: 3 and 3.0 (JSON Schema's integers both), not true.
MaxTokens = Annotated[int, Field(ge=1, le=1_000_000), BeforeValidator(not_a_bool)]
Retries = Annotated[int, Field(ge=0, le=10), BeforeValidator(not_a_bool)]
# Any JSON object (its size is checked against MAX_METADATA_BYTES). In the document, one named
# schema (api/document.py adds it): client generators make one type of it, not one a body.
JsonObject = Annotated[
    dict[str, Any], AfterValidator(_json_object), WithJsonSchema({"$ref": "#/components/schemas/Metadata"})
]


@dataclass(frozen=True)
class _StorableFloat(GroupedMetadata):
    """A float within [low, high] an item can hold. The bounds come before the validator, so that
    the document carries them; its form there: 0, or a magnitude DynamoDB keeps (1e-130 and up),
    on either side of 0 that the bounds allow."""

    low: float
    high: float

    def __iter__(self) -> Iterator[object]:
        forms: list[dict[str, Any]] = [
            {"type": "number", "minimum": 0, "maximum": 0},
            {"type": "number", "exclusiveMinimum": 1e-130, "maximum": self.high},
        ]
        if self.low < 0:
            forms.append({"type": "number", "minimum": self.low, "exclusiveMaximum": -1e-130})
        yield Ge(self.low)
        yield Le(self.high)
        yield BeforeValidator(not_a_bool)
        yield AfterValidator(dynamodb_number)
        yield WithJsonSchema({"anyOf": forms})


Temperature = Annotated[float, _StorableFloat(0, 2)]
Fraction = Annotated[float, _StorableFloat(0, 1)]  # a share of probability mass (top_p)
Penalty = Annotated[float, _StorableFloat(-2, 2)]  # a presence or frequency penalty
# Its form, which the document can say: an http(s) URL (the scheme in any case, as the SSRF guard
# reads it, services/webhook_urls.py) with a host, and no whitespace.
WEBHOOK_URL_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://[^\s/?#]+([/?#]\S*)?$"
# The bounds before the validator, so that the document carries them.
WebhookUrl = Annotated[str, Field(max_length=2048, pattern=WEBHOOK_URL_PATTERN), AfterValidator(_utf8)]
TimeoutSeconds = Annotated[
    float, Field(ge=1, le=7 * 24 * 3600), BeforeValidator(not_a_bool), AfterValidator(dynamodb_number)
]


# The context of a task written to its item and read back from it: free JSON is text there.
STORED = {"stored": True}


def _from_stored_text(value: Any, info: ValidationInfo) -> Any:
    if isinstance(value, str) and isinstance(info.context, dict) and info.context.get("stored"):
        return json.loads(value)
    return value


def _as_stored(value: dict[str, Any], info: SerializationInfo) -> Any:
    if isinstance(info.context, dict) and info.context.get("stored"):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return value


# A JSON Schema, or a tool's parameters: any JSON object the client sends, passed to the model as
# it came. An item keeps it as text (a DynamoDB map refuses empty keys, nesting past 32 and
# numbers past 38 digits, all of which a schema may have): dumped with context STORED, and read
# back with it.
FreeJson = Annotated[
    dict[str, Any],
    BeforeValidator(_from_stored_text),
    AfterValidator(_json_object),
    PlainSerializer(_as_stored),
    WithJsonSchema({"type": "object", "additionalProperties": True}),
]
