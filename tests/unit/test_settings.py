"""Each function's configuration is checked as Lambda imports its handler: the resources it uses
and nothing more. A missing variable fails the cold start with its name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmtasks.settings import (
    MissingConfiguration,
    WebhookResources,
    WorkerResources,
    forget_configuration,
    resources,
)
from tests.helpers import ROOT, resource_variables

WORKER_ENV = {
    "TASKS_TABLE_NAME": "tasks",
    "RESULTS_BUCKET": "results",
    "TASK_QUEUE_URL": "https://sqs/1/tasks",
    "HIGH_TASK_QUEUE_URL": "https://sqs/1/high",
    "BATCH_TASK_QUEUE_URL": "https://sqs/1/batch-tasks",
}


def cold_start(function: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Imports functions/<function>/app.py in a fresh interpreter with only `environment` (and
    what Python needs), as a Lambda execution environment would."""
    path = str(ROOT / "functions" / function / "app.py")
    code = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('app', {path!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
    )
    kept = {name: os.environ[name] for name in ("PATH", "PYTHONPATH", "HOME") if name in os.environ}
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**kept, "AWS_DEFAULT_REGION": "us-east-1", **environment},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_function_starts_with_its_own_resources_and_no_others() -> None:
    assert cold_start("authorizer", {"API_KEYS_TABLE_NAME": "keys"}).returncode == 0
    started = cold_start("worker", WORKER_ENV)
    assert started.returncode == 0, started.stderr


def test_a_missing_variable_fails_the_cold_start_naming_it() -> None:
    without = {name: value for name, value in WORKER_ENV.items() if name != "HIGH_TASK_QUEUE_URL"}
    failed = cold_start("worker", without)
    assert failed.returncode != 0
    assert "WorkerResources cannot start: HIGH_TASK_QUEUE_URL: Field required" in failed.stderr
    refused = cold_start("authorizer", {"TASKS_TABLE_NAME": "tasks"})
    assert "AuthorizerResources cannot start: API_KEYS_TABLE_NAME: Field required" in refused.stderr


def test_every_missing_or_bad_variable_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in resource_variables():
        monkeypatch.delenv(name)
    monkeypatch.setenv("TASKS_TABLE_NAME", "")
    forget_configuration()
    try:
        with pytest.raises(MissingConfiguration) as refused:
            resources(WebhookResources)
        message = str(refused.value)
        for name in ("TASKS_TABLE_NAME", "RESULTS_BUCKET", "WEBHOOK_QUEUE_URL", "WEBHOOK_DLQ_URL"):
            assert name in message
        assert "TASK_QUEUE_URL" not in message  # not the webhook function's
        monkeypatch.setenv("TASKS_TABLE_NAME", "tasks")
        for name, value in WORKER_ENV.items():
            monkeypatch.setenv(name, value)
        assert resources(WorkerResources).high_task_queue_url == "https://sqs/1/high"
    finally:
        forget_configuration()
