"""The fault-injection suite: 300 tasks through the local stack while the LLM, the worker and
SQS misbehave; once the faults stop, every task is accounted for and none was paid twice.

Faults: the mock LLM answers 20% 500s and 10% 429s and hangs on 2% of calls (past the worker's
Timeout); the worker dies in 5% of invocations (at start, after a claim, or before replying)
and 5% of messages are delivered twice; a few poison tasks fail on every delivery until they
are dead-lettered, and are redriven with `llmtasks dlq redrive` once the faults stop.
Timings are compressed through template parameters (Timeout 30 s, visibility 45 s).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmtasks_local.mock_llm import reply_text
from llmtasks_local.sam.provision import local_name
from tests.e2e.conftest import RunningStack, faulty_template, start_stack, still_running
from tests.helpers import eventually, local_client

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.load]

TASKS = 300
POISONED = 3
POISON = "poison-pill"
TERMINAL = ("completed", "failed", "cancelled")
FAULTS = {"crash_rate": 0.05, "duplicate_rate": 0.05, "poison": POISON}
# Calls of 1.5 s: past call_slots.RECHECK_S, so invocations take more messages as calls end.
LLM_FAULTS = {
    "latency_s": 1.5,
    "rate_500": 0.2,
    "rate_429": 0.1,
    "retry_after_s": 1,
    "rate_hang": 0.02,
    "hang_s": 3600,
}


@pytest.fixture(scope="module")
def faulty_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningStack, Path]]:
    directory = tmp_path_factory.mktemp("faults")
    faults_file = directory / "faults.json"
    faults_file.write_text(json.dumps(FAULTS))
    env = {
        "LLMTASKS_FAULTS_FILE": str(faults_file),
        "LEASE_MARGIN_S": "2",
        "RETRY_BASE_DELAY_S": "0.5",
        "RETRY_MAX_DELAY_S": "4",
        # A call's whole time: with WorkerTimeoutSeconds=30 an invocation takes more messages
        # from its queue for its first 10 s, so the faults also meet that path (call_slots.py).
        # 10 s for the mock's 1.5 s: a loaded run's calls went unanswered for 5 s while the mock
        # counted them answered, and their retries paid twice.
        "LLM_TIMEOUT_S": "10",
    }
    # Timeout 30 s: a call gets its whole 10 s when it starts within 10 s of its invocation. At
    # 20 s (5 s of slack), a loaded CI run's calls began with under 12 s of their invocation
    # left and got 1.4-1.9 s for the mock's 1.5 s: the mock answered as the worker gave up, and
    # the retries paid twice (six tasks).
    # Visibility 45 s against that Timeout (AWS advises 6x): a redelivery of the same message
    # takes the task over at once, on the rule that SQS redelivers only once the earlier
    # delivery's invocation is over. Under CI's load one waited 20 s for its sandbox's cold start
    # before it claimed, so with visibility equal to Timeout its redelivery came while it ran.
    # Two deliveries before TaskDLQ (TaskMaxReceiveCount's least; 5 by default): a poison task
    # fails every delivery and waits out the visibility timeout after each, so the suite's time
    # was 5 x 45 s before the DLQ could be redriven (275 s in all); now 2 x 45 s. A task that an
    # injected crash meets on both of its deliveries is dead-lettered too, and redriven with them.
    stack = start_stack(
        "-t",
        str(faulty_template(directory)),
        "--parameter-overrides",
        "WorkerTimeoutSeconds=30 TaskVisibilityTimeoutSeconds=45 TaskMaxReceiveCount=2",
        env=env,
    )
    try:
        yield stack, faults_file
    finally:
        stack.stop()


def story(log: Path, task_id: str, outcomes: list[str]) -> str:
    """What the stack's log says of one task, and the invocations that ended abnormally: a
    failure's message, so that a CI run tells why."""
    lines = log.read_text().splitlines()
    mine = [line for line in lines if task_id in line]
    abnormal = [line for line in lines if "timed out" in line or "Runtime." in line]
    return "\n".join(
        [
            f"{task_id} (calls at the mock: {outcomes}):",
            *mine[-40:],
            "invocations that ended abnormally:",
            *abnormal[-20:],
        ]
    )


