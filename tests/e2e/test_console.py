"""The local console (`llmtasks up`, /console) in a real headless Chromium (Debian's chromium and
chromium-driver, driven by Selenium): it lists a completed and a failed task, shows a
dead-lettered one in its DLQ, and its Redrive button brings that one back to completed; a
batch's Retry button runs its failed items again; a run's timeline shows its steps and its wait
for its client.

With LLMTASKS_SCREENSHOT=1 it also writes the docs' picture of it, docs/console.png."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import llmtasks_client
from llmtasks.ops.deployment import FUNCTIONS
from tests.e2e.conftest import RunningStack, faulty_template, start_stack
from tests.e2e.test_local_stack import wait_terminal
from tests.helpers import HANG_S, ROOT, ToolEndpoint, WebhookReceiver, chromium, eventually, serve

pytestmark = pytest.mark.e2e

POISON = "poison-pill"


@pytest.fixture
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path_factory.mktemp("chromium")) as driver:
        yield driver


@pytest.fixture
def console_stack(tmp_path: Path) -> Iterator[tuple[RunningStack, Path]]:
    """A stack whose worker fails the poison prompt on every delivery (until the faults file
    says otherwise), with two deliveries a message and a 15 s visibility timeout, so a poison
    task is dead-lettered within about half a minute. The visibility timeout is over the
    worker's 12 s Timeout, as AWS requires: at 3 s (under it), a loaded run's fine task was still
    running when its message came back, and its third delivery put it in TaskDLQ beside the
    poison one."""
    faults_file = tmp_path / "faults.json"
    faults_file.write_text(json.dumps({"poison": POISON}))
    stack = start_stack(
        "-t",
        str(faulty_template(tmp_path)),
        "--parameter-overrides",
        "WorkerTimeoutSeconds=12 TaskVisibilityTimeoutSeconds=15 TaskMaxReceiveCount=2",
        env={"LLMTASKS_FAULTS_FILE": str(faults_file), "LEASE_MARGIN_S": "1", "DEAD_LETTER_GRACE_S": "1"},
    )
    try:
        yield stack, faults_file
    finally:
        stack.stop()


def shown(
    browser: webdriver.Chrome, find: Callable[[webdriver.Chrome], Any], timeout_s: float = HANG_S
) -> Any:
    """What `find` returns once it returns something truthy; the page redraws every two seconds."""

    def attempt(driver: webdriver.Chrome) -> Any:
        try:
            return find(driver)
        except (StaleElementReferenceException, WebDriverException):
            return None

    return WebDriverWait(browser, timeout_s, poll_frequency=0.25).until(attempt)


def status_in_recent(task_id: str) -> Callable[[webdriver.Chrome], str | None]:
    def read(driver: webdriver.Chrome) -> str | None:
        rows = driver.find_elements(
            By.CSS_SELECTOR, f"#recent tr[data-task-id='{task_id}'] [data-role=status]"
        )
        return rows[0].text if rows else None

    return read


def dead_letter_story(stack: RunningStack, task_id: str) -> str:
    """What TaskDLQ holds and the stack's log lines about the task, for a count that is off."""
    lines = [line for line in stack.log.read_text().splitlines() if task_id in line]
    return "\n".join([stack.cli("dlq", "list", "--queue", "tasks"), *lines[-60:]])


