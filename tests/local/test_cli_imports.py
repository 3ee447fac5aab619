"""The CLI imports a command's module only when that command runs: `--help` and `--version`
load click alone, an API command the SDK but neither boto3 nor the emulator. Checked by the
modules a run loaded, not by its time (the bench measures that)."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

import llmtasks_client
from llmtasks_local import cli
from llmtasks_local.cli import LAZY_COMMANDS, local, ops, options, tasks

pytestmark = pytest.mark.unit

# Runs the CLI in-process with `args`, then prints the top-level packages it had loaded.
PROBE = """
import json, sys
from llmtasks_local.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
loaded = [name for name, module in sys.modules.items() if module is not None]  # None: kept out
whole = ("llmtasks", "httpx.", "importlib.metadata")  # named whole: what the tests look for
names = {name.split(".")[0] for name in loaded} | {n for n in loaded if n.startswith(whole)}
print(json.dumps(sorted(names)))
"""
HEAVY = {
    "boto3",
    "botocore",
    "moto",
    "pydantic",
    "httpx",
    "aws_lambda_powertools",
    "localstack_client",
    "llmtasks",
}


def loaded(*args: str) -> set[str]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(run.stdout.strip().splitlines()[-1]))


def test_help_and_version_load_click_alone() -> None:
    for args in (["--help"], ["--version"]):
        found = loaded(*args)
        assert not found & HEAVY, (args, found & HEAVY)
        assert not {"llmtasks", "llmtasks_client", "llmtasks_local.cli.tasks"} & found, args
    assert "importlib.metadata" not in loaded("--help")  # the versions' metadata is read for --version alone


def test_an_api_command_loads_the_sdk_and_nothing_of_aws_or_the_emulator() -> None:
    found = loaded("status", "0" * 32, "--api-url", "http://127.0.0.1:9")  # nothing listens there
    assert {"llmtasks_client", "httpx", "pydantic"} <= found
    # httpx's own command line (rich's syntax highlighting, pygments) is never this CLI's.
    assert not found & {"httpx._main", "pygments"}
    assert not found & {"boto3", "botocore", "moto", "aws_lambda_powertools", "localstack_client"}
    assert "llmtasks_local.emulator" not in found


def test_every_command_is_listed_once_with_its_own_summary() -> None:
    group = cli.main
    ctx = click.Context(group)
    defined = {command.name for module in (local, ops, tasks) for command in module.COMMANDS}
    assert set(LAZY_COMMANDS) == defined
    for name, (_, _, summary) in LAZY_COMMANDS.items():
        command = group.get_command(ctx, name)
        assert command is not None
        assert command.name == name
        assert command.get_short_help_str(limit=1000) == summary, name


def test_the_cli_s_default_api_url_is_the_sdk_s() -> None:
    assert options.API_URL == llmtasks_client.DEFAULT_URL
