"""The packages a function's sandbox can import: what `sam build` installs for it, and no more.

In Lambda a function imports its code (/var/task, with what its requirements.txt installed
there), its layers (/opt/python, with theirs) and the runtime's own packages (awslambdaric,
boto3). The local tools' venv holds far more: the tests', linters' and bench's packages. A
sandbox that saw all of them would import what Lambda would not have (a handler importing a
package its requirements do not name would work here and fail there), and libraries that look
for optional packages would find them: httpx imports its command-line client when rich, click
and pygments are installed.

So a sandbox runs without the venv's site-packages (`python -S`) and with a folder of links to
the venv's installed distributions that its requirements name, their own requirements (with
their extras and markers) followed through: the same versions, nothing downloaded. The folder is
made once for each set of distributions and kept, and which folder a set of requirements gets is
kept too, until the venv's installed distributions change (following them through reads every
distribution's metadata, a noticeable part of each `llmtasks invoke`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from llmtasks_local.sam.template import requirements_of

# What Lambda's Python runtime carries itself, beside a function's own packages.
RUNTIME_PACKAGES = ("awslambdaric", "boto3")
SITES = Path(tempfile.gettempdir()) / "llmtasks-function-sites"


def closure(requirements: Iterable[Requirement]) -> tuple[list[metadata.Distribution], list[str]]:
    """The installed distributions the requirements and the runtime's own packages need, their
    requirements followed through (extras and markers evaluated); and the names of those that
    are not installed."""
    environment: dict[str, str] = {key: str(value) for key, value in default_environment().items()}
    wanted = [*requirements, *(Requirement(name) for name in RUNTIME_PACKAGES)]
    extras_seen: dict[str, set[str]] = {}
    found: dict[str, metadata.Distribution] = {}
    missing: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = canonicalize_name(requirement.name)
        extras = set(requirement.extras)
        if name in extras_seen and extras <= extras_seen[name]:
            continue
        extras_seen.setdefault(name, set()).update(extras)
        try:
            distribution = found.get(name) or metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            missing.add(requirement.name)
            continue
        found[name] = distribution
        for text in distribution.requires or ():
            needed = Requirement(text)
            marker, needed.marker = needed.marker, None
            if marker is None or any(
                marker.evaluate({**environment, "extra": extra}) for extra in extras_seen[name] or {""}
            ):
                wanted.append(needed)
    return list(found.values()), sorted(missing)


def _top_level_entries(distribution: metadata.Distribution) -> set[str]:
    """What the distribution put at the top of its site-packages: its packages, modules,
    extension modules and its .dist-info (importlib.metadata reads it in the sandbox too)."""
    entries = set()
    for file in distribution.files or ():
        parts = Path(file).parts
        if parts and parts[0] not in ("..", "__pycache__") and not parts[0].endswith(".pth"):
            entries.add(parts[0])
    return entries


def site_of(distributions: Iterable[metadata.Distribution]) -> Path:
    """A folder of links to these distributions' files, and to the emulator's own package (the
    runtime client, sandbox_main, is imported from it), made once and kept by what it holds."""
    links: dict[str, Path] = {"llmtasks_local": Path(__file__).resolve().parents[1]}
    for distribution in distributions:
        root = Path(str(distribution.locate_file("")))
        for entry in _top_level_entries(distribution):
            if (root / entry).exists():
                links.setdefault(entry, root / entry)
    digest = hashlib.sha256(repr(sorted(links.items())).encode()).hexdigest()[:16]
    site = SITES / digest
    if site.is_dir():
        return site
    SITES.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"{digest}-", dir=SITES))
    for entry, target in links.items():
        (building / entry).symlink_to(target)
    try:
        building.rename(site)
    except OSError:  # another stack made the same folder meanwhile
        shutil.rmtree(building)
    return site


@functools.cache
def function_site(code_dir: Path, layer_dirs: tuple[Path, ...]) -> tuple[Path, tuple[str, ...]]:
    """The site of a function with this code and these layers, and the requirements no
    installed distribution answers (importing them fails in the sandbox, as in a Lambda whose
    build left them out). Read once a process: a requirements.txt changed while the stack runs
    counts from its next start."""
    return _site_of_requirements(tuple(sorted(str(r) for r in requirements_of([code_dir, *layer_dirs]))))


@functools.cache
def _site_of_requirements(requirements: tuple[str, ...]) -> tuple[Path, tuple[str, ...]]:
    """Functions that require the same (the template's six all share the layer's) share one."""
    # The folders distributions are installed in change (their mtime) as one is added, removed
    # or upgraded: each install writes a new .dist-info folder.
    installed = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    state = [(folder, os.stat(folder).st_mtime_ns) for folder in installed if os.path.isdir(folder)]
    key = hashlib.sha256(repr((requirements, sys.prefix, state)).encode()).hexdigest()[:16]
    record = SITES / f"{key}.json"
    try:
        kept = json.loads(record.read_text())
        if Path(kept["site"]).is_dir():
            return Path(kept["site"]), tuple(kept["missing"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not made yet, or unreadable: made again
    distributions, missing = closure(Requirement(text) for text in requirements)
    site = site_of(distributions)
    SITES.mkdir(parents=True, exist_ok=True)
    writing = record.with_name(f"{record.name}.{os.getpid()}")
    writing.write_text(json.dumps({"site": str(site), "missing": missing}))
    writing.replace(record)
    return site, tuple(missing)
