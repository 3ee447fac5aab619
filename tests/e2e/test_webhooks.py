"""Webhooks on the local stack, to real receivers on 127.0.0.1: signatures, retries, 410, the
DLQ and its redrive, hanging receivers. The retry schedule is compressed to 0.5 s a step (six
attempts, as by default) and a receiver gets 5 s to answer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from llmtasks_client import verify_webhook
from tests.e2e.conftest import RunningStack, start_stack
from tests.helpers import HANG_S, WebhookReceiver, eventually, serve

pytestmark = pytest.mark.e2e

ATTEMPTS = 6


@pytest.fixture(scope="module")
def hook_stack() -> Iterator[RunningStack]:
    # 5 s to answer: on a loaded machine a delivery to a receiver that answers at once can take
    # over a second, and would count as a failed attempt
    env = {"WEBHOOK_RETRY_SCHEDULE": ",".join(["0.5"] * (ATTEMPTS - 1)), "WEBHOOK_TIMEOUT_S": "5"}
    stack = start_stack(env=env)
    try:
        yield stack
    finally:
        stack.stop()


def submit_with_hook(client: httpx.Client, url: str, prompt: str) -> str:
    reply = client.post("/tasks", json={"prompt": prompt, "webhook_url": url})
    assert reply.status_code == 202, reply.text
    task_id: str = reply.json()["task_id"]
    return task_id


def webhook_of(client: httpx.Client, task_id: str, status: str, timeout_s: float = HANG_S) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        webhook: dict[str, Any] = client.get(f"/tasks/{task_id}").json()["webhook"]
        return webhook

    return eventually(read, lambda webhook: webhook["status"] == status, timeout_s=timeout_s)


def test_the_receiver_verifies_with_the_standardwebhooks_package(
    hook_stack: RunningStack, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    with hook_stack.client() as client:
        secret = client.get("/webhooks/secret").json()["key"]
        task_id = submit_with_hook(client, url, "sign this")
        [delivery] = hook.wait_for(1)
        event = Webhook(secret).verify(delivery.body, delivery.headers)
        assert webhook_of(client, task_id, "delivered") == {"status": "delivered", "attempts": 1}
    assert (event["type"], event["data"]["task_id"], event["data"]["status"]) == (
        "task.completed",
        task_id,
        "completed",
    )
    assert verify_webhook(delivery.body, delivery.headers, secret).data.task_id == task_id


def test_three_500s_then_a_200_is_four_attempts_under_one_webhook_id(
    hook_stack: RunningStack, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    hook.answers = [500, 500, 500]
    with hook_stack.client() as client:
        task_id = submit_with_hook(client, url, "flaky receiver")
        webhook = webhook_of(client, task_id, "delivered")
    assert webhook == {"status": "delivered", "attempts": 4}
    assert len(hook.deliveries) == 4
    assert len({d.headers["webhook-id"] for d in hook.deliveries}) == 1


def test_a_410_stops_after_one_attempt(
    hook_stack: RunningStack, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    hook.answers = [410]
    with hook_stack.client() as client:
        task_id = submit_with_hook(client, url, "gone receiver")
        webhook = webhook_of(client, task_id, "failed")
        time.sleep(1.5)  # room for a retry, were there one
    assert webhook == {"status": "failed", "attempts": 1}
    assert len(hook.deliveries) == 1


def test_a_receiver_that_always_fails_lands_in_the_dlq_and_a_redrive_delivers(
    hook_stack: RunningStack, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    hook.answers = [503] * ATTEMPTS
    with hook_stack.client() as client:
        task_id = submit_with_hook(client, url, "down receiver")
        assert webhook_of(client, task_id, "failed") == {"status": "failed", "attempts": ATTEMPTS}
        listing = hook_stack.cli("dlq", "list", "--queue", "webhooks")
        assert task_id in listing
        # Once the receiver is back, a redrive delivers it, with the same webhook-id
        # (the DLQ may also hold the 410 test's event: this stack is shared by the module)
        assert "Redriving" in hook_stack.cli("dlq", "redrive", "--queue", "webhooks")
        webhook = webhook_of(client, task_id, "delivered")
    assert webhook == {"status": "delivered", "attempts": ATTEMPTS + 1}
    assert len(hook.deliveries) == ATTEMPTS + 1
    assert len({d.headers["webhook-id"] for d in hook.deliveries}) == 1


def test_a_hanging_receiver_is_a_failed_attempt_then_retried(
    hook_stack: RunningStack, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    hook.hang_s = 8  # beyond the 5 s it is given
    with hook_stack.client() as client:
        task_id = submit_with_hook(client, url, "slow receiver")
        hook.wait_for(1)
        hook.hang_s = 0
        webhook = webhook_of(client, task_id, "delivered")
    assert webhook == {"status": "delivered", "attempts": 2}


class HeldReceiver:
    """An endpoint that takes every request and holds it open until released (or until its
    sender gives up on it): a receiver that hangs. Counts the requests it holds at once."""

    def __init__(self) -> None:
        self.held = 0
        self.most_held = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    async def _receive(self, request: Request) -> Response:
        await request.body()
        with self._lock:
            self.held += 1
            self.most_held = max(self.most_held, self.held)
        try:
            # Two things end the hold, one set from the test's thread: polled. A sender that gives
            # up (its 15 s timeout, on a loaded machine) is seen within 10 ms: well before its
            # place, given back through the endpoint, can be taken by another delivery.
            while not self.release.is_set() and not await request.is_disconnected():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        finally:
            with self._lock:
                self.held -= 1
        return Response(status_code=204)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/hook", self._receive, methods=["POST"])])


def test_an_endpoint_that_hangs_holds_its_places_alone_while_another_endpoint_s_events_go_on(
    stack: RunningStack, receiver: tuple[WebhookReceiver, str]
) -> None:
    """The template's WebhookEndpointConcurrency (2): however many events wait for an endpoint
    that hangs, it holds two deliveries; the rest are put off, never dropped, and every other
    endpoint's events are delivered meanwhile."""
    hook, healthy_url = receiver
    hanging = HeldReceiver()
    with serve(hanging.app()) as hanging_base, stack.client() as client:
        hung = [submit_with_hook(client, hanging_base + "/hook", f"hung {i}") for i in range(12)]
        eventually(lambda: hanging.held, lambda held: held >= 2, timeout_s=HANG_S, what="two held deliveries")
        healthy = [submit_with_hook(client, healthy_url, f"healthy {i}") for i in range(3)]
        hook.wait_for(3)
        assert hanging.most_held == 2  # twelve waited for it, two at a time
        for task_id in healthy:
            assert webhook_of(client, task_id, "delivered") == {"status": "delivered", "attempts": 1}
        hanging.release.set()
        # Every event put off is delivered once the endpoint answers
        for task_id in hung:
            webhook_of(client, task_id, "delivered", timeout_s=HANG_S)
    assert hanging.most_held == 2
