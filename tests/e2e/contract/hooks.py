"""schemathesis hooks for the contract test (SCHEMATHESIS_HOOKS names this module): the rules
the document cannot state (about state, the network, and sizes in bytes) are kept out of the
generated requests, so that every other refusal is checked.

- A webhook_url is refused unless its host resolves to a public address (or is one of the
  stack's WEBHOOK_ALLOWED_HOSTS): a property of the network, not of the string. In a request
  generated to fit the document, the URL (which then fits its form: an http(s) URL with a host,
  up to 2048 characters) goes to the test's receiver; one generated not to fit is sent as it is.
- A metadata object is refused over MAX_METADATA_BYTES (2 KiB) of JSON text: a size JSON Schema
  cannot measure (the document says it in words). A generated one over it is replaced by a small
  object, of a task body and of each batch item.
- A batch's custom_ids are unique within it: JSON Schema's uniqueItems compares whole items. A
  generated batch whose items repeat one has the repeats made unique.
- A request's tools have names of their own, and a tool_choice that names a function names one
  of them: uniqueItems compares whole tools, and no schema ties one field's value to another's.
  Repeated names are made unique, and a named choice names the first tool (in a request
  generated to fit the document: one generated not to is sent as it is).
- A task body's function tool may carry a `url` (an endpoint the worker calls), refused as a
  webhook_url is unless it resolves to a public address: in a request generated to fit the
  document, it goes to the test's receiver; so does an MCP server's `server_url`.
- A task body's MCP servers have labels of their own, its functions are not named as a server's
  tools (`<server_label>__...`), and with servers but no function `tool_choice` and
  `parallel_tool_calls` have nothing to choose among: repeated labels are made unique, such a
  function renamed, and the two fields left out.
- A response_format's schema must be a JSON Schema: the document says an object (the
  meta-schema is the rule, which it cannot hold); a generated one that is not becomes
  `{"type": "object"}`.
- A previous_response_id must name a response of this tenant that has completed or waits for
  its function calls' outputs: state the document cannot hold (any other is OpenAI's 404, or a
  400 saying why). In a request generated to fit the document, it is left out.
- An Idempotency-Key is bound to the first body sent with it: sent again with another body, it
  is refused (422, as the IETF draft has it). A generated key that the document allows (1 to 255
  characters) is made unique to its request.

Each edit swaps a value the document allows for another it allows, so the request is as valid,
or as invalid, as it was generated: the edit is taken as the case's own (no revalidation, which
would relabel a case generated without its Authorization header and send it with the run's).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import schemathesis
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

RECEIVER = os.environ["LLMTASKS_TEST_WEBHOOK"]  # the test's receiver on 127.0.0.1, an allowed host
MAX_KEY = 255
MAX_METADATA_BYTES = 2048
MAX_CUSTOM_ID = 256


def _small_metadata(body: dict[str, Any]) -> None:
    metadata = body.get("metadata")
    if (
        isinstance(metadata, dict)
        and len(json.dumps(metadata, separators=(",", ":")).encode()) > MAX_METADATA_BYTES
    ):
        body["metadata"] = {"replaced": "generated over 2 KiB"}


def _request_rules(body: dict[str, Any]) -> None:
    """The rules between a request's values: tool names, the named choice, the schema."""
    tools = [tool for tool in body.get("tools") or [] if isinstance(tool, dict)]
    _mcp_rules(body, tools)
    names: list[str] = []
    for index, tool in enumerate(tools):
        # Chat Completions nests a tool's name in `function`; the Responses API has it flat.
        named = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if isinstance(tool.get("url"), str):
            tool["url"] = RECEIVER
        if isinstance(named.get("name"), str):
            if named["name"] in names:
                named["name"] = f"{named['name'][:56]}_{index}"
            names.append(named["name"])
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and names:
        named = choice.get("function") if isinstance(choice.get("function"), dict) else choice
        if "name" in named:
            named["name"] = names[0]
    response_format = body.get("response_format")
    spec = response_format.get("json_schema") if isinstance(response_format, dict) else None
    if isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
        try:
            Draft202012Validator.check_schema(spec["schema"])
        except SchemaError:
            spec["schema"] = {"type": "object"}


def _mcp_rules(body: dict[str, Any], tools: list[dict[str, Any]]) -> None:
    """The rules between a task body's MCP servers and its functions."""
    servers = [tool for tool in tools if tool.get("type") == "mcp"]
    labels: list[str] = []
    for index, server in enumerate(servers):
        if isinstance(server.get("server_url"), str):
            server["server_url"] = RECEIVER
        label = server.get("server_label")
        if isinstance(label, str):
            if label in labels:
                label = server["server_label"] = f"{label[:24]}-{index}"
            labels.append(label)
    functions = [tool for tool in tools if tool.get("type") == "function"]
    for tool in functions:
        named = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = named.get("name")
        if isinstance(name, str) and name.split("__")[0] in labels:
            named["name"] = f"_{name}"[:64]  # no label starts with "_"
    if servers and not functions:
        body.pop("tool_choice", None)
        body.pop("parallel_tool_calls", None)


def _fits_the_document(case: Any) -> bool:
    """Whether the case was generated to fit the document (its positive mode): then any value
    of it the document allows may be swapped for another it allows."""
    meta = case.meta
    return meta is None or meta.generation.mode.is_positive


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    body = case.body
    if isinstance(body, dict):
        url = body.get("webhook_url")
        if isinstance(url, str) and _fits_the_document(case):
            body["webhook_url"] = RECEIVER
        _small_metadata(body)
        fits = _fits_the_document(case)
        if fits:
            _request_rules(body)
            body.pop("previous_response_id", None)
        seen: set[str] = set()
        for index, item in enumerate(body.get("items") or []):
            if isinstance(item, dict):
                _small_metadata(item)
                if fits:
                    _request_rules(item)
                custom_id = item.get("custom_id")
                if isinstance(custom_id, str) and custom_id in seen and len(custom_id) < MAX_CUSTOM_ID - 8:
                    item["custom_id"] = f"{custom_id}~{index}"
                seen.add(str(item.get("custom_id")))
    for name, value in list((case.headers or {}).items()):
        if name.lower() == "idempotency-key" and isinstance(value, str) and 1 <= len(value) <= MAX_KEY:
            case.headers[name] = uuid.uuid4().hex
    case._sync_validated_hashes()  # see the docstring
