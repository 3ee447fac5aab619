"""Rules between a model's fields, written into its JSON Schema (pydantic's json_schema_extra),
in the forms that both validators and schemathesis' generator read as meant. The models name
the fields (domain/models.py); the validators that enforce the rules stay beside them.
"""

from __future__ import annotations

import copy
import itertools
from collections import ChainMap
from collections.abc import Callable
from typing import Any

Ways = list[dict[str, bool]]  # each way: field -> given (non-null, required) or not (null or absent)


def non_null(field: dict[str, Any]) -> dict[str, Any]:
    """An optional field's schema when it is given: its one form that is not null."""
    given: dict[str, Any]
    [given] = [option for option in field.get("anyOf", [field]) if option != {"type": "null"}]
    described: dict[str, Any] = {key: value for key, value in field.items() if key not in ("anyOf", "type")}
    return described | given


def exactly_one_of(*fields: str) -> Callable[[dict[str, Any]], None]:
    """Exactly one of `fields`, for an object nested in another's array (a batch's items), in the
    form schemathesis' generator handles there: the nullable properties as they are, and `oneOf`
    each given. (Nested, the whole-object form of `alternatives` is what it gives up on.)"""

    def add(schema: dict[str, Any]) -> None:
        schema["oneOf"] = [
            {
                "required": [name],
                "properties": {name: non_null(schema["properties"][name])},
            }
            for name in fields
        ]

    return add


def needs(
    rules: dict[str, dict[str, Any]], *, free: dict[str, dict[str, Any]] | None = None
) -> Callable[[dict[str, Any]], None]:
    """Fields that, given (non-null, and not of `free`'s schema for it), need others to fit a
    schema: `dependentSchemas`, in each of the object's `anyOf` branches (`alternatives`) or
    beside its properties. One keyword a rule, where a branch a way would multiply the branches
    (and the generator's work) by each rule."""

    def add(schema: dict[str, Any]) -> None:
        def unneeded(field: str) -> dict[str, Any]:
            exempt = (free or {}).get(field)
            return {"type": "null"} if exempt is None else {"anyOf": [{"type": "null"}, exempt]}

        dependent = {
            field: {
                "anyOf": [
                    {"properties": {field: unneeded(field)}},
                    {"properties": needed, "required": list(needed)},
                ]
            }
            for field, needed in rules.items()
        }
        for place in schema.get("anyOf", [schema]):
            place["dependentSchemas"] = dependent

    return add


def excludes(field: str, others: tuple[str, ...]) -> Callable[[dict[str, Any]], None]:
    """`field`, when true, with none of `others` given: a `dependentSchemas` entry beside the
    others (`needs`), in each of the object's `anyOf` branches."""

    def add(schema: dict[str, Any]) -> None:
        rule = {
            "anyOf": [
                {"properties": {field: {"anyOf": [{"const": False}, {"type": "null"}]}}},
                {"properties": {other: {"type": "null"} for other in others}},
            ]
        }
        for place in schema.get("anyOf", [schema]):
            place.setdefault("dependentSchemas", {})[field] = rule

    return add


def each(*extras: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """json_schema_extras applied in turn."""

    def apply(schema: dict[str, Any]) -> None:
        for extra in extras:
            extra(schema)

    return apply


def alternatives(*choices: Ways) -> Callable[[dict[str, Any]], None]:
    """A json_schema_extra that makes the model's schema an anyOf: one whole object per way of
    each choice taken together. (`oneOf` over partial schemas beside the properties, or an `allOf`
    there, is what schemathesis' generator gives up on at the top of a body, or reads wrong.)"""
    ways = [dict(ChainMap(*combination)) for combination in itertools.product(*choices)]

    def split(schema: dict[str, Any]) -> None:
        keys = ("type", "properties", "required", "additionalProperties")
        whole = {key: schema.pop(key) for key in keys if key in schema}
        branches = []
        for way in ways:
            branch = copy.deepcopy(whole)
            for name, given in way.items():
                if not given:
                    branch["properties"][name] = {"type": "null"}
                    continue
                branch["properties"][name] = non_null(branch["properties"][name])
                branch["required"] = [*branch.get("required", []), name]
            branches.append(branch)
        schema["anyOf"] = branches

    return split
