"""The stream pollers' event filtering (sam/events.py's pattern_matcher) answers as moto's
EventPattern answers for the whole record: every filter pattern of the template and patterns
of each kind EventBridge has, against the sample records, records changed one field at a time,
and events shaped to reach each edge of moto's flattening (empty dicts, lists, missing keys)."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
from moto.events.models import EventPattern, EventPatternParser

from llmtasks_local.sam.events import pattern_matcher, pattern_paths, read_by
from tests.conftest import Aws
from tests.helpers import load_event

pytestmark = pytest.mark.unit

PATTERNS = [
    '{"$or": [{"a": {"b": [1]}}, {"a": [{"exists": true}]}]}',
    '{"a": {"b": {"c": [{"exists": false}]}}}',
    '{"a": {"b": [{"exists": false}]}}',
    '{"a": {"b": [{"numeric": [">", 1]}]}}',
    '{"a": {"b": [{"prefix": "x"}]}, "$or": [{"c": ["1"]}, {"d": {"e": ["2"]}}]}',
    '{"a": {"b": [{"anything-but": ["x"]}]}}',
    '{"eventName": ["MODIFY"],'
    ' "dynamodb": {"NewImage": {"status": {"S": [{"anything-but": ["completed"]}]}}}}',
    '{"dynamodb": {"NewImage": {"batch_id": {"S": [{"exists": true}]}},'
    ' "Keys": {"pk": {"S": [{"prefix": "task#"}]}}}}',
]

SHAPES: list[dict[str, Any]] = [
    {},
    {"a": {}},
    {"a": {"b": 1}},
    {"a": {"b": 2}},
    {"a": {"b": {}}},
    {"a": {"b": {"c": 1}}},
    {"a": [{"b": 1}]},
    {"a": "flat"},
    {"a": {"b": "xy"}, "c": "1"},
    {"a": {"b": "x"}, "d": {"e": "2"}},
    {"a": {"b": "x"}, "d": {"e": "3"}, "c": "2"},
]


def records() -> list[dict[str, Any]]:
    """The sample stream records, and each with one thing changed: its event's name, the
    status in either image, an image or a key of it gone, a batch id added."""
    samples = [
        record
        for name in ("webhook_stream.json", "batch_stream.json", "foreign_stream.json")
        for record in load_event(name)["Records"]
    ]
    changed = []
    for record in samples:
        for name in ("INSERT", "MODIFY", "REMOVE"):
            changed.append({**record, "eventName": name})
        for image, status in itertools.product(("OldImage", "NewImage"), ("pending", "completed", "batch")):
            variant = copy.deepcopy(record)
            variant["dynamodb"].setdefault(image, {})["status"] = {"S": status}
            changed.append(variant)
        for image in ("OldImage", "NewImage"):
            variant = copy.deepcopy(record)
            variant["dynamodb"].pop(image, None)
            changed.append(variant)
            variant = copy.deepcopy(record)
            variant["dynamodb"].get(image, {}).pop("pk", None)
            changed.append(variant)
        variant = copy.deepcopy(record)
        variant["dynamodb"].setdefault("NewImage", {})["batch_id"] = {"S": "b1"}
        changed.append(variant)
    return samples + changed


def template_patterns(aws: Aws) -> list[str]:
    return [
        pattern
        for function in ("WebhookFunction", "BatchFunction")
        for source in aws.function(function).stream_sources
        for pattern in source.filter_patterns
    ]


def moto_matches(pattern: str, event: dict[str, Any]) -> bool:
    return bool(EventPattern(pattern, EventPatternParser(pattern).parse()).matches_event(event))


def test_each_pattern_answers_as_moto_does_for_the_whole_record(aws: Aws) -> None:
    patterns = template_patterns(aws) + PATTERNS
    assert len(patterns) > len(PATTERNS)  # the template's own are in
    events = records() + SHAPES
    answers = []
    for pattern, event in itertools.product(patterns, events):
        expected = moto_matches(pattern, event)
        assert pattern_matcher((pattern,))(event) is expected, (pattern, json.dumps(event)[:300])
        answers.append(expected)
    assert any(answers)
    assert not all(answers)
    # Several patterns: any one matching lets the record through, as Lambda's filters do.
    for event in events:
        assert pattern_matcher(tuple(patterns[:3]))(event) is any(
            moto_matches(p, event) for p in patterns[:3]
        )


def test_a_pattern_reads_only_the_paths_it_names() -> None:
    pattern = json.loads(PATTERNS[4])
    assert pattern_paths(pattern) == {"a": {"b": None}, "c": None, "d": {"e": None}}
    # An $or whose alternatives read a key whole and below it: read whole.
    assert pattern_paths(json.loads(PATTERNS[0])) == {"a": None}
    event = {"a": {"b": "x", "big": "y" * 1000}, "c": "1", "images": {"NewImage": {}}}
    assert read_by(event, pattern_paths(pattern)) == {"a": {"b": "x"}, "c": "1"}
