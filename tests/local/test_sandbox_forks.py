"""Forked sandboxes (sandbox_forks.py) are the sandboxes a spawn makes, minus the imports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import llmtasks_local
from llmtasks_local.emulator import sandbox
from llmtasks_local.emulator.runtime import FunctionRuntime
from llmtasks_local.emulator.sandbox_forks import ForkedProcess, ForkServer, ServerUnusable, common_libraries
from llmtasks_local.emulator.sandbox_main import PRELOAD_LISTS, preload_list
from tests.helpers import HANG_S, eventually, toy_function

pytestmark = pytest.mark.unit

# What a handler can see of the process it runs in.
_INTROSPECTING = """
import os, signal, sys, json, email.message

# Each sandbox's own: its log stream, its Runtime API, its trace, the stack's file for a stop
VARYING = {
    "AWS_LAMBDA_LOG_STREAM_NAME", "AWS_LAMBDA_RUNTIME_API", "_X_AMZN_TRACE_ID", "LLMTASKS_SANDBOX_CUT_FILE"
}
SIGNALS = ("SIGINT", "SIGTERM", "SIGCHLD", "SIGPIPE", "SIGUSR1")

def handler_name(signum):
    handler = signal.getsignal(signum)
    return getattr(handler, "__qualname__", str(handler))

def handler(event, context):
    if event.get("exit") is not None:
        sys.exit(event["exit"])
    if event.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if event.get("raise_at_exit"):
        import atexit
        atexit.register(lambda: print("atexit ran", flush=True))
        raise SystemExit(4)
    environment = {key: value for key, value in os.environ.items() if key not in VARYING}
    return {
        "path": sys.path,
        "argv": sys.argv[1:],
        "cwd": os.getcwd(),
        "environment": environment,
        "flags": list(sys.flags),
        "stdout_unbuffered": sys.stdout.write_through,
        "stdin": os.readlink("/proc/self/fd/0"),
        "stdout_is_stderr": os.path.samestat(os.fstat(1), os.fstat(2)),
        "signals": {name: handler_name(getattr(signal, name)) for name in SIGNALS},
        "threads": len(os.listdir("/proc/self/task")),
    }
"""


@pytest.fixture(autouse=True)
def forks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's own servers, which fork from a site's first sandbox on."""
    monkeypatch.setattr(sandbox, "_fork_servers", sandbox._ForkServers(spawn_first=False))


def test_a_process_spawns_its_first_sandbox_of_a_site_and_forks_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "_fork_servers", sandbox._ForkServers())
    spec = toy_function(tmp_path, "def handler(event, context):\n    return 1\n")
    kinds = []
    with FunctionRuntime(spec) as runtime:
        for _ in range(3):
            assert runtime.invoke(None).payload == 1
            [(idle, _)] = runtime._idle
            kinds.append(type(idle.process))
            runtime.reload()  # the next invocation starts a sandbox
    assert kinds == [subprocess.Popen, ForkedProcess, ForkedProcess]


def _seen(runtime: FunctionRuntime, event: dict[str, Any]) -> tuple[Any, type]:
    invocation = runtime.invoke(event)
    [(started, _)] = runtime._idle if invocation.ok else [(None, None)]
    return invocation, type(started.process) if started else type(None)


def test_a_forked_sandbox_sees_what_a_spawned_one_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = toy_function(tmp_path, _INTROSPECTING)
    with FunctionRuntime(spec) as first:
        first.invoke({})  # leaves the site's list of libraries, for the server to preload
    with FunctionRuntime(spec) as runtime:
        forked, kind = _seen(runtime, {})
    assert kind is ForkedProcess
    monkeypatch.setattr(sandbox, "_CAN_FORK", False)
    with FunctionRuntime(spec) as runtime:
        spawned, kind = _seen(runtime, {})
    assert kind is subprocess.Popen
    assert forked.ok, forked
    assert spawned.ok, spawned
    for seen in forked.payload:  # one at a time: a difference names what differs
        if seen == "environment":
            ours, theirs = forked.payload[seen], spawned.payload[seen]
            assert {k: v for k, v in ours.items() if theirs.get(k) != v} == {}
            assert {k: v for k, v in theirs.items() if ours.get(k) != v} == {}
        assert forked.payload[seen] == spawned.payload[seen], seen
    assert forked.payload["path"][0] == str(spec.code_dir)  # python -m's first entry


