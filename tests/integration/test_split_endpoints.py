"""`llmtasks up --endpoint-url sqs=URL`: SQS on one endpoint (a LocalStack when
AWS_ENDPOINT_URL_SQS names one, as scripts/localstack-tests sets it; otherwise a second moto
server), every other service on the embedded moto; a task goes through the split stack. The
same with `sqs=localstack`, the endpoint found by LocalStack's conventions (LOCALSTACK_HOST)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llmtasks_local.emulator.launcher import LaunchedStack, launch
from tests.helpers import HANG_S, ROOT, endpoint_or_moto, eventually, local_client

# Integration (the LocalStack suite runs it with SQS there) and end-to-end: each case starts the
# whole stack, so make test-fast (no end-to-end stack) leaves it to make test.
pytestmark = [pytest.mark.integration, pytest.mark.e2e]


@pytest.fixture
def sqs_endpoint() -> Iterator[str]:
    with endpoint_or_moto("AWS_ENDPOINT_URL_SQS") as url:
        yield url


def queue_names(endpoint_url: str) -> set[str]:
    sqs = local_client("sqs", endpoint_url)
    return {url.rsplit("/", 1)[1] for url in sqs.list_queues().get("QueueUrls", [])}


@pytest.mark.parametrize("named", ["by URL", "by LOCALSTACK_HOST"])
def test_a_task_runs_with_sqs_on_its_own_endpoint_and_the_rest_on_moto(sqs_endpoint: str, named: str) -> None:
    env = {"WEBHOOK_RESOLVE_NAMES": "false"}
    given = f"sqs={sqs_endpoint}"
    if named == "by LOCALSTACK_HOST":
        env["LOCALSTACK_HOST"] = sqs_endpoint.removeprefix("http://")
        given = "sqs=localstack"
    stack: LaunchedStack = launch("--endpoint-url", given, env=env, cwd=ROOT)
    try:
        with stack.client() as client:
            task_id = client.post("/tasks", json={"prompt": "split"}).json()["task_id"]
            # Read until it has ended: a loaded machine's cold starts can outlast one long poll
            task = eventually(
                lambda: client.get(f"/tasks/{task_id}", params={"wait": 5}).json(),
                lambda task: task["status"] in ("completed", "failed", "cancelled"),
                timeout_s=HANG_S,
                what="the task ended",
            )
        assert task["status"] == "completed", task
        assert "llmtasks-local-TaskQueue" in queue_names(sqs_endpoint)
        assert queue_names(stack.endpoint) == set()  # the embedded moto holds no queue
        assert f"sqs        {sqs_endpoint}" in stack.log.read_text()
    finally:
        stack.stop()
