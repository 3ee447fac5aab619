"""No prompt, result, API key or webhook secret in any log line of the local stack."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.conftest import RunningStack
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
            assert stranger.get(f"/tasks/{task_id}").status_code == 401
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
