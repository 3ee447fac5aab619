"""Output deltas (section streaming): how soon a waiting reader gets a chunk after its write, and
a waiting reader's read units a minute against polling the task.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from drive import TERMINAL, submit
from figures import Report, ms, percentile, verdict
from harness import PLAIN_MOCK, settled_calls, stack_running
from llmtasks_local.emulator.launcher import LaunchedStack


@dataclass
class Following:
    """What one design of waiting reader measured over its tasks."""

    lags_s: list[float]  # each chunk: from its write to the reply that carried it (output readers)
    task_reads: int  # GetItem calls of the readers, less the worker's own
    minutes: float  # reader-minutes of waiting
    batch_gets: int = 0


def follow_output(stack: LaunchedStack, task_id: str, lags: list[float]) -> None:
    after = 0
    with stack.client() as client:
        while True:
            page = client.get(f"/tasks/{task_id}/output", params={"after": after, "wait": 20}).json()
            now = time.time()
            lags += [now - datetime.fromisoformat(c["written_at"]).timestamp() for c in page["chunks"]]
            after = page["after"]
            if page["final"]:
                return


def poll_task(stack: LaunchedStack, task_id: str) -> None:
    with stack.client() as client:
        while client.get(f"/tasks/{task_id}", params={"wait": 20}).json()["status"] not in TERMINAL:
            pass


def waiting_readers(
    stack: LaunchedStack, readers: int, prompt: str, read: Callable[[LaunchedStack, str, list[float]], None]
) -> Following:
    """`readers` tasks submitted at once, each followed by a reader of its own to its end."""
    settled_calls(stack)
    stack.aws_calls(reset=True)
    with stack.client() as client:
        ids = [submit(client, {"prompt": f"{prompt} {i} {uuid.uuid4().hex}"}) for i in range(readers)]
    lags: list[float] = []
    started = time.monotonic()
    threads = [threading.Thread(target=read, args=(stack, task_id, lags)) for task_id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    minutes = readers * (time.monotonic() - started) / 60
    calls = stack.aws_calls()
    # The worker reads each task's output head once, at its first chunk; the rest are readers'.
    return Following(
        lags, calls.get("dynamodb.GetItem", 0) - readers, minutes, calls.get("dynamodb.BatchGetItem", 0)
    )


def streaming(report: Report, quick: bool) -> None:
    """Issue 42's figures: how soon a reader waiting on GET /tasks/{id}/output gets a chunk after
    it is written, and what a waiting reader costs in DynamoDB read units a minute, against
    polling the task with GET /tasks/{id}?wait= (same stack, same tasks' shape, same run)."""
    # Ten at once: more streams and their readers on two cores measure the machine (each
    # stream's progress writes fall behind), not the stack.
    readers, call_s = (5, 12) if quick else (10, 40)
    prompt = "p" * 6000  # a long prompt: the task item a ?wait= poll reads is its size
    with stack_running() as stack:
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": call_s, "reply_chars": 4000})
        chunks = waiting_readers(stack, readers, prompt, follow_output)
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": call_s, "reply_chars": 4000})
        polls = waiting_readers(stack, readers, prompt, lambda st, task_id, _lags: poll_task(st, task_id))
    section = "streaming"
    lags = sorted(chunks.lags_s)
    p95 = percentile(lags, 0.95)
    report.add(
        section,
        f"a chunk's write to a waiting reader's reply, p50 ({len(lags)} chunks, {readers} readers)",
        ms(percentile(lags, 0.5)),
    )
    report.add(section, "  p95", ms(p95), f"target < 500 ms: {verdict(p95 < 0.5)}")
    # Read units: a head read is eventually consistent and under 4 KB (half a unit); a task read
    # is consistent, a unit per 4 KB of the item (the 6 KB prompt, up to 4 KB of text: 3 units);
    # a chunk is read consistently once (a unit). Of the output readers' GetItems, three per task
    # read the task itself (at its first read while pending, and twice at its end).
    task_units = math.ceil((len(prompt) + 4000 + 1000) / 4096)
    task_reads = 3 * readers
    output_units = (chunks.task_reads - task_reads) * 0.5 + task_reads * task_units + len(lags)
    poll_units = polls.task_reads * task_units
    per_minute = output_units / chunks.minutes
    poll_per_minute = poll_units / polls.minutes
    report.add(
        section, "read units a waiting reader costs a minute: GET /tasks/{id}/output", f"{per_minute:.0f}"
    )
    report.add(
        section,
        "  polling GET /tasks/{id}?wait=20 instead",
        f"{poll_per_minute:.0f}",
        f"ratio {per_minute / poll_per_minute:.2f}",
    )
    report.note(
        f"streaming: {readers} tasks of a {call_s} s streamed call (4,000 characters, written at most"
        f" every 2 s as the mock's pieces come) and a 6 KB prompt, each followed by one reader to its"
        f" end; the read units are computed from the GetItem calls counted by the local endpoint"
        f" ({chunks.task_reads} for the output readers, {polls.task_reads} for the pollers) at"
        f" {task_units} units a task read, half a unit a head read, a unit a chunk"
    )
