"""API keys on the local stack: the HTTP API's Lambda authorizer, tenants, `llmtasks keys`."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.conftest import RunningStack, start_stack
from tests.e2e.test_local_stack import wait_terminal

pytestmark = pytest.mark.e2e


def assert_401(reply: httpx.Response, detail: str) -> None:
    assert reply.status_code == 401, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    assert reply.headers["www-authenticate"] == 'Bearer realm="llmtasks"'
    problem = reply.json()
    assert (problem["status"], problem["title"]) == (401, "Unauthorized")
    assert detail in problem["detail"]
    assert problem["type"].endswith("/unauthorized")


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({}, "Send an API key"),
        ({"Authorization": "Bearer lt_0123456789ab_notthesecret"}, "not valid"),
        ({"Authorization": "Bearer hello"}, "not an llmtasks API key"),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, "Send an API key"),
        ({"x-api-key": "lt_nope_nope"}, "not valid"),
    ],
)
def test_a_missing_or_wrong_key_is_a_401_problem(
    stack: RunningStack, headers: dict[str, str], detail: str
) -> None:
    with httpx.Client(base_url=stack.api, headers=headers) as client:
        assert_401(client.post("/tasks", json={"prompt": "p"}), detail)
        assert_401(client.get("/tasks"), detail)
        assert_401(client.get("/tasks/" + "a" * 32), detail)
        # Auth comes first: a bad body tells an unauthenticated caller nothing
        assert_401(client.post("/tasks", content=b"{not json"), detail)


def test_health_and_the_docs_need_no_key(stack: RunningStack) -> None:
    with httpx.Client(base_url=stack.api) as client:
        assert client.get("/health").json()["status"] == "ok"
        assert client.get("/docs").status_code == 200
        assert "/tasks" in client.get("/openapi.json").json()["paths"]


def test_the_key_may_come_as_x_api_key(stack: RunningStack) -> None:
    assert stack.api_key is not None
    with httpx.Client(base_url=stack.api, headers={"x-api-key": stack.api_key}) as client:
        assert client.post("/tasks", json={"prompt": "via x-api-key"}).status_code == 202


def test_a_tenant_never_sees_another_tenant_s_tasks(stack: RunningStack) -> None:
    acme_key = stack.cli("keys", "create", "--tenant", "acme", "--name", "e2e").strip()
    with stack.client() as dev, stack.client(acme_key) as acme:
        task_id = dev.post("/tasks", json={"prompt": "dev's own"}).json()["task_id"]
        assert acme.get(f"/tasks/{task_id}").status_code == 404
        assert acme.post(f"/tasks/{task_id}/cancel").status_code == 404
        assert task_id not in [t["task_id"] for t in acme.get("/tasks").json()["data"]]
        mine = acme.post("/tasks", json={"prompt": "acme's own"}).json()["task_id"]
        assert [t["task_id"] for t in acme.get("/tasks").json()["data"]] == [mine]
        assert task_id in [t["task_id"] for t in dev.get("/tasks", params={"limit": 100}).json()["data"]]
        assert dev.get(f"/tasks/{mine}").status_code == 404


def test_keys_are_listed_without_their_secret_and_a_revoked_key_stops_working(stack: RunningStack) -> None:
    key = stack.cli("keys", "create", "--tenant", "revokee").strip()
    key_id = key.split("_")[1]
    listing = stack.cli("keys", "list")
    assert key_id in listing
    assert key not in listing
    assert key.split("_", 2)[2] not in listing
    with stack.client(key) as client:
        assert client.get("/tasks").status_code == 200
        assert "revoked" in stack.cli("keys", "revoke", key_id)
        time.sleep(1.5)  # the authorizer's cache time on this stack
        assert_401(client.get("/tasks"), "revoked")


def test_no_auth_lets_the_simplest_polling_client_work() -> None:
    import requests

    stack = start_stack("--no-auth")
    try:
        assert stack.api_key is None
        base = stack.api
        task_id = requests.post(f"{base}/tasks", json={"prompt": "no key needed"}, timeout=10).json()[
            "task_id"
        ]
        give_up = time.monotonic() + 30
        while requests.get(f"{base}/tasks/{task_id}", timeout=10).json()["status"] != "completed":
            assert time.monotonic() < give_up
            time.sleep(0.2)
        assert requests.get(f"{base}/tasks/{task_id}", timeout=10).json()["result"]
    finally:
        stack.stop()


def test_up_prints_a_working_dev_key(stack: RunningStack) -> None:
    assert stack.api_key is not None
    assert stack.api_key in stack.log.read_text()
    with stack.client() as client:
        task = wait_terminal(client, client.post("/tasks", json={"prompt": "dev key"}).json()["task_id"])
    assert task["status"] == "completed"
