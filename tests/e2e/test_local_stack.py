"""The local stack end to end over HTTP, as a user drives it."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from llmtasks.domain.llm_request import LLMRequest
from llmtasks.ops.deployment import FUNCTIONS
from llmtasks.settings import default_price_table
from llmtasks_local.emulator.moto_server import CALLS_PATH
from llmtasks_local.mock_llm import reply_text
from llmtasks_local.sam.provision import local_name
from llmtasks_local.sam.template import Template
from tests.e2e.conftest import RunningStack, derived_template, start_stack, wait_terminal
from tests.helpers import (
    HANG_S,
    ROOT,
    WebhookReceiver,
    eventually,
    local_client,
    metric_statistics,
    moto_endpoint,
    serve,
)

pytestmark = pytest.mark.e2e


def test_an_idle_connection_outlives_a_client_s_keep_alive(stack: RunningStack) -> None:
    """A client may send on a pooled connection until it has been idle 5 s (httpx, urllib3): the
    API must not close it first, or a request sent as it closes is lost without an answer."""
    connection = http.client.HTTPConnection("127.0.0.1", int(stack.api.rsplit(":", 1)[1]), timeout=HANG_S)
    try:
        connection.request("GET", "/health")
        assert connection.getresponse().read()
        opened = connection.sock
        assert opened is not None
        time.sleep(6)  # idle past the clients' 5 s
        connection.request("GET", "/health")  # on the same socket: RemoteDisconnected had it closed
        assert connection.getresponse().status == 200
        assert connection.sock is opened
    finally:
        connection.close()


def test_a_curl_style_submit_is_polled_to_completion(fresh_mock: RunningStack) -> None:
    with fresh_mock.client() as client:
        # Given the body curl -d sends, with its form content type
        reply = client.post(
            "/tasks",
            content=b'{"prompt":"hello"}',
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        # Then it is accepted at once
        assert reply.status_code == 202, reply.text
        task_id = reply.json()["task_id"]
        assert reply.headers["location"] == f"/tasks/{task_id}"
        # And polling reaches completed with the mock's text
        task = wait_terminal(client, task_id)
    assert task["status"] == "completed"
    assert task["result"] == reply_text("hello")
    assert task["attempts"] == 1


def test_the_endpoint_s_cloudwatch_holds_the_functions_metrics_as_aws_would(fresh_mock: RunningStack) -> None:
    with fresh_mock.client() as client:
        task = wait_terminal(client, client.post("/tasks", json={"prompt": "metered"}).json()["task_id"])
    assert task["status"] == "completed"
    cloudwatch = local_client("cloudwatch", fresh_mock.endpoint)

    def total(namespace: str, name: str, dimensions: dict[str, str]) -> float:
        return metric_statistics(cloudwatch, namespace, name, dimensions)["Sum"]

    # The template's metric alarms are there with their definitions (moto keeps, not evaluates)
    alarms = {
        alarm["AlarmName"]: alarm
        for page in cloudwatch.get_paginator("describe_alarms").paginate()
        for alarm in page["MetricAlarms"]
    }
    template = Template.load(ROOT / "template.yaml")
    assert set(alarms) >= {local_name(name) for name in template.resources("AWS::CloudWatch::Alarm")}
    backlog = alarms[local_name("TaskBacklogAlarm")]
    assert (backlog["Namespace"], backlog["MetricName"], backlog["Threshold"]) == (
        "AWS/SQS",
        "ApproximateAgeOfOldestMessage",
        900.0,
    )
    assert backlog["Dimensions"] == [{"Name": "QueueName", "Value": local_name("TaskQueue")}]
    # The worker's EMF line (namespace llmtasks), and Lambda's own count of each function's runs
    functions = ("SubmitFunction", "WorkerFunction", "StatusFunction")
    eventually(
        lambda: (
            [total("llmtasks", "TasksCompleted", {"service": "llmtasks"})]
            + [total("AWS/Lambda", "Invocations", {"FunctionName": name}) for name in functions]
        ),
        lambda counts: min(counts) >= 1,
        timeout_s=HANG_S,
        every_s=1,
        what="TasksCompleted and the functions' Invocations on the endpoint's CloudWatch",
    )
    # Each function's lines in its log group, as `aws logs tail /aws/lambda/WorkerFunction` reads
    # them: the worker's lines about this task, and Lambda's REPORT line of an invocation
    logs = local_client("logs", fresh_mock.endpoint)

    def worker_lines() -> list[str]:
        # Every event, matched here: moto's filterPattern matching is loose (a task id's pattern
        # also returned START lines)
        pages = logs.get_paginator("filter_log_events").paginate(logGroupName="/aws/lambda/WorkerFunction")
        return [event["message"] for page in pages for event in page["events"]]

    lines = eventually(
        lambda: [line for line in worker_lines() if task["task_id"] in line],
        bool,
        timeout_s=HANG_S,
        what="the worker's lines about the task",
    )
    assert all(json.loads(line)["function_name"] == "WorkerFunction" for line in lines)
    assert any(line.startswith("REPORT RequestId: ") for line in worker_lines())


def test_a_task_with_a_webhook_gets_one_signed_post(fresh_mock: RunningStack) -> None:
    hook = WebhookReceiver()
    with serve(hook.app()) as receiver_url, fresh_mock.client() as client:
        secret = client.get("/webhooks/secret").json()["key"]
        reply = client.post("/tasks", json={"prompt": "notify me", "webhook_url": receiver_url + "/hook"})
        task_id = reply.json()["task_id"]
        [delivery] = hook.wait_for(1)
        time.sleep(1.5)  # room for a duplicate to show up, if there were one
        assert len(hook.deliveries) == 1
        event = Webhook(secret).verify(delivery.body, delivery.headers)
        task = client.get(f"/tasks/{task_id}").json()
    assert event["type"] == "task.completed"
    assert event["data"]["task_id"] == task_id
    assert event["data"]["result"] == reply_text("notify me")
    assert task["webhook"] == {"status": "delivered", "attempts": 1}


def test_ten_slow_calls_overlap_at_the_llm(fresh_mock: RunningStack) -> None:
    # Each call is held at the mock until ten are in flight at once: the overlap is the event the
    # test ends on. A latency long enough to outlast ten submits was not (8 s: under four test
    # processes on two cores the first call ended before the tenth began), nor was a 30 s cap
    # (on one loaded core the tenth call began later). A stack that ran fewer at once gets its
    # calls answered after the cap only a hang reaches, and the count below says how many.
    fresh_mock.configure_mock(hold_until_in_flight=10, hang_s=HANG_S)
    with fresh_mock.client() as client:
        ids = [client.post("/tasks", json={"prompt": f"slow {i}"}).json()["task_id"] for i in range(10)]
        tasks = [wait_terminal(client, task_id) for task_id in ids]
    assert [t["status"] for t in tasks] == ["completed"] * 10
    stats = fresh_mock.mock_stats()
    assert stats["calls"] == 10
    assert stats["max_in_flight"] == 10  # all ten calls were in flight at once at the provider


def test_cancel_and_problem_replies_over_http(fresh_mock: RunningStack) -> None:
    fresh_mock.configure_mock(latency_s=3)
    with fresh_mock.client() as client:
        task_id = client.post("/tasks", json={"prompt": "cancel me"}).json()["task_id"]
        assert client.post(f"/tasks/{task_id}/cancel").json()["status"] == "cancelled"
        again = client.post(f"/tasks/{task_id}/cancel")
        assert again.status_code == 409
        assert again.headers["content-type"] == "application/problem+json"
        assert client.get("/tasks/unknown").status_code == 404
        assert client.post("/tasks", json={"prompt": "x", "bogus": 1}).status_code == 422
        assert client.get("/health").json()["status"] == "ok"
        assert "/tasks" in client.get("/openapi.json").json()["paths"]
        time.sleep(3.5)
        assert client.get(f"/tasks/{task_id}").json()["status"] == "cancelled"


def test_llm_base_url_points_the_stack_at_another_openai_compatible_server() -> None:
    calls: list[dict[str, Any]] = []

    async def chat(request: Request) -> JSONResponse:
        calls.append(json.loads(await request.body()))
        return JSONResponse(
            {
                "model": "other-model",
                "choices": [{"message": {"role": "assistant", "content": "from the other server"}}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6},
            }
        )

    other = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with serve(other) as other_url:
        stack = start_stack(env={"LLM_BASE_URL": other_url + "/v1"})
        try:
            with stack.client() as client:
                task_id = client.post("/tasks", json={"prompt": "who answers?"}).json()["task_id"]
                task = wait_terminal(client, task_id)
        finally:
            # Ctrl-C stops it cleanly: exit code 0, pollers before the endpoint, ports closed.
            assert stack.stop(signal.SIGINT) == 0
            assert "poll failed" not in stack.log.read_text()
    assert (task["status"], task["result"], task["model"]) == (
        "completed",
        "from the other server",
        "other-model",
    )
    assert [c["messages"] for c in calls] == [[{"role": "user", "content": "who answers?"}]]
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", stack.moto_port)) != 0, (
            "the embedded moto server is still running"
        )


def test_endpoint_url_runs_the_stack_on_an_existing_aws_endpoint() -> None:
    # Given an AWS endpoint that the stack did not start (a LocalStack, here another moto server)
    with moto_endpoint() as endpoint:
        stack = start_stack("--endpoint-url", endpoint)
        try:
            with stack.client() as client:
                task_id = client.post("/tasks", json={"prompt": "where am I stored?"}).json()["task_id"]
                task = wait_terminal(client, task_id)
        finally:
            assert stack.stop() == 0
        # Then the task lives on that endpoint, which outlives the stack
        dynamodb = local_client("dynamodb", endpoint)
        item = dynamodb.get_item(TableName=local_name("TasksTable"), Key={"pk": {"S": f"task#{task_id}"}})[
            "Item"
        ]
        assert task["status"] == item["status"]["S"] == "completed"


def test_the_stack_deletes_expired_items_as_dynamodb_ttl_does() -> None:
    stack = start_stack("--ttl-sweep", "0.5")
    try:
        dynamodb = local_client("dynamodb", stack.endpoint)
        table = local_name("TasksTable")
        now = int(time.time())
        for pk, expires_at in (("task#expired", now - 1), ("task#alive", now + 3600)):
            dynamodb.put_item(TableName=table, Item={"pk": {"S": pk}, "expires_at": {"N": str(expires_at)}})

        def present() -> set[str]:
            keys = [{"pk": {"S": "task#expired"}}, {"pk": {"S": "task#alive"}}]
            reply = dynamodb.batch_get_item(RequestItems={table: {"Keys": keys}})
            return {item["pk"]["S"] for item in reply["Responses"][table]}

        eventually(
            present, lambda left: left == {"task#alive"}, timeout_s=HANG_S, what="the expired item deleted"
        )
        # asked of the embedded endpoint's TTL index: no sweep scanned the table
        calls = httpx.get(f"{stack.endpoint}{CALLS_PATH}").json()
        assert [operation for operation in calls if operation.endswith(".Scan")] == []
    finally:
        stack.stop()


def test_a_start_that_loses_its_port_to_another_process_is_tried_again_on_new_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llmtasks_local.emulator import launcher

    # Another process takes the API's port between the probe and the stack's bind
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ports = iter([busy])
    real_free_port = launcher.free_port
    monkeypatch.setattr(launcher, "free_port", lambda: next(ports, None) or real_free_port())
    try:
        stack = start_stack()
    finally:
        taken.close()
    try:
        assert stack.api != f"http://127.0.0.1:{busy}"
        with stack.client() as client:
            assert client.get("/health").status_code == 200
    finally:
        stack.stop()


def test_each_function_runs_in_its_own_environment_and_a_changed_handler_is_reloaded(tmp_path: Path) -> None:
    """StatusFunction sets POWERTOOLS_SERVICE_NAME apart from the others (the stack ran every
    function in one process and refused such a template); its code lives in a folder of its
    own, and a change there is running at the next request, with the stack saying so."""
    code = tmp_path / "status"
    shutil.copytree(ROOT / "functions" / "status", code)
    status = "CodeUri: functions/status/\n      Handler: app.lambda_handler\n"
    status += "      Environment:\n        Variables:\n"
    template = derived_template(
        tmp_path,
        {
            status: status.replace("functions/status/", f"{code}/")
            + "          POWERTOOLS_SERVICE_NAME: status-alone\n"
        },
    )
    stack = start_stack("--template", str(template))
    try:
        with stack.client() as client:
            task_id = client.post("/tasks", json={"prompt": "hello"}).json()["task_id"]
            assert wait_terminal(client, task_id)["status"] == "completed"
            submits = eventually(
                lambda: [r for r in stack_records(stack) if r.get("function_name") == "SubmitFunction"],
                bool,
                timeout_s=HANG_S,
                what="SubmitFunction's log lines",
            )
            assert {record["service"] for record in submits} == {"llmtasks"}

            assert client.get("/health").json()["status"] == "ok"
            with (code / "app.py").open("a") as app:
                app.write(
                    "\nimport os\n_served = lambda_handler\n"
                    "def lambda_handler(event, context):\n"
                    "    reply = _served(event, context)\n"
                    "    service = os.environ['POWERTOOLS_SERVICE_NAME']\n"
                    "    reply.setdefault('headers', {})['x-service'] = service\n"
                    "    return reply\n"
                )
            eventually(
                lambda: "Reloaded StatusFunction" in stack.log.read_text(),
                bool,
                timeout_s=HANG_S,
                what="the stack saying it reloaded StatusFunction",
            )
            # The new code runs, and it sees StatusFunction's own value, not SubmitFunction's.
            assert client.get("/health").headers.get("x-service") == "status-alone"
            assert "Reloaded SubmitFunction" not in stack.log.read_text()  # its code did not change
    finally:
        stack.stop()


def stack_records(stack: RunningStack) -> list[dict[str, Any]]:
    """The JSON log records the stack has printed (the launcher asks for --log-format json)."""
    records = []
    for line in stack.log.read_text().splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def test_warm_containers_eager_starts_every_function_ahead_so_the_first_task_pays_no_cold_start() -> None:
    """SAM CLI's --warm-containers EAGER: a sandbox of each function starts while the stack
    starts, each reported as the cold start it is, and the stack is Ready once they are; the
    first task's invocations then find them and report no Init Duration of their own."""
    stack = start_stack("--warm-containers", "eager", "--report")
    try:
        functions = set(FUNCTIONS)
        # Given every function warmed before Ready
        before_ready = stack.log.read_text().split("Ready.")[0]
        warmed = re.findall(r"^warm container: (\w+) \(Init Duration: [\d.]+ ms\)$", before_ready, re.M)
        assert sorted(warmed) == sorted(functions)
        # When the first task runs
        with stack.client() as client:
            task_id = client.post("/tasks", json={"prompt": "warm"}).json()["task_id"]
            assert wait_terminal(client, task_id)["status"] == "completed"
        # Then none of its invocations was a cold start
        reports = eventually(
            lambda: [
                line for line in stack.log.read_text().splitlines() if line.startswith("REPORT RequestId:")
            ],
            lambda lines: (
                {"SubmitFunction", "WorkerFunction", "StatusFunction"}
                <= {re.search(r"Function: (\w+)", line)[1] for line in lines}
            ),  # type: ignore[index]
            timeout_s=HANG_S,
            what="the first task's REPORT lines",
        )
        assert [line for line in reports if "Init Duration" in line] == []
        # And the warm-up started one sandbox a function, no more
        assert stack.log.read_text().count("warm container:") == len(functions)
    finally:
        stack.stop()


