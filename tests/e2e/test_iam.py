"""Least privilege, checked: each function's IAM policy in template.yaml allows every AWS call the
function makes, and every action it allows is one the function calls.

A stack records each function's calls as IAM authorizes them (`llmtasks up --record-aws-calls`:
function, action, resource ARN) while a workload touches every route and path: tasks with
webhooks, a listing, a cancel, batches, the OpenAI surface, a key at its limits. Each call must
match an Allow statement of that function's policy (action and resource, with IAM's wildcards);
each allowed action must have been called, or be listed in UNEXERCISED with the path that uses it.
The event sources' own calls (SQS receives and deletes, stream reads: SAM adds their permissions)
are the stack's, not the functions', and are not recorded.
"""

from __future__ import annotations

import fnmatch
import io
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from llmtasks_local.sam.provision import provision
from llmtasks_local.sam.template import Template
from tests.documents import pdf_document
from tests.e2e.conftest import ROOT, RunningStack, start_stack
from tests.e2e.test_local_stack import wait_terminal
from tests.helpers import HANG_S, WebhookReceiver, eventually, serve

pytestmark = pytest.mark.e2e

# Allowed, not called by this workload: (function, action, the resource's name or "*") -> the
# path that calls it.
UNEXERCISED: dict[tuple[str, str, str], str] = {
    ("SubmitFunction", "dynamodb:DeleteItem", "llmtasks-local-IdempotencyTable"): (
        "Powertools deletes the Idempotency-Key record of a request that failed"
    ),
    ("SubmitFunction", "dynamodb:GetItem", "llmtasks-local-IdempotencyTable"): (
        "Powertools reads a record when its conditional put does not return the one in the way"
    ),
    ("WorkerFunction", "secretsmanager:GetSecretValue", "*"): "the LLM key, with LlmApiKeySecretArn set",
    ("BatchFunction", "secretsmanager:GetSecretValue", "*"): (
        "the LLM key for a provider batch's jobs, with LlmApiKeySecretArn set"
    ),
    ("WorkerFunction", "bedrock:InvokeModel", "*"): "LlmProvider=bedrock",
    ("WorkerFunction", "bedrock:InvokeModelWithResponseStream", "*"): "LlmProvider=bedrock, streamed",
    ("BatchFunction", "bedrock:CreateModelInvocationJob", "*"): "LlmProvider=bedrock, a provider batch",
    (
        "BatchFunction",
        "bedrock:GetModelInvocationJob",
        "*",
    ): "LlmProvider=bedrock, a provider batch's progress",
    (
        "BatchFunction",
        "bedrock:StopModelInvocationJob",
        "*",
    ): "LlmProvider=bedrock, a provider batch cancelled",
    ("BatchFunction", "bedrock:ListModelInvocationJobs", "*"): (
        "LlmProvider=bedrock, a provider batch whose submit crashed before its job id was stored"
    ),
    ("BatchFunction", "iam:PassRole", "*"): "LlmProvider=bedrock, BedrockBatchRole handed to a job",
    (
        "BatchFunction",
        "s3:PutObject",
        "*",
    ): "LlmProvider=bedrock, a provider batch's records (bedrock-batch/)",
    (
        "BatchFunction",
        "s3:GetObject",
        "*",
    ): "LlmProvider=bedrock, a provider batch's answers (bedrock-batch/)",
    ("BatchFunction", "s3:ListBucket", "*"): "LlmProvider=bedrock, a provider batch's output files",
    ("WebhookFunction", "sqs:SendMessage", "llmtasks-local-WebhookDLQ"): "a delivery's last failure",
    ("WorkerFunction", "sqs:ChangeMessageVisibility", "*"): "a message whose lease is held elsewhere",
    ("WorkerFunction", "sqs:DeleteMessage", "*"): (
        "a message an invocation took from its queue itself (worker/call_slots.py): it deletes what"
        " it handled; whether this workload's few tasks meet a refilling invocation is timing"
    ),
    ("BatchFunction", "sqs:ChangeMessageVisibility", "*"): "a fan-out chunk whose batch is not stored yet",
    ("WorkerFunction", "s3:GetObject", "*"): "a run's step text over 100 KB, read back by a later delivery",
    ("BatchFunction", "dynamodb:GetItem", "llmtasks-local-LimitsTable"): (
        "a batch file's items that do not fit its key's max_in_flight once read"
    ),
}
# What the SAM policy template used here expands to (SAM's policy_templates.json).
SAM_POLICY_TEMPLATES = {
    "AWSSecretsManagerGetSecretValuePolicy": lambda arguments: [
        {"Effect": "Allow", "Action": ["secretsmanager:GetSecretValue"], "Resource": [arguments["SecretArn"]]}
    ],
}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def statements(template: Template, stack: RunningStack) -> dict[str, list[dict[str, Any]]]:
    """Each function's Allow statements, resolved against the stack's resources (the policies
    behind the template's conditions included: the unused paths must be allowed too)."""
    endpoint = {
        "endpoint_url": stack.endpoint,
        "region_name": "us-east-1",
        "aws_access_key_id": "local",
        "aws_secret_access_key": "local",
    }
    resources = provision(
        template,
        dynamodb=boto3.client("dynamodb", **endpoint),
        sqs=boto3.client("sqs", **endpoint),
        s3=boto3.client("s3", **endpoint),
    )
    found: dict[str, list[dict[str, Any]]] = {}
    for function, props in template.resources("AWS::Serverless::Function").items():
        policies = [
            branch
            for policy in props.get("Policies") or []
            for branch in (policy["Fn::If"][1:] if "Fn::If" in policy else [policy])
            if branch != {"Ref": "AWS::NoValue"}
        ]
        resolved = template.resolve(policies, resources.refs, resources.attributes)
        found[function] = []
        for policy in resolved:
            if "Statement" in policy:
                found[function] += policy["Statement"]
            else:
                ((name, arguments),) = policy.items()
                found[function] += SAM_POLICY_TEMPLATES[name](arguments)
    return found


