"""Batches from files (sections batch_files, batch_output): a file's read and fan-out and the
fan-out function's memory at two sizes, an Uploads API join, and an OpenAI batch's output file
written and downloaded.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from figures import Report, verdict
from harness import PLAIN_MOCK, charged_to_tasks, moto_session, sandbox_functions, stack_running
from llmtasks_local.emulator.launcher import LaunchedStack
from llmtasks_local.emulator.processes import status_kib
from llmtasks_local.sam.provision import local_name

# What one call costs in AWS, for the fan-out's projection: typical in-region latencies, not
# measured here (DynamoDB single-digit ms, SQS and S3 tens of ms).
AWS_CALL_MS = {"dynamodb": 6.0, "sqs": 15.0, "s3": 25.0}


def batch_file_lines(items: int, line_bytes: int) -> bytes:
    pad = "p" * (line_bytes - 60)
    return b"".join(
        json.dumps({"prompt": f"{i:06d} {pad}", "custom_id": f"row-{i}"}).encode() + b"\n"
        for i in range(items)
    )


def queue_drained(stack: LaunchedStack, name: str) -> bool:
    sqs = moto_session().client("sqs", endpoint_url=stack.endpoint)
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    counts = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return counts["ApproximateNumberOfMessages"] == counts["ApproximateNumberOfMessagesNotVisible"] == "0"


@dataclass
class FileBatch:
    bytes: int
    upload_s: float
    read_s: float  # from POST /batches to pending (the file read, its chunks' messages sent)
    fanout_s: float  # from POST /batches to every chunk fanned out (BatchFanoutQueue drained)
    total: int
    peak_rss_kib: int  # the BatchFunction sandboxes' peak resident memory
    calls: dict[str, int]
    tasks_table_units: int  # the write units TasksTable was billed from the submit to the fan-out's end


def file_batch(items: int, line_bytes: int) -> FileBatch:
    """One batch of `items` lines from an uploaded file on a fresh stack, its calls against the
    mock's 300 s calls (the items wait in their queue: only the fan-out works)."""
    data = batch_file_lines(items, line_bytes)
    with stack_running() as stack:
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 300})
        with stack.client() as client:
            upload = client.post("/batches/uploads").json()
            started = time.monotonic()
            httpx.put(upload["upload_url"], content=data, timeout=300).raise_for_status()
            upload_s = time.monotonic() - started
            stack.aws_calls(reset=True)
            started = time.monotonic()
            batch_id = submit_batch_file(client, upload["file_id"])
            while (batch := client.get(f"/batches/{batch_id}").json())["status"] == "validating":
                time.sleep(0.1)
            read_s = time.monotonic() - started
            while not queue_drained(stack, local_name("BatchFanoutQueue")):
                time.sleep(0.25)
            fanout_s = time.monotonic() - started
            calls = stack.aws_calls()
            units = stack.aws_writes()["units"].get(local_name("TasksTable"), 0)
        peaks = [status_kib(pid, "VmHWM") or 0 for pid in sandbox_functions(stack).get("BatchFunction", [])]
    return FileBatch(
        len(data), upload_s, read_s, fanout_s, batch["total"], max(peaks, default=0), calls, units
    )


def submit_batch_file(client: httpx.Client, file_id: str) -> str:
    reply = client.post("/batches", json={"input_file_id": file_id})
    reply.raise_for_status()
    return str(reply.json()["batch_id"])


def projected_fanout_s(calls: dict[str, int], concurrency: int) -> float:
    """The fan-out's time in AWS from the calls it made here: each call at AWS_CALL_MS, the
    chunks spread over BatchFunction's `concurrency` (the fan-out source's MaximumConcurrency)."""
    spent_ms = 0.0
    for operation, count in calls.items():
        service = operation.split(".")[0].lower()
        if charged_to_tasks(operation) and service in AWS_CALL_MS:
            spent_ms += count * AWS_CALL_MS[service]
    return spent_ms / 1000 / concurrency


