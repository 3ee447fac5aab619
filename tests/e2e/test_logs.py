"""No prompt, result, API key or webhook secret in any log line of the local stack."""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest

from tests.e2e.conftest import RunningStack, start_stack
from tests.e2e.test_local_stack import wait_terminal
from tests.helpers import WebhookReceiver, serve

pytestmark = pytest.mark.e2e


def test_logs_carry_ids_but_never_prompts_results_keys_or_secrets(stack: RunningStack) -> None:
    marker = f"confidential-{uuid.uuid4().hex}"
    key = stack.cli("keys", "create", "--tenant", "logscan").strip()
    wrong = f"lt_{uuid.uuid4().hex[:12]}_{uuid.uuid4().hex}"
    hook = WebhookReceiver()
    with serve(hook.app()) as receiver, stack.client(key) as client:
        secret = client.get("/webhooks/secret").json()["key"]
        reply = client.post(
            "/tasks",
            json={
                "prompt": f"{marker} prompt",
                "system": f"{marker} system",
                "webhook_url": receiver + "/hook",
            },
            headers={"idempotency-key": marker},
        )
        task_id = reply.json()["task_id"]
        task = wait_terminal(client, task_id)
        hook.wait_for(1)
        with stack.client(wrong) as stranger:
            assert stranger.get(f"/tasks/{task_id}").status_code == 403  # the authorizer's deny
    assert marker in task["result"]  # the mock echoes the prompt: the result carries it too
    log = stack.log.read_text()
    assert task_id in log  # the logs do say what happened
    for secret_text in (
        marker,
        key,
        key.split("_", 2)[2],
        wrong.split("_", 2)[2],
        secret,
        secret.removeprefix("whsec_"),
    ):
        assert secret_text not in log, f"a log line carries {secret_text[:12]}..."


def test_one_task_s_life_carries_its_task_id_on_every_line_and_the_request_id_as_correlation_id() -> None:
    # A stack of its own, so that its log is about this one task
    fresh = start_stack()
    try:
        marker = f"private-{uuid.uuid4().hex}"
        hook = WebhookReceiver()
        with serve(hook.app()) as receiver, fresh.client() as client:
            reply = client.post("/tasks", json={"prompt": marker, "webhook_url": receiver + "/hook"})
            task_id, request_id = reply.json()["task_id"], reply.headers["apigw-requestid"]
            assert wait_terminal(client, task_id)["status"] == "completed"
            hook.wait_for(1)
            time.sleep(0.5)  # the delivery's own lines
    finally:
        fresh.stop()
    lines = [json.loads(line) for line in fresh.log.read_text().splitlines() if line.startswith('{"level"')]
    # Every line but the authorizer's (about requests) is about the one task. (Not told apart by
    # function_name: locally the functions share one logger, and its keys, in one process.)
    about_the_task = [line for line in lines if line["message"] != "authorized"]
    messages = {line["message"] for line in about_the_task}
    assert messages >= {"submitted", "claimed", "completed", "webhook queued", "webhook delivered"}
    strays = [
        line for line in about_the_task if (line.get("task_id"), line.get("tenant_id")) != (task_id, "dev")
    ]
    assert strays == []
    # One X-Ray trace from the submit request to the worker and the webhook
    traced = {
        line["message"]: line.get("trace_id") for line in about_the_task if line["message"] != "claimed"
    }
    traced["claimed"] = next(line.get("trace_id") for line in about_the_task if line["message"] == "claimed")
    [trace] = set(traced.values())
    assert re.fullmatch(r"1-[0-9a-f]{8}-[0-9a-f]{24}", trace), traced
    # The submit request's lines, the authorizer's included, carry API Gateway's request id
    [submitted] = [line for line in lines if line["message"] == "submitted"]
    assert submitted["correlation_id"] == request_id
    assert request_id in {line.get("correlation_id") for line in lines if line["message"] == "authorized"}
    assert marker not in fresh.log.read_text()
