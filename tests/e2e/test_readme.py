"""Every shell and console block of the README and of the documentation site's pages (in the
order of mkdocs.yml's nav), run as a reader pastes them, one page after another in one terminal
session, against one live local stack that the README's own `make up` starts. A page's `make up`
while that stack runs is the stack the reader already has: it is not started twice.

A reader fills the placeholders: the key `make up` printed (`lt_...`, or the example key of a
console session) becomes the stack's dev key, an id shown as `b7468a7b...` (or a whole example
id) becomes the id the previous commands printed, a key id the one `keys create` printed. The
one thing a reader would not change: the stack here listens on free ports (a developer's own
`make up` may hold 3000), so `127.0.0.1:3000` and `:4566` become its ports, and the CLI finds
them through LLMTASKS_API_URL and AWS_ENDPOINT_URL. Each command must exit 0, unless the
page shows it ending in `Error: ...`; a console block's output lines must each begin as the
page shows them. Blocks that only illustrate (a reply's shape, a command's output, Python) are
`text` or `python` blocks, and are not run.

Commands that cannot run here are run in the nearest form that can, each listed in NEAR:
`make test` (this very suite) and `make bench` (minutes) as make's dry run of their target,
`sam deploy` (needs an AWS account) as its --help, `pip install ./client` into a venv of its
own, offline.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from llmtasks_local.emulator.launcher import free_port
from tests.helpers import ROOT

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Files the pages' commands write in the work tree; removed afterwards.
WRITTEN = ("items.jsonl", "out.jsonl", "event.json", "reply.json")
ITEMS = [
    {"prompt": "Classify: invoice", "custom_id": "doc-1"},
    {"prompt": "Classify: receipt", "custom_id": "doc-2"},
]
# What the session sets so that the CLI's defaults find the stack on its free ports.
SESSION_ONLY = ("LLMTASKS_API_URL", "AWS_ENDPOINT_URL")
# Commands that cannot run here, and what runs instead.
NEAR = {
    "make test": "make -n test",
    "make bench": "make -n bench",
    "make bench ARGS=--quick": "make -n bench ARGS=--quick",
    # SAM CLI's venv is made by make test's first phases; its check here (scripts/check-template
    # install) would also start SAM CLI and checkov for their versions, 2 s each.
    "sam build": "{ test -x .venv-sam/bin/sam || scripts/check-template install >/dev/null; }"
    " && .venv-sam/bin/sam build --help",
    "sam deploy --guided": "{ test -x .venv-sam/bin/sam || scripts/check-template install >/dev/null; }"
    " && .venv-sam/bin/sam deploy --help",
    # Into a venv of its own, from the wheels `make venv` cached: the test downloads nothing.
    # At the dev venv's versions, whose wheels the cache holds (a dev tool may cap one below the newest).
    "pip install ./client": 'd=$(mktemp -d) && .venv/bin/uv venv -q "$d"'
    ' && .venv/bin/uv pip freeze --python .venv/bin/python | grep == > "$d/constraints.txt"'
    ' && .venv/bin/uv pip install -q --offline --python "$d/bin/python" -c "$d/constraints.txt" ./client'
    ' && "$d/bin/python" -c "import llmtasks_client"',
}


@dataclass
class Block:
    page: str
    line: int
    language: str
    text: str


def site_pages() -> list[Path]:
    """The site's pages in the order of its nav, as a reader goes through them."""

    def flatten(entries: list[object]) -> Iterator[str]:
        for entry in entries:
            if isinstance(entry, str):
                yield entry
            elif isinstance(entry, dict):
                for value in entry.values():
                    yield from flatten(value if isinstance(value, list) else [value])

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [DOCS / page for page in flatten(nav)]


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(
            str(path.relative_to(ROOT)), text[: found.start()].count("\n") + 1, found.group(1), found.group(2)
        )
        for found in re.finditer(r"^```(sh|console)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    ]


@dataclass
class Command:
    line: str
    shown: list[str] = field(default_factory=list)  # a console block's output lines


def commands_of(block: Block) -> list[Command]:
    """A block's commands: continuation lines and multi-line quotes joined, comments dropped;
    in a console block, the lines after `$ ` and what it shows below them."""
    found: list[Command] = []
    pending = ""
    for raw in block.text.splitlines():
        if block.language == "console" and not raw.startswith("$ ") and not pending:
            if found:
                found[-1].shown.append(raw)
            continue
        line = raw.removeprefix("$ ") if block.language == "console" else raw
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending.endswith("\\"):  # a continued line: the shell joins it with a space
            pending = f"{pending[:-1]} {line.lstrip()}"
        else:  # a first line, or one inside a quote that is still open
            pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on below
            continue
        found.append(Command(pending.strip()))
        pending = ""
    assert not pending, f"{block.page} line {block.line}: a command never ends"
    return found


class Reader:
    """One terminal session of a reader: variables, ids seen so far, background processes."""

    def __init__(self, api: str, endpoint: str) -> None:
        self.api, self.endpoint = api, endpoint
        self.variables: dict[str, str] = {}
        self.seen: dict[str, str] = {}
        self.background: list[subprocess.Popen[str]] = []
        self.stack: subprocess.Popen[str] | None = None
        self.state_dirs: list[Path] = []

    def environment(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LLMTASKS_", "LLM_"))}
        return {**keep, "LLMTASKS_API_URL": self.api, "AWS_ENDPOINT_URL": self.endpoint, **self.variables}

    def fill(self, line: str) -> str:
        """The placeholders, filled the way a reader fills them."""
        line = line.replace("127.0.0.1:3000", self.api.removeprefix("http://"))
        line = line.replace("http://127.0.0.1:4566", self.endpoint)
        if "dev_key" in self.seen:
            line = re.sub(r"lt_(\.\.\.|[A-Za-z0-9_-]{20,})", self.seen["dev_key"], line)
        batchy = "batch" in line
        for placeholder in re.findall(r"\b[0-9a-f]{8}\.\.\.|\b(?!0{32})[0-9a-f]{32}\b", line):
            kind = "batch_id" if batchy else "task_id"
            assert kind in self.seen, f"{line}: no {kind} printed yet to put in place of {placeholder}"
            line = line.replace(placeholder, self.seen[kind])
        if "keys revoke" in line:
            line = re.sub(r"revoke \w+", f"revoke {self.seen['key_id']}", line)
        return line

    def remember(self, output: str) -> None:
        for kind, pattern in (
            ("task_id", r'"task_id":\s*"([0-9a-f]{32})"|^([0-9a-f]{32})$'),
            ("batch_id", r'"batch_id":\s*"([0-9a-f]+)"'),
            ("key_id", r"^lt_([0-9a-f]{12})_"),
        ):
            for found in re.finditer(pattern, output, flags=re.MULTILINE):
                self.seen[kind] = next(group for group in found.groups() if group)

    def run(self, command: Command) -> None:
        near = NEAR.get(command.line.split("  #")[0].split(" # ")[0].strip())
        line = self.fill(near or command.line)
        command_only = re.split(r"\s+#", line, maxsplit=1)[0].strip()
        if command_only == "make up" and self.stack is not None:
            return  # the reader's stack is up already, started by an earlier page's `make up`
        if re.search(r"(^|\s)make up\b", command_only) and not near:
            self.start_stack(line)
            return
        assignment = re.match(r"(?:export\s+)?([A-Za-z_]\w*)=", line)
        if assignment:  # the shell's own evaluation of the value, kept for the next commands
            name = assignment.group(1)
            value = self.shell(f'{line}\nprintf "%s" "${name}"')
            assert value.returncode == 0, f"{line}: {value.stderr}"
            self.variables[name] = value.stdout
            return
        if line.rstrip().endswith("&"):
            self.background.append(self.spawn(line.rstrip().removesuffix("&")))
            time.sleep(1)  # a server the next commands talk to: let it bind (a real-time wait)
            return
        done = self.shell(line)
        expects_error = any(shown.startswith("Error:") for shown in command.shown)
        context = f"{line}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert (done.returncode != 0) == expects_error, context
        self.remember(done.stdout)
        printed = (done.stdout + done.stderr).splitlines()
        for shown in command.shown:
            first = self.fill(shown).split()[0] if shown.strip() else ""
            if first and re.fullmatch(r"[A-Za-z:]+", first):
                assert any(p.strip().startswith(first) for p in printed), f"{context}\nshown: {shown}"

    def shell(self, line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", line],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            env=self.environment(),
            check=False,
        )

    def spawn(self, line: str, *, stack: bool = False) -> subprocess.Popen[str]:
        # The stack itself starts as a reader's would: no endpoint or API URL in its environment.
        given = {k: v for k, v in self.environment().items() if not stack or k not in SESSION_ONLY}
        return subprocess.Popen(
            ["bash", "-c", line],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=given,
            start_new_session=True,
        )

    def start_stack(self, line: str) -> None:
        """`make up` on this session's ports: the first is the stack every block talks to; a
        later one (another LLM, say) starts, is seen ready, and stops."""
        port = int(self.api.rsplit(":", 1)[1]) if self.stack is None else free_port()
        moto = int(self.endpoint.rsplit(":", 1)[1]) if self.stack is None else free_port()
        state = Path(tempfile.mkdtemp(prefix="llmtasks-readme-"))
        self.state_dirs.append(state)
        ports = f"--port {port} --moto-port {moto} --mock-port {free_port()} --state-dir {state} --reset"
        line = re.split(r"\s+#", line, maxsplit=1)[0]  # the comment, not the ports, ends the line
        line = re.sub(r'ARGS="', f'ARGS="{ports} ', line) if "ARGS=" in line else f'{line} ARGS="{ports}"'
        process = self.spawn(line, stack=True)
        try:
            printed = wait_ready(process)
        except BaseException:  # not ready, or the test's timeout: the stack must not outlive it
            stop(process)
            raise
        # Its logs go on: read them, or the pipe fills and the stack blocks on its next line.
        threading.Thread(target=process.communicate, daemon=True).start()
        key = re.search(r"API key\s+(lt_\S+)", printed)
        if self.stack is None:
            self.stack = process
            assert key, printed
            self.seen["dev_key"] = key.group(1)
        else:
            stop(process)

    def close(self) -> None:
        for process in [*self.background, *([self.stack] if self.stack else [])]:
            stop(process)
        for state in self.state_dirs:
            shutil.rmtree(state, ignore_errors=True)


def wait_ready(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    printed = ""
    give_up = time.monotonic() + 180  # a first `make up` installs the venv
    while "Ready." not in printed:
        line = process.stdout.readline()
        assert line or process.poll() is None, f"make up ended:\n{printed}"
        assert time.monotonic() < give_up, f"make up not ready:\n{printed}"
        printed += line
    return printed


def stop(process: subprocess.Popen[str]) -> None:
    """Ctrl-C, and a second one if it is still finishing its calls, as a reader would."""
    for wait_s in (5, 30):
        if process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def reader() -> Iterator[Reader]:
    session = Reader(f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")
    # What a reader writes before `llmtasks batch submit items.jsonl`: one task body a line.
    (ROOT / "items.jsonl").write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    try:
        yield session
    finally:
        session.close()
        for name in WRITTEN:
            (ROOT / name).unlink(missing_ok=True)


# A cap only a hang reaches: each command has its own (120 s), and a stack's start its own. The
# blocks run one after another, several minutes of work on one loaded core.
@pytest.mark.timeout(1800)
def test_every_shell_and_console_block_of_the_readme_and_the_docs_runs_as_pasted(reader: Reader) -> None:
    pages = site_pages()
    assert {page.name for page in pages} >= {"getting-started.md", "http-api.md", "local-stack.md"}
    blocks = [block for page in [README, *pages] for block in blocks_of(page)]
    assert len(blocks) >= 12
    assert blocks[0].text.startswith("make up"), "the README's first block starts the stack the others use"
    ran: list[str] = []
    for block in blocks:
        for command in commands_of(block):
            try:
                reader.run(command)
            except AssertionError as failure:
                raise AssertionError(f"{block.page} line {block.line}: {command.line}\n{failure}") from None
            ran.append(command.line)
    near = {line.split("  #")[0].split(" # ")[0].strip() for line in ran} & set(NEAR)
    assert near == set(NEAR), "every stand-in in NEAR is for a command the README or a page has"
