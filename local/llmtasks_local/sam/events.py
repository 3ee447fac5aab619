"""What Lambda hands a function from the template's event sources: a DynamoDB Streams record in
Lambda's shape, and the records that pass an event source's FilterCriteria.

The local stack's pollers deliver through these, and the unit tests feed the handlers what the
template's filters would let through, so a filter that drops a record a handler needs fails a
unit test, not only the local stack.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from moto.events.models import EventPattern, EventPatternParser

from llmtasks_local.sam.function_spec import PSEUDO_PARAMETERS


def stream_record(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A DynamoDB Streams record as boto3 reads it, as Lambda hands it to a function: its
    ApproximateCreationDateTime in epoch seconds, a number, and its blobs in base64, as on the
    wire (boto3 reads them as a datetime and bytes). The local stack's pollers take records as
    the wire has them (wire_stream_record); the unit tests read theirs through boto3."""
    created = (record.get("dynamodb") or {}).get("ApproximateCreationDateTime")
    if isinstance(created, datetime):
        record = {
            **record,
            "dynamodb": {**record["dynamodb"], "ApproximateCreationDateTime": created.timestamp()},
        }
    return wire_stream_record(json.loads(json.dumps(record, default=_as_on_the_wire)), stream_arn)


def _as_on_the_wire(value: Any) -> str:
    return base64.b64encode(value).decode() if isinstance(value, bytes) else str(value)


def wire_stream_record(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A record of GetRecords' reply as the wire has it (its times epoch seconds, its blobs
    base64, as Lambda's events carry them), with what Lambda adds to each record."""
    return {
        **record,
        "eventSourceARN": stream_arn,
        "awsRegion": record.get("awsRegion") or PSEUDO_PARAMETERS["AWS::Region"],
    }


def pattern_matcher(patterns: tuple[str, ...]) -> Callable[[dict[str, Any]], bool]:
    """Lambda event filtering: a record passes when any pattern matches (EventBridge syntax)."""
    if not patterns:
        return lambda _record: True
    compiled = [EventPattern(raw, EventPatternParser(raw).parse()) for raw in patterns]
    return lambda record: any(p.matches_event(record) for p in compiled)  # type: ignore[arg-type]
