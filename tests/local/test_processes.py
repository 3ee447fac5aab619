"""The stack's child servers (moto, the mock LLM) serve a socket the stack bound itself: no other
process can take the port between a check and the child's bind, and a child that dies before it
answers is said so, never mistaken for whatever else listens there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest

from llmtasks_local.emulator.moto_server import CALLS_PATH
from llmtasks_local.emulator.processes import (
    RunqueueWait,
    cpu_seconds,
    die_with_parent,
    listen_on,
    spawn_moto_server,
    spawn_python,
    stop,
    thread_waits_s,
)
from llmtasks_local.emulator.sandbox import LEAST_DEFERRAL_S, LambdaDeadline
from llmtasks_local.tool_errors import ServiceDownError, ToolError
from tests.helpers import HANG_S, eventually, local_client, moto_endpoint

pytestmark = pytest.mark.unit


def test_the_port_is_held_from_the_bind_on_so_a_second_claimant_is_refused() -> None:
    listener = listen_on("127.0.0.1", 0, "--moto-port", "the embedded moto server")
    port = listener.getsockname()[1]
    server = spawn_moto_server(listener)
    try:
        with pytest.raises(ToolError, match=f"port {port} is in use by another `llmtasks up`"):
            listen_on("127.0.0.1", port, "--moto-port", "the embedded moto server")
        # What answers there is the child that was handed the socket.
        assert httpx.get(f"http://127.0.0.1:{port}{CALLS_PATH}").status_code == 200
        assert listener.fileno() == -1  # this process's copy is closed: the socket is the child's
    finally:
        stop(server)


def test_a_child_that_exits_before_it_answers_is_an_error_not_a_ready_server() -> None:
    # The listener accepts connections from the bind on: only an answer tells readiness.
    listener = listen_on("127.0.0.1", 0, "--port", "a server")
    with pytest.raises(ServiceDownError, match="exited with 3 before it answered"):
        spawn_python("-c", "import sys; sys.exit(3)", listener=listener, probe_path="/")


def test_a_port_another_program_listens_on_is_refused_with_the_option_that_changes_it() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(ToolError) as refused:
            listen_on("127.0.0.1", port, "--mock-port", "the mock LLM")
    assert refused.value.what == f"port {port} is in use by another program"
    assert "--mock-port" in str(refused.value.fix)


def test_the_mock_llm_serves_a_handed_socket() -> None:
    listener = listen_on("127.0.0.1", 0, "--mock-port", "the mock LLM")
    port = listener.getsockname()[1]
    mock = spawn_python(
        "-m",
        "llmtasks_local.cli",
        "mock-llm",
        "--port",
        str(port),
        listener=listener,
        probe_path="/_mock/stats",
    )
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/_mock/stats").json()["calls"] == 0
    finally:
        stop(mock)


def test_the_preexec_function_imports_and_loads_nothing() -> None:
    # It runs between fork and exec, where an import or a dlopen can wait for good on a lock that
    # another thread of the stack held at the fork (a warm-up's sandbox was left a fork, never
    # exec'd, and the stack never said Ready).
    import builtins
    import ctypes

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("die_with_parent imported or loaded a library")

    imports, loads = builtins.__import__, ctypes.CDLL
    builtins.__import__, ctypes.CDLL = refuse, refuse  # type: ignore[assignment,misc]
    try:
        die_with_parent(0)  # 0: no signal (clears this test process's own setting)
    finally:
        builtins.__import__, ctypes.CDLL = imports, loads  # type: ignore[misc]


def test_a_child_gets_the_signal_when_its_parent_dies() -> None:
    # A parent process spawns a sleeping child with die_with_parent, prints its pid, then is killed.
    script = (
        "import subprocess, sys\n"
        "from llmtasks_local.emulator.processes import die_with_parent\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " preexec_fn=die_with_parent)\n"
        "print(child.pid, flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    eventually(lambda: _gone(child_pid), bool, timeout_s=30, what="the child ended with its parent")


def _gone(pid: int) -> bool:
    """Whether the process has ended (reaped by init, or a zombie waiting to be)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_moto_s_server_keeps_each_connection_for_the_client_s_next_request() -> None:
    """werkzeug closes every connection after its reply (`Connection: close`); the embedded
    endpoint keeps it, with each reply's length exact, so a client's calls share one."""
    with moto_endpoint() as url:
        s3 = local_client("s3", url)
        replies = [
            s3.create_bucket(Bucket="kept"),
            s3.put_object(Bucket="kept", Key="a", Body=b"x" * 1000),
            head := s3.head_object(Bucket="kept", Key="a"),
            got := s3.get_object(Bucket="kept", Key="a"),
            s3.delete_object(Bucket="kept", Key="a"),  # a 204, without a body
            listed := s3.list_objects_v2(Bucket="kept"),
        ]
        assert head["ContentLength"] == 1000  # a HEAD's length is its GET's
        assert got["Body"].read() == b"x" * 1000
        assert listed["KeyCount"] == 0
    said = [reply["ResponseMetadata"]["HTTPHeaders"].get("connection") for reply in replies]
    assert said == [None] * len(replies)


# --- a sandbox's time as Lambda counts it -------------------------------------------------------


def fake_waits(*readings: dict[int, float]) -> RunqueueWait:
    """A process whose threads' runqueue waits read as given, one reading a look."""
    given = iter(readings)
    return RunqueueWait(0, read=lambda _pid: next(given))


def test_a_deadline_moves_on_by_the_time_the_sandbox_waited_for_a_cpu_and_no_further() -> None:
    # Given a deadline already reached on the wall clock, during which the sandbox's threads
    # waited 2 s for a CPU other processes held (one thread has ended since: its wait counts)
    deadline = LambdaDeadline(fake_waits({1: 0.5, 2: 0.0}, {1: 2.5}, {1: 2.5, 3: 0.01}), 0.0)
    # Then it has not passed: it moved on by those 2 s
    assert not deadline.passed()
    assert 1.0 < deadline.left_s() <= 2.0
    # And a deadline whose sandbox waited for no CPU (it slept, or waited on I/O) has passed
    assert LambdaDeadline(fake_waits({1: 0.5}, {1: 0.5}), 0.0).passed()
    # as has one whose waits since it was last looked at are too short to be worth another look
    assert LambdaDeadline(fake_waits({1: 0.5}, {1: 0.5 + LEAST_DEFERRAL_S / 2}), 0.0).passed()


def test_the_runqueue_waits_of_a_process_sharing_its_cpu_are_read() -> None:
    # Given a busy process and a second one on the same CPU
    cpu = min(os.sched_getaffinity(0))
    busy = [
        subprocess.Popen(
            [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
        )
        for _ in range(2)
    ]
    try:
        # When the first has run for a fifth of a second of CPU
        eventually(
            lambda: cpu_seconds(busy[0].pid),
            lambda used: used >= 0.2,
            timeout_s=HANG_S,
            what="a fifth of a second of CPU",
        )
        # Then it was also runnable while the other held the CPU, and that wait is read
        waits = RunqueueWait(busy[0].pid)
        assert waits.total_s() > 0
        assert set(thread_waits_s(busy[0].pid)) == {busy[0].pid}  # one thread: the process's
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert thread_waits_s(busy[0].pid) == {}  # gone: nothing to read
