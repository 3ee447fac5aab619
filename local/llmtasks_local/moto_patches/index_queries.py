"""A DynamoDB Query on an index that reads the items of its key alone, sorted by their plain values.

moto's Query on an index lists every item of the table sorted by its keys (Table.all_items),
keeps those of the queried key, sorts them again comparing DynamoType objects (a Decimal made at
each comparison for a number), then deep-copies the page's full items before it projects them to
the index's few attributes: a page of `GET /tasks?status=...` cost time linear in the table.

Here such a Query keeps the table's items of its hash key in one pass over the table, sorts them
once by their keys' plain values (DynamoType.cast_value, what moto's comparisons compare), finds
an ExclusiveStartKey's place by bisection, and projects each item of the page before copying it
(a projection is a new item; only an index of ALL attributes copies the whole item). The page's
limits are moto's: Limit items, or the items' full sizes past 1 MB (RESULT_SIZE_LIMIT), before
the filter; the filter, the ProjectionExpression, the counts and LastEvaluatedKey are moto's own.

Any other Query (on the table itself, a key condition on the range key, a composite key, the
legacy QueryFilter, a start key without every sort attribute) is moto's.

And a ProjectionExpression (GetItem, BatchGetItem, Query, Scan) converts the item to plain JSON
once, not once a path: moto's Item.project made a deep copy of the whole item for each path, so
twenty fields of a task cost twenty copies of its prompt. Only for paths of plain names none of
which begins another (DynamoDB refuses overlapping paths, and so does moto before this runs;
the merge of one into another's map would edit the shared copy); any other is moto's.

The answers are compared with moto's own in tests/unit/test_fast_paths.py.
"""

from __future__ import annotations

import copy
import functools
import heapq
import operator
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any, cast

from botocore.utils import merge_dicts
from moto.dynamodb.models.dynamo_type import DynamoType, Item, LimitedSizeDict, serializer
from moto.dynamodb.models.table import RESULT_SIZE_LIMIT, Table
from moto.dynamodb.models.utilities import find_nested_key

from llmtasks_local import moto_patches

_moto_query = Table.query
_moto_project = Item.project


class _Switch:
    on = True


_switch = _Switch()


def _sort_attrs(table: Table, index: Any) -> list[str] | None:
    """The attributes moto sorts an index's items by (its hash key, its range key, the table's
    keys), or None when the index is not of one hash key and one range key."""
    hashes = [key["AttributeName"] for key in index.schema if key["KeyType"] == "HASH"]
    ranges = [key["AttributeName"] for key in index.schema if key["KeyType"] == "RANGE"]
    if len(hashes) != 1 or len(ranges) != 1:
        return None
    return [
        attr
        for attr in (hashes[0], ranges[0], table.hash_key_attr, table.range_key_attr)
        if attr is not None and attr != "None"
    ]


def _order(attrs: list[str]) -> Callable[[Item], tuple[Any, ...]]:
    """An item's place among items of one hash key: its other key attributes' cast_value, what
    moto's comparisons compare (a string is itself, a number a Decimal)."""
    return lambda item: tuple([_plain_value(item.attrs[attr]) for attr in attrs])


# A (place, item) pair's place (the pairs a query collects are ordered by it).
_ORDER_OF_PAIR = operator.itemgetter(0)


def _plain_value(value: DynamoType) -> Any:
    if value.type == "S":
        return value.value
    return Decimal(value.value) if value.type == "N" else value.cast_value


def _equal(value: DynamoType | None, expected: DynamoType) -> bool:
    """moto's `value and value == expected` (a DynamoType compares by type and cast_value)."""
    if value is None:
        return False
    if expected.type == "S":
        return value.type == "S" and value.value == expected.value and bool(value)
    return bool(value) and value == expected


def _size(item: Item) -> int:
    """moto's Item.size(), its strings' sizes counted here (most of a task's attributes)."""
    size = 0
    for name, value in item.attrs.items():
        size += len(name) if name.isascii() else len(name.encode())
        if value.type == "S":
            text = value.value
            size += len(text) if text.isascii() else len(text.encode())
        else:
            size += value.size()
    return size


def _simple_shape(
    table: Table,
    index_name: str | None,
    consistent_read: bool,
    hash_key_conditions: list[tuple[str, DynamoType]] | None,
    exclusive_start_key: dict[str, Any] | None,
) -> tuple[Any, list[str], DynamoType] | None:
    """The index, its sort attributes and the hash key's value of a Query on an index of one hash
    key and one range key by its hash key alone; None for any other (moto answers, or refuses)."""
    index = {i.name: i for i in table.all_indexes()}.get(index_name or "")
    if index is None or (consistent_read and index in (table.global_indexes or [])):
        return None
    attrs = _sort_attrs(table, index)
    if attrs is None or not hash_key_conditions or len(hash_key_conditions) != 1:
        return None
    hash_attr, expected = hash_key_conditions[0]
    if hash_attr != attrs[0]:
        return None
    if exclusive_start_key is not None and any(exclusive_start_key.get(a) is None for a in attrs):
        return None
    return index, attrs, expected


