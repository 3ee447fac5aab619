"""What Lambda hands a function from the template's event sources: an SQS message and a DynamoDB
Streams record in Lambda's shape, and the records that pass an event source's FilterCriteria.

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


def sqs_record(message: Any, queue_arn: str) -> dict[str, Any]:
    """A ReceiveMessage message as Lambda's SQS event source hands it to a function."""

    def lower_first(attribute: dict[str, Any]) -> dict[str, Any]:
        return {key[0].lower() + key[1:]: value for key, value in attribute.items()}

    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": dict(message.get("Attributes") or {}),
        "messageAttributes": {
            name: lower_first(dict(value)) for name, value in (message.get("MessageAttributes") or {}).items()
        },
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": queue_arn.split(":")[3] if queue_arn.startswith("arn:") else "",
    }


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
    """Lambda event filtering: a record passes when any pattern matches (EventBridge syntax),
    as moto's EventPattern matches it. moto copies the whole event through JSON and flattens it
    before it looks anything up, and a task's record holds both of its images (its prompt and
    text twice): in a burst, the stack's stream pollers spent most of their CPU there. Each
    pattern is handed the parts of the record it reads (pattern_paths), which it matches as it
    matches the whole (tests/unit/test_event_filters.py compares the two). The parts are fresh
    dicts of JSON's own types (a record comes from GetRecords' JSON), so moto's copy of them
    through JSON would give back the same: they are flattened and
    matched as moto does after it."""
    if not patterns:
        return lambda _record: True
    parsed = [(raw, EventPatternParser(raw).parse()) for raw in patterns]
    # Each pattern's EventPattern, its parsed tree and the paths it reads
    compiled = [(EventPattern(raw, tree), tree, pattern_paths(tree)) for raw, tree in parsed]

    def matches(pattern: EventPattern, tree: dict[str, Any], part: dict[str, Any]) -> bool:
        # EventPattern.matches_event less its json.loads(json.dumps(event))
        return not tree or pattern._does_event_match(EventPattern._flatten_dict(part), tree)

    return lambda record: any(
        matches(pattern, tree, read_by(record, paths)) for pattern, tree, paths in compiled
    )


# What a pattern reads of an event, as a tree: each key the pattern names, with the tree of what
# it reads below it, or None where it reads the value whole (a list of filters).
Paths = dict[str, "Paths | None"]


def pattern_paths(pattern: dict[str, Any]) -> Paths:
    """The paths a parsed EventBridge pattern reads; `$or`'s alternatives read at its own level
    (as moto matches them), so their paths join there."""
    paths: Paths = {}
    for key, below in pattern.items():
        if key == "$or":
            for alternative in below:
                _join(paths, pattern_paths(alternative))
        else:
            _join(paths, {key: pattern_paths(below) if isinstance(below, dict) else None})
    return paths


def _join(into: Paths, more: Paths) -> None:
    for key, below in more.items():
        if key not in into:
            into[key] = below
            continue
        kept = into[key]
        if kept is None or below is None:
            into[key] = None  # read whole by one of them: whole
        else:
            _join(kept, below)


def read_by(event: Any, paths: Paths) -> Any:
    """The parts of `event` on `paths`; what is not a dict (a list, a value) is kept whole, as
    moto's flattening stops there too."""
    if not isinstance(event, dict):
        return event
    return {
        key: event[key] if below is None else read_by(event[key], below)
        for key, below in paths.items()
        if key in event
    }
