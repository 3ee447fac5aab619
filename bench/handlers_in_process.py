"""The handlers' floor: SubmitFunction, WorkerFunction and StatusFunction's handlers run in this
process, on the events a burst gives them, against the stack's own endpoint and mock LLM: no
sandbox, no Runtime API, no gateway, no two dozen processes taking turns on the cores.

Run by bench/workloads/cpu_account.py as `python bench/handlers_in_process.py CONFIG`, CONFIG a JSON
object: `endpoint`, `tasks`, `environment` (the three functions' variables together, as the
stack's Lambda API gives them) and `queue_url` (a queue no event source polls, where this
process's submits go and its worker takes them from). Prints a JSON object: each function's CPU
seconds in its handler (the whole process's clock, so the worker's threads count) and the tasks
that covered.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EVENTS = ROOT / "events"
FUNCTIONS = ("SubmitFunction", "WorkerFunction", "StatusFunction")  # what a burst invokes
WARM_UP = 20  # tasks through the handlers before the clock runs: their clients built, their imports done


class Context:
    """What Lambda hands the handler, as much of it as Powertools and the handlers read."""

    function_name = "bench"
    function_version = "$LATEST"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    log_group_name = "/aws/lambda/bench"
    log_stream_name = "bench"

    def __init__(self, timeout_s: float) -> None:
        self.aws_request_id = str(uuid.uuid4())
        self._until = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return int((self._until - time.monotonic()) * 1000)


def handler_of(function: str) -> Any:
    path = ROOT / "functions" / function / "app.py"
    spec = importlib.util.spec_from_file_location(f"bench_{function}_app", path)
    assert spec is not None
    assert spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lambda_handler


def submit_event(i: int) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / "submit_task.json").read_text())
    event["body"] = json.dumps({"prompt": f"floor {i} {uuid.uuid4().hex}"})
    return event


def status_event(task_id: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / "get_task.json").read_text())
    sample = event["pathParameters"]["task_id"]
    event["rawPath"] = event["rawPath"].replace(sample, task_id)
    event["requestContext"]["http"]["path"] = event["rawPath"]
    event["pathParameters"] = {"task_id": task_id}
    event["rawQueryString"], event["queryStringParameters"] = "wait=20", {"wait": "20"}
    return event


class Clock:
    """The process's CPU in each function's handler, once `running`."""

    def __init__(self) -> None:
        self.running = False
        self.cpu_s = dict.fromkeys(FUNCTIONS, 0.0)

    def invoke(self, function: str, handler: Any, event: dict[str, Any], timeout_s: float) -> Any:
        started = time.process_time()
        try:
            return handler(event, Context(timeout_s))
        finally:
            if self.running:
                self.cpu_s[function] += time.process_time() - started


def sqs_event(messages: Sequence[Mapping[str, Any]], queue_arn: str) -> dict[str, Any]:
    """An SQS event source's event of the messages a receive returned."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m["Attributes"],
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": "us-east-1",
            }
            for m in messages
        ]
    }


def main() -> None:
    config = json.loads(sys.argv[1])
    # The handlers write their log lines and metrics to stdout, as in a sandbox (where it is a
    # pipe); here they go to /dev/null, and the figures to what stdout was.
    result_fd = os.dup(1)
    sink = os.open(os.devnull, os.O_WRONLY)
    os.dup2(sink, 1)
    tasks, queue_url = int(config["tasks"]), str(config["queue_url"])
    os.environ.update(config["environment"])
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": config["endpoint"],
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "TASK_QUEUE_URL": queue_url,  # no event source takes these tasks: the worker below does
            # As in a sandbox: the worker keeps its event loop (and its LLM client) from one
            # invocation to the next, and each function builds its parts as its module is imported.
            "LAMBDA_TASK_ROOT": str(ROOT / "functions"),
            "POWERTOOLS_TRACE_DISABLED": "true",  # as the stack sets it: no X-Ray daemon
        }
    )
    import boto3

    sqs = boto3.client("sqs")
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    submit, worker, status = (handler_of(f) for f in ("submit", "worker", "status"))
    clock = Clock()

    def submit_all(count: int) -> list[str]:
        ids = []
        for i in range(count):
            reply = clock.invoke("SubmitFunction", submit, submit_event(i), 30)
            assert reply["statusCode"] == 202, reply
            ids.append(json.loads(reply["body"])["task_id"])
        return ids

    def work_all() -> None:
        while True:
            messages = sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=10, AttributeNames=["All"], WaitTimeSeconds=1
            ).get("Messages", [])
            if not messages:
                return  # the worker took the rest itself (its call slots refill from the queue)
            reply = clock.invoke("WorkerFunction", worker, sqs_event(messages, queue_arn), 900)
            assert not reply["batchItemFailures"], reply
            # What the event source does with the records that succeeded.
            sqs.delete_message_batch(
                QueueUrl=queue_url,
                Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(messages)],
            )

    def read_all(ids: list[str]) -> None:
        for task_id in ids:
            reply = clock.invoke("StatusFunction", status, status_event(task_id), 30)
            assert json.loads(reply["body"])["status"] == "completed", reply

    for running, count in ((False, WARM_UP), (True, tasks)):
        clock.running = running
        ids = submit_all(count)
        work_all()
        read_all(ids)
    with os.fdopen(result_fd, "w") as result:
        print(json.dumps({"cpu_s": clock.cpu_s, "tasks": tasks}), file=result)


if __name__ == "__main__":
    main()
