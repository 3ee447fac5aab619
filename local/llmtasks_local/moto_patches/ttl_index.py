"""Each TTL table's items by their TTL value, kept as moto writes them, so the local stack's TTL
sweep (emulator/ttl.py) reads the items that have expired, not every item of every TTL table.

moto keeps a table's items in a dict by key; the sweep found the expired ones with a Scan of the
whole table each minute, a cost that grew with the table whatever expired. Here each table whose
TTL is enabled has an index beside its items (TtlIndex): the TTL value of each item that has one,
and a heap of (TTL value, key) entries. It follows every write: Table.put_item and
Table.delete_item (PutItem, BatchWriteItem, a transaction's actions and its undo, PartiQL, a state
dir's load and its journal's replay all end there) and the backend's update_item, which changes
an item in place. UpdateTimeToLive makes the table's index again from its items (one pass, when
the spec changes), DeleteTable drops it. A table with no index (one restored from a backup, or
loaded from a state dir of the release before) gets one at its first question.

`expired()` answers the keys whose TTL value is before a time, each checked against the item as
stored: it reads the heap's expired entries (stale ones, of an item since deleted or whose TTL
moved on, are dropped as they are met) and those items, nothing else. Nothing here changes what
a request answers: the sweep deletes through DeleteItem, each delete conditional on the item
still being expired. READS counts what the questions read, for the tests that bound it.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from moto.dynamodb.models import DynamoDBBackend
from moto.dynamodb.models.dynamo_type import DynamoType, Item
from moto.dynamodb.models.table import Table

from llmtasks_local import moto_patches
from llmtasks_local.moto_patches.atomic import write_lock

Key = tuple[DynamoType, DynamoType | None]  # an item's hash key and range key (None: none)
# The heap may hold this many stale entries per live one (and this many more) before it is made
# again from the live ones.
_STALE_ENTRIES = 2
_SPARE_ENTRIES = 1024
MAX_KEYS = 1000  # the most keys one question answers


@dataclass
class Reads:
    """What the questions read: heap entries looked at, items read (checks and index builds)."""

    entries: int = 0
    items: int = 0


READS = Reads()


class TtlIndex:
    """One table's items by their TTL attribute's value (see the module)."""

    def __init__(self, attribute: str, items: Iterator[Item]) -> None:
        self.attribute = attribute
        self.values: dict[Key, Decimal] = {}  # each item's TTL value, of the items that have one
        self._heap: list[tuple[Decimal, int, Key]] = []  # tiebreak: keys need not compare
        self._order = itertools.count()
        for item in items:
            READS.items += 1
            self.record(item)

    def record(self, item: Item) -> None:
        key = (item.hash_key, item.range_key)
        value = ttl_value(item, self.attribute)
        if value is None:
            self.values.pop(key, None)
        elif self.values.get(key) != value:
            self._push(key, value)
            if len(self._heap) > _STALE_ENTRIES * len(self.values) + _SPARE_ENTRIES:
                self._heap = [(kept, next(self._order), at) for at, kept in self.values.items()]
                heapq.heapify(self._heap)

    def _push(self, key: Key, value: Decimal) -> None:
        self.values[key] = value
        heapq.heappush(self._heap, (value, next(self._order), key))

    def forget(self, key: Key) -> None:
        self.values.pop(key, None)

    def expired(self, table: Table, before: Decimal, limit: int) -> list[Item]:
        """Up to `limit` items whose TTL value is before `before`, as stored now."""
        found: list[tuple[Decimal, int, Key]] = []
        items: list[Item] = []
        keys: set[Key] = set()
        while self._heap and self._heap[0][0] < before and len(items) < limit:
            entry = heapq.heappop(self._heap)
            READS.entries += 1
            value, _, key = entry
            if self.values.get(key) != value or key in keys:
                continue  # deleted, or its TTL moved on: a later entry (or none) stands for it
            item = _stored(table, key)
            READS.items += 1
            stored = None if item is None else ttl_value(item, self.attribute)
            if item is None or stored != value:  # changed behind the index's back
                self.values.pop(key, None)
                if stored is not None:
                    self._push(key, stored)
                continue
            found.append(entry)
            items.append(item)
            keys.add(key)
        for entry in found:  # until its delete is seen: a sweep cut short finds it again
            heapq.heappush(self._heap, entry)
        return items


_indexes: weakref.WeakKeyDictionary[Table, TtlIndex] = weakref.WeakKeyDictionary()


def ttl_attribute(table: Table) -> str | None:
    """The table's TTL attribute, when its TTL is enabled."""
    ttl = table.ttl or {}
    return ttl.get("AttributeName") if ttl.get("TimeToLiveStatus") == "ENABLED" else None


def ttl_value(item: Item, attribute: str) -> Decimal | None:
    """The item's TTL value: DynamoDB's TTL ignores an attribute that is not a number."""
    value = item.attrs.get(attribute)
    if value is None or value.type != "N":
        return None
    try:
        return Decimal(str(value.value))
    except InvalidOperation:
        return None


