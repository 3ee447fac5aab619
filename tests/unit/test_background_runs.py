"""Runs whose model calls go in the provider's background mode, through the worker on moto and
the mock LLM's Responses API over HTTP: the run parks while the provider thinks, a later look
records the answer, a failed look looks again, cancel reaches the provider, and the provider's
signed webhook wakes a parked run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from standardwebhooks import Webhook

from llmtasks.domain.errors import LLMError
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import SubmitTaskRequest, Task, TaskStatus
from llmtasks.llm import BackgroundCall
from llmtasks.llm.openai import OpenAIChat
from llmtasks.settings import Settings
from llmtasks.worker.runner import TaskRunner
from tests.conftest import Aws, RunningMock
from tests.helpers import ToolEndpoint, serve
from tests.unit.test_api import Api, task_service
from tests.unit.test_runs import RunWorker, lookup

pytestmark = pytest.mark.unit

BEDROCK = {"llm_provider": "bedrock", "llm_model": "anthropic.claude-3-5-haiku-20241022-v1:0"}
SECRET = "whsec_" + "c2VjcmV0LWZvci10aGUtcHJvdmlkZXItd2ViaG9vaw=="


class BackgroundWorker(RunWorker):
    """The worker with the provider's background mode: the mock's Responses API."""

    llm: OpenAIChat | None = None

    def runner(self, llm: Any = None, pacer: Any = None, **overrides: Any) -> TaskRunner:
        return super().runner(llm or self.llm, pacer, **overrides)

    def runner_parts(self, llm: Any) -> dict[str, Any]:
        return {"background": llm}

    def submit_background(self, prompt: str, **options: Any) -> str:
        body = SubmitTaskRequest.model_validate({"prompt": prompt, "provider_background": True, **options})
        return self.service.submit("default", body).task.task_id

    def until_ended(self, task_id: str, *, deliveries: int = 40) -> Task:
        """Delivers the run's messages (each look's is delayed) until it ends."""
        for _ in range(deliveries):
            task = self.task(task_id)
            if task.status.is_terminal:
                return task
            self.deliver()
        raise AssertionError(f"the run did not end in {deliveries} deliveries")


@pytest.fixture
def worker(aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock) -> BackgroundWorker:
    overrides = {"retry_base_delay_s": 0.0, "worker_call_slots": 0, "background_first_look_s": 1.0}
    return BackgroundWorker(aws, handler, settings.model_copy(update=overrides), mock_llm)


@pytest.fixture
def endpoint() -> Iterator[tuple[ToolEndpoint, str]]:
    tool = ToolEndpoint()
    with serve(tool.app()) as url:
        yield tool, url + "/tool"


def test_a_background_call_parks_the_run_and_a_later_look_records_its_answer(
    worker: BackgroundWorker, mock_llm: RunningMock
) -> None:
    task_id = worker.submit_background("Think long about it [mock:background-s=2]")

    # The first delivery starts the call at the provider and lets the task go
    worker.deliver()
    parked = worker.task(task_id)
    assert parked.status is TaskStatus.PROCESSING
    assert parked.lease_id is None  # no worker holds it while the provider thinks
    assert parked.provider_call is not None
    assert parked.provider_call.response_id.startswith("resp_")
    assert mock_llm.stats.background_started == 1

    # Later looks find it running, then ended: its answer is the run's one model step
    done = worker.until_ended(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert done.result
    assert mock_llm.stats.background_started == 1  # never started twice
    assert mock_llm.stats.background_polls >= 1
    [step] = worker.service.runs.steps(done, limit=10, cursor=None).steps
    assert step.type == "model_call"
    assert step.usage is not None
    assert done.usage is not None
    assert done.usage.total_tokens == step.usage.total_tokens > 0
    # The step began when the call was started, not when it was found ended
    assert step.started_at.timestamp() == pytest.approx(parked.provider_call.started_at)
    assert done.provider_call is None


def test_a_run_with_tools_takes_each_model_step_in_background(
    worker: BackgroundWorker, mock_llm: RunningMock, endpoint: tuple[ToolEndpoint, str]
) -> None:
    tool, url = endpoint
    task_id = worker.submit_background("Research it [mock:agent-steps=2]", tools=[lookup(url)])
    done = worker.until_ended(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert "tool result 2" in done.result  # the last tool output, read back by the model
    assert len(tool.calls) == 2
    assert mock_llm.stats.background_started == 3  # three model steps, each started once
    kinds = [step.type for step in worker.service.runs.steps(done, limit=10, cursor=None).steps]
    assert kinds == ["model_call", "tool_call", "model_call", "tool_call", "model_call"]


class LookFailsOnce(OpenAIChat):
    """The mock's Responses API, whose first look at a call is lost (the provider away)."""

    failed = 0

    async def poll_background(self, call: BackgroundCall, *, timeout_s: float) -> Completion | None:
        if not self.failed:
            self.failed += 1
            raise LLMError(
                "The LLM could not be reached (ConnectError).", code="llm_unreachable", transient=True
            )
        return await super().poll_background(call, timeout_s=timeout_s)


