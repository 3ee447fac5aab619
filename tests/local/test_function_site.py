"""A sandbox imports what `sam build` would install for its function, and no more: the packages
its code's and its layers' requirements name, theirs followed through, and the runtime's own
(function_site.py). The venv's other packages (the tests', the linters') are not there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from llmtasks_local.emulator import function_site as function_site_module
from llmtasks_local.emulator.function_site import closure, function_site
from llmtasks_local.sam.template import TemplateError, requirements_of
from tests.helpers import ROOT

pytestmark = pytest.mark.unit


def names(requirements: list[str]) -> set[str]:
    distributions, missing = closure(Requirement(text) for text in requirements)
    assert missing == []
    return {d.metadata["Name"].lower().replace("_", "-") for d in distributions}


def test_the_layer_s_requirements_are_followed_through_with_their_extras_and_markers() -> None:
    layer = names([str(r) for r in requirements_of([ROOT / "src"])])
    # The layer's own, what they need (powertools' [tracer] extra brings the X-Ray SDK), and the
    # runtime's (awslambdaric, boto3)
    assert {"pydantic", "pydantic-core", "httpx", "httpcore", "boto3", "botocore", "awslambdaric"} <= layer
    assert {"aws-lambda-powertools", "aws-xray-sdk", "wrapt", "standardwebhooks"} <= layer
    # The MCP client, with what its SDK requires (uvicorn among them, which brings click)
    assert {"mcp", "starlette", "uvicorn"} <= layer
    # Nothing that only the tools need: httpx's command line (rich), pytest, moto
    assert not {"rich", "pygments", "pytest", "moto", "schemathesis"} & layer
    # Without the extra, powertools alone: the tracer's SDK is not pulled in
    assert "aws-xray-sdk" not in names(["aws-lambda-powertools"])
    # A marker that does not hold leaves its requirement out
    assert "rich" not in names(['rich; python_version < "3"'])


def test_requirements_files_are_read_as_sam_build_reads_them(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text(
        "# what the function needs\n\n-i https://example.invalid/simple\nhttpx>=0.27  # its client\nrich\n"
    )
    assert [str(r) for r in requirements_of([tmp_path, tmp_path / "none"])] == ["httpx>=0.27", "rich"]
    (tmp_path / "requirements.txt").write_text("httpx\nnot a requirement!\n")
    with pytest.raises(TemplateError, match="not a requirement") as refused:
        requirements_of([tmp_path])
    assert refused.value.where == f"{tmp_path / 'requirements.txt'}:2"


def test_a_requirement_the_venv_has_not_installed_is_named(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("httpx\nno-such-package-llmtasks\n")
    _, missing = function_site(tmp_path, ())
    assert missing == ("no-such-package-llmtasks",)


def sandbox_imports(code_dir: Path, module: str) -> subprocess.CompletedProcess[str]:
    """`import module` in a process started as a sandbox is (python -S, the site on PYTHONPATH)."""
    site, _ = function_site(code_dir, (ROOT / "src",))
    path = os.pathsep.join(str(p) for p in (code_dir, ROOT / "src", site))
    return subprocess.run(
        [sys.executable, "-S", "-c", f"import {module}, llmtasks_local.emulator.sandbox_main"],
        env={"PYTHONPATH": path, "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_sandbox_imports_its_requirements_and_not_the_venv_s_other_packages(tmp_path: Path) -> None:
    for module in ("llmtasks.wiring.worker", "awslambdaric.bootstrap", "boto3", "standardwebhooks"):
        done = sandbox_imports(tmp_path, module)
        assert done.returncode == 0, done.stderr
    assert "No module named 'rich'" in sandbox_imports(tmp_path, "rich").stderr
    (tmp_path / "requirements.txt").write_text("rich\n")  # named: then it is there
    function_site.cache_clear()  # read once a process: read it again
    assert sandbox_imports(tmp_path, "rich").returncode == 0


def test_which_site_requirements_get_is_kept_until_an_install_changes_the_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = tmp_path / "site-packages"
    installed.mkdir()
    monkeypatch.setattr(function_site_module.sysconfig, "get_path", lambda _: str(installed))
    monkeypatch.setattr(function_site_module, "SITES", tmp_path / "sites")
    followed: list[int] = []
    follow = function_site_module.closure
    monkeypatch.setattr(function_site_module, "closure", lambda wanted: followed.append(1) or follow(wanted))
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    (code_dir / "requirements.txt").write_text("httpx\n")

    def in_a_new_process() -> tuple[Path, tuple[str, ...]]:
        function_site.cache_clear()
        function_site_module._site_of_requirements.cache_clear()
        return function_site(code_dir, ())

    first = in_a_new_process()
    assert (in_a_new_process(), followed) == (first, [1])  # kept: not followed through again
    (installed / "something-1.0.dist-info").mkdir()  # an install
    assert (in_a_new_process(), followed) == (first, [1, 1])
