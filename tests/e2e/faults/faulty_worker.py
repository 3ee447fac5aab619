"""WorkerFunction with faults injected, for the fault suite: the real handler, wrapped.

The faults are read per invocation from the JSON file named by LLMTASKS_FAULTS_FILE, so the
suite can turn them off while the stack runs:
- crash_rate: share of invocations that die (see crash_number), in turn before any
  record is touched, right after the first claim (before any token is spent), and after every
  record is done (the reply is lost, so the whole batch comes back);
- duplicate_rate: share of first deliveries that SQS delivers twice (a copy is sent);
- poison: prompts containing this text fail their record after the claim, every time.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import random
from pathlib import Path
from typing import Any

from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion, TaskMessage
from llmtasks.llm import OnProgress, provider_from_settings
from llmtasks.settings import LlmSettings, RunnerSettings, TaskLanesQueues, resources, section
from llmtasks.wiring import adapters
from llmtasks.worker.runner import TaskRunner

ROOT = Path(__file__).resolve().parents[3]


def _real_handler() -> Any:
    spec = importlib.util.spec_from_file_location("_real_worker_app", ROOT / "functions/worker/app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lambda_handler


real_handler = _real_handler()
CRASH_POINTS = ("start", "after_claim", "after_reply")
rng = random.Random()


def faults() -> dict[str, Any]:
    path = Path(os.environ["LLMTASKS_FAULTS_FILE"])
    return json.loads(path.read_text()) if path.exists() else {}


def injected(kind: str) -> int:
    """Logs one event beside the faults file, for the suite's accounting; returns how many
    events of this kind there have been, this one included (sandboxes share the count)."""
    with Path(os.environ["LLMTASKS_FAULTS_FILE"]).with_suffix(".log").open("a+") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.write(kind + "\n")
        log.flush()
        log.seek(0)
        return log.read().splitlines().count(kind)


def crash_number(invocation: int, crash_rate: float) -> int | None:
    """Which crash (0, 1, 2, ...) the invocation numbered `invocation` (from 1) is, or None.

    The first three crashes, one at each place, come at invocations 3, 6 and 9; then every
    1/crash_rate-th invocation dies. The suite sees every kind of crash whatever the number of
    invocations the load makes (a loaded run's invocations take more messages each: one CI
    run had 42, and a crash every 20th from the 3rd never reached the third kind), and whatever
    the random draws."""
    if not crash_rate:
        return None
    early = len(CRASH_POINTS) * 3
    if invocation <= early:
        return invocation // 3 - 1 if invocation % 3 == 0 else None
    period = max(round(1 / crash_rate), 1)
    if (invocation - early) % period:
        return None
    return len(CRASH_POINTS) + (invocation - early) // period - 1


class InjectedCrash(SystemExit):
    """Ends the invocation as a dying process would: no record is reported, the batch returns."""


class FaultyLLM:
    def __init__(self, real: Any, *, poison: str | None, crash_on_first_call: bool) -> None:
        self._real = real
        self._poison = poison
        self._crash = crash_on_first_call

    async def complete(
        self,
        request: LLMRequest,
        *,
        timeout_s: float,
        on_progress: OnProgress | None = None,
        tokens: int = 0,
    ) -> Completion:
        if self._crash:
            raise InjectedCrash("injected: the worker died after its claim")
        if self._poison and self._poison in request.prompt:
            raise RuntimeError("injected: a poison task")
        completion: Completion = await self._real.complete(
            request, timeout_s=timeout_s, on_progress=on_progress, tokens=tokens
        )
        return completion


def lambda_handler(event: dict[str, Any], context: Any) -> Any:
    now = faults()
    records = event.get("Records") or []
    sqs, queue_url = adapters.sqs(), resources(TaskLanesQueues).task_queue_url
    for record in records:
        first = record["attributes"].get("ApproximateReceiveCount") == "1"
        if first and rng.random() < now.get("duplicate_rate", 0):
            task_id = TaskMessage.model_validate_json(record["body"]).task_id
            sqs.send_message(QueueUrl=queue_url, MessageBody=TaskMessage(task_id=task_id).model_dump_json())
            injected("duplicate delivery")
    invocation = injected("invocation")
    crash = crash_number(invocation, now.get("crash_rate", 0))
    where = CRASH_POINTS[crash % len(CRASH_POINTS)] if crash is not None else None
    if where:
        injected(f"worker crash {where}")
    if where == "start":
        raise RuntimeError("injected: the worker died on start")
    llm = FaultyLLM(
        provider_from_settings(section(LlmSettings)),
        poison=now.get("poison"),
        crash_on_first_call=where == "after_claim",
    )
    runner = TaskRunner(
        section(RunnerSettings),
        adapters.task_store(),
        adapters.task_lanes(),
        llm,
        results=adapters.result_blobs(),
    )
    reply = real_handler(event, context, runner=runner)
    if where == "after_reply":
        raise RuntimeError("injected: the worker died before it could reply")
    return reply