def test_the_console_lists_tasks_shows_a_dead_letter_and_its_redrive_completes_it_and_retries_a_batch(
    console_stack: tuple[RunningStack, Path], browser: webdriver.Chrome
) -> None:
    stack, faults_file = console_stack
    hook = WebhookReceiver(answers=[500])  # the fine task's first delivery fails, its retry lands
    with stack.client() as client, serve(hook.app()) as receiver:
        fine = {"prompt": "a fine prompt", "webhook_url": receiver + "/hook"}
        completed = client.post("/tasks", json=fine).json()["task_id"]
        assert wait_terminal(client, completed)["status"] == "completed"
        stack.configure_mock(rate_500=1.0)
        failed = client.post("/tasks", json={"prompt": "doomed", "max_retries": 0}).json()["task_id"]
        assert wait_terminal(client, failed)["error_code"] == "llm_http_500"
        stack.configure_mock(rate_500=0.0)
        poison = client.post("/tasks", json={"prompt": f"a {POISON}"}).json()["task_id"]
        eventually(
            lambda: client.get(f"/tasks/{poison}").json().get("error_code"),
            lambda code: code == "dead_lettered",
            timeout_s=180,  # two 15 s visibility timeouts and the grace, and cold starts under load
            what="the poison task dead-lettered",
        )
        # The fine task's webhook: its two attempts, as `llmtasks webhooks` lists them, and a
        # replay the receiver gets under the same webhook-id
        hook.wait_for(2)

        def listed() -> list[str]:
            return stack.run_cli("webhooks", "attempts", completed).stdout.splitlines()

        attempts = eventually(
            listed,
            lambda lines: len(lines) == 2 and "delivered" in lines[0],
            timeout_s=HANG_S,
            what="both webhook attempts logged",
        )
        assert tuple(attempts[0].split()[2:4]) == ("scheduled", "200")
        assert tuple(attempts[1].split()[2:4]) == ("scheduled", "500")
        assert "retrying  (receiver answered 500)  next at" in attempts[1]
        assert "task.completed" in stack.run_cli("webhooks", "replay", completed).stdout
        replayed = hook.wait_for(3)[2]
        assert replayed.headers["webhook-id"] == hook.deliveries[0].headers["webhook-id"]
    # The task reads as dead-lettered once its last delivery is past due (plus this stack's 1 s
    # grace); the message moves to TaskDLQ when a poller's next receive finds it, which a loaded
    # machine's pollers can do later than that. The refusals below are checked against the move.
    eventually(
        lambda: stack.cli("dlq", "list", "--queue", "tasks"),
        lambda listed: poison in listed,
        timeout_s=HANG_S,
        every_s=1,
        what="the poison task's message in TaskDLQ",
    )
    faults_file.write_text("{}")  # the worker is fixed: a redrive will now complete it

    # Without its token the console shows no data, and its page says how to open it
    browser.get(stack.api + "/console")
    told = shown(browser, lambda d: d.find_element(By.ID, "updated").text)
    assert "open the console URL `llmtasks up` printed" in told
    assert not browser.find_elements(By.CSS_SELECTOR, "#recent tr[data-task-id]")
    for path in ("/console/api/overview", "/console/api/dlq"):
        assert httpx.get(stack.api + path).status_code == 401
        assert httpx.get(stack.api + path, headers={"Authorization": "Bearer not-it"}).status_code == 401
    assert httpx.post(stack.api + "/console/api/dlq/tasks/redrive").status_code == 401
    assert stack.cli("dlq", "list", "--queue", "tasks").count(poison) == 1  # the refusal redrove nothing
    # With it (the URL `llmtasks up` printed), the page keeps it in a cookie and shows the data
    browser.get(stack.console)
    assert "token" not in browser.current_url  # out of the address bar once kept
    assert shown(browser, status_in_recent(completed)) == "completed"

    # Its timeline lists the webhook's attempts, the replay's too
    def webhook_attempts(driver: webdriver.Chrome) -> list[str] | None:
        found = driver.find_elements(
            By.CSS_SELECTOR, f"#recent tr[data-task-id='{completed}'] [data-role=webhook-attempt]"
        )
        return [attempt.text for attempt in found] if len(found) == 3 else None

    webhook = shown(browser, webhook_attempts)
    assert [line.split()[1] for line in webhook] == ["scheduled", "scheduled", "replay"]
    assert [line.split()[3] for line in webhook] == ["500", "200", "200"]
    assert shown(browser, status_in_recent(failed)) == "failed"
    assert shown(browser, status_in_recent(poison)) == "dead_lettered"
    # Each read finds and reads its elements in one attempt: the page redraws every two seconds,
    # and an element found before a redraw is stale by its read.
    dead = shown(
        browser,
        lambda d: [
            row.text
            for row in d.find_elements(By.CSS_SELECTOR, f"[data-dlq=tasks] tr[data-task-id='{poison}']")
        ],
    )
    assert "failed" in dead[0]  # the DLQ view says what the task reads as now
    cards = shown(
        browser,
        lambda d: {
            card.get_attribute("data-status"): int(card.text.split()[-1])
            for card in d.find_elements(By.CSS_SELECTOR, ".card")
        },
    )
    assert (cards["completed"], cards["failed"], cards["dead_lettered"]) == (1, 1, 1)
    # `llmtasks stats` prints the same numbers in the terminal
    stats = json.loads(stack.cli("stats", "--json"))
    assert stats["tasks"]["by_status"] == cards
    assert stats["queues"]["tasks_dlq"] == 1, dead_letter_story(stack, poison)
    assert "dead_lettered=1" in stack.cli("stats")
    # Nothing waits or runs now: each priority's row says so, and no tenant is listed
    waiting = shown(
        browser,
        lambda d: {
            row.get_attribute("data-priority"): row.text.split()[1:]
            for row in d.find_elements(By.CSS_SELECTOR, "#priorities tr[data-priority]")
        },
    )
    assert waiting == {"high": ["0", "0"], "normal": ["0", "0"], "low": ["0", "0"]}
    assert "nothing waiting or running" in shown(browser, lambda d: d.find_element(By.ID, "tenants").text)
    assert stats["scheduling"]["tenants"] == []
    # Each function's row, from the endpoint's CloudWatch as `llmtasks stats` reads it; the
    # stream consumers with their lag
    functions = shown(
        browser,
        lambda d: {
            row.get_attribute("data-function"): row.find_element(By.CSS_SELECTOR, "[data-role=lag]").text
            for row in d.find_elements(By.CSS_SELECTOR, "#functions tr[data-function]")
        },
    )
    assert set(functions) == set(stats["functions"]) == set(FUNCTIONS)
    assert functions["WorkerFunction"] == ""  # not a stream consumer
    assert functions["BatchFunction"] != ""
    if os.environ.get("LLMTASKS_SCREENSHOT"):
        browser.save_screenshot(str(ROOT / "docs" / "console.png"))

    def redrive(driver: webdriver.Chrome) -> bool:
        # Found and clicked in one attempt: the page redraws every two seconds, and a button found
        # before a redraw is gone by the click (a stale element).
        driver.find_element(By.CSS_SELECTOR, "button[data-redrive=tasks]:not([disabled])").click()
        return True

    shown(browser, redrive)
    assert shown(
        browser, lambda d: status_in_recent(poison)(d) == "completed" and "completed", timeout_s=HANG_S
    )
    with stack.client() as client:
        assert client.get(f"/tasks/{poison}").json()["status"] == "completed"
    assert shown(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, "[data-dlq=tasks] tr[data-task-id]"))
    # An ended batch with failed items: its Retry button runs them again
    retry_button_runs_a_batch_s_failed_items_again(stack, browser)