@pytest.mark.parametrize(
    ("event", "error"),
    [
        ({"exit": 3}, "Runtime.ExitError: Runtime exited with error: exit status 3"),
        ({"exit": "a message"}, "Runtime.ExitError: Runtime exited with error: exit status 1"),
        ({"kill": True}, "Runtime.ExitError: Runtime exited with error: signal: killed"),
    ],
)
def test_a_forked_sandbox_exits_as_a_spawned_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, event: dict[str, Any], error: str
) -> None:
    spec = toy_function(tmp_path, _INTROSPECTING)
    lines: list[str] = []
    for can_fork in (True, False):
        monkeypatch.setattr(sandbox, "_CAN_FORK", can_fork)
        with FunctionRuntime(spec, on_line=lines.append) as runtime:
            invocation = runtime.invoke(event)
        assert invocation.error == error, (can_fork, invocation)
    if isinstance(event.get("exit"), str):
        assert lines.count("a message") == 2  # printed by each, as the interpreter prints it


def test_a_forked_sandbox_runs_its_exit_handlers(tmp_path: Path) -> None:
    spec = toy_function(tmp_path, _INTROSPECTING)
    lines: list[str] = []
    with FunctionRuntime(spec, on_line=lines.append) as runtime:
        runtime.invoke({})
        invocation = runtime.invoke({"raise_at_exit": True})
    assert invocation.error == "Runtime.ExitError: Runtime exited with error: exit status 4"
    assert "atexit ran" in lines


def test_a_forked_sandbox_ends_with_its_server(tmp_path: Path) -> None:
    spec = toy_function(
        tmp_path, "import time\ndef handler(event, context):\n    time.sleep(event)\n", timeout_s=60
    )
    with FunctionRuntime(spec) as runtime:
        runtime.invoke(0)
        [(idle, _)] = runtime._idle
        assert isinstance(idle.process, ForkedProcess)
        with ThreadPoolExecutor(1) as pool:
            sleeping = pool.submit(runtime.invoke, 30)
            eventually(lambda: runtime._busy, bool, timeout_s=HANG_S, what="the invocation running")
            [server] = [
                s
                for s in sandbox._fork_servers._servers[sandbox.function_site(spec.code_dir, ())[0]]
                if s.alive
            ]
            server.process.kill()
            ended = sleeping.result(timeout=HANG_S)
    assert ended.error == "Runtime.ExitError: Runtime exited with error: signal: killed"


def _site_with(tmp_path: Path, modules: dict[str, str]) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "llmtasks_local").symlink_to(Path(llmtasks_local.__file__).parent)  # as function_site links it
    for name, source in modules.items():
        (site / f"{name}.py").write_text(source)
    return site


def _server(site: Path, environment: dict[str, str], preload: tuple[str, ...]) -> ForkServer:
    return ForkServer(site, {**environment, "PYTHONPATH": str(site)}, preload, lambda start: start(), None)


def test_a_server_serves_only_environments_that_agree_on_what_its_imports_read(tmp_path: Path) -> None:
    site = _site_with(
        tmp_path,
        {
            "reads_at_import": "import os\nMODE = os.environ.get('LIBRARY_MODE')\n"
            "HAS = 'OTHER' in os.environ\n"
        },
    )
    base = {"PATH": os.environ["PATH"], "LIBRARY_MODE": "fast"}
    server = _server(site, base, ("reads_at_import", "no_such_module"))
    try:
        assert server.read_at_import == {"LIBRARY_MODE": "fast", "OTHER": None}
        assert server.preloaded == 1  # the missing module is left to the sandbox that imports it
        assert server.serves({**base, "UNREAD": "anything", "PYTHONPATH": "elsewhere"})
        assert not server.serves({**base, "LIBRARY_MODE": "slow"})
        assert not server.serves({**base, "OTHER": "set"})
        assert not server.serves({**base, "PYTHONHASHSEED": "1"})  # read as the interpreter starts
    finally:
        server.close()
    assert not server.serves(base)


