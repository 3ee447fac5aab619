"""The stack's CPU account (emulator/cpu_account.py), which the bench sets beside each part's
floor: threads summed by what they do, ended ones kept, and each sandbox's init and handler told
apart from the rest of its process."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from pathlib import Path

import pytest

from llmtasks_local.emulator.cpu_account import ACCOUNT, UNACCOUNTED, CpuAccount, part_of
from llmtasks_local.emulator.runtime import FunctionRuntime
from tests.helpers import toy_function

pytestmark = pytest.mark.unit


def burn(seconds: float) -> None:
    """`seconds` of this thread's CPU, not of a clock."""
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def test_threads_are_parts_by_the_name_they_were_started_with() -> None:
    assert part_of("sqs-WorkerFunction-3") == "SQS pollers"
    assert part_of("stream-BatchFunction") == "stream pollers"
    assert part_of("runtime-api-SubmitFunction-connection") == "Runtime API"
    assert part_of("http-api") == "HTTP API"
    assert part_of("AnyIO worker thread") == "HTTP API invokes"
    assert part_of("Thread-7 (something)") == "other threads"


def test_live_threads_are_read_from_their_clocks_and_ended_ones_as_charged() -> None:
    account = CpuAccount()
    release = threading.Event()

    def poll() -> None:
        burn(0.05)
        release.wait()

    def connection() -> None:
        burn(0.05)
        account.charge_ending()

    live = threading.Thread(target=poll, name="sqs-F-0", daemon=True)
    live.start()
    ended = threading.Thread(target=connection, name="runtime-api-F-connection")
    ended.start()
    ended.join()
    try:
        deadline = time.monotonic() + 30
        while account.read()["stack"].get("SQS pollers", 0) < 0.05 and time.monotonic() < deadline:
            time.sleep(0.01)
        stack = account.read()["stack"]
        assert stack["SQS pollers"] >= 0.05  # the live thread, by its clock
        assert stack["Runtime API"] >= 0.05  # the ended one, as it charged itself
        # Nothing counted twice, nothing spread: the parts and the rest add up to the process.
        assert sum(stack.values()) == pytest.approx(time.process_time(), abs=0.05)
        assert stack[UNACCOUNTED] >= 0
    finally:
        release.set()
        live.join()


def test_a_sandbox_s_init_and_handler_are_told_apart_from_its_process(tmp_path: Path) -> None:
    spec = dataclasses.replace(
        toy_function(
            tmp_path,
            """
            import time

            def burn(seconds):
                started = time.process_time()
                while time.process_time() - started < seconds:
                    pass

            burn(0.2)  # the init: an import's work

            def handler(event, context):
                burn(event["burn"])
                return "done"
            """,
            timeout_s=10,
        ),
        logical_id=f"Cpu{uuid.uuid4().hex[:8]}",  # the account is the test process's, shared
    )
    with FunctionRuntime(spec) as runtime:
        assert runtime.invoke({"burn": 0.1}).payload == "done"
        assert runtime.invoke({"burn": 0.2}).payload == "done"
        live = ACCOUNT.read()["sandboxes"][spec.logical_id]
        assert len(ACCOUNT.read()["live_sandboxes"][spec.logical_id]) == 1
    ended = ACCOUNT.read()["sandboxes"][spec.logical_id]  # the sandbox ended: its figures stay
    assert spec.logical_id not in ACCOUNT.read()["live_sandboxes"]
    for figures in (live, ended):
        assert 0.3 <= figures["handler_s"] < 0.5
        assert 0.2 <= figures["init_s"] < figures["process_s"]
        # /proc counts in ticks of 10 ms: the process took at least its init and handler.
        assert figures["process_s"] >= figures["init_s"] + figures["handler_s"] - 0.02
    assert ended["process_s"] >= live["process_s"]
