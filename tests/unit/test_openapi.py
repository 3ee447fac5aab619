"""The OpenAPI document says exactly what the API accepts: each body below is accepted by the
routes if and only if the document's schema for it holds (jsonschema, the validator a client
would use), and the document's links name operations and parameters that exist. schemathesis
walks the same document against the local stack (tests/e2e/test_contract.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonschema
import pytest
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from llmtasks.domain.cursors import RESULTS_CURSOR_PATTERN, TASKS_CURSOR_PATTERN
from llmtasks.settings import Settings
from tests.conftest import Aws, RunningMock
from tests.unit.test_batches import Rig

pytestmark = pytest.mark.unit

HOOK = "http://127.0.0.1:9/hook"  # an allowed host of the unit settings
# A webhook URL's form, which the document says (a host's addresses, it cannot): an http(s) URL
# with a host, the scheme in any case, no whitespace.
WEBHOOK_URLS = [
    HOOK,
    "HTTP://127.0.0.1:9/hook?a=1#b",
    "",
    "127.0.0.1:9/hook",
    "ftp://127.0.0.1/x",
    "http://",
    "http://127.0.0.1:9/a b",
]

PIXEL = "data:image/png;base64,iVBORw0KGgo="
IMAGE = {"type": "image_url", "image_url": {"url": PIXEL}}
TEXT = {"type": "text", "text": "hi"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# A message of each role, with what its role may carry and what it may not.
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "rules"},
    {"role": "system", "content": [TEXT]},
    {"role": "system", "content": [IMAGE]},
    {"role": "developer", "content": None},
    {"role": "developer", "content": "rules", "tool_call_id": None, "refusal": None},
    {"role": "user", "content": [TEXT, IMAGE]},
    {"role": "user", "content": "hi", "tool_calls": [CALL]},
    {"role": "user", "content": "hi", "name": "ann"},
    {"role": "user"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "assistant", "refusal": "no"},
    {"role": "assistant", "content": None},
    {"role": "assistant"},
    {"role": "assistant", "content": [IMAGE]},
    {"role": "assistant", "content": "ok", "tool_call_id": "call_1"},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_1", "content": [TEXT]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny", "refusal": "no"},
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]},
    {"role": "user", "content": [{"type": "file", "file": {"filename": "a.pdf"}}]},
]

TASK_BODIES: list[dict[str, Any]] = [
    {"prompt": "hi"},
    {"prompt": "hi", "provider_background": True},
    {"prompt": "hi", "provider_background": True, "seed": 1},
    {"prompt": "hi", "provider_background": True, "stop": None},
    {"prompt": "hi", "provider_background": False, "logprobs": True},
    {"prompt": "hi", "provider_background": "yes"},
    {"prompt": ""},
    {"messages": [{"role": "user", "content": "hi"}]},
    {"prompt": None, "messages": [{"role": "user", "content": "hi"}]},
    {"prompt": "hi", "messages": None},
    {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]},
    {},
    {"prompt": None},
    {"messages": []},
    {"prompt": "hi", "bogus": 1},
    {"prompt": "hi", "temperature": 0},
    {"prompt": "hi", "temperature": 2},
    {"prompt": "hi", "temperature": 2.5},
    {"prompt": "hi", "temperature": 1e-200},
    {"prompt": "hi", "temperature": -1},
    {"prompt": "hi", "timeout_s": 0.5},
    {"prompt": "hi", "timeout_s": 604800},
    {"prompt": "hi", "timeout_s": 604801},
    {"prompt": "hi", "max_tokens": 0},
    {"prompt": "hi", "max_retries": 11},
    {"prompt": "hi", "max_retries": False},
    {"prompt": "hi", "max_retries": 2.0},
    {"prompt": "hi", "max_tokens": True},
    {"prompt": "hi", "temperature": True},
    {"prompt": "hi", "timeout_s": True},
    {"prompt": "hi", "priority": "urgent"},
    {"prompt": "hi", "model": "m" * 201},
    {"prompt": "hi", "metadata": {"a": 1}},
    {"prompt": "hi", "metadata": {"": 1}},
    {"prompt": "hi", "metadata": []},
    *({"messages": [message]} for message in MESSAGES),
    {"prompt": "hi", "logprobs": True, "top_logprobs": 3},
    {"prompt": "hi", "top_logprobs": 3},
    {"prompt": "hi", "logprobs": False, "top_logprobs": 3},
    {"prompt": "hi", "logprobs": False, "top_logprobs": None},
    {"prompt": "hi", "tools": [TOOL], "tool_choice": "required"},
    {"prompt": "hi", "tool_choice": "required"},
    {"prompt": "hi", "response_format": {"type": "json_schema", "json_schema": {"name": "S", "schema": {}}}},
    {"prompt": "hi", "webhook_events": ["task.completed"]},
    {"prompt": "hi", "webhook_events": None},
    {"prompt": "hi", "webhook_events": ["task.completed"], "webhook_url": HOOK},
    {"prompt": "hi", "webhook_events": [], "webhook_url": HOOK},
    {"prompt": "hi", "webhook_format": "openai"},
    {"prompt": "hi", "webhook_format": "openai", "webhook_url": HOOK},
    {"prompt": "hi", "webhook_url": None, "webhook_format": None},
    *({"prompt": "hi", "webhook_url": url} for url in WEBHOOK_URLS),
]
BATCH_BODIES: list[dict[str, Any]] = [
    {"items": [{"prompt": "a", "top_logprobs": 2}]},
    {"items": [{"prompt": "a", "logprobs": True, "top_logprobs": 2}]},
    {"items": [{"prompt": "a", "tool_choice": "auto"}]},
    {"items": [{"prompt": "a", "tools": [TOOL], "tool_choice": "auto"}]},
    {"items": [{"messages": [message]} for message in MESSAGES[2:4]]},
    {"items": [{"prompt": "a"}, {"messages": [{"role": "user", "content": "b"}]}]},
    {"items": []},
    {"items": [{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}]},
    {"items": [{}]},
    {"items": [{"prompt": "a", "webhook_url": HOOK}]},
    {"items": [{"prompt": "a", "custom_id": ""}]},
    {"items": [{"prompt": "a"}], "webhook_events": ["batch.completed"]},
    {"items": [{"prompt": "a"}], "webhook_events": ["batch.completed"], "webhook_url": HOOK},
    {"items": [{"prompt": "a"}], "priority": "high"},
    *({"items": [{"prompt": "a"}], "webhook_url": url} for url in WEBHOOK_URLS),
]
FLAT_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}
RESPONSE_BODIES: list[dict[str, Any]] = [
    {"input": "hi", "background": True},
    {"input": "hi", "background": True, "tool_choice": "required"},
    {"input": "hi", "background": True, "tool_choice": "auto"},
    {"input": "hi", "background": True, "tool_choice": "required", "tools": []},
    {"input": "hi", "background": True, "tool_choice": "required", "tools": [FLAT_TOOL]},
    {"input": "hi", "background": True, "tools": [{"type": "web_search"}]},
    {"input": "hi", "background": True, "tool_choice": {"type": "web_search"}},
    {"input": "hi", "background": True, "truncation": "auto"},
    {"input": "hi", "background": True, "include": ["reasoning.encrypted_content"]},
    {"input": "hi", "background": True, "safety_identifier": ""},
    {"input": [{"type": "reasoning", "summary": []}], "background": True},
    {"input": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "hi"}], "background": True},
    {"input": "hi"},
    {"input": "hi", "background": False},
    {"input": "hi", "background": True, "store": False},
    {"input": "hi", "background": True, "store": True},
    {"input": "", "background": True},
    {"input": [], "background": True},
    {"input": [{"role": "developer", "content": "hi"}], "background": True},
    {"input": [{"role": "user", "content": []}], "background": True},
    {"input": "hi", "background": True, "temperature": 1e-200},
    {"input": "hi", "background": True, "max_output_tokens": 1_000_001},
    {"input": "hi", "background": True, "metadata": {"": "x"}},
    {"input": "hi", "background": True, "metadata": {"k": 1}},
    {"input": "hi", "background": True, "tools": []},
    {"input": "hi", "background": 1},
    {"input": "hi", "background": "true"},
    {"input": "hi", "background": True, "store": "yes"},
    {"input": "hi", "background": True, "max_output_tokens": True},
    *({"input": "hi", "background": True, "webhook_url": url} for url in WEBHOOK_URLS),
]


@pytest.fixture
def rig(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> Rig:
    return Rig(aws, handler, settings, mock_llm)


def document(rig: Rig) -> dict[str, Any]:
    reply = rig.api.call("GET", "/openapi.json")
    assert reply["statusCode"] == 200
    doc: dict[str, Any] = reply["json"]
    return doc


def validator(doc: dict[str, Any], path: str, method: str = "post") -> jsonschema.Draft202012Validator:
    schema = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    registry: Registry[Any] = Registry().with_resource("urn:doc", DRAFT202012.create_resource(doc))
    rooted = {"$ref": "urn:doc#" + schema["$ref"].removeprefix("#")} if "$ref" in schema else schema
    return jsonschema.Draft202012Validator(rooted, registry=registry)


@pytest.mark.parametrize(
    ("path", "bodies", "accepted"),
    [("/tasks", TASK_BODIES, 202), ("/batches", BATCH_BODIES, 202), ("/v1/responses", RESPONSE_BODIES, 200)],
)
def test_a_body_is_accepted_exactly_when_the_document_s_schema_holds(
    rig: Rig, path: str, bodies: list[dict[str, Any]], accepted: int
) -> None:
    doc = document(rig)
    check = validator(doc, path)
    verdicts = []
    for body in bodies:
        reply = rig.api.call("POST", path, body)
        assert reply["statusCode"] in (accepted, 400, 422), (body, reply["body"])
        verdicts.append((body, check.is_valid(body), reply["statusCode"] == accepted))
    assert [json.dumps(v) for v in verdicts if v[1] != v[2]] == []
    # Both verdicts occur: the table tells the two apart
    assert {said for _, said, _ in verdicts} == {True, False}


def test_the_document_uses_json_schema_s_own_keywords_only(rig: Rig) -> None:
    # pydantic writes a bound it cannot place (ge, le beside a validator) under its own name,
    # which no validator or generator reads: the bound was not in the document at all.
    found: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in {"ge", "le", "gt", "lt"} and not isinstance(value, dict):
                    found.append(f"{where}/{key}")
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}/{i}")

    walk(document(rig), "#")
    assert found == []


def test_cursors_carry_their_patterns_and_the_upload_its_multipart_body(rig: Rig) -> None:
    doc = document(rig)

    def pattern(path: str) -> str:
        [cursor] = [p for p in doc["paths"][path]["get"]["parameters"] if p["name"] == "cursor"]
        schema = cursor["schema"]
        [string] = [s for s in schema.get("anyOf", [schema]) if s.get("type") == "string"]
        return str(string["pattern"])

    assert pattern("/tasks") == TASKS_CURSOR_PATTERN
    assert pattern("/batches/{batch_id}/results") == RESULTS_CURSOR_PATTERN
    upload = doc["paths"]["/v1/files"]["post"]["requestBody"]
    assert upload["required"] is True
    assert upload["content"]["multipart/form-data"]["schema"]["required"] == ["file", "purpose"]
    created = doc["paths"]["/v1/batches"]["post"]["requestBody"]
    assert created["required"] is True


def test_every_link_names_an_operation_and_its_parameters(rig: Rig) -> None:
    doc = document(rig)
    operations = {
        operation["operationId"]: operation
        for route in doc["paths"].values()
        for operation in route.values()
        if isinstance(operation, dict) and "operationId" in operation
    }
    links = [
        (path, status, name, link)
        for path, route in doc["paths"].items()
        for operation in route.values()
        for status, response in operation.get("responses", {}).items()
        for name, link in response.get("links", {}).items()
    ]
    creates = {(path, status) for path, status, _, _ in links}
    assert {("/tasks", "202"), ("/batches", "202"), ("/v1/responses", "200"), ("/v1/files", "200")} <= creates
    for path, status, name, link in links:
        target = operations[link["operationId"]]
        names = {p["name"] for p in target.get("parameters", [])}
        assert set(link["parameters"]) <= names, (path, status, name)
        # Runtime expressions: a value of the reply, or a path parameter of the request itself
        for value in link["parameters"].values():
            assert str(value).startswith("$response.body#/") or (
                str(value).startswith("$request.path.") and str(value).split(".")[-1] in names
            ), (path, status, name, value)


def test_a_value_the_document_allows_no_task_can_hold_is_refused_naming_the_field(rig: Rig) -> None:
    # A lone surrogate is a JSON string, and no text a task can store or send
    body = '{"input": [{"role": "user", "content": "\\ud800"}], "background": true}'
    reply = rig.api.call("POST", "/v1/responses", raw=body)
    assert reply["statusCode"] == 400
    # Where it is, not which member of a union pydantic tried (constrained-str, type:message)
    assert reply["json"]["error"]["param"] == "input.0.content"


def multipart(fields: dict[str, tuple[str | None, bytes]]) -> tuple[str, bytes]:
    boundary = "llmtasks-test-boundary"
    parts = b""
    for name, (filename, data) in fields.items():
        named = f'; filename="{filename}"' if filename else ""
        parts += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"{named}\r\n\r\n'.encode()
        parts += data + b"\r\n"
    return f"multipart/form-data; boundary={boundary}", parts + f"--{boundary}--\r\n".encode()


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"file": ("in.jsonl", b'{"custom_id": "a"}\n'), "purpose": (None, b"batch")}, 200),
        ({"file": ("in.bin", b"\xff\xfe\x00 not UTF-8"), "purpose": (None, b"batch")}, 200),
        ({"file": ("in.jsonl", b"x")}, 400),
        ({"file": ("in.jsonl", b""), "purpose": (None, b"batch")}, 400),
        ({"file": ("in.jsonl", b"x"), "purpose": (None, b"fine-tune")}, 400),
    ],
)
def test_an_upload_is_the_multipart_body_the_document_describes_whatever_its_bytes(
    rig: Rig, fields: dict[str, tuple[str | None, bytes]], status: int
) -> None:
    # API Gateway hands a multipart body over base64-encoded, as bytes that need not be UTF-8
    content_type, body = multipart(fields)
    reply = rig.api.call(
        "POST",
        "/v1/files",
        raw=base64.b64encode(body).decode(),
        headers={"content-type": content_type},
        base64_body=True,
    )
    assert reply["statusCode"] == status, reply["body"]
    if status == 200:
        file_id = reply["json"]["id"]
        described = rig.api.call("GET", f"/v1/files/{file_id}")["json"]
        assert described["bytes"] == len(fields["file"][1])
        content = rig.api.call("GET", f"/v1/files/{file_id}/content")
        assert content["statusCode"] == 200
        assert content["isBase64Encoded"] is True
        assert base64.b64decode(content["body"]) == fields["file"][1]  # the bytes as uploaded