def batch_files(report: Report, quick: bool) -> None:
    """Issue 45's figures: a batch from a file (2,000 and 20,000 lines of ~2 KB: 4 and 40 MB),
    its read and fan-out, the fan-out function's peak memory at each size, the same file
    downloaded through its presigned redirect, and an Uploads API join of it."""
    section = "batch files"
    sizes = (200, 2000) if quick else (2000, 20000)
    line_bytes = 2000
    runs = {items: file_batch(items, line_bytes) for items in sizes}
    concurrency = 2  # template.yaml: the Fanout source's MaximumConcurrency
    for items, run in runs.items():
        label = f"{items:,} lines, {run.bytes / 1e6:.0f} MB"
        report.add(section, f"{label}: PUT to the presigned URL", f"{run.upload_s:.2f} s")
        report.add(
            section,
            f"  read (validating -> pending), total {run.total:,}",
            f"{run.read_s:.1f} s",
            f"exact: {verdict(run.total == items)}",
        )
        report.add(
            section,
            "  fanned out (every task made and queued)",
            f"{run.fanout_s:.1f} s",
            f"{items / run.fanout_s:.0f} items/s here",
        )
        projected = projected_fanout_s(run.calls, concurrency)
        report.add(
            section,
            "  projected for AWS from its calls",
            f"{projected:.0f} s",
            f"{items / projected:.0f} items/s",
        )
        report.add(
            section,
            "  TasksTable write units an item (made, counted; the 100 calls that run claim theirs)",
            f"{run.tasks_table_units / items:.2f}",
        )
        report.add(section, "  BatchFunction peak RSS", f"{run.peak_rss_kib / 1024:.0f} MiB")
    small, large = (runs[items] for items in sizes)
    growth = large.peak_rss_kib / max(small.peak_rss_kib, 1)
    report.add(
        section, "peak RSS at 10x the file", f"{growth:.2f}x", f"flat (<= 1.2): {verdict(growth <= 1.2)}"
    )
    data = batch_file_lines(sizes[1], line_bytes)
    with stack_running() as stack, stack.client() as client:
        begun = client.post(
            "/v1/uploads",
            json={
                "bytes": len(data),
                "filename": "big.jsonl",
                "mime_type": "application/jsonl",
                "purpose": "batch",
            },
        ).json()
        part_size = 4 * 1024 * 1024
        started = time.monotonic()
        parts = [
            client.post(
                f"/v1/uploads/{begun['id']}/parts", files={"data": ("p", data[i : i + part_size])}
            ).json()["id"]
            for i in range(0, len(data), part_size)
        ]
        parts_s = time.monotonic() - started
        started = time.monotonic()
        joined = client.post(
            f"/v1/uploads/{begun['id']}/complete", json={"part_ids": parts}, timeout=120
        ).json()
        join_s = time.monotonic() - started
        started = time.monotonic()
        content = client.get(f"/v1/files/{joined['file']['id']}/content", follow_redirects=True, timeout=300)
        download_s = time.monotonic() - started
    report.add(section, f"Uploads API: {len(parts)} parts of 4 MiB sent", f"{parts_s:.1f} s")
    report.add(
        section,
        "  complete (the parts joined, in SubmitFunction)",
        f"{join_s:.1f} s",
        "API Gateway's 30 s: " + verdict(join_s < 30),
    )
    report.add(
        section,
        f"{len(data) / 1e6:.0f} MB file downloaded (307 to a presigned GET)",
        f"{download_s:.2f} s",
        f"bytes exact: {verdict(content.content == data)}",
    )
    report.note(
        "batch files: the items' calls wait on a mock answering in 300 s, so only the fan-out works;"
        f" the AWS projection counts each call of the fan-out at {AWS_CALL_MS} ms and spreads them"
        f" over BatchFunction's {concurrency} concurrent fan-out invocations"
    )


@dataclass
class OutputFile:
    lines: int
    run_s: float  # from batches.create to every request ended (finalizing, or completed)
    finalizing_s: float  # from first seen finalizing to completed: its files written
    bytes: int
    download_s: float
    exact: bool  # every custom_id once, each answered
    peak_rss_kib: int


def openai_output_file(items: int, reply_chars: int) -> OutputFile:
    """An OpenAI batch of `items` requests run to its end on a fresh stack (the mock answering at
    once with `reply_chars` characters), its output file written by BatchFunction as it ends,
    then downloaded through the presigned redirect."""
    lines = b"".join(
        json.dumps(
            {
                "custom_id": f"row-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]},
            }
        ).encode()
        + b"\n"
        for i in range(items)
    )
    with stack_running() as stack:
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 0, "reply_chars": reply_chars})
        with stack.client() as client:
            upload = client.post("/batches/uploads").json()
            httpx.put(upload["upload_url"], content=lines, timeout=300).raise_for_status()
            create = {
                "input_file_id": upload["file_id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            }
            started = time.monotonic()
            openai_id = client.post("/v1/batches", json=create).json()["id"]
            finalizing_at = None
            while (batch := client.get(f"/v1/batches/{openai_id}").json())["status"] != "completed":
                if batch["status"] == "finalizing" and finalizing_at is None:
                    finalizing_at = time.monotonic()
                time.sleep(0.25)
            ended_at = time.monotonic()
            started_download = time.monotonic()
            content = client.get(
                f"/v1/files/{batch['output_file_id']}/content", follow_redirects=True, timeout=300
            ).content
            download_s = time.monotonic() - started_download
        peaks = [status_kib(pid, "VmHWM") or 0 for pid in sandbox_functions(stack).get("BatchFunction", [])]
    answered = [json.loads(line) for line in content.splitlines()]
    exact = sorted(line["custom_id"] for line in answered) == sorted(
        f"row-{i}" for i in range(items)
    ) and all(line["response"]["status_code"] == 200 for line in answered)
    run_s = (finalizing_at or ended_at) - started
    return OutputFile(
        items,
        run_s,
        ended_at - (finalizing_at or ended_at),
        len(content),
        download_s,
        exact,
        max(peaks, default=0),
    )


def batch_output(report: Report, quick: bool) -> None:
    """Issue 45's output figure: an OpenAI batch of 20,000 requests run to its end (its answers of
    ~2 KB), its output file written by BatchFunction as it ends, and downloaded."""
    section = "batch output"
    output = openai_output_file(500 if quick else 20000, 2000)
    report.add(
        section,
        f"OpenAI batch of {output.lines:,} requests: run to its last answer",
        f"{output.run_s:.0f} s",
        f"{output.lines / output.run_s:.0f} requests/s",
    )
    report.add(
        section,
        "  finalizing (BatchFunction writes its output file, then it ends)",
        f"{output.finalizing_s:.1f} s",
        f"{output.lines / max(output.finalizing_s, 0.01):.0f} lines/s",
    )
    report.add(
        section,
        f"  its {output.bytes / 1e6:.0f} MB output file downloaded (307 to a presigned GET)",
        f"{output.download_s:.2f} s",
        f"every custom_id once, answered: {verdict(output.exact)}",
    )
    report.add(
        section,
        "  BatchFunction peak RSS (fan-out, counting, the file)",
        f"{output.peak_rss_kib / 1024:.0f} MiB",
    )
    report.note(
        "batch output: the mock answers at once; the run's time is the local stack's (moto) for"
        " as many tasks; finalizing is from the first read that saw it finalizing (reads 0.25 s apart)"
    )