def allows(statement: dict[str, Any], action: str, resource: str) -> bool:
    return (
        statement.get("Effect") == "Allow"
        and any(fnmatch.fnmatchcase(action, pattern) for pattern in as_list(statement["Action"]))
        and any(fnmatch.fnmatchcase(resource, pattern) for pattern in as_list(statement["Resource"]))
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningStack, Path]]:
    calls = tmp_path_factory.mktemp("iam") / "calls.jsonl"
    # A cap on a tenant's running calls, so the worker counts them (LimitsTable)
    stack = start_stack("--record-aws-calls", str(calls), "--parameter-overrides", "TenantMaxRunning=50")
    try:
        yield stack, calls
    finally:
        stack.stop()


def hold_a_lapsed_running_place(stack: RunningStack, tenant: str) -> None:
    """The tenant's running-calls item (aws/limits.py RunningCalls) as a crash leaves it: one
    place taken by a task whose lease ended long ago."""
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=stack.endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    dynamodb.put_item(
        TableName="llmtasks-local-LimitsTable",
        Item={"pk": {"S": f"running#{tenant}"}, "t_crashed": {"N": "1"}, "n": {"N": "1"}},
    )


def drive(stack: RunningStack) -> None:
    """A workload that takes every function down each of its usual paths."""
    capped = stack.cli(
        "keys", "create", "--tenant", "iam", "--rps", "50", "--max-in-flight", "2", "--max-running", "1"
    ).strip()
    hook = WebhookReceiver(answers=[500])  # the first delivery fails and is retried
    with serve(hook.app()) as receiver, stack.client() as client, stack.client(capped) as limited:
        client.get("/webhooks/secret")
        client.post("/webhooks/secret/rotate")
        done = client.post("/tasks", json={"prompt": "iam", "webhook_url": receiver + "/hook"}).json()
        wait_terminal(client, done["task_id"])
        # Its delivery log, the event sent again, its URL enabled (a no-op: it never was disabled)
        client.get(f"/tasks/{done['task_id']}/webhook/attempts")
        hook.wait_for(2, timeout_s=HANG_S)  # the first attempt and its retry, before the replay
        client.post(f"/tasks/{done['task_id']}/webhook/replay")
        client.post("/webhooks/endpoints/enable", json={"url": receiver + "/hook"})
        # A tenant that never read its webhook secret: the delivery creates it
        fresh = limited.post("/tasks", json={"prompt": "fresh tenant", "webhook_url": receiver + "/hook"})
        wait_terminal(limited, fresh.json()["task_id"])
        limited.get("/tasks")
        stack.configure_mock(reply_chars=200_000)  # a result too large for the item: S3, read back
        large = client.post("/tasks", json={"prompt": "large", "webhook_url": receiver + "/hook"}).json()
        wait_terminal(client, large["task_id"])
        client.get(f"/tasks/{large['task_id']}")
        stack.configure_mock(reply_chars=0, rate_500=1.0)  # a retry through the queue, then a failure
        failing = client.post("/tasks", json={"prompt": "failing", "max_retries": 1}).json()
        wait_terminal(client, failing["task_id"])
        # 5 s calls: past a second, so an invocation looks at its queue for more (below).
        stack.configure_mock(rate_500=0.0, latency_s=5)
        cancelled = client.post("/tasks", json={"prompt": "cancel me"}).json()
        client.post(f"/tasks/{cancelled['task_id']}/cancel")
        client.get("/tasks", params={"limit": 5})
        # A place held by a sandbox that died mid-call, its lease lapsed: the first capped task's
        # take is refused (the refusal returns who holds the places), clears the lapsed one and takes
        # it. Set up here rather than left to two calls overlapping, which a loaded machine's
        # cold starts can keep apart.
        hold_a_lapsed_running_place(stack, tenant="iam")
        # The third is refused: the ended ones are looked up and released.
        for i in range(3):
            limited.post("/tasks", json={"prompt": f"capped {i}"})
        # A call past a second: its invocation looks at its queue for more (worker/call_slots.py)
        slow = client.post("/tasks", json={"prompt": "a call past a second"}).json()
        wait_terminal(client, slow["task_id"])
        stack.configure_mock(latency_s=0)
        # The lanes: a high-priority task, a low-priority one, a high-priority batch's items
        for priority in ("high", "low"):
            lane = client.post("/tasks", json={"prompt": f"{priority} lane", "priority": priority}).json()
            wait_terminal(client, lane["task_id"])
        urgent_batch = client.post("/batches", json={"items": [{"prompt": "u"}], "priority": "high"}).json()
        eventually(
            lambda: client.get(f"/batches/{urgent_batch['batch_id']}").json()["status"],
            lambda status: status == "completed",
            timeout_s=HANG_S,
            what="the high-priority batch completed",
        )
        # A key with a budget: its submit and its batch's items reserve in LimitsTable
        budgeted = stack.cli("keys", "create", "--tenant", "iam", "--budget-usd-month", "1").strip()
        with stack.client(budgeted) as spending:
            spending.post("/tasks", json={"prompt": "within budget"})
            spending.post("/batches", json={"items": [{"prompt": "budgeted item"}]})
        client.get("/usage", params={"group_by": "model"})
        items = {"items": [{"prompt": "b1"}, {"prompt": "b2"}], "webhook_url": receiver + "/hook"}
        batch = client.post("/batches", json=items, headers={"Idempotency-Key": "iam-batch"}).json()
        client.post("/batches", json=items, headers={"Idempotency-Key": "iam-batch"})  # a replay
        eventually(
            lambda: client.get(f"/batches/{batch['batch_id']}").json()["status"],
            lambda status: status == "completed",
            timeout_s=HANG_S,
            what="the batch completed",
        )
        client.get(f"/batches/{batch['batch_id']}/results")
        other = client.post("/batches", json={"items": [{"prompt": "c"}] * 3}).json()
        client.post(f"/batches/{other['batch_id']}/cancel")
        # The OpenAI surface: a file, a batch from it, a background response
        request = {"method": "POST", "url": "/v1/responses", "body": {"model": "m", "input": "x"}}
        lines = "".join(json.dumps({"custom_id": f"r{i}", **request}) + "\n" for i in range(2))
        upload = client.post(
            "/v1/files", files={"file": ("in.jsonl", io.BytesIO(lines.encode()))}, data={"purpose": "batch"}
        )
        file_id = upload.json()["id"]
        client.get(f"/v1/files/{file_id}")
        client.get(f"/v1/files/{file_id}/content")
        # The same lines sent in a part through the Uploads API: the batch is made of that file
        begun = client.post(
            "/v1/uploads",
            json={
                "bytes": len(lines),
                "filename": "in.jsonl",
                "mime_type": "application/jsonl",
                "purpose": "batch",
            },
        ).json()
        part = client.post(
            f"/v1/uploads/{begun['id']}/parts", files={"data": ("p", io.BytesIO(lines.encode()))}
        )
        joined = client.post(f"/v1/uploads/{begun['id']}/complete", json={"part_ids": [part.json()["id"]]})
        created = {
            "input_file_id": joined.json()["file"]["id"],
            "endpoint": "/v1/responses",
            "completion_window": "24h",
        }
        # Answers over an item's inline limit: BatchFunction reads them from the bucket into the
        # batch's output file as it ends.
        stack.configure_mock(reply_chars=150_000)
        openai_batch = client.post("/v1/batches", json=created).json()
        eventually(
            lambda: client.get(f"/v1/batches/{openai_batch['id']}").json()["status"],
            lambda status: status == "completed",
            timeout_s=HANG_S,
            what="the OpenAI batch completed",
        )
        stack.configure_mock(reply_chars=0)
        # A document for tasks, uploaded in a part (its pages kept with it), and a task naming it:
        # the worker reads it into the call
        document = pdf_document("an invoice", pages=2)
        begun = client.post(
            "/v1/uploads",
            json={
                "bytes": len(document),
                "filename": "a.pdf",
                "mime_type": "application/pdf",
                "purpose": "user_data",
            },
        ).json()
        part = client.post(f"/v1/uploads/{begun['id']}/parts", files={"data": ("p", io.BytesIO(document))})
        joined = client.post(f"/v1/uploads/{begun['id']}/complete", json={"part_ids": [part.json()["id"]]})
        content = [
            {"type": "text", "text": "Which kind?"},
            {"type": "file", "file": {"file_id": joined.json()["file"]["id"]}},
        ]
        reading = client.post("/tasks", json={"messages": [{"role": "user", "content": content}]}).json()
        wait_terminal(client, reading["task_id"])
        # An agent run: it waits for its client's output, then goes on (its steps read together)
        ask = {"type": "function", "name": "ask", "parameters": {"type": "object"}}
        run_body = {"prompt": "a run [mock:agent-steps=1]", "tools": [ask], "max_steps": 2}
        run = client.post("/tasks", json=run_body).json()
        waiting = eventually(
            lambda: client.get(f"/tasks/{run['task_id']}", params={"wait": 5}).json(),
            lambda task: task["status"] == "requires_action",
            timeout_s=HANG_S,
            what="the run waits for its client",
        )
        [asked] = waiting["required_action"]["tool_calls"]
        answer = {"tool_outputs": [{"tool_call_id": asked["id"], "output": "yes"}]}
        client.post(f"/tasks/{run['task_id']}/tool_outputs", json=answer)
        wait_terminal(client, run["task_id"])
        client.get(f"/tasks/{run['task_id']}/steps")
        response = client.post("/v1/responses", json={"model": "m", "input": "hi", "background": True}).json()
        eventually(
            lambda: client.get(f"/v1/responses/{response['id']}").json()["status"],
            lambda status: status == "completed",
            timeout_s=HANG_S,
            what="the response completed",
        )
        hook.wait_for(6, timeout_s=HANG_S)  # the deliveries (the first one's retry and replay too)


