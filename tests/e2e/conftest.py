"""The local stack as users start it (`llmtasks up`), in a subprocess on free ports."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmtasks_local.emulator.launcher import LaunchedStack, launch
from llmtasks_local.mock_llm import MockConfig
from tests.helpers import HANG_S, ROOT, WebhookReceiver, eventually, serve

RunningStack = LaunchedStack

# A failing test's report shows what its stacks said went wrong: an invocation that failed (the
# gateway's `[Function] error` line, API Gateway's bare 500), a line logged at ERROR, a traceback.
# Their logs are temp files that a CI machine does not keep.
_STACK_TROUBLE = ("Function] ", '"level":"ERROR"', "Traceback", "Error:")
_TROUBLE_LINES = 40


def _stacks_of(values: Any) -> Iterator[RunningStack]:
    for value in values:
        if isinstance(value, LaunchedStack):
            yield value
        elif isinstance(value, tuple):
            yield from _stacks_of(value)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed and isinstance(item, pytest.Function):
        for stack in _stacks_of(item.funcargs.values()):
            with open(stack.log, errors="replace") as log:
                trouble = [line.rstrip()[:600] for line in log if any(m in line for m in _STACK_TROUBLE)]
            if trouble:
                said = "\n".join(trouble[-_TROUBLE_LINES:])
                report.sections.append((f"stack {stack.api}: {stack.log}", said))
    return report


def start_stack(*extra: str, env: dict[str, str] | None = None) -> RunningStack:
    # Revoked keys stop working within a second here (the authorizer cache's TTL: 60 s by
    # default), and no webhook host is ever looked up in DNS: fuzzed URLs must not reach past
    # 127.0.0.1.
    given = {"WEBHOOK_RESOLVE_NAMES": "false", **(env or {})}
    return launch("--parameter-overrides", f"AuthCacheSeconds={AUTH_CACHE_S}", *extra, env=given, cwd=ROOT)


AUTH_CACHE_S = 1


def still_running(client: httpx.Client) -> list[str]:
    """The client's tenant's tasks not yet ended (pending or processing) as the listing shows
    them: a request or two, however many tasks there are, so that a wait on hundreds of tasks
    does not load the stack it waits on with a read of each. A task that moves between the two
    reads can be missed: gate a full read with it, never replace one."""
    running = []
    for status in ("processing", "pending"):
        reply = client.get("/tasks", params={"status": status, "limit": 100})
        assert reply.status_code == 200, reply.text
        running += [task["task_id"] for task in reply.json()["data"]]
    return running


def wait_terminal(client: httpx.Client, task_id: str, timeout_s: float = HANG_S) -> dict[str, Any]:
    """The task once it has ended. Long polls of 5 s: each reply comes well inside the client's
    and the API's 30 s, however slow a loaded machine makes the stack's start and cold starts."""

    def read() -> dict[str, Any]:
        task: dict[str, Any] = client.get(f"/tasks/{task_id}", params={"wait": 5}).json()
        return task

    return eventually(
        read, lambda t: t["status"] in ("completed", "failed", "cancelled"), timeout_s=timeout_s, every_s=0.2
    )


def derived_template(directory: Path, replacements: dict[str, str]) -> Path:
    """template.yaml with some text replaced (each must occur) and code paths made absolute,
    written to `directory`: the same application, rewired for one suite."""
    text = (ROOT / "template.yaml").read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    text = text.replace("CodeUri: functions/", f"CodeUri: {ROOT}/functions/")
    text = text.replace("ContentUri: src/", f"ContentUri: {ROOT}/src/")
    path = directory / "template.yaml"
    path.write_text(text)
    return path


# The worker's timeout and its queue's visibility timeout may be seconds here, not minutes: the
# fault suites compress time (the stack refuses overrides outside a parameter's range).
COMPRESSED_TIME = {
    "MinValue: 30\n    MaxValue: 900\n    Description: WorkerFunction's": "MinValue: 1\n    MaxValue: 900\n"
    "    Description: WorkerFunction's",
    "MinValue: 30\n    MaxValue: 43200\n    Description: TaskQueue's": "MinValue: 1\n    MaxValue: 43200\n"
    "    Description: TaskQueue's",
}


def faulty_template(directory: Path) -> Path:
    """template.yaml with WorkerFunction's code swapped for the fault-injecting wrapper, and
    timeouts that may be set to seconds."""
    worker = "CodeUri: functions/worker/\n      Handler: app.lambda_handler"
    faulty = f"CodeUri: {ROOT}/tests/e2e/faults/\n      Handler: faulty_worker.lambda_handler"
    return derived_template(directory, {worker: faulty, **COMPRESSED_TIME})


@pytest.fixture(scope="session")
def stack() -> Iterator[RunningStack]:
    running = start_stack()
    yield running
    running.stop()


@pytest.fixture
def receiver() -> Iterator[tuple[WebhookReceiver, str]]:
    """A webhook endpoint on 127.0.0.1 that records what it gets; its URL."""
    hook = WebhookReceiver()
    with serve(hook.app()) as url:
        yield hook, url + "/hook"


@pytest.fixture
def fresh_mock(stack: RunningStack) -> Iterator[RunningStack]:
    """The session's stack with the mock's knobs at their defaults and its counters zeroed; the
    knobs go back to their defaults afterwards too, for the tests that use `stack` as it is."""
    # The webhook URL and secret are the stack's wiring (its API verifies them), not knobs.
    defaults = MockConfig().model_dump(exclude={"seed", "webhook_url", "webhook_secret"})
    stack.configure_mock(**defaults)
    yield stack
    stack.configure_mock(**defaults)
