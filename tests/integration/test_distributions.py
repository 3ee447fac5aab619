"""The three distributions as a user installs them: the SDK alone in a fresh venv, with nothing of
AWS or of the service; and the release each one shows (the CLI's --version, the API's /health)
is its package's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib.metadata import requires, version
from pathlib import Path

import pytest

import llmtasks
import llmtasks_client
import llmtasks_local
from tests.helpers import ROOT

pytestmark = pytest.mark.integration

UV = Path(sys.executable).parent / "uv"
# What a caller's app must not get with the SDK.
NOT_FOR_CALLERS = ("boto3", "botocore", "aws_lambda_powertools", "aws_xray_sdk", "pydantic_settings", "moto")
PROBE = f"""
import importlib.util, json, sys
import llmtasks_client
from llmtasks_client import AsyncClient, Client, verify_webhook
print(json.dumps({{
    "file": llmtasks_client.__file__,
    "importable": [name for name in {NOT_FOR_CALLERS!r} + ("llmtasks", "llmtasks_local")
                   if importlib.util.find_spec(name) is not None],
    "loaded": sorted({{name.split(".")[0] for name in sys.modules}}),
}}))
"""


def test_the_sdk_installs_alone_into_a_fresh_venv_without_aws(tmp_path: Path) -> None:
    # Offline, from the wheels `make venv` cached: tests download nothing.
    venv = tmp_path / "venv"
    subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # At the versions the dev venv holds: the cache has their wheels, and not always the newest
    # (a dev tool may cap one, as openapi-python-client caps httpx).
    frozen = subprocess.run(
        [str(UV), "pip", "freeze", "--python", sys.executable], capture_output=True, text=True, check=True
    ).stdout
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("".join(line + "\n" for line in frozen.splitlines() if "==" in line))
    install = subprocess.run(
        [
            str(UV),
            "pip",
            "install",
            "-q",
            "--offline",
            "--python",
            str(python),
            "--constraint",
            str(constraints),
            str(ROOT / "client"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    probe = subprocess.run(
        [str(python), "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    assert found["file"].startswith(str(venv))  # the installed copy, not this tree's
    assert found["importable"] == []
    assert not set(found["loaded"]) & {*NOT_FOR_CALLERS, "llmtasks", "llmtasks_local"}


def test_the_sdk_declares_three_dependencies_and_the_service_none_of_the_local_tools() -> None:
    def names(distribution: str) -> set[str]:
        return {re.split(r"[\s;\[<>=]", line, maxsplit=1)[0] for line in requires(distribution) or []}

    assert names("llmtasks-client") == {"httpx", "pydantic", "standardwebhooks"}
    local_only = {"moto", "click", "rich", "awslambdaric", "llmtasks-client", "llmtasks-local"}
    assert not names("llmtasks") & local_only
    assert {"llmtasks", "llmtasks-client", "moto"} <= names("llmtasks-local")


def test_each_distribution_shows_its_own_release() -> None:
    assert version("llmtasks") == llmtasks.__version__
    assert version("llmtasks-client") == llmtasks_client.__version__
    assert version("llmtasks-local") == llmtasks_local.__version__
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "llmtasks"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert shown.split() == [
        "llmtasks-local",
        llmtasks_local.__version__,
        "(service",
        "llmtasks",
        f"{llmtasks.__version__},",
        "SDK",
        "llmtasks-client",
        f"{llmtasks_client.__version__})",
    ]


def test_the_changelog_names_each_release_of_each_distribution() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for distribution, release in (
        ("llmtasks", llmtasks.__version__),
        ("llmtasks-client", llmtasks_client.__version__),
        ("llmtasks-local", llmtasks_local.__version__),
    ):
        assert f"## [{release}]" in changelog, release
        assert f"`{distribution}`" in changelog, distribution
    # The root project is the service's distribution.
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"] == "llmtasks"
