"""JSON made to fit a JSON schema (a structured output's answer), and JSON made not to.

Deterministic: the same schema and hint give the same value. A string `enum` picks the value
that appears first in the hint (whole words, any case), else its first value, so a classification
test gets the label its document names.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Past this depth a recursive schema is closed: null where allowed, no optional items.
MAX_DEPTH = 8
FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00Z",
    "email": "mock@example.com",
    "uri": "https://example.com/mock",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "192.0.2.1",
}


def instance(schema: dict[str, Any], hint: str = "") -> Any:
    """A value that validates against `schema` ($ref into its $defs/definitions resolved)."""
    return _Maker(schema, hint).make(schema, 0)


def broken(schema: dict[str, Any], hint: str = "") -> Any:
    """JSON that does not validate against `schema`: an object missing its first required
    property, else with its first property of the wrong type, else a value of the wrong type."""
    maker = _Maker(schema, hint)
    root = maker.resolve(schema)
    value = maker.make(root, 0)
    if isinstance(value, dict):
        required = [name for name in root.get("required", []) if name in value]
        if required:
            del value[required[0]]
            return value
        if value:
            first = next(iter(value))
            value[first] = [] if isinstance(value[first], str) else "mock: wrong type"
            return value
        if root.get("additionalProperties") is False:
            return {"mock_unexpected": True}
    return [] if not isinstance(value, list) else "mock: wrong type"


class _Maker:
    def __init__(self, root: dict[str, Any], hint: str) -> None:
        self.root = root
        self.hint = hint

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while isinstance(schema.get("$ref"), str) and seen < 32:
            target: Any = self.root
            for step in schema["$ref"].removeprefix("#").strip("/").split("/"):
                if step:
                    target = target[step.replace("~1", "/").replace("~0", "~")]
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
            seen += 1
        return schema

    def make(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, dict):
            return None if schema is False else "mock"
        schema = self.resolve(schema)
        if "const" in schema or (isinstance(schema.get("enum"), list) and schema["enum"]):
            return schema["const"] if "const" in schema else self.pick(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                branches = schema[key]
                if depth >= MAX_DEPTH:  # close a recursion on its null branch where it has one
                    branches = [b for b in branches if self.resolve(b).get("type") == "null"] or branches
                return self.make(branches[0], depth + 1)
        if isinstance(schema.get("allOf"), list):
            return self.make(self.merged(schema), depth)
        kind = self.kind(schema, depth)
        if kind == "object":
            return {
                name: self.make(sub, depth + 1)
                for name, sub in schema.get("properties", {}).items()
                if depth < MAX_DEPTH or name in schema.get("required", [])
            }
        makers = {"array": self.array, "string": self.string, "integer": self.number, "number": self.number}
        return makers[kind](schema, depth) if kind in makers else (True if kind == "boolean" else None)

    def merged(self, schema: dict[str, Any]) -> dict[str, Any]:
        """An allOf's members in one schema: their properties and required lists joined."""
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for member in schema["allOf"]:
            part = self.resolve(member)
            merged["properties"] = {**merged.get("properties", {}), **part.get("properties", {})}
            merged["required"] = [*merged.get("required", []), *part.get("required", [])]
            merged.update({k: v for k, v in part.items() if k not in ("properties", "required")})
        return merged

    def kind(self, schema: dict[str, Any], depth: int) -> str:
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if k != "null"] if depth < MAX_DEPTH or "null" not in kind else ["null"]
            kind = kinds[0] if kinds else "null"
        if kind is None:
            if "properties" in schema:
                return "object"
            return "array" if "items" in schema or "prefixItems" in schema else "string"
        return str(kind)

    def array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        prefix = [self.make(sub, depth + 1) for sub in schema.get("prefixItems", [])]
        least = int(schema.get("minItems", 0 if depth >= MAX_DEPTH else 1))
        most = schema.get("maxItems")
        count = max(least - len(prefix), 0 if prefix else least)
        if most is not None:
            count = min(count, int(most) - len(prefix))
        items = schema.get("items", {})
        return (
            prefix + [self.make(items, depth + 1) for _ in range(max(count, 0))]
            if items is not False
            else prefix
        )

    def string(self, schema: dict[str, Any], _: int) -> str:
        text = FORMATS.get(str(schema.get("format")), "mock")
        least, most = int(schema.get("minLength", 0)), schema.get("maxLength")
        text = text.ljust(least, "x")
        return text if most is None else text[: int(most)]

    @staticmethod
    def number(schema: dict[str, Any], _: int) -> int | float:
        """The minimum (or just above an exclusive one), else 0 kept under a maximum."""
        kind = schema.get("type")
        integer = kind == "integer" or (isinstance(kind, list) and "integer" in kind)
        step = 1 if integer else 0.5
        value: int | float = 0
        if "minimum" in schema or "exclusiveMinimum" in schema:
            value = schema["minimum"] if "minimum" in schema else schema["exclusiveMinimum"] + step
        elif "maximum" in schema or "exclusiveMaximum" in schema:
            value = min(0, schema["maximum"] if "maximum" in schema else schema["exclusiveMaximum"] - step)
        return math.ceil(value) if integer else value

    def pick(self, values: list[Any]) -> Any:
        """The string value the hint names first, else the first value."""
        found: list[tuple[int, int]] = []
        for index, value in enumerate(values):
            if isinstance(value, str) and value:
                match = re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", self.hint, re.IGNORECASE)
                if match:
                    found.append((match.start(), index))
        return values[min(found)[1]] if found else values[0]