def _indexed_query(
    table: Table,
    hash_key: DynamoType | None,
    range_comparison: str | None,
    range_objs: list[DynamoType],
    limit: int,
    exclusive_start_key: dict[str, Any] | None,
    scan_index_forward: bool,
    projection_expressions: list[list[str]] | None,
    index_name: str | None = None,
    consistent_read: bool = False,
    filter_expression: Any = None,
    hash_key_conditions: list[tuple[str, DynamoType]] | None = None,
    range_key_conditions: list[tuple[str, str, list[DynamoType]]] | None = None,
    **filter_kwargs: Any,
) -> tuple[list[Item], int, dict[str, Any] | None] | None:
    """moto's answer to a Query of the simple shape (see the module), or None for another."""
    if range_comparison or range_key_conditions or filter_kwargs:
        return None
    shape = _simple_shape(table, index_name, consistent_read, hash_key_conditions, exclusive_start_key)
    if shape is None:
        return None
    index, attrs, expected = shape
    hash_attr, range_attr = attrs[0], attrs[1]
    # Every item found has the queried hash key: its order is that of the rest of its key.
    order = _order(attrs[1:])
    found = []
    for item in _items(table):
        if not isinstance(item, Item):
            continue
        if not _equal(item.attrs.get(hash_attr), expected) or not item.attrs.get(range_attr):
            continue
        found.append((order(item), item))
    if exclusive_start_key is not None:
        after = tuple(DynamoType(exclusive_start_key[a]).cast_value for a in attrs[1:])
        found = [pair for pair in found if (pair[0] > after if scan_index_forward else pair[0] < after)]
    # The page's items (and the one after it, which says whether another page follows): the
    # first `limit` + 1 in the query's order, without sorting the key's every item.
    if limit is not None and limit + 1 < len(found):
        pick = heapq.nsmallest if scan_index_forward else heapq.nlargest
        found = pick(limit + 1, found, key=_ORDER_OF_PAIR)
    else:
        found.sort(key=_ORDER_OF_PAIR, reverse=not scan_index_forward)
    results: list[Item] = []
    result_size = 0
    last_evaluated_key = None
    for _, item in found:
        size = _size(item)
        if len(results) == limit or result_size + size > RESULT_SIZE_LIMIT:
            last_evaluated_key = table._get_last_evaluated_key(results[-1], index_name)
            break
        results.append(item)
        result_size += size
    scanned_count = len(results)
    kept = _projected_attrs(table, index)
    projected = [copy.deepcopy(item) if kept is None else _project(item, kept) for item in results]
    if filter_expression is not None:
        projected = [item for item in projected if filter_expression.expr(item)]
    if projection_expressions:
        projected = [item.project(projection_expressions) for item in projected]
    return projected, scanned_count, last_evaluated_key


def _projected_attrs(table: Table, index: Any) -> list[str] | None:
    """The attributes an index keeps of an item (its keys, the table's, and those it includes);
    None when it keeps them all."""
    projection = index.projection or {}
    kind = projection.get("ProjectionType")
    if kind not in ("KEYS_ONLY", "INCLUDE"):
        return None
    names = [*index.table_key_attrs, *(key["AttributeName"] for key in index.schema)]
    if kind == "INCLUDE":
        names += projection.get("NonKeyAttributes", [])
    return list(dict.fromkeys(names))


def _project(item: Item, names: list[str]) -> Item:
    """moto's index.project(item) for an index of top-level attributes: a new item of copies of
    those the item has (moto makes it by turning the whole item into plain JSON and back, once
    an attribute)."""
    kept = cast(Item, Item.__new__(Item))
    kept.hash_key, kept.range_key = item.hash_key, item.range_key
    attrs = LimitedSizeDict.__new__(LimitedSizeDict)
    dict.__init__(attrs)
    for name in names:
        value = item.attrs.get(name)
        if value is not None:
            dict.__setitem__(attrs, name, copy.deepcopy(value))
    kept.attrs = attrs
    return kept


def _items(table: Table) -> Iterator[Any]:
    """The table's items in no order (moto's all_items sorts them), from a copy of its dicts'
    values: a write beside the query may add an item (atomic.py locks them apart as well)."""
    for stored in list(table.items.values()):
        if table.range_key_attr:
            yield from list(stored.values())
        else:
            yield stored


def _query(query: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(query)
    def indexed(table: Table, *args: Any, **kwargs: Any) -> Any:
        if _switch.on:
            answered = _indexed_query(table, *args, **kwargs)
            if answered is not None:
                return answered
        return query(table, *args, **kwargs)

    indexed.__llmtasks_indexed__ = True  # type: ignore[attr-defined]
    return indexed


@functools.lru_cache(maxsize=256)
def _plain_paths(paths: tuple[tuple[str, ...], ...]) -> bool:
    """Whether a projection's paths are plain names none of which begins another (or repeats):
    worked out once a projection, not once an item it projects."""
    overlapping = any(a != b and b[: len(a)] == a for a in paths for b in paths) or len(set(paths)) < len(
        paths
    )
    return not overlapping and not any("[" in name for path in paths for name in path)


def _item_projection(item: Item, projection_expressions: list[list[str]]) -> Item:
    """moto's Item.project with the item made plain JSON once, for paths that cannot overlap."""
    if not _switch.on or not _plain_paths(tuple(tuple(path) for path in projection_expressions)):
        return _moto_project(item, projection_expressions)
    plain = item.to_regular_json()
    result: dict[str, Any] = {}
    for path in projection_expressions:
        merge_dicts(result, find_nested_key(path, plain))
    attrs = cast(dict[str, Any], serializer.serialize(result)["M"])
    return Item(hash_key=item.hash_key, range_key=item.range_key, attrs=attrs)


def install() -> None:
    """Idempotent; before moto serves."""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
    _switch.on = True
    if not getattr(Table.query, "__llmtasks_indexed__", False):
        setattr(Table, "query", _query(Table.query))  # noqa: B010
    setattr(Item, "project", _item_projection)  # noqa: B010


def uninstall() -> None:
    """moto's own Query and projection (for the tests that compare the two)."""
    _switch.on = False
