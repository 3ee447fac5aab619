"""Hot reload: a change under a function's CodeUri or a layer's ContentUri is picked up by the
function's next cold start (as LocalStack's hot reload and `sam sync --watch` do).

The stack looks at the files' sizes and modification times once a second; the sandboxes of a
function whose code changed are retired (idle ones at once, busy ones after their invocation).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from llmtasks_local.sam.function_spec import FunctionSpec

WATCH_EVERY_S = 1.0
_SKIPPED_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".git"}

Fingerprint = frozenset[tuple[str, int, int]]


def fingerprint(folders: Iterable[Path]) -> Fingerprint:
    """Every file under `folders` with its size and modification time (ns)."""
    seen: set[tuple[str, int, int]] = set()
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d not in _SKIPPED_DIRS]
            for name in files:
                path = os.path.join(root, name)
                try:
                    stat = os.stat(path)
                except OSError:
                    continue  # removed while we looked: the next look sees it gone
                seen.add((path, stat.st_size, stat.st_mtime_ns))
    return frozenset(seen)


def code_folders(spec: FunctionSpec) -> tuple[Path, ...]:
    return (spec.code_dir, *spec.layer_dirs)


class CodeWatch:
    """Which functions' code changed since the last look."""

    def __init__(self, functions: Mapping[str, FunctionSpec]) -> None:
        self._folders = {name: code_folders(spec) for name, spec in functions.items()}
        self._seen = {
            folder: fingerprint([folder]) for folders in self._folders.values() for folder in folders
        }

    def changed(self) -> list[tuple[str, Path]]:
        """(function, the folder that changed) for each function whose code changed."""
        moved = set()
        for folder, before in self._seen.items():
            now = fingerprint([folder])
            if now != before:
                self._seen[folder] = now
                moved.add(folder)
        return [
            (name, next(folder for folder in folders if folder in moved))
            for name, folders in self._folders.items()
            if moved.intersection(folders)
        ]


def watch(watcher: CodeWatch, reload: Callable[[str], None], say: Callable[[str], None]) -> None:
    """One look: reloads each changed function and says so."""
    for name, folder in watcher.changed():
        reload(name)
        say(f"Reloaded {name}: {folder} changed; its next invocation starts on the new code")