def test_a_server_whose_preload_started_a_thread_forks_nothing(tmp_path: Path) -> None:
    site = _site_with(
        tmp_path,
        {
            "starts_a_thread": "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        },
    )
    with pytest.raises(ServerUnusable):
        _server(site, {"PATH": os.environ["PATH"]}, ("starts_a_thread",))


def test_sandboxes_leave_the_libraries_they_imported_for_the_server(tmp_path: Path) -> None:
    spec = toy_function(
        tmp_path, "import email.message\ndef handler(event, context):\n    import html.parser\n"
    )
    with FunctionRuntime(spec) as runtime:
        runtime.invoke(None)
    site = sandbox.function_site(spec.code_dir, spec.layer_dirs)[0]
    listed = json.loads(preload_list(site, str(spec.code_dir)).read_text())["modules"]
    assert "email.message" in listed  # imported at init
    assert "html.parser" in listed  # imported by the first invocation
    assert "app" not in listed  # the function's own code: imported in each sandbox


def test_signals_reach_the_forked_process_through_its_pidfd_and_none_after_its_exit() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    process = ForkedProcess(sleeper.pid, os.pidfd_open(sleeper.pid), None)
    process.terminate()
    assert sleeper.wait(timeout=HANG_S) == -signal.SIGTERM
    process._ended(-signal.SIGTERM, 0.0)
    assert process.wait() == -signal.SIGTERM
    process.kill()  # after its exit: sent nowhere (its pidfd is closed, its pid may be reused)


def test_a_server_preloads_what_every_function_of_the_site_imported(tmp_path: Path) -> None:
    lists = tmp_path / PRELOAD_LISTS
    lists.mkdir()
    gone = tmp_path / "a-deleted-function"
    for name, code_dir, modules in (
        ("a", tmp_path, ["json", "awslambdaric.bootstrap", "email.message", "boto3"]),
        ("b", tmp_path, ["boto3", "json", "html.parser", "awslambdaric.bootstrap"]),
        ("c", gone, ["only.the.gone.one"]),
    ):
        (lists / f"{name}.json").write_text(json.dumps({"code_dir": str(code_dir), "modules": modules}))
    assert common_libraries(lists) == ["json", "boto3"]  # the runtime client: each sandbox's own
    assert common_libraries(tmp_path / "none-yet") == []


def test_a_retired_server_takes_no_start_and_ends_after_its_sandboxes(tmp_path: Path) -> None:
    spec = toy_function(tmp_path, "def handler(event, context):\n    return 1\n")
    with FunctionRuntime(spec) as runtime:
        runtime.invoke(None)
        [(first, _)] = runtime._idle
        site = sandbox.function_site(spec.code_dir, ())[0]
        [retired] = [server for server in sandbox._fork_servers._servers[site] if server.alive]
        retired.retire()
        with pytest.raises(ServerUnusable):
            retired.start({}, tmp_path, [], [])
        assert retired.process.poll() is None  # its sandbox still runs
        runtime.reload()  # the idle sandbox ends; the next invocation starts one
        assert runtime.invoke(None).payload == 1
        [(second, _)] = runtime._idle
        assert isinstance(second.process, ForkedProcess)
        assert second.process.pid != first.process.pid
    assert first.process.wait(timeout=HANG_S) == -signal.SIGTERM  # its exit still reported
    assert retired.process.wait(timeout=HANG_S) == 0


def test_a_server_is_replaced_when_the_functions_common_libraries_change_and_only_then(
    tmp_path: Path,
) -> None:
    spec = toy_function(tmp_path, "import json\ndef handler(event, context):\n    return 1\n")
    site = sandbox.function_site(spec.code_dir, ())[0]
    other = tmp_path / "another-function"
    other.mkdir()

    def server_of_a_new_sandbox() -> ForkServer:
        with FunctionRuntime(spec) as runtime:
            runtime.invoke(None)
        [server] = [server for server in sandbox._fork_servers._servers[site] if server.alive]
        return server

    server_of_a_new_sandbox()  # its first invocation lists what it imported
    first = server_of_a_new_sandbox()
    assert "json" in first.preload
    listed = json.loads(preload_list(site, str(spec.code_dir)).read_text())["modules"]
    other_list = preload_list(site, str(other))
    try:
        # Another function imports more: the common part, and the server, stay.
        other_list.write_text(json.dumps({"code_dir": str(other), "modules": [*listed, "html.parser"]}))
        assert server_of_a_new_sandbox() is first
        # One imports less: the server is retired for one that preloads only what both import.
        fewer = [name for name in listed if name != "json"]
        other_list.write_text(json.dumps({"code_dir": str(other), "modules": fewer}))
        second = server_of_a_new_sandbox()
        assert second is not first
        assert not first.alive
        assert "json" not in second.preload
    finally:
        other_list.unlink(missing_ok=True)  # the site is shared by every toy function