def _stored(table: Table, key: Key) -> Item | None:
    """The item stored under `key`, looked up without moto's defaultdict adding an entry."""
    found: Any = table.items.get(key[0])
    if found is None or key[1] is None:
        return found  # type: ignore[no-any-return]
    return found.get(key[1])  # type: ignore[no-any-return]


def _all_items(table: Table) -> Iterator[Item]:
    stored: Any
    for stored in list(table.items.values()):
        yield from (list(stored.values()) if table.range_key_attr else [stored])


def _index(table: Table) -> TtlIndex | None:
    """The table's index, made from its items when it has none (or one of another attribute)."""
    attribute = ttl_attribute(table)
    if attribute is None:
        _indexes.pop(table, None)
        return None
    index = _indexes.get(table)
    if index is None or index.attribute != attribute:
        index = _indexes[table] = TtlIndex(attribute, _all_items(table))
    return index


def expired_keys(
    table: Table, attribute: str, now: float, *, limit: int = MAX_KEYS
) -> list[dict[str, Any]] | None:
    """The keys (DynamoDB JSON) of up to `limit` (at most MAX_KEYS) items of `table` whose
    `attribute` is before `now`; None when that is not the table's enabled TTL attribute."""
    with write_lock():  # no write changes the table meanwhile
        index = _index(table)
        if index is None or index.attribute != attribute:
            return None
        items = index.expired(table, Decimal(repr(float(now))), max(0, min(limit, MAX_KEYS)))
        keys = []
        for item in items:
            key = {table.hash_key_attr: item.hash_key.to_json()}
            if table.range_key_attr and item.range_key is not None:
                key[table.range_key_attr] = item.range_key.to_json()
            keys.append(key)
        return keys


def _recorded(table: Table, item: Item | None) -> None:
    if item is None:
        return
    with write_lock():
        index = _indexes.get(table)
        if index is not None:
            index.record(item)


def _put_item(put: Callable[..., Item]) -> Callable[..., Item]:
    @functools.wraps(put)
    def indexed(table: Table, *args: Any, **kwargs: Any) -> Item:
        item = put(table, *args, **kwargs)
        _recorded(table, item)
        return item

    indexed.__llmtasks_ttl__ = True  # type: ignore[attr-defined]
    return indexed


def _delete_item(delete: Callable[..., Item | None]) -> Callable[..., Item | None]:
    @functools.wraps(delete)
    def indexed(table: Table, hash_key: DynamoType, range_key: DynamoType | None) -> Item | None:
        item = delete(table, hash_key, range_key)
        with write_lock():
            index = _indexes.get(table)
            if index is not None:
                index.forget((hash_key, range_key or None))
        return item

    indexed.__llmtasks_ttl__ = True  # type: ignore[attr-defined]
    return indexed


def _update_item(update: Callable[..., Item]) -> Callable[..., Item]:
    @functools.wraps(update)
    def indexed(backend: DynamoDBBackend, table_name: str, *args: Any, **kwargs: Any) -> Item:
        item = update(backend, table_name, *args, **kwargs)
        _recorded(backend.get_table(table_name), item)  # changed in place, after its put
        return item

    indexed.__llmtasks_ttl__ = True  # type: ignore[attr-defined]
    return indexed


def _update_time_to_live(change: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(change)
    def indexed(backend: DynamoDBBackend, table_name: str, *args: Any, **kwargs: Any) -> None:
        change(backend, table_name, *args, **kwargs)
        table = backend.get_table(table_name)
        with write_lock():
            _indexes.pop(table, None)
            _index(table)  # made now, while the spec changes, so writes keep it from here on

    indexed.__llmtasks_ttl__ = True  # type: ignore[attr-defined]
    return indexed


def _delete_table(delete: Callable[..., Table]) -> Callable[..., Table]:
    @functools.wraps(delete)
    def indexed(backend: DynamoDBBackend, name: str) -> Table:
        table = delete(backend, name)
        with write_lock():
            _indexes.pop(table, None)
        return table

    indexed.__llmtasks_ttl__ = True  # type: ignore[attr-defined]
    return indexed


_PATCHES: tuple[tuple[type, str, Callable[[Any], Any]], ...] = (
    (Table, "put_item", _put_item),
    (Table, "delete_item", _delete_item),
    (DynamoDBBackend, "update_item", _update_item),
    (DynamoDBBackend, "update_time_to_live", _update_time_to_live),
    (DynamoDBBackend, "delete_table", _delete_table),
)


def install() -> None:
    """Idempotent; before moto serves (a table written before has its index made at its first
    question)."""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
    for owner, name, wrap in _PATCHES:
        method = getattr(owner, name)
        if not getattr(method, "__llmtasks_ttl__", False):
            setattr(owner, name, wrap(method))


def table_of(region: str, name: str) -> Table | None:
    """The table `name` of any account's backend in `region`."""
    from moto.dynamodb.models import dynamodb_backends

    for _account, backend_region, backend in dynamodb_backends.iter_backends():
        tables: dict[str, Table] = backend.tables  # type: ignore[attr-defined]
        if backend_region == region and name in tables:
            return tables[name]
    return None
