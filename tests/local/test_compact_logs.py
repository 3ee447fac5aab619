"""The local stack's compact log view: one line a record, metrics left out, other lines kept."""

from __future__ import annotations

import io
import json
import threading

import pytest

from llmtasks_local.emulator.logs import CompactStdout, compact

pytestmark = pytest.mark.unit

RECORD = {
    "level": "INFO",
    "location": "_run:448",
    "message": "completed",
    "timestamp": "2026-11-30 11:34:22,511+0000",
    "service": "llmtasks",
    "function_name": "WorkerFunction",
    "function_request_id": "6ea2b42e-7f2e-435f-9c78-01db1b86de29",
    "task_id": "a9ee56cbf9e641c4857f0a54336064cb",
    "tenant_id": "dev",
    "total_tokens": 10,
}
METRIC = {"_aws": {"Timestamp": 1, "CloudWatchMetrics": []}, "TasksCompleted": [1.0]}


def test_a_record_is_one_line_with_time_function_request_level_message_and_ids() -> None:
    assert compact(json.dumps(RECORD)) == (
        "11:34:22.511 WorkerFunction     6ea2b42e INFO    completed"
        "  task_id=a9ee56cbf9e641c4857f0a54336064cb  tenant_id=dev"
    )


def test_a_failure_shows_the_last_line_of_its_exception() -> None:
    failed = {**RECORD, "level": "ERROR", "message": "failed", "exception": "Traceback ...\nValueError: bad"}
    assert compact(json.dumps(failed)).endswith(
        "failed  task_id=a9ee56cbf9e641c4857f0a54336064cb  tenant_id=dev  | ValueError: bad"
    )


@pytest.mark.parametrize("line", ["Starting the llmtasks local stack ...", "[1, 2]", '{"other": "json"}'])
def test_lines_that_are_not_log_records_pass_unchanged(line: str) -> None:
    assert compact(line) == line


def test_metric_lines_are_left_out() -> None:
    assert compact(json.dumps(METRIC)) is None


def test_the_stdout_gathers_each_thread_s_line_before_showing_it() -> None:
    target = io.StringIO()
    out = CompactStdout(target)

    def write(task: int) -> None:
        # print() writes a line's text and its newline in two calls
        for _ in range(50):
            out.write(json.dumps({**RECORD, "task_id": f"t{task}"}))
            out.write("\n")
            out.write(json.dumps(METRIC) + "\n")

    threads = [threading.Thread(target=write, args=(task,)) for task in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = target.getvalue().splitlines()
    assert len(lines) == 200
    assert all(line.startswith("11:34:22.511 WorkerFunction") for line in lines)
    assert sorted({line.split("task_id=")[1].split()[0] for line in lines}) == ["t0", "t1", "t2", "t3"]
