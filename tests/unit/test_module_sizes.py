"""No module outside tests/ runs past LIMIT lines unless its docstring says why, in a line that
begins "Long because" (say, "Long because the two clients sit method beside method, so that they
stay alike."). A long module is split where it has a seam; where it has none, the reason is
written down where the next reader looks first.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 450
MARKER = "Long because"
SOURCES = ("src", "client", "functions", "local", "bench", "scripts", "examples")
NOT_SOURCE = {"__pycache__", "build", "dist", "mutants", "node_modules"}


def modules() -> list[Path]:
    """Every Python file of the project outside tests/ (nothing built, cached or vendored)."""
    found = []
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            parts = path.relative_to(ROOT).parts
            if not any(part.startswith(".") or part in NOT_SOURCE for part in parts):
                found.append(path)
    return found


def reason(source: str) -> str | None:
    """The module docstring's line that says why the module is long, if it has one with words."""
    docstring = ast.get_docstring(ast.parse(source)) or ""
    for line in docstring.splitlines():
        said = line.strip()
        if said.startswith(MARKER) and len(said.split()) >= 4:
            return said
    return None


def too_long_without_reason(source: str) -> bool:
    return len(source.splitlines()) > LIMIT and reason(source) is None


def test_every_module_over_the_limit_says_why_in_its_docstring() -> None:
    sources = modules()
    assert len(sources) > 100  # the walk found the project, not an empty tree
    unexplained = [
        f"{path.relative_to(ROOT)} ({len(text.splitlines())} lines)"
        for path in sources
        if too_long_without_reason(text := path.read_text(encoding="utf-8"))
    ]
    assert not unexplained, (
        f"over {LIMIT} lines with no line beginning {MARKER!r} in the module docstring (split the"
        " module where it has a seam, or say why it is one): " + ", ".join(unexplained)
    )


def test_only_a_docstring_line_with_a_reason_lets_a_module_run_long() -> None:
    body = "value = 1\n" * LIMIT
    said = "Long because its parts are read together."
    assert too_long_without_reason('"""A module."""\n' + body)
    assert not too_long_without_reason(f'"""A module.\n\n{said}\n"""\n' + body)
    # A comment is not the docstring, and the words "Long because" alone give no reason.
    assert too_long_without_reason(f'"""A module."""\n# {said}\n' + body)
    assert too_long_without_reason('"""A module.\n\nLong because.\n"""\n' + body)
    # At the limit, no reason is needed.
    assert not too_long_without_reason('"""A module."""\n' + "value = 1\n" * (LIMIT - 1))
