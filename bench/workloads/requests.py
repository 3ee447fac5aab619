"""What the whole request costs at submit (section request): a structured-output task and a task
that names a 20 MB document, beside a plain one. Each kind: its submits' latency from one client
(POST /tasks to the 202), then the AWS calls, Lambda time and DynamoDB write units a task costs
end to end, counted as the cost section counts them.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import llmtasks_client
from figures import Report
from harness import ROOT, stack_running
from llmtasks_local.emulator.launcher import LaunchedStack
from llmtasks_local.sam.provision import local_name
from workloads.costs import Cost, measure_cost

sys.path.insert(0, str(ROOT))  # the tests' document maker: one PDF writer in the repository
from tests.documents import pdf_document

LABEL = {
    "type": "json_schema",
    "json_schema": {
        "name": "Label",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {
                "category": {"type": "string", "enum": ["invoice", "contract", "report", "letter"]},
                "summary": {"type": "string"},
            },
            "required": ["category", "summary"],
            "additionalProperties": False,
        },
    },
}
DOCUMENT_BYTES = 20 * 1024 * 1024
LATENCY_SUBMITS = 30
# Each document task moves its 20 MB from S3 through the worker to the mock (27 MB of base64):
# fewer of them, or the one-process mock, not llmtasks, bounds the run.
DOCUMENT_TASKS = 10


def uploaded_document(stack: LaunchedStack) -> str:
    """A 20 MB PDF sent as a user would (the SDK's upload_file: in parts, through /v1/uploads,
    past the API's request limit): its file id."""
    document = pdf_document("This invoice is due in 30 days.", size=DOCUMENT_BYTES)
    with llmtasks_client.Client(stack.api, stack.api_key or "") as client:
        return client.upload_file(document, filename="invoice.pdf", media_type="application/pdf").id


def submit_latency_ms(stack: LaunchedStack, body: Callable[[int], dict[str, Any]], most: int) -> list[float]:
    """POST /tasks to its 202, one submit after the other from one client (LATENCY_SUBMITS, or
    `most` if fewer)."""
    took = []
    with stack.client() as client:
        for i in range(min(LATENCY_SUBMITS, most)):
            started = time.perf_counter()
            client.post("/tasks", json=body(i)).raise_for_status()
            took.append((time.perf_counter() - started) * 1000)
    return took


def request_costs(report: Report, tasks: int) -> None:
    with stack_running() as stack:
        file_id = uploaded_document(stack)
        kinds: dict[str, Callable[[int], dict[str, Any]]] = {
            "plain": lambda i: {"prompt": f"plain {i} {uuid.uuid4().hex}"},
            "structured output": lambda i: {
                "prompt": f"an invoice {i} {uuid.uuid4().hex}",
                "response_format": LABEL,
            },
            "20 MB document": lambda i: {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": f"Classify {i} {uuid.uuid4().hex}"},
                            {"type": "file", "file": {"file_id": file_id}},
                        ],
                    }
                ],
                "response_format": LABEL,
            },
        }
        measured: dict[str, tuple[list[float], Cost]] = {}
        for label, body in kinds.items():
            stack.configure_mock()
            count = DOCUMENT_TASKS if label == "20 MB document" else tasks
            latency = submit_latency_ms(stack, body, count)
            measured[label] = (latency, measure_cost(stack, count, body))
    section = "request"
    plain_latency, plain = measured["plain"]
    for label, (latency, cost) in measured.items():
        p50 = statistics.median(latency)
        ratio = p50 / statistics.median(plain_latency)
        report.add(
            section,
            f"{label}: submit p50 / p95, ms",
            f"{p50:.1f} / {_p95(latency):.1f}",
            f"{ratio:.2f}x plain",
        )
        submit_gb_s = cost.lambda_usage.get("SubmitFunction", (0.0, 0.0))[1]
        worker_gb_s = cost.lambda_usage.get("WorkerFunction", (0.0, 0.0))[1]
        report.add(
            section,
            "  SubmitFunction, WorkerFunction GB-s per task",
            f"{submit_gb_s:.4f}, {worker_gb_s:.4f}",
        )
        units = cost.writes.get("units", {}).get(local_name("TasksTable"), 0.0)
        report.add(
            section, "  AWS calls, TasksTable write units per task", f"{cost.api_calls:.2f}, {units:.2f}"
        )
        usd = sum(cost.per_million(http_requests=1).values())
        plain_usd = sum(plain.per_million(http_requests=1).values())
        report.add(section, "  AWS cost per million tasks", f"${usd:.2f}", f"{usd / plain_usd:.2f}x plain")
    report.note(
        "Submit latency from one client, each submit after the last (the mock answers at once, so"
        " the worker runs beside). The document is uploaded once and named by file_id in each task;"
        " the worker reads it from S3 for each call. AWS cost as the cost section prices it."
    )


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
