"""Overhead against the boto3 floor, and scale (sections overhead, scale): the six AWS calls a
task needs made directly, then closed-loop tasks through the stack at one and 16 clients, with
many tasks already stored, and with the template's batching window.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import boto3

from drive import CLIENTS, closed_loop
from figures import Report, ms, percentile, verdict
from harness import stack_cpu, stack_parts, stack_running, store_completed_tasks
from llmtasks_local.emulator.launcher import peak_rss_kib


def boto3_floor(endpoint: str, tasks: int) -> list[float]:
    """Per task: put, send, receive, claim, complete, delete, in sequence on one client."""
    session = boto3.session.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    dynamodb = session.client("dynamodb", endpoint_url=endpoint)
    sqs = session.client("sqs", endpoint_url=endpoint)
    table = f"bench-floor-{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    queue = sqs.create_queue(QueueName=table)["QueueUrl"]
    durations = []
    for i in range(tasks):
        key = {"pk": {"S": f"task#{i}"}}
        started = time.perf_counter()
        dynamodb.put_item(
            TableName=table,
            Item={**key, "status": {"S": "pending"}, "prompt": {"S": f"bench {i}"}},
            ConditionExpression="attribute_not_exists(pk)",
        )
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"task_id": str(i)}))
        message = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"][
            0
        ]
        dynamodb.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET #s = :processing",
            ConditionExpression="#s = :pending",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":processing": {"S": "processing"}, ":pending": {"S": "pending"}},
            ReturnValues="ALL_NEW",
        )
        dynamodb.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET #s = :completed, #r = :result",
            ConditionExpression="#s = :processing",
            ExpressionAttributeNames={"#s": "status", "#r": "result"},
            ExpressionAttributeValues={
                ":completed": {"S": "completed"},
                ":processing": {"S": "processing"},
                ":result": {"S": "answer"},
            },
        )
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
        durations.append(time.perf_counter() - started)
    return durations


def overhead(
    report: Report,
    tasks: int,
    floor_p50: float | None,
    *,
    window_s: int | None = None,
    stored_first: int = 0,
    clients: int = CLIENTS,
) -> float:
    """Closed-loop overhead of `tasks` tasks; `window_s` overrides the worker's batching window
    (the template's default otherwise). With `stored_first`, TasksTable holds that many more
    tasks of the same tenant before the timed ones run: whatever in the path grew with the
    number of stored tasks would show in the timed figures."""
    overrides = (
        () if window_s is None else ("--parameter-overrides", f"WorkerBatchingWindowSeconds={window_s}")
    )
    with stack_running(*overrides) as stack:
        if stored_first:
            store_completed_tasks(stack, stored_first)
        cpu_before = stack_cpu(stack)
        started = time.time()
        done = closed_loop(stack, tasks, clients)
        wall = max(d.completed_at for d in done) - started
        cpu = {name: seconds - cpu_before[name] for name, seconds in stack_cpu(stack).items()}
        parts = stack_parts(stack)
        rss = {name: sum(peak_rss_kib(pid) for pid in pids) for name, pids in parts.items()}
    failed = [d for d in done if d.task["status"] != "completed"]
    if failed:
        reasons = Counter(f"{d.task['status']}/{d.task.get('error_code')}" for d in failed)
        report.note(f"{tasks + stored_first} tasks, window {window_s}: not completed: {dict(reasons)}")
    # The mock answers at once (latency 0), so the LLM's share is its HTTP round trip, counted here.
    per_task = [d.completed_at - d.submitted_at for d in done if d.task["status"] == "completed"]
    window = "default" if window_s is None else f"{window_s} s"
    section = f"{tasks + stored_first}, window {window}" + (f", {clients} client" if clients == 1 else "")
    if stored_first:
        report.note(f"{section}: {tasks} tasks timed with {stored_first} more already stored in TasksTable")
    p50 = percentile(per_task, 0.5)
    ratio = (
        f"{p50 / floor_p50:.2f}x floor (target <= 2x): {verdict(p50 <= 2 * floor_p50)}" if floor_p50 else ""
    )
    report.add(section, "overhead p50 (completed - submitted)", ms(p50), ratio)
    report.add(section, "overhead p95", ms(percentile(per_task, 0.95)))
    report.add(section, "overhead p99", ms(percentile(per_task, 0.99)))
    report.add(section, f"throughput ({clients} clients, closed loop)", f"{tasks / wall:.1f} tasks/s")
    report.add(section, "tasks not completed", str(len(failed)))
    for part, seconds in cpu.items():
        report.add(section, f"CPU per task, {part}", ms(seconds / tasks))
    for part, kib in rss.items():
        label = f"peak RSS, {part}" + (f" ({len(parts[part])}, summed)" if part == "sandboxes" else "")
        report.add(section, label, f"{kib / 1024:.0f} MiB")
    return p50