def retry_button_runs_a_batch_s_failed_items_again(stack: RunningStack, browser: webdriver.Chrome) -> None:
    """The batch table's Retry button (on the same stack and page as the test above)."""
    stack.configure_mock(rate_500=1.0)
    with stack.client() as client:
        items = [{"prompt": f"batch item {i}", "max_retries": 0} for i in range(2)]
        batch_id = client.post("/batches", json={"items": items}).json()["batch_id"]

        def ended() -> dict[str, Any]:
            return client.get(f"/batches/{batch_id}").json()  # type: ignore[no-any-return]

        first = eventually(
            ended, lambda b: b["status"] == "completed_with_errors", timeout_s=HANG_S, what="the batch ended"
        )
        assert first["failed"] == 2  # the mock refused both
        stack.configure_mock(rate_500=0.0)
        browser.get(stack.console)

        def retry(driver: webdriver.Chrome) -> bool:
            driver.find_element(By.CSS_SELECTOR, f"button[data-retry='{batch_id}']").click()
            return True

        assert "Retry 2 failed" in shown(
            browser, lambda d: d.find_element(By.CSS_SELECTOR, f"button[data-retry='{batch_id}']").text
        )
        shown(browser, retry)
        done = eventually(
            ended,
            lambda b: b["status"] == "completed" and b["retries"] == 1,
            timeout_s=HANG_S,
            what="the retried batch ended",
        )
    assert (done["completed"], done["failed"]) == (2, 0)
    # Once nothing failed, the row has no button, and the route says why it would do nothing
    assert shown(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, f"button[data-retry='{batch_id}']"))
    route = f"{stack.api}/console/api/batches/{batch_id}/retry"
    assert httpx.post(route).status_code == 401
    token = {"Authorization": f"Bearer {stack.console.rsplit('token=', 1)[1]}"}
    nothing = httpx.post(route, headers=token)
    assert nothing.status_code == 409, nothing.text
    assert httpx.post(f"{stack.api}/console/api/batches/{'0' * 32}/retry", headers=token).status_code == 404