def test_a_failed_look_looks_again_and_never_starts_the_call_twice(
    worker: BackgroundWorker, mock_llm: RunningMock
) -> None:
    worker.llm = LookFailsOnce(base_url=worker.llm_url, api_key=None, default_model="mock-model")
    task_id = worker.submit_background("Think [mock:background-s=1]")
    done = worker.until_ended(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error
    assert worker.llm.failed == 1
    assert mock_llm.stats.background_started == 1
    assert done.attempts == 1  # the looks, the failed one too, cost the task none of its retries


def test_cancelling_a_parked_run_cancels_the_provider_s_response(
    worker: BackgroundWorker, mock_llm: RunningMock
) -> None:
    task_id = worker.submit_background("Think for a minute [mock:background-s=60]")
    worker.deliver()
    assert worker.task(task_id).provider_call is not None

    cancelled = worker.service.cancel("default", task_id)
    assert cancelled.status is TaskStatus.CANCELLED
    # The cancel's message reaches the worker, which holds the provider's keys
    worker.deliver()
    assert mock_llm.stats.background_cancelled == 1
    after = worker.task(task_id)
    assert after.status is TaskStatus.CANCELLED
    assert after.provider_call is None  # cancelled there once, then forgotten


def signed(event: dict[str, Any], secret: str = SECRET) -> tuple[str, dict[str, str]]:
    payload = json.dumps(event)
    headers = {"webhook-id": event["id"], "webhook-timestamp": str(int(time.time()))}
    headers["webhook-signature"] = Webhook(secret).sign(event["id"], datetime.now(tz=UTC), payload)
    return payload, headers


def completed_event(response_id: str) -> dict[str, Any]:
    return {
        "id": "evt_1",
        "object": "event",
        "created_at": int(time.time()),
        "type": "response.completed",
        "data": {"id": response_id},
    }


def test_the_provider_s_signed_webhook_wakes_a_parked_run_at_once(
    worker: BackgroundWorker, aws: Aws, handler: Any, settings: Settings, mock_llm: RunningMock
) -> None:
    api = Api(aws, handler, task_service(aws, settings.model_copy(update={"openai_webhook_secret": SECRET})))
    worker.settings = worker.settings.model_copy(update={"background_first_look_s": 60.0})
    task_id = worker.submit_background("Think [mock:background-s=0]")
    worker.deliver()
    parked = worker.task(task_id)
    assert parked.provider_call is not None
    assert parked.lease_until is not None
    assert parked.lease_until > time.time()  # its next look is not due yet

    # A forged event is refused, and wakes nothing
    payload, headers = signed(completed_event(parked.provider_call.response_id), secret="whsec_" + "Zm9yZ2Vk")
    refused = api.call("POST", "/provider-webhooks/openai", raw=payload, headers=headers)
    assert refused["statusCode"] == 401

    # The provider's own event wakes it: its lease lapses now and its message is sent undelayed
    payload, headers = signed(completed_event(parked.provider_call.response_id))
    taken = api.call("POST", "/provider-webhooks/openai", raw=payload, headers=headers)
    assert taken["statusCode"] == 200
    assert taken["json"] == {"woken": True}
    woken = worker.task(task_id)
    assert woken.lease_until is not None
    assert woken.lease_until <= time.time()
    # An event for a response no run waits on is taken, and wakes nothing
    payload, headers = signed(completed_event("resp_unknown"))
    assert api.call("POST", "/provider-webhooks/openai", raw=payload, headers=headers)["json"] == {
        "woken": False
    }
    done = worker.until_ended(task_id)
    assert done.status is TaskStatus.COMPLETED, done.error


def test_without_a_secret_the_provider_webhook_route_is_not_served(
    aws: Aws, handler: Any, settings: Settings
) -> None:
    api = Api(aws, handler, task_service(aws, settings))
    payload, headers = signed(completed_event("resp_1"))
    reply = api.call("POST", "/provider-webhooks/openai", raw=payload, headers=headers)
    assert reply["statusCode"] == 404


def test_background_mode_is_refused_where_the_provider_has_none(
    aws: Aws, handler: Any, settings: Settings
) -> None:
    api = Api(aws, handler, task_service(aws, settings.model_copy(update=BEDROCK)))
    reply = api.call("POST", "/tasks", {"prompt": "x", "provider_background": True})
    assert reply["statusCode"] == 422
    assert "Bedrock" in reply["json"]["detail"]
