"""What grows with stored data (issue 66; sections progress, listing, queues): the bytes a long
streamed answer writes, a listing page at 100 and many stored tasks, and a receive from a short
and a long queue.
"""

from __future__ import annotations

import statistics
import time

from drive import submit, wait_done
from figures import Report, ms, verdict
from harness import (
    PLAIN_MOCK,
    ROOT,
    moto_session,
    settled_calls,
    stack_as_make_up_starts_it,
    stack_running,
    store_completed_tasks,
)
from llmtasks_local.emulator.launcher import launch
from llmtasks_local.sam.provision import local_name


def progress_writes(report: Report, quick: bool) -> None:
    """Issue 66's figure: what one long streamed answer writes to TasksTable, from its submit to
    its end (the task, its output's chunks and head), against the answer's own size: the items'
    bytes and the write units DynamoDB bills for them, each write counted by the endpoint; and the
    same answer to a prompt as long as it (an update is billed by its item's whole size)."""
    chars, call_s = (20_000, 6) if quick else (100_000, 20)
    section = "progress"
    table = local_name("TasksTable")
    for prompt, label in (
        ("one long answer", "a short prompt"),
        ("x " * (chars // 2), f"a {chars:,}-character prompt"),
    ):
        with stack_running() as stack:
            # Words of 100 characters, the call's time spread over them: the worker's progress
            # writes (every 2 s) each find about a tenth of the answer more.
            stack.configure_mock(
                **{**PLAIN_MOCK, "latency_s": call_s, "reply_chars": chars, "pad_word_chars": 100}
            )
            settled_calls(stack)
            stack.aws_calls(reset=True)
            with stack.client() as client:
                task_id = submit(client, {"prompt": prompt})
                task = wait_done(client, task_id)
            settled_calls(stack)
            writes = stack.aws_writes()
        if task["status"] != "completed" or len(task["result"]) != chars:
            raise RuntimeError(f"the long answer did not complete whole: {task['status']}")
        written, units, items = (writes[what].get(table, 0) for what in ("bytes", "units", "items"))
        if prompt == "one long answer":
            ratio = written / chars
            report.add(
                section,
                f"one {chars:,}-character answer over {call_s} s, {label}: bytes written to TasksTable",
                f"{written / 1000:.0f} KB",
                f"{ratio:.2f}x the answer (target <= 2x): {verdict(ratio <= 2)}",
            )
        else:
            report.add(
                section,
                f"  the same answer to {label}: bytes written to TasksTable",
                f"{written / 1000:.0f} KB",
                f"{written / (2 * chars):.2f}x the answer and the prompt",
            )
        report.add(section, "  items written; write units billed", f"{items}; {units}")
    report.note(
        "progress: the items' sizes after each write (DynamoDB bills an update by the larger of"
        " the item before and after), counted by the local endpoint for every TasksTable write from"
        " the submit to the end: the task's own writes, its output's chunks and their head. The"
        " answer is written twice whatever the design: as the output's chunks (resumable readers)"
        " and as the task's result (one GetItem for GET /tasks/{id})"
    )


def listing_pages(report: Report, quick: bool) -> None:
    """Issue 66's figure: a page of GET /tasks?status=... with 100 tasks stored and with 10,000,
    on one stack (its sandboxes warmed by the first page of each kind, no other task stored), and
    moto's CPU a Query at each size."""
    sizes = (100, 2000) if quick else (100, 10_000)
    pages = 20
    section = "listing"
    with stack_as_make_up_starts_it() as stack, stack.client() as client:
        stored = 0
        timed: dict[tuple[int, str], float] = {}
        query_cpu: dict[int, float] = {}
        for size in sizes:
            store_completed_tasks(stack, size - stored)
            stored = size
            stack.aws_calls(reset=True)
            for status in ("completed", "pending"):
                client.get("/tasks", params={"status": status, "limit": 100}).raise_for_status()  # warm
                took = []
                for _ in range(pages):
                    started = time.perf_counter()
                    reply = client.get("/tasks", params={"status": status, "limit": 100})
                    took.append(time.perf_counter() - started)
                    reply.raise_for_status()
                timed[(size, status)] = statistics.median(took)
            calls, cpu = stack.aws_calls(), stack.aws_cpu_us()
            query_cpu[size] = cpu.get("dynamodb.Query", 0) / max(1, calls.get("dynamodb.Query", 0)) / 1e6
    small, large = sizes
    for status, what in (("completed", "a page of 100 completed"), ("pending", "no pending among them")):
        ratio = timed[(large, status)] / timed[(small, status)]
        report.add(
            section, f"GET /tasks?status={status}, {small} tasks stored: p50", ms(timed[(small, status)])
        )
        report.add(
            section,
            f"  {large:,} stored ({what}): p50",
            ms(timed[(large, status)]),
            f"{ratio:.2f}x (target <= 2x): {verdict(ratio <= 2)}",
        )
    report.add(
        section,
        f"  moto's CPU a Query, {small} and {large:,} stored",
        f"{ms(query_cpu[small])} / {ms(query_cpu[large])}",
    )


def queue_receives(report: Report, quick: bool) -> None:
    """Issue 66's figure: a receive of ten messages and their delete (ReceiveMessage, then
    DeleteMessageBatch) from a queue of 1,000 and of 20,000, against the stack's moto server as
    a worker makes them: a fair queue, one tenant's messages (MessageGroupId). Then the same with
    100 of that tenant's in flight (it is noisy) and a second tenant's ten sent after the rest."""
    sizes = (1000, 5000) if quick else (1000, 20_000)
    rounds = 30
    section = "queues"
    stack = launch("--report", cwd=ROOT)
    try:
        sqs = moto_session().client("sqs", endpoint_url=stack.endpoint)
        for size in sizes:
            timed = {}
            for scenario in ("alone", "in flight"):
                url = sqs.create_queue(QueueName=f"bench-{size}-{scenario.replace(' ', '-')}")["QueueUrl"]
                for start in range(0, size, 10):
                    sqs.send_message_batch(
                        QueueUrl=url,
                        Entries=[
                            {"Id": str(i), "MessageBody": f"task {start + i}", "MessageGroupId": "flood"}
                            for i in range(10)
                        ],
                    )
                if scenario == "in flight":
                    for _ in range(10):
                        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=900)
                    sqs.send_message_batch(
                        QueueUrl=url,
                        Entries=[
                            {"Id": str(i), "MessageBody": "quiet", "MessageGroupId": "quiet"}
                            for i in range(10)
                        ],
                    )
                took = []
                for _ in range(rounds):
                    started = time.perf_counter()
                    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=900)[
                        "Messages"
                    ]
                    sqs.delete_message_batch(
                        QueueUrl=url,
                        Entries=[
                            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
                        ],
                    )
                    took.append(time.perf_counter() - started)
                timed[scenario] = statistics.median(took)
                sqs.delete_queue(QueueUrl=url)
            report.add(section, f"receive 10 and delete them, a queue of {size:,}: p50", ms(timed["alone"]))
            report.add(
                section, "  the same, 100 in flight and a quiet tenant's 10 behind", ms(timed["in flight"])
            )
            if size == sizes[0]:
                base = timed
            else:
                for scenario in ("alone", "in flight"):
                    ratio = timed[scenario] / base[scenario]
                    report.add(
                        section,
                        f"  {size:,} against {sizes[0]:,} ({scenario})",
                        f"{ratio:.2f}x",
                        f"target <= 2x: {verdict(ratio <= 2)}",
                    )
    finally:
        stack.stop()