def test_each_function_is_allowed_what_it_calls_and_calls_what_it_is_allowed(
    recorded: tuple[RunningStack, Path],
) -> None:
    stack, calls_file = recorded
    drive(stack)
    template = Template.load(ROOT / "template.yaml")
    policies = statements(template, stack)
    calls = [json.loads(line) for line in calls_file.read_text().splitlines()]
    assert {call["function"] for call in calls} == set(policies)  # every function was recorded

    denied = sorted(
        {
            (call["function"], call["action"], call["resource"])
            for call in calls
            if not any(allows(s, call["action"], call["resource"]) for s in policies[call["function"]])
        }
    )
    assert denied == [], "calls the function's policy does not allow"

    used: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for call in calls:
        used[call["function"]].add((call["action"], call["resource"]))
    unused = []
    for function, allowed in policies.items():
        for statement in allowed:
            patterns = as_list(statement["Resource"])
            for action in as_list(statement["Action"]):
                if any(allows(statement, a, r) for a, r in used[function]) and any(
                    fnmatch.fnmatchcase(a, action) and any(fnmatch.fnmatchcase(r, p) for p in patterns)
                    for a, r in used[function]
                ):
                    continue
                name = patterns[0].rsplit(":", 1)[-1].split("/")[-1 if ":table/" not in patterns[0] else 1]
                if (function, action, name) not in UNEXERCISED and (function, action, "*") not in UNEXERCISED:
                    unused.append((function, action, patterns))
    assert unused == [], f"allowed but never called (and not listed in UNEXERCISED): {unused}"
