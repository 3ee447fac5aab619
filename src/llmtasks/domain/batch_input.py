"""A batch's input file read line by line: which lines are items, and why the others are not.

The file is read as a stream of byte chunks (S3's body, never the whole object): a line is
kept only up to its limit, so one long line costs no more memory than the limit, and the
line numbers the refusals carry are the file's own (from 1, blank lines counted)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from llmtasks.domain.batches import BatchItem
from llmtasks.domain.errors import ApiError
from llmtasks.domain.models import Priority
from llmtasks.domain.rules import SizeLimits, check_limits

# One line (a JSON value) as an item; ValueError says why it is not one.
LineParser = Callable[[Any], BatchItem]


@dataclass(frozen=True)
class ReadLine:
    number: int  # from 1
    item: BatchItem | None = None
    refused: str | None = None  # why it is not an item
    custom_id: str | None = None  # of a refused line, when it had one


def numbered_lines(chunks: Iterable[bytes], max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """The lines of a stream (without their line ends), numbered from 1; None for a line over
    `max_bytes` (its bytes past the limit are skipped, never kept)."""
    number, kept, too_long = 1, bytearray(), False
    for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not too_long:
                kept += piece
                if len(kept) > max_bytes:
                    too_long = True
                    kept.clear()
            if end < 0:
                break
            yield number, None if too_long else bytes(kept.rstrip(b"\r"))
            number, too_long = number + 1, False
            kept.clear()
            start = end + 1
    if kept or too_long:
        yield number, None if too_long else bytes(kept.rstrip(b"\r"))


def llmtasks_line(value: Any) -> BatchItem:
    """A line of llmtasks' own format: one item of POST /batches, as JSON."""
    if not isinstance(value, dict):
        raise ValueError("a line must be a JSON object (an item of POST /batches)")
    try:
        return BatchItem.model_validate(value)
    except ValidationError as invalid:
        raise ValueError(first_error(invalid)) from None


def first_error(invalid: ValidationError) -> str:
    first = invalid.errors()[0]
    field = ".".join(str(part) for part in first.get("loc", ()))
    if first.get("type") == "extra_forbidden":
        return f"unsupported parameter '{field}'"
    return f"invalid '{field}': {first.get('msg')}" if field else str(first.get("msg"))


def read_items(
    chunks: Iterable[bytes],
    parse: LineParser,
    limits: SizeLimits,
    *,
    priority: Priority | None = None,
    max_line_bytes: int,
) -> Iterator[ReadLine]:
    """Every non-blank line of the stream, as an item or as a refusal: not JSON, over the line
    limit, not an item (`parse`), over the size limits, or a custom_id used by an earlier line."""
    seen: set[str] = set()
    for number, raw in numbered_lines(chunks, max_line_bytes):
        if raw is None:
            yield ReadLine(number, refused=f"the line is over {max_line_bytes} bytes")
            continue
        if not raw.strip():
            continue
        value: Any = None
        try:
            try:
                value = json.loads(raw)
            except ValueError:
                raise ValueError("not JSON") from None
            item = parse(value)
            check_limits(item, limits)
            if item.custom_id is not None:
                if item.custom_id in seen:
                    raise ValueError(f"custom_id '{item.custom_id}' is used by an earlier line")
                seen.add(item.custom_id)
        except (ValueError, ApiError) as why:
            custom_id = value.get("custom_id") if isinstance(value, dict) else None
            reason = why.detail if isinstance(why, ApiError) else str(why)
            yield ReadLine(
                number, refused=reason, custom_id=custom_id if isinstance(custom_id, str) else None
            )
            continue
        if priority is not None and "priority" not in item.model_fields_set:
            item.priority = priority
        yield ReadLine(number, item=item)