def first_call_given_up(log_lines: list[str], task_id: str) -> bool:
    """Whether the worker's first word on the task's LLM call was its own timeout (it never read
    the answer) rather than the answer recorded."""
    for line in log_lines:
        if task_id not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:  # the emulator's own lines are text
            continue
        if not isinstance(entry, dict) or entry.get("task_id") != task_id:
            continue
        if entry.get("message") == "completed":
            return False
        if entry.get("message") == "llm error":
            return entry.get("error_code") == "llm_timeout"
    return False


def read_all(client: httpx.Client, ids: list[str]) -> dict[str, dict[str, Any]]:
    return {task_id: client.get(f"/tasks/{task_id}").json() for task_id in ids}


@pytest.mark.timeout(900)  # about two minutes here; room for a slow machine
def test_every_task_is_accounted_for_after_faults(
    faulty_stack: tuple[RunningStack, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    stack, faults_file = faulty_stack
    stack.configure_mock(**LLM_FAULTS)
    prompts = {f"fault suite task {i}": i for i in range(TASKS)}
    prompts |= {f"fault suite {POISON} {i}": TASKS + i for i in range(POISONED)}
    started = time.monotonic()
    with stack.client() as client:
        ids = {}
        for prompt in prompts:
            reply = client.post("/tasks", json={"prompt": prompt, "max_retries": 4})
            assert reply.status_code == 202, reply.text
            ids[reply.json()["task_id"]] = prompt
        task_ids = list(ids)

        sqs = local_client("sqs", stack.endpoint)
        dlq_url = sqs.get_queue_url(QueueName=local_name("TaskDLQ"))["QueueUrl"]

        def dlq_depth() -> int:
            name = "ApproximateNumberOfMessages"
            attributes = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=[name])["Attributes"]
            return int(attributes[name])

        def in_dlq() -> set[str]:
            listed = stack.cli("dlq", "list", "--queue", "tasks", "--json")
            return {json.loads(line)["task_id"] for line in listed.splitlines()}

        # Under faults, every task reaches an end or TaskDLQ. The poison ones read as
        # dead-lettered (their last delivery's invocation says so). A batch that an injected
        # crash met on both of its deliveries reaches TaskDLQ as SQS moves it, with no invocation
        # left to say so: its tasks still read pending, visible in the DLQ, until a redrive.
        def settled() -> bool:
            # Cheap gates first (a full read of 303 tasks, or a CLI's listing, loads the stack)
            running = still_running(client)
            if running and (dlq_depth() < len(running) or not set(running) <= in_dlq()):
                return False
            views = read_all(client, task_ids)
            waiting = {i for i, t in views.items() if t["status"] not in TERMINAL}
            # A poison task's last delivery failed it after its claim: it reads dead-lettered
            # once that claim's lease lapses, which can come after SQS has moved its message
            # (cc52: every other task had ended, and the read came between the two).
            poisoned_waiting = any(POISON in ids[i] for i in waiting)
            return not waiting or (waiting <= in_dlq() and not poisoned_waiting)

        eventually(settled, bool, timeout_s=600, every_s=2, what="every task settled under faults")
        under_faults = read_all(client, task_ids)
        settled_s = time.monotonic() - started
        dead = sorted(i for i, t in under_faults.items() if t.get("error_code") == "dead_lettered")
        unmarked = sorted(i for i, t in under_faults.items() if t["status"] not in TERMINAL)
        assert {ids[i] for i in dead} >= {p for p in prompts if POISON in p}

        # The faults stop
        faults_file.write_text("{}")
        stack.configure_mock(reset=False, **{knob: 0 for knob in LLM_FAULTS})

        # The dead-lettered messages reach TaskDLQ, and `llmtasks dlq list` shows them
        eventually(
            lambda: in_dlq() >= {*dead, *unmarked},
            bool,
            timeout_s=120,
            every_s=2,
            what="the dead-lettered messages in TaskDLQ",
        )
        listing = stack.cli("dlq", "list")
        for task_id in [*dead, *unmarked]:
            assert task_id in listing
        redrive = stack.cli("dlq", "redrive", "--queue", "tasks")
        # Every message goes back (a task's duplicate delivery may add one); the tasks marked
        # dead-lettered go back to pending, unless a worker claims one from its moved message
        # first (the redrive then leaves it alone: ops/deadletters.py), and the unmarked ones
        # were never anything else
        moved = re.search(r"Redriving (\d+) message\(s\).*; (\d+) task\(s\) back to pending", redrive)
        assert moved, redrive
        assert int(moved.group(1)) >= len(dead) + len(unmarked)
        assert int(moved.group(2)) <= len(dead)
        eventually(
            lambda: all(t["status"] == "completed" for t in read_all(client, [*dead, *unmarked]).values()),
            bool,
            timeout_s=120,
            every_s=2,
            what="the redriven tasks completed",
        )
        final = read_all(client, task_ids)
    stats = stack.mock_stats()
    taken = stack.log.read_text().count("took messages from the queue")
    worker_faults = Counter(faults_file.with_suffix(".log").read_text().splitlines())
    outcomes: dict[str, list[str]] = stats["outcomes_by_prompt"]  # type: ignore[assignment]

    # Accounting
    by_status = Counter(t["status"] for t in final.values())
    failed_codes = Counter(t["error_code"] for t in final.values() if t["status"] == "failed")
    # A first call the worker gave up on before its answer (its timeout, on a loaded machine)
    # reads "gone" at the mock when the mock saw the hang-up, and not when its answer was sent
    # but never read in time: the worker's own log says which; calling again after either is a
    # retry, not a second charge
    log_lines = stack.log.read_text().splitlines()
    first_ok = [i for i, p in ids.items() if (outcomes.get(p) or ["-"])[0] == "ok"]
    double_charged = [
        i for i in first_ok if len(outcomes[ids[i]]) != 1 and not first_call_given_up(log_lines, i)
    ]
    completed_wrong = [
        i for i, t in final.items() if t["status"] == "completed" and t["result"] != reply_text(ids[i])
    ]
    rows = [
        ("tasks submitted", len(final)),
        ("completed", by_status["completed"]),
        ("  of which first LLM call succeeded", sum(final[i]["status"] == "completed" for i in first_ok)),
        ("  of which dead-lettered, then redriven", sum(final[i]["status"] == "completed" for i in dead)),
        ("  of which DLQ'd unmarked, redriven", sum(final[i]["status"] == "completed" for i in unmarked)),
        *((f"failed: {code}", n) for code, n in sorted(failed_codes.items())),
        ("cancelled", by_status["cancelled"]),
        ("pending or processing (stuck)", by_status["pending"] + by_status["processing"]),
        ("lost (404)", sum("status" not in t for t in final.values())),
        ("double-charged (first call ok, then called again)", len(double_charged)),
        ("LLM calls at the mock", stats["calls"]),
        ("  500s / 429s / hangs", f"{stats['errors_500']} / {stats['errors_429']} / {stats['hangs']}"),
        ("  given up by the worker before their answer", sum(o.count("gone") for o in outcomes.values())),
        ("worker invocations", worker_faults["invocation"]),
        ("  receives that took more messages in an invocation", taken),
        *((f"  injected: {kind}", n) for kind, n in sorted(worker_faults.items()) if kind != "invocation"),
        ("settled under faults in", f"{settled_s:.0f} s"),
    ]
    with capsys.disabled():  # the table is the suite's report: shown even when it passes
        print("\nFault suite accounting")
        for label, value in rows:
            print(f"  {label:<52} {value:>8}")

    assert len(final) == TASKS + POISONED
    assert by_status["pending"] == by_status["processing"] == 0
    assert all(t["status"] in TERMINAL for t in final.values())
    assert all(t.get("error_code") for t in final.values() if t["status"] == "failed")
    assert not double_charged, story(stack.log, double_charged[0], outcomes[ids[double_charged[0]]])
    assert not completed_wrong
    # Faults really happened
    assert min(stats["errors_500"], stats["errors_429"], stats["hangs"]) > 0
    for where in ("start", "after_claim", "after_reply"):
        assert worker_faults[f"worker crash {where}"] > 0, where
    assert worker_faults["duplicate delivery"] > 0
    assert taken > 0  # the faults met invocations that refill their slots too
