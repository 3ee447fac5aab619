"""A client generated from the served OpenAPI document (openapi-python-client, as users generate
one) submits a task, reads it to completion and finds it in the listing, against the local
stack: the document is exact enough for a generator to make every body and reply a type, and
for the requests it makes to be accepted."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmtasks_local.mock_llm import reply_text
from tests.e2e.conftest import RunningStack
from tests.helpers import HANG_S, eventually

pytestmark = pytest.mark.e2e

PACKAGE = "llmtasks_api_client"


def generated_client(api: str, where: Path) -> Any:
    """The package openapi-python-client makes of the stack's document in `where`, imported."""
    # Under HANG_S: a cold StatusFunction builds the document on a loaded machine in over httpx's 5 s.
    document = httpx.get(api + "/openapi.json", timeout=HANG_S).raise_for_status()
    (where / "openapi.json").write_text(document.text)
    # No post-hooks: the generator would run ruff over its output, which changes nothing it runs.
    (where / "config.yaml").write_text(f"post_hooks: []\npackage_name_override: {PACKAGE}\n")
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("openapi-python-client")),
            "generate",
            "--path",
            str(where / "openapi.json"),
            "--config",
            str(where / "config.yaml"),
            "--meta",
            "none",
            "--output-path",
            str(where / PACKAGE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # Every schema became a type: the generator warns about any it had to leave out
    assert "Unable to process" not in output, output
    assert "Warning" not in output, output
    sys.path.insert(0, str(where))
    try:
        return importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(where))


def test_a_generated_client_submits_reads_to_completion_and_lists_a_task(
    fresh_mock: RunningStack, tmp_path: Path
) -> None:
    stack = fresh_mock
    package = generated_client(stack.api, tmp_path)
    models = importlib.import_module(f"{PACKAGE}.models")
    submit = importlib.import_module(f"{PACKAGE}.api.default.submit_task_tasks_post")
    get = importlib.import_module(f"{PACKAGE}.api.default.get_task_tasks_task_id_get")
    listing = importlib.import_module(f"{PACKAGE}.api.default.list_tasks_tasks_get")

    with package.AuthenticatedClient(base_url=stack.api, token=stack.api_key) as client:
        # The body as the generator typed it: a prompt, no webhook
        body = models.SubmitTaskRequestType0(prompt="generated client", max_retries=1)
        accepted = submit.sync_detailed(client=client, body=body)
        assert accepted.status_code == 202, accepted.content
        task_id = accepted.parsed.task_id
        assert isinstance(accepted.parsed, models.TaskAccepted)

        def completed() -> Any:
            view = get.sync(task_id, client=client, wait=5)
            assert isinstance(view, models.TaskView), view
            return view if view.status == models.TaskStatus.COMPLETED else None

        view = eventually(completed, bool, timeout_s=HANG_S, every_s=0.1, what="the task completed")
        assert view.result == reply_text("generated client")

        page = listing.sync(client=client, limit=100)
        assert isinstance(page, models.TaskList)
        assert task_id in [task.task_id for task in page.data]
