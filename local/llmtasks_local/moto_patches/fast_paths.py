"""moto's hot paths computed the same way at less cost: the same replies, the same answers.

Each one replaces work moto repeats on every request with work done once, where profiles of the
local stack under load found moto's CPU going (the measurements are in bench/RESULTS.md and the CHANGELOG):

- replies written straight to JSON: DynamoDB Streams' GetRecords and DynamoDB's item replies
  (GetItem, BatchGetItem, Query, Scan, the writes' ReturnValues). moto keeps records and items in
  the wire's form already, and its generic serializer walked every attribute against the shape;
  only timestamps and blobs are written here, as the serializer writes them;
- expressions: an UpdateItem's expression parsed once by its text and kept (moto's validator
  copies the tree before it substitutes values), its tree-only checks run once per set of
  attribute names, a condition's tokens kept by text, and a request's second parse given the
  first's tree; the traverser's per-node class checks worked out once per pair of classes;
- SQS: a receive's retention check reads the period instead of building every attribute (whose
  counts scan the queue), a message answers whether it had a receipt handle without building the
  list, the clock read as epoch milliseconds without datetimes (queue_index ends the scans);
- UpdateItem's two deep copies of the old item skipped where nothing reads them (a table with
  no stream), and a Scan copies only the items its filter keeps; a Query on an index reads only
  the items of its key (index_queries);
- a response class's method list and the camelCase-to-snake names worked out once, and request
  ids drawn from the OS's random bytes at once (moto's seeding no longer repeats them).

tests/unit/test_fast_paths.py runs the same requests with and without them and compares. Just
over 400 lines: the paths share their install and uninstall, which that test switches together.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import string
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

from moto.core import responses as _core_responses
from moto.core.common_types import TYPE_RESPONSE
from moto.core.responses import ActionContext
from moto.core.serialize import TimestampSerializer
from moto.core.utils import camelcase_to_underscores, unix_time
from moto.dynamodb import models as _dynamodb_models
from moto.dynamodb import responses as _dynamodb_responses
from moto.dynamodb.comparisons import ConditionExpressionParser
from moto.dynamodb.models import table as _dynamodb_table
from moto.dynamodb.models.dynamo_type import Item
from moto.dynamodb.parsing import ast_nodes, expressions, validators
from moto.dynamodb.responses import DynamoHandler, DynamoResult
from moto.dynamodbstreams.responses import DynamoDBStreamsHandler
from moto.sqs import models as _sqs_models
from moto.sqs.models import Message, SQSBackend
from moto.utilities import aws_headers as _aws_headers

from llmtasks_local import moto_patches
from llmtasks_local.moto_patches import index_queries

_serializers_get_records = DynamoDBStreamsHandler.get_records
_serialized_dynamo_result = DynamoResult.execute_result
# The replies whose size grows with the items they carry; the rest keep moto's serializer.
_ITEM_REPLIES = frozenset(
    {"GetItem", "BatchGetItem", "Query", "Scan", "PutItem", "UpdateItem", "DeleteItem", "TransactGetItems"}
)
_UpdateExpressionParser: Any = expressions.UpdateExpressionParser  # type: ignore[attr-defined]
_parse_update = _UpdateExpressionParser.__dict__["make"]  # the classmethod itself
_Traverser: Any = ast_nodes.DepthFirstTraverser  # type: ignore[attr-defined]
_Node: Any = ast_nodes.Node  # type: ignore[attr-defined]
_traverse_node = _Traverser.traverse_node_recursively
_retention_check = SQSBackend.is_message_valid_based_on_retention_period
_moto_had_receipt_handle = Message.had_receipt_handle
_moto_visible = Message.__dict__["visible"]
_moto_delayed = Message.__dict__["delayed"]
_moto_request_id = _aws_headers.gen_amzn_requestid_long
# Distinct update expressions kept: the service sends about twenty.
_PARSED_UPDATES = 512


def _wire(value: Any) -> Any:
    """What json cannot write, as the JSON protocol writes it."""
    if isinstance(value, datetime):
        return TimestampSerializer._timestamp_unixtimestamp(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()  # a blob (B, BS)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _get_records(self: DynamoDBStreamsHandler) -> str:
    limit = self._get_param("Limit")
    records = self.backend.get_records(self._get_param("ShardIterator"), 1000 if limit is None else limit)
    return json.dumps(records, default=_wire)


def _dynamo_result(self: DynamoResult, context: ActionContext) -> TYPE_RESPONSE:
    operation = context.operation_model
    result = self.result
    if operation.name not in _ITEM_REPLIES or not isinstance(result, dict):
        return _serialized_dynamo_result(self, context)
    members = operation.output_shape.members  # type: ignore[union-attr]  # every item reply has one
    body = {name: value for name, value in result.items() if value is not None and name in members}
    return 200, {"Content-Type": "application/x-amz-json-1.0"}, json.dumps(body, default=_wire)


@functools.lru_cache(maxsize=_PARSED_UPDATES)
def _parsed(parser: type, expression: str) -> Any:
    return _parse_update.__func__(parser, expression)


def _parsed_update(parser: type, expression: str) -> Any:
    return _parsed(parser, expression)


_UpdateValidator: Any = validators.UpdateExpressionValidator
_moto_update_validator_init = _UpdateValidator.__init__
_moto_update_passes = _UpdateValidator.get_ast_processors
# The passes that look at the tree and the attribute names alone (moto runs them first).
_SHAPE_CHECKS = (validators.ActionCountValidator, validators.OverlappingPathsValidator)
# A kept tree's mark: the attribute names its shape passed with. Not carried into its copies.
_SHAPE_PASSED = "llmtasks_shape_passed"
_KEPT_MARKS = frozenset({_SHAPE_PASSED})


def _update_validator_init(
    self: Any,
    expression: Any,
    expression_attribute_names: dict[str, str],
    expression_attribute_values: dict[str, Any],
    item: Any,
    table: Any,
) -> None:
    """moto's Validator.__init__, with the kept tree copied node by node: its passes write the
    request's values into the copy. deepcopy's generic walk of it was a third of what moto's
    UpdateItem cost once the checks below were kept."""
    self.expression_attribute_names = expression_attribute_names
    self.expression_attribute_values = expression_attribute_values
    self.item = item
    self.table = table
    self.llmtasks_tree = expression
    self.processors = self.get_ast_processors()
    self.node_to_validate = _copy_tree(expression)


# What a node of a parsed tree holds besides nodes, and may share with its copy.
_IMMUTABLE = (str, int, float, bool, type(None))


def _copy_tree(node: Any, parent: Any = None) -> Any:
    """What deepcopy makes of a parsed expression: each node anew with its attributes (a type
    name, children, a parent), its children copied, its parent the copy's; anything else a node
    holds deep-copied."""
    if not isinstance(node, _Node):
        return node if isinstance(node, _IMMUTABLE) else copy.deepcopy(node)
    twin = object.__new__(type(node))
    twin.__dict__.update((name, value) for name, value in node.__dict__.items() if name not in _KEPT_MARKS)
    twin.parent = parent
    if node.children is not None:
        twin.children = [_copy_tree(child, twin) for child in node.children]
    return twin


def _update_passes(self: Any) -> list[Any]:
    """moto's passes over an update expression, less its shape checks once the kept tree has
    passed them with these attribute names. They run here, on the tree (they only read it),
    rather than first thing in validate(), which moto calls straight after construction: a
    refusal is the same error at the same point of the request."""
    passes = _moto_update_passes(self)
    tree = self.llmtasks_tree
    names = frozenset((self.expression_attribute_names or {}).items())
    passed: set[frozenset[tuple[str, str]]] = tree.__dict__.setdefault(_SHAPE_PASSED, set())
    if names not in passed:
        for check in passes:
            if isinstance(check, _SHAPE_CHECKS):
                check.traverse(tree)
        passed.add(names)
    return [each for each in passes if not isinstance(each, _SHAPE_CHECKS)]


_moto_lex_condition = ConditionExpressionParser._lex_condition_expression
# Condition expressions' tokens by text (immutable tuples; a kept sequence is copied per parse,
# which consumes it). The service sends about twenty distinct conditions.
_LEXED_CONDITIONS: dict[str, tuple[Any, ...]] = {}


def _lex_condition(self: ConditionExpressionParser) -> deque[Any]:
    """moto's lexing of a condition expression, done once for each text (a refused text is
    lexed, and refused, every time)."""
    text = self.condition_expression or ""  # parse() lexes none: it returns first
    tokens = _LEXED_CONDITIONS.get(text)
    if tokens is None:
        tokens = tuple(_moto_lex_condition(self))
        if len(_LEXED_CONDITIONS) < _PARSED_UPDATES:
            _LEXED_CONDITIONS[text] = tokens
    return deque(tokens)


_moto_parse_condition = ConditionExpressionParser.parse
# This thread's last parse: (text, names, values, tree, names found, values found). The names and
# values are held, so the objects compared by identity are still those.
_last_condition = threading.local()


def _parse_condition(self: ConditionExpressionParser) -> Any:
    """moto's parse of a condition, or the tree this thread made last from the same text, names
    and values (the same objects: one request's), with the placeholders that parse found."""
    names, values = self.expression_attribute_names, self.expression_attribute_values
    kept = getattr(_last_condition, "kept", None)
    if kept is not None and kept[0] == self.condition_expression and kept[1] is names and kept[2] is values:
        self.expr_attr_names_found = list(kept[4])
        self.expr_attr_values_found = list(kept[5])
        return kept[3]
    tree = _moto_parse_condition(self)  # a refused text raises: nothing kept
    _last_condition.kept = (
        self.condition_expression,
        names,
        values,
        tree,
        tuple(self.expr_attr_names_found),
        tuple(self.expr_attr_values_found),
    )
    return tree


# (pass class, node class) -> (whether it is a Node, the pass's processor of it as a function)
_dispatch: dict[tuple[type, type], tuple[bool, Any]] = {}


def _processing_of(traverser: Any, kind: type) -> tuple[bool, Any]:
    """What moto's traversal asks of a node of class `kind`, as it asks it (the first processor
    in the pass's map whose class the node is an instance of)."""
    key = (type(traverser), kind)
    found = _dispatch.get(key)
    if found is None:
        processor = next((p for k, p in traverser._processing_map().items() if issubclass(kind, k)), None)
        if processor is not None and getattr(processor, "__self__", None) is not traverser:
            # Not a method of the pass (none of moto's is so): used as it is, and not kept.
            return issubclass(kind, _Node), lambda _traverser, node: processor(node)
        found = _dispatch[key] = (issubclass(kind, _Node), processor and processor.__func__)
    return found


def _traverse_node_recursively(self: Any, node: Any, child_id: int = -1) -> Any:
    """moto's DepthFirstTraverser.traverse_node_recursively, its two questions answered from
    `_processing_of`."""
    is_node, process = _processing_of(self, type(node))
    if is_node:
        parent_node = node.parent
        if node.children is not None:
            for i, child_node in enumerate(node.children):
                self.pre_processing_of_child(node, i)
                self.traverse_node_recursively(child_node, i)
        if process is not None:
            node = process(self, node)
            node.parent = parent_node
            if parent_node:
                parent_node.children[child_id] = node
    return node


class _CopiesOffInThisThread:
    """The `copy` module as a moto module sees it, whose deepcopy is the identity while this
    thread has it off (`_off.active`)."""

    def __init__(self) -> None:
        self._off = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        if getattr(self._off, "active", False):
            return value
        return copy.deepcopy(value, memo)


class _CopyUnlessStreamless(_CopiesOffInThisThread):
    """moto.dynamodb.models' `copy`: none while an UpdateItem on a table without a stream runs
    (the copy would only be its stream's old image)."""

    def around(self, handle: Callable[[DynamoHandler], Any]) -> Callable[[DynamoHandler], Any]:
        """moto's UpdateItem request handler (whatever wraps it: the lock, the journal), run with
        the copy skipped when its table has no stream."""

        @functools.wraps(handle)
        def update_item(handler: DynamoHandler) -> Any:
            tables = handler.dynamodb_backend.tables
            table = tables.get(str(handler.body.get("TableName", "")))
            self._off.active = table is not None and table.stream_shard is None
            try:
                return handle(handler)
            finally:
                self._off.active = False

        update_item.__llmtasks_streamless__ = True  # type: ignore[attr-defined]
        return update_item


_copies = _CopyUnlessStreamless()


class _ScanCopiesWhatItKeeps(_CopiesOffInThisThread):
    """moto.dynamodb.models.table's `copy`: none while a Scan runs, whose kept items are copied
    when it returns."""

    def around(self, scan: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(scan)
        def scan_copying_what_it_keeps(table: Any, *args: Any, **kwargs: Any) -> Any:
            self._off.active = True
            try:
                items, scanned, last_key = scan(table, *args, **kwargs)
            finally:
                self._off.active = False
            return [copy.deepcopy(item) for item in items], scanned, last_key

        return scan_copying_what_it_keeps


_scan_copies = _ScanCopiesWhatItKeeps()
_moto_table_scan = _dynamodb_table.Table.scan


class _NoItemCopy:
    """The `copy` module as moto.dynamodb.responses sees it: its one deepcopy is of the item an
    UpdateItem is about to change, read at once through Item.to_json (a copy of its own: lists,
    maps and sets rebuilt, the rest immutable), so the item is given as it is."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        return value if isinstance(value, Item) or value is None else copy.deepcopy(value, memo)


# moto's camelcase_to_underscores walks its argument a character at a time (three istitle() calls
# a character): each request's action name, and every attribute name of a queue each time an SQS
# send builds the queue's attributes (14 names a send). It is a
# function of its argument alone, and the names are a few dozen: each is worked out once.
_moto_camelcase_to_underscores = camelcase_to_underscores
_camelcase_to_underscores = functools.lru_cache(maxsize=1024)(camelcase_to_underscores)

_moto_method_names = _core_responses.method_names_from_class  # type: ignore[attr-defined]
_METHOD_NAMES: dict[type, list[str]] = {}


def _method_names(clazz: type) -> list[str]:
    """moto's method_names_from_class, made once a class."""
    names = _METHOD_NAMES.get(clazz)
    if names is None:
        names = _METHOD_NAMES[clazz] = _moto_method_names(clazz)
    return names


def _within_retention(self: SQSBackend, queue_name: str, message: Message) -> bool:
    """moto's is_message_valid_based_on_retention_period, the period read from the queue."""
    retention_s = self.get_queue(queue_name).message_retention_period  # type: ignore[attr-defined]
    return bool(int(retention_s) + message.sent_timestamp / 1000 > unix_time())  # type: ignore[operator]


def _had_receipt_handle(message: Message, receipt_handle: str) -> bool:
    """moto's Message.had_receipt_handle without a fresh list of the handles each time."""
    return receipt_handle == message.receipt_handle or receipt_handle in message._old_receipt_handles


def _visible(message: Message) -> bool:
    return time.time() * 1000 > message.visible_at


def _delayed(message: Message) -> bool:
    return time.time() * 1000 < message.delayed_until


_REQUEST_ID_ALPHABET = (string.ascii_letters + string.digits).encode()


def _request_id(headerdict: dict[str, Any] | None = None) -> str:
    """moto's gen_amzn_requestid_long, from os.urandom: each byte picks one of the 62 characters
    (the slight bias of 256 mod 62 does not matter to an id)."""
    request_id = bytes(_REQUEST_ID_ALPHABET[byte % 62] for byte in os.urandom(52)).decode()
    if isinstance(headerdict, dict):
        headerdict["x-amzn-requestid"] = request_id
    return request_id


def install() -> None:
    """Idempotent; before moto serves."""
    if not moto_patches.enabled():  # not the moto version it was written for
        return
    setattr(DynamoDBStreamsHandler, "get_records", _get_records)  # noqa: B010 - a patch, typed apart
    setattr(DynamoResult, "execute_result", _dynamo_result)  # noqa: B010
    _UpdateExpressionParser.make = classmethod(_parsed_update)
    _Traverser.traverse_node_recursively = _traverse_node_recursively
    _UpdateValidator.__init__ = _update_validator_init
    _UpdateValidator.get_ast_processors = _update_passes
    setattr(ConditionExpressionParser, "_lex_condition_expression", _lex_condition)  # noqa: B010
    setattr(ConditionExpressionParser, "parse", _parse_condition)  # noqa: B010
    setattr(SQSBackend, "is_message_valid_based_on_retention_period", _within_retention)  # noqa: B010
    setattr(_dynamodb_models, "copy", _copies)  # noqa: B010
    setattr(_dynamodb_responses, "copy", _NoItemCopy())  # noqa: B010
    if not getattr(DynamoHandler.update_item, "__llmtasks_streamless__", False):
        setattr(DynamoHandler, "update_item", _copies.around(DynamoHandler.update_item))  # noqa: B010
    setattr(Message, "had_receipt_handle", _had_receipt_handle)  # noqa: B010
    setattr(Message, "visible", property(_visible))  # noqa: B010
    setattr(Message, "delayed", property(_delayed))  # noqa: B010
    setattr(_core_responses, "method_names_from_class", _method_names)  # noqa: B010
    setattr(_core_responses, "gen_amzn_requestid_long", _request_id)  # noqa: B010
    setattr(_core_responses, "camelcase_to_underscores", _camelcase_to_underscores)  # noqa: B010
    setattr(_sqs_models, "camelcase_to_underscores", _camelcase_to_underscores)  # noqa: B010
    setattr(_dynamodb_table, "copy", _scan_copies)  # noqa: B010
    setattr(_dynamodb_table.Table, "scan", _scan_copies.around(_moto_table_scan))  # noqa: B010
    index_queries.install()


def uninstall() -> None:
    """moto's own code back (for the tests that compare the two)."""
    setattr(DynamoDBStreamsHandler, "get_records", _serializers_get_records)  # noqa: B010
    setattr(DynamoResult, "execute_result", _serialized_dynamo_result)  # noqa: B010
    _UpdateExpressionParser.make = _parse_update
    _Traverser.traverse_node_recursively = _traverse_node
    _UpdateValidator.__init__ = _moto_update_validator_init
    _UpdateValidator.get_ast_processors = _moto_update_passes
    setattr(ConditionExpressionParser, "_lex_condition_expression", _moto_lex_condition)  # noqa: B010
    setattr(ConditionExpressionParser, "parse", _moto_parse_condition)  # noqa: B010
    _last_condition.kept = None
    setattr(SQSBackend, "is_message_valid_based_on_retention_period", _retention_check)  # noqa: B010
    setattr(_dynamodb_models, "copy", copy)  # noqa: B010
    setattr(_dynamodb_responses, "copy", copy)  # noqa: B010
    setattr(Message, "had_receipt_handle", _moto_had_receipt_handle)  # noqa: B010
    setattr(Message, "visible", _moto_visible)  # noqa: B010
    setattr(Message, "delayed", _moto_delayed)  # noqa: B010
    setattr(_core_responses, "method_names_from_class", _moto_method_names)  # noqa: B010
    setattr(_core_responses, "gen_amzn_requestid_long", _moto_request_id)  # noqa: B010
    setattr(_core_responses, "camelcase_to_underscores", _moto_camelcase_to_underscores)  # noqa: B010
    setattr(_sqs_models, "camelcase_to_underscores", _moto_camelcase_to_underscores)  # noqa: B010
    setattr(_dynamodb_table, "copy", copy)  # noqa: B010
    setattr(_dynamodb_table.Table, "scan", _moto_table_scan)  # noqa: B010
    index_queries.uninstall()
