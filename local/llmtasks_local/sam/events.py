"""What Lambda hands a function from the template's event sources: a DynamoDB Streams record in
Lambda's shape, and the records that pass an event source's FilterCriteria.

The local stack's pollers deliver through these, and the unit tests feed the handlers what the
template's filters would let through, so a filter that drops a record a handler needs fails a
unit test, not only the local stack.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from moto.events.models import EventPattern, EventPatternParser

from llmtasks_local.sam.template import PSEUDO_PARAMETERS


def stream_record(record: dict[str, Any], stream_arn: str) -> dict[str, Any]:
    """A DynamoDB Streams record as Lambda hands it to a function: its ApproximateCreationDateTime
    in epoch seconds, a number, as Lambda's events carry it (boto3 reads it as a datetime)."""
    created = (record.get("dynamodb") or {}).get("ApproximateCreationDateTime")
    if isinstance(created, datetime):
        record = {
            **record,
            "dynamodb": {**record["dynamodb"], "ApproximateCreationDateTime": created.timestamp()},
        }
    record = json.loads(json.dumps(record, default=str))  # other datetimes to text, as on the wire
    record["eventSourceARN"] = stream_arn
    record.setdefault("awsRegion", PSEUDO_PARAMETERS["AWS::Region"])
    return record


def pattern_matcher(patterns: tuple[str, ...]) -> Callable[[dict[str, Any]], bool]:
    """Lambda event filtering: a record passes when any pattern matches (EventBridge syntax)."""
    if not patterns:
        return lambda _record: True
    compiled = [EventPattern(raw, EventPatternParser(raw).parse()) for raw in patterns]
    return lambda record: any(p.matches_event(record) for p in compiled)  # type: ignore[arg-type]