def test_a_task_s_cost_reaches_its_usage_and_a_key_s_budget_refuses_past_it(fresh_mock: RunningStack) -> None:
    # A key whose month's budget fits one task of this shape (the default table's gpt-4o-mini:
    # the prompt a token a byte, and its 16,384 output tokens at most)
    most = default_price_table().most_cost(LLMRequest(prompt="budget e2e 1"), "gpt-4o-mini")
    key = fresh_mock.cli("keys", "create", "--tenant", "spender", "--budget-usd-month", str(most)).strip()
    with fresh_mock.client(key) as client:
        accepted = client.post("/tasks", json={"prompt": "budget e2e 1"})
        assert accepted.status_code == 202, accepted.text
        refused = client.post("/tasks", json={"prompt": "budget e2e 2"})
        assert refused.status_code == 429
        assert refused.json()["type"].endswith("/budget_exhausted")
        assert int(refused.headers["retry-after"]) > 0
        task = wait_terminal(client, accepted.json()["task_id"])
        # The call is priced: the mock's tokens at gpt-4o-mini's prices
        usage = task["usage"]
        expected = (usage["prompt_tokens"] * 0.15 + usage["completion_tokens"] * 0.6) / 1e6
        assert usage["cost_usd"] == pytest.approx(expected, rel=1e-9)
        assert usage["cost_unknown"] is False
        # Settled to its real cost, what is left is less than a task's most cost: still refused
        assert client.post("/tasks", json={"prompt": "budget e2e 3"}).status_code == 429
        report = client.get("/usage", params={"group_by": "model"}).json()
    assert [(r["group"], r["calls"]) for r in report["data"]] == [("gpt-4o-mini", 1)]
    assert report["total"]["cost_usd"] == pytest.approx(usage["cost_usd"], rel=1e-9)
    shown = fresh_mock.run_cli("usage", "--by", "key", "--api-key", key)
    assert shown.returncode == 0, shown.stderr
    key_id = key.split("_")[1]
    assert [line.split()[:2] for line in shown.stdout.splitlines()[1:]] == [[key_id, "1"], ["total", "1"]]
