"""The unit suite tests the service, not the emulator: it runs on in-process moto (with
llmtasks_local.moto_patches) and the template as AWS reads it (llmtasks_local.sam), and imports nothing of
the local stack's runtime (llmtasks_local.emulator: the gateway, the sandboxes, the pollers, the journal).
The emulator's own tests are tests/local."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.unit

UNIT = ROOT / "tests" / "unit"

# Imports every unit test module with llmtasks_local.emulator made unimportable; prints what was refused.
PROBE = """
import importlib, importlib.abc, pathlib, sys
refused = []
class NoLocal(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "llmtasks_local.emulator" or name.startswith("llmtasks_local.emulator."):
            refused.append(name)
            raise ImportError(f"{name} is the local emulator's")
        return None
sys.meta_path.insert(0, NoLocal())
import tests.conftest, tests.unit.conftest
for path in sorted(pathlib.Path("tests/unit").glob("test_*.py")):
    importlib.import_module(f"tests.unit.{path.stem}")
print(sorted(set(refused)))
"""


def test_no_unit_test_module_imports_the_local_emulator() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert probe.stdout.strip().splitlines()[-1] == "[]"


def test_no_unit_test_imports_the_local_emulator_inside_a_function() -> None:
    """The probe sees module-level imports; an import inside a test runs only with the test."""
    naming = [
        path.name
        for path in [*UNIT.glob("*.py"), ROOT / "tests" / "conftest.py", ROOT / "tests" / "helpers.py"]
        if path.name != "test_layers.py"
        and (
            "llmtasks_local.emulator" in path.read_text() or "from llmtasks import local" in path.read_text()
        )
    ]
    # helpers.py's moto_endpoint starts the stack's moto server, for the integration suites.
    assert naming == ["helpers.py"]