def run_timeline(task_id: str, *, until: str) -> Callable[[webdriver.Chrome], list[str] | None]:
    """The run's steps and pauses on its timeline, in order, once one of them says `until` and
    its steps are read: an overview out of time shows the task without them (its `incomplete`
    names them), and the next redraw reads them again."""

    def read(driver: webdriver.Chrome) -> list[str] | None:
        row = f"#recent tr[data-task-id='{task_id}']"
        found = driver.find_elements(By.CSS_SELECTOR, f"{row} [data-role^=run-]")
        texts = [element.text for element in found]
        steps = driver.find_elements(By.CSS_SELECTOR, f"{row} [data-role=run-step]")
        return texts if steps and any(until in text for text in texts) else None

    return read


def test_the_console_shows_a_run_s_steps_and_its_wait_for_its_client(
    fresh_mock: RunningStack, browser: webdriver.Chrome
) -> None:
    tool = ToolEndpoint()
    confirm = {"type": "function", "name": "confirm", "parameters": {"type": "object"}}
    with serve(tool.app()) as url, llmtasks_client.Client(fresh_mock.api, fresh_mock.api_key) as client:
        lookup = {
            "type": "function",
            "name": "lookup",
            "parameters": {"type": "object"},
            "url": url + "/tool",
        }
        # Given a run that called its endpoint and waits for its client's function
        task = client.submit("Plan it [mock:agent-steps=2]", tools=[lookup, confirm], max_steps=5)
        waiting = client.wait(task.task_id, timeout=HANG_S)
        assert waiting.required_action is not None, waiting.error
        [asked] = waiting.required_action.tool_calls

        # Then its timeline shows the model calls, the tool call with its source, and the wait
        browser.get(fresh_mock.console)
        seen = shown(browser, run_timeline(task.task_id, until="waiting for"))
        assert [text.split()[:3] for text in seen] == [
            ["step", "0", "model_call"],
            ["step", "1", "tool_call"],
            ["step", "2", "model_call"],
            ["requires_action", "waiting", "for"],
        ]
        assert "tokens" in seen[0]
        assert seen[0].endswith("→ lookup")
        assert "lookup (endpoint)" in seen[1]
        assert seen[3] == "requires_action waiting for confirm"
        assert shown(browser, status_in_recent(task.task_id)) == "requires_action"

        # When the client answers, the timeline shows the answered wait, the call and the answer
        client.submit_tool_outputs(task.task_id, {asked.id: "yes"})
        done = client.wait(task.task_id, timeout=HANG_S)
        assert done.status is llmtasks_client.TaskStatus.COMPLETED, done.error
        seen = shown(browser, run_timeline(task.task_id, until="step 4"))
        assert [text.split()[:3] for text in seen] == [
            ["step", "0", "model_call"],
            ["step", "1", "tool_call"],
            ["step", "2", "model_call"],
            ["requires_action", "answered", seen[3].split()[2]],
            ["step", "3", "tool_call"],
            ["step", "4", "model_call"],
        ]
        assert "confirm (client)" in seen[4]
        assert seen[5].endswith("answer")
        # The steps are written before the task's end: the page may draw one without the other
        assert shown(browser, lambda driver: status_in_recent(task.task_id)(driver) == "completed")
