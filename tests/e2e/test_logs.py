"""No prompt, result, API key, webhook secret or LLM key in any log line of the local stack;
no key or secret in a task, an error, the console or the stats either."""

from __future__ import annotations

import json
import re
import uuid

import httpx
import pytest

from tests.e2e.conftest import RunningStack, start_stack
from tests.e2e.test_local_stack import wait_terminal
from tests.helpers import HANG_S, WebhookReceiver, eventually, serve

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


def test_no_key_or_secret_reaches_a_log_a_task_an_error_or_the_console() -> None:
    # A stack of its own with an LLM key set; the mock, when told to, quotes it back in its errors
    llm_key = f"sk-test-{uuid.uuid4().hex}{uuid.uuid4().hex}"
    stack = start_stack(env={"LLM_API_KEY": llm_key})
    try:
        key = stack.cli("keys", "create", "--tenant", "secrets").strip()
        wrong = f"lt_{uuid.uuid4().hex[:12]}_{uuid.uuid4().hex}"
        hook = WebhookReceiver(answers=[500])  # the first delivery fails, its retry lands
        with serve(hook.app()) as receiver, stack.client(key) as client:
            secret = client.get("/webhooks/secret").json()["key"]
            done = client.post("/tasks", json={"prompt": "fine", "webhook_url": receiver + "/hook"})
            done_id = done.json()["task_id"]
            assert wait_terminal(client, done_id)["status"] == "completed"
            stack.configure_mock(reset=False, rate_500=1.0, echo_key=True)
            failed_id = client.post("/tasks", json={"prompt": "doomed", "max_retries": 0}).json()["task_id"]
            failed = wait_terminal(client, failed_id)
            stack.configure_mock(reset=False, rate_500=0.0, echo_key=False)
            assert "[its API key]" in failed["error"]  # the provider did quote it
            hook.wait_for(2, timeout_s=HANG_S)  # the 500, then the retry
            with stack.client(wrong) as stranger:
                assert stranger.get(f"/tasks/{done_id}").status_code == 403
            reads = [client.get(f"/tasks/{task_id}").text for task_id in (done_id, failed_id)]
            reads.append(client.get("/tasks").text)
        token = {"Authorization": f"Bearer {stack.console.split('token=')[1]}"}
        console = [
            httpx.get(stack.api + path, headers=token).text
            for path in ("/console/api/overview", "/console/api/dlq")
        ]
        stats = stack.cli("stats", "--json")
        assert stack.mock_stats()["calls_with_key"] >= 2  # the key was in use
    finally:
        stack.stop()
    log = stack.log.read_text()
    function_lines = "\n".join(line for line in log.splitlines() if line.startswith("{"))
    # The logs do tell the story
    assert done_id in function_lines
    assert failed_id in function_lines
    places = {
        "the log": log,
        "a task read": "\n".join(reads),
        "the console": "\n".join(console),
        "stats": stats,
    }
    secrets = {
        "the API key": key,
        "its secret part": key.split("_", 2)[2],
        "a refused key's secret": wrong.split("_", 2)[2],
        "the webhook secret": secret.removeprefix("whsec_"),
        "the LLM key": llm_key,
        "the LLM key's body": llm_key.removeprefix("sk-test-"),
    }
    for place, text in places.items():
        for what, value in secrets.items():
            assert value not in text, f"{place} carries {what}"
    assert stack.api_key is not None
    assert stack.api_key not in function_lines  # the dev key: printed once by `up`, never logged


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
            # The delivery's own lines, written once the receiver has answered
            eventually(
                fresh.log.read_text,
                lambda log: '"webhook delivered"' in log,
                timeout_s=HANG_S,
                what="the delivery's log line",
            )
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
