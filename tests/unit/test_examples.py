"""examples/: the webhook receiver accepts a signed delivery and refuses a tampered one."""

from __future__ import annotations

import importlib.util
import threading
from datetime import UTC, datetime
from http.server import HTTPServer
from typing import Any

import httpx
import pytest

from llmtasks.domain.events import WebhookEvent
from llmtasks.domain.messages import new_webhook_secret
from llmtasks.domain.models import TaskView
from llmtasks.services.webhooks import WebhookSender
from tests.helpers import ROOT

pytestmark = pytest.mark.unit


def load_receiver(secret: str) -> Any:
    spec = importlib.util.spec_from_file_location("webhook_receiver", ROOT / "examples/webhook_receiver.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.SECRET = secret
    return module


def test_the_example_receiver_verifies_deliveries() -> None:
    secret = new_webhook_secret()
    receiver = load_receiver(secret)
    server = HTTPServer(("127.0.0.1", 0), receiver.Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    view = TaskView.model_validate(
        {
            "task_id": "t1",
            "status": "completed",
            "result": "42",
            "attempts": 1,
            "created_at": 0,
            "expires_at": 9,
        }
    )
    body = WebhookEvent(type="task.completed", timestamp=datetime.now(tz=UTC), data=view).model_dump_json()
    headers = WebhookSender.sign([secret], message_id="msg_1", timestamp=datetime.now(tz=UTC), body=body)
    try:
        assert httpx.post(url, content=body, headers=headers).status_code == 204
        assert httpx.post(url, content=body.replace("42", "43"), headers=headers).status_code == 400
    finally:
        server.shutdown()
