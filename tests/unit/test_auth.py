"""API keys: stored as hashes, checked by the authorizer, turned into 401 problems by the API."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmtasks.apikeys import ApiKeys, CachedAuthenticator
from llmtasks.queues import Queue
from llmtasks.service import TaskService
from llmtasks.settings import Settings
from llmtasks.store import TaskStore
from tests.conftest import Aws
from tests.helpers import blobs, load_event

pytestmark = pytest.mark.unit


@pytest.fixture
def api_keys(aws: Aws) -> ApiKeys:
    return ApiKeys(aws.resources.table_names["ApiKeysTable"], aws.dynamodb)


def test_only_a_hash_of_the_key_is_stored(aws: Aws, api_keys: ApiKeys) -> None:
    key, record = api_keys.create("acme", name="ci")
    assert key.startswith(f"lt_{record.key_id}_")
    [item] = aws.dynamodb.scan(TableName=api_keys.table_name)["Items"]
    stored = json.dumps(item)
    assert key not in stored
    assert key.split("_", 2)[2] not in stored
    assert set(item) == {"key_id", "key_hash", "tenant_id", "name", "created_at"}


def test_keys_authenticate_to_their_tenant_until_revoked(api_keys: ApiKeys) -> None:
    key, record = api_keys.create("acme")
    assert api_keys.authenticate(key).tenant_id == "acme"
    assert api_keys.authenticate(key[:-1] + ("A" if key[-1] != "A" else "B")).refusal == "unknown"
    assert api_keys.authenticate(None).refusal == "missing"
    assert api_keys.authenticate("sk-proj-123").refusal == "malformed"
    assert api_keys.authenticate("lt_" + "x" * 300).refusal == "malformed"
    assert api_keys.revoke(record.key_id) is not None
    assert api_keys.authenticate(key).refusal == "revoked"
    assert api_keys.revoke("nosuchkey") is None
    assert [k.revoked_at is not None for k in api_keys.all()] == [True]


def test_the_authorizer_caches_decisions_for_its_ttl(api_keys: ApiKeys) -> None:
    now = [0.0]
    cached = CachedAuthenticator(api_keys, ttl_s=60, clock=lambda: now[0])
    key, record = api_keys.create("acme")
    assert cached.authenticate(key).tenant_id == "acme"
    api_keys.revoke(record.key_id)
    assert cached.authenticate(key).tenant_id == "acme"  # within the TTL: the cached decision
    now[0] = 61
    assert cached.authenticate(key).refusal == "revoked"


def test_the_authorizer_function_passes_its_verdict_in_the_context(handler: Any, api_keys: ApiKeys) -> None:
    authorize, context = handler("AuthorizerFunction")
    key, _ = api_keys.create("acme")
    event = load_event("authorizer_request.json")
    authenticator = CachedAuthenticator(api_keys, ttl_s=0)
    refused = authorize(event, context, authenticator=authenticator)
    assert refused == {"isAuthorized": True, "context": {"refusal": "unknown"}}
    event["headers"]["authorization"] = f"Bearer {key}"
    assert authorize(event, context, authenticator=authenticator) == {
        "isAuthorized": True,
        "context": {"tenant_id": "acme"},
    }


def submit_as(handler: Any, service: TaskService, verdict: dict[str, str] | None) -> dict[str, Any]:
    submit, context = handler("SubmitFunction")
    event = load_event("submit_task.json")
    if verdict is not None:
        event["requestContext"]["authorizer"] = {"lambda": verdict}
    else:
        event["requestContext"].pop("authorizer", None)
    return submit(event, context, service=service)  # type: ignore[no-any-return]


def test_the_api_answers_a_refusal_with_a_401_problem_and_a_verdict_with_the_tenant(
    aws: Aws, settings: Settings, handler: Any
) -> None:
    strict = settings.model_copy(update={"auth_required": True})
    store = TaskStore(strict.tasks_table_name, aws.dynamodb)
    service = TaskService(strict, store, Queue(strict.task_queue_url, aws.sqs), results=blobs(strict))
    for verdict, detail in [(None, "Send an API key"), ({"refusal": "revoked"}, "revoked")]:
        reply = submit_as(handler, service, verdict)
        assert reply["statusCode"] == 401
        assert reply["headers"]["WWW-Authenticate"] == 'Bearer realm="llmtasks"'
        assert detail in json.loads(reply["body"])["detail"]
    assert aws.messages("TaskQueue") == []
    accepted = submit_as(handler, service, {"tenant_id": "acme"})
    assert accepted["statusCode"] == 202
    task = store.get(json.loads(accepted["body"])["task_id"], now=0)
    assert task is not None
    assert task.tenant_id == "acme"
