"""Structured outputs: a pydantic model given as `response_format` becomes the json_schema format
the API takes, its schema made strict the way OpenAI's SDK makes it (`to_strict_json_schema` in
openai/lib/_pydantic.py): every object closed (`additionalProperties: false`), every property
required, None defaults dropped, a `$ref` with siblings inlined. The answer then fits the model
and is parsed into it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from pydantic import BaseModel, TypeAdapter


def is_model_class(value: object) -> TypeGuard[type[BaseModel]]:
    return inspect.isclass(value) and issubclass(value, BaseModel)


def strict_json_schema(model: type[BaseModel] | TypeAdapter[Any]) -> dict[str, Any]:
    """The model's JSON Schema in the form a strict json_schema format takes."""
    schema = model.json_schema() if isinstance(model, TypeAdapter) else model.model_json_schema()
    return _strict(schema, root=schema)


def json_schema_format(model: type[BaseModel], *, description: str | None = None) -> dict[str, Any]:
    """`response_format` asking for an answer that fits `model`: named after the class (a generic
    one's brackets made underscores, as a schema's name allows), strict."""
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", model.__name__)[:64]
    spec: dict[str, Any] = {"name": name, "schema": strict_json_schema(model), "strict": True}
    if description is not None:
        spec["description"] = description
    return {"type": "json_schema", "json_schema": spec}


def response_format_of(value: type[BaseModel] | Mapping[str, Any]) -> dict[str, Any]:
    """A response_format as the API takes it: a pydantic model class converted, a mapping as given."""
    if is_model_class(value):
        return json_schema_format(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"response_format must be a pydantic model class or a mapping, not {value!r}")


def _strict(schema: object, *, root: dict[str, Any]) -> dict[str, Any]:
    """`schema`, changed in place to the strict form (openai's _ensure_strict_json_schema)."""
    if not isinstance(schema, dict):
        raise TypeError(f"expected a JSON Schema object, got {schema!r}")
    for key in ("$defs", "definitions"):
        for sub in (schema.get(key) or {}).values():
            _strict(sub, root=root)
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        schema["additionalProperties"] = False
    properties = schema.get("properties")
    if isinstance(properties, dict):
        schema["required"] = list(properties)
        schema["properties"] = {name: _strict(sub, root=root) for name, sub in properties.items()}
    if isinstance(schema.get("items"), dict):
        schema["items"] = _strict(schema["items"], root=root)
    if isinstance(schema.get("anyOf"), list):
        schema["anyOf"] = [_strict(variant, root=root) for variant in schema["anyOf"]]
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        if len(all_of) == 1:
            schema.update(_strict(all_of[0], root=root))
            schema.pop("allOf")
        else:
            schema["allOf"] = [_strict(entry, root=root) for entry in all_of]
    if "default" in schema and schema["default"] is None:
        schema.pop("default")
    ref = schema.get("$ref")
    if isinstance(ref, str) and len(schema) > 1:
        # A $ref beside other keys (a description) is not allowed in strict mode: inline it.
        schema.update({**_resolved(root, ref), **schema})
        schema.pop("$ref")
        return _strict(schema, root=root)
    return schema


def _resolved(root: dict[str, Any], ref: str) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"unexpected $ref {ref!r}: only local references (#/...) are followed")
    found: Any = root
    for key in ref[2:].split("/"):
        found = found[key]
        if not isinstance(found, dict):
            raise ValueError(f"$ref {ref!r} does not name a schema")
    return dict(found)
