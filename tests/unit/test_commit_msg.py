"""scripts/check-commit-msg, the commit-msg hook: a subject of at most 72 characters, then a blank
line, then the body; git's comment lines and what follows the scissors line are not the message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.unit

SCRIPT = ROOT / "scripts" / "check-commit-msg"


def check(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=30, check=False
    )


@pytest.mark.parametrize(
    "message",
    [
        "Docs: the webhook page says when an endpoint is disabled\n",
        "x" * 72
        + "\n\nThe why, in as many lines as it takes, each as long as it needs to be"
        + " y" * 40
        + "\n",
        "Subject alone, no body\n",
        # git's own lines: its comments and a verbose commit's diff under the scissors line
        "Fix the pager\n\nWhy.\n# Please enter the commit message"
        + "z" * 80
        + "\n# ------------------------ >8 ------------------------\n"
        + "diff "
        + "d" * 100
        + "\n",
        "\n\nLeading blank lines are dropped by git\n\nBody.\n",
    ],
)
def test_a_message_that_follows_the_convention_passes(tmp_path: Path, message: str) -> None:
    done = check(tmp_path, message)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_subject_over_72_characters_fails_and_says_its_length(tmp_path: Path) -> None:
    done = check(tmp_path, "x" * 73 + "\n\nWhy.\n")
    assert done.returncode == 1
    assert "the subject is 73 characters, over 72" in done.stderr


def test_a_body_right_under_the_subject_fails(tmp_path: Path) -> None:
    done = check(tmp_path, "Docs: a page for batches\nbecause the README was long\n")
    assert done.returncode == 1
    assert "not blank" in done.stderr
    assert "characters" not in done.stderr


def test_an_empty_message_fails(tmp_path: Path) -> None:
    done = check(tmp_path, "# only a comment\n\n")
    assert done.returncode == 1
    assert "empty" in done.stderr
