"""Bad input to the local tools: one clear line on stderr, the documented exit code, and a
traceback only with --debug. Each case runs the command in a subprocess, as a user types it;
nothing needs a running stack (the API, where one is needed, is a small fake on 127.0.0.1)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.helpers import ROOT, free_port, serve

pytestmark = pytest.mark.unit

USAGE, FAILED = 2, 1  # the exit-code table of docs/sdk-cli.md


def llmtasks(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    given = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LLMTASKS_"))}
    return subprocess.run(
        [sys.executable, "-m", "llmtasks_local.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**given, **(env or {})},
    )


def said(done: subprocess.CompletedProcess[str], exit_code: int, *words: str) -> str:
    """The one or two lines on stderr, once they name the problem and no traceback shows."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == exit_code, (done.returncode, done.stderr[-3000:])
    assert 1 <= len(lines) <= 2, done.stderr[-3000:]
    assert lines[-1].startswith("Error: "), done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr)
    return done.stderr


def stack_args(*extra: str) -> list[str]:
    """`up` on free ports, keeping nothing, so a case fails for its own reason alone."""
    ports = ["--port", str(free_port()), "--moto-port", str(free_port()), "--mock-port", str(free_port())]
    return ["up", *ports, "--no-state", *extra]


@pytest.fixture
def template_with(tmp_path: Path) -> Any:
    """template.yaml with one piece of text replaced (it must occur), code paths made absolute."""

    def write(old: str, new: str) -> Path:
        text = (ROOT / "template.yaml").read_text()
        assert old in text, old
        text = text.replace(old, new, 1).replace("CodeUri: functions/", f"CodeUri: {ROOT}/functions/")
        text = text.replace("ContentUri: src/", f"ContentUri: {ROOT}/src/")
        path = tmp_path / "template.yaml"
        path.write_text(text)
        return path

    return write


# --- llmtasks up ----------------------------------------------------------------------------------


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program holds: bound, and not listening, so the stack's probe of what
    holds it (an `llmtasks up`?) is refused at once; a listener that never answers holds that
    probe its whole 3 s timeout, each time."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield holder.getsockname()[1]


def test_a_port_in_use_names_the_port_and_the_option_that_changes_it(taken_port: int) -> None:
    args = stack_args()
    args[args.index("--port") + 1] = str(taken_port)
    done = llmtasks(*args)
    said(done, USAGE, f"port {taken_port} is in use by another program", "--port")
    mock = stack_args()
    mock[mock.index("--mock-port") + 1] = str(taken_port)
    said(llmtasks(*mock), USAGE, f"port {taken_port}", "--mock-port", "the mock LLM")


def test_the_mock_llm_on_a_port_in_use_says_so(taken_port: int) -> None:
    said(llmtasks("mock-llm", "--port", str(taken_port)), USAGE, f"port {taken_port}", "--port")


def test_a_port_held_by_another_stack_says_so() -> None:
    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    with serve(Starlette(routes=[Route("/health", health)])) as url:
        port = url.rsplit(":", 1)[1]
        args = stack_args()
        args[args.index("--port") + 1] = port
        said(llmtasks(*args), USAGE, f"port {port}", "another `llmtasks up`")


def test_a_template_that_does_not_parse_names_file_line_and_column(tmp_path: Path) -> None:
    broken = tmp_path / "template.yaml"
    broken.write_text("Resources:\n  Queue:\n    Type: AWS::SQS::Queue\n   Properties: [\n")
    said(llmtasks(*stack_args("-t", str(broken))), USAGE, f"{broken}:4:", "not valid YAML")


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        (
            "Type: AWS::Serverless::Function",
            "Type: AWS::Serverless::Functoin",
            ["AWS::Serverless::Functoin", "does not know"],
        ),
        (
            "Handler: app.lambda_handler",
            "Handler: nowhere.lambda_handler",
            ["nowhere.lambda_handler", "Handler"],
        ),
        ("CodeUri: functions/submit/", "CodeUri: functions/submitt/", ["submitt", "CodeUri"]),
        ("ContentUri: src/", "ContentUri: srcc/", ["LlmtasksLayer", "srcc", "ContentUri"]),
        ("!Ref TasksTable", "!Ref TasksTabel", ["a Ref to 'TasksTabel'"]),
        # CreateEventSourceMapping refuses a queue whose messages would come back mid-invocation.
        (
            "VisibilityTimeout: 360",
            "VisibilityTimeout: 5",
            ["Queue visibility timeout: 5 seconds is less than Function timeout: 60 seconds", "WebhookQueue"],
        ),
    ],
    ids=[
        "unknown-type",
        "missing-handler",
        "missing-codeuri",
        "missing-layer",
        "ref-to-nothing",
        "visibility-under-timeout",
    ],
)
def test_a_template_that_names_what_does_not_exist_is_refused_before_anything_starts(
    template_with: Any, old: str, new: str, words: list[str]
) -> None:
    path = template_with(old, new)
    said(llmtasks(*stack_args("-t", str(path))), USAGE, str(path), *words)


def test_a_requirements_line_pip_would_not_read_is_refused_before_anything_starts(
    template_with: Any, tmp_path: Path
) -> None:
    code = tmp_path / "submit"
    shutil.copytree(ROOT / "functions" / "submit", code, ignore=shutil.ignore_patterns("__pycache__"))
    (code / "requirements.txt").write_text("httpx>=0.27\nhttpx[http2>=1\n")
    path = template_with("CodeUri: functions/submit/", f"CodeUri: {code}/")
    said(llmtasks(*stack_args("-t", str(path))), USAGE, f"{code / 'requirements.txt'}:2", "not a requirement")


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("NoSuchParameter=1", ["declares no parameter NoSuchParameter", "--parameter-overrides"]),
        ("LlmProvider=anthropic", ["LlmProvider='anthropic'", "AllowedValues", "openai"]),
        ("WorkerTimeoutSeconds=5", ["WorkerTimeoutSeconds='5'", "from 30 to 900"]),
        ("WorkerTimeoutSeconds=soon", ["not a number"]),
    ],
)
def test_a_parameter_override_the_template_refuses_says_why(override: str, words: list[str]) -> None:
    said(llmtasks(*stack_args("--parameter-overrides", override)), USAGE, *words)


def test_an_endpoint_that_does_not_answer_is_named() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    said(llmtasks(*stack_args("--endpoint-url", closed)), FAILED, closed, "does not answer", "--endpoint-url")


def test_a_state_dir_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    args = [arg for arg in stack_args() if arg != "--no-state"]
    said(llmtasks(*args, "--state-dir", str(a_file / "state")), USAGE, str(a_file / "state"), "--state-dir")


def test_debug_shows_the_traceback(taken_port: int) -> None:
    args = stack_args()
    args[args.index("--port") + 1] = str(taken_port)
    for debug in (["--debug"], []):
        done = llmtasks(*debug, *args, env={"LLMTASKS_DEBUG": "1"} if not debug else None)
        assert done.returncode == USAGE
        assert "Traceback" in done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("Error: port")


# --- llmtasks invoke ------------------------------------------------------------------------------


def test_invoke_with_a_missing_or_non_json_event_or_an_unknown_function(tmp_path: Path) -> None:
    said(
        llmtasks("invoke", "StatusFunction", "-e", str(tmp_path / "none.json")), USAGE, "none.json", "--event"
    )
    not_json = tmp_path / "event.json"
    not_json.write_text("{not json")
    said(llmtasks("invoke", "StatusFunction", "-e", str(not_json)), USAGE, "event.json is not JSON")
    said(llmtasks("invoke", "StatusFuncion"), USAGE, "StatusFuncion is not a function", "StatusFunction")


# --- the API's client commands --------------------------------------------------------------------


@pytest.fixture
def api() -> Iterator[tuple[str, list[str]]]:
    """A fake API refusing as API Gateway does (no Authorization: 401; a key other than `lt_good`:
    the authorizer's 403), in its plain JSON; records what reached it."""
    seen: list[str] = []

    async def anything(request: Request) -> JSONResponse:
        seen.append(f"{request.method} {request.url.path}")
        if "authorization" not in request.headers:
            return JSONResponse({"message": "Unauthorized"}, status_code=401)
        if request.headers["authorization"] != "Bearer lt_good":
            return JSONResponse({"message": "Forbidden"}, status_code=403)
        return JSONResponse({"batch_id": "b", "total": 1, "status": "pending"}, status_code=202)

    app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])])
    with serve(app) as url:
        yield url, seen


def test_batch_submit_names_the_bad_line_and_sends_nothing(
    api: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, seen = api
    items = tmp_path / "items.jsonl"
    items.write_text('{"prompt": "a"}\n\n{"prompt": "b"\n')
    done = llmtasks("batch", "submit", str(items), "--api-url", url, "--api-key", "lt_good")
    said(done, USAGE, f"{items}:3", "line 3 is not JSON", "nothing was submitted")
    items.write_text('{"prompt": "a"}\n["a list"]\n')
    done = llmtasks("batch", "submit", str(items), "--api-url", url, "--api-key", "lt_good")
    said(done, USAGE, f"{items}:2", "not a JSON object")
    assert seen == []


def test_submit_names_an_image_or_schema_it_cannot_use_and_sends_nothing(
    api: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, seen = api
    given = ["--api-url", url, "--api-key", "lt_good"]
    missing = tmp_path / "missing.png"
    said(
        llmtasks("submit", "x", "--image", str(missing), *given),
        USAGE,
        str(missing),
        "cannot attach the image",
    )
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    said(llmtasks("submit", "x", "--image", str(text), *given), USAGE, "not an image of a known type")
    schema = tmp_path / "label.json"
    schema.write_text("[1, 2]")
    said(llmtasks("submit", "x", "--schema", str(schema), *given), USAGE, str(schema), "not a JSON object")
    assert seen == []


def test_a_missing_or_wrong_key_or_api_url_is_named(api: tuple[str, list[str]]) -> None:
    url, _ = api
    said(
        llmtasks("status", "abc", "--api-url", url),
        USAGE,
        "401 Unauthorized: no API key was sent",
        "LLMTASKS_API_KEY",
        "keys dev",
    )
    said(
        llmtasks("status", "abc", "--api-url", url, "--api-key", "lt_bad"),
        USAGE,
        "403 Forbidden: the API key is not valid, or was revoked",
        "the API key was refused",
    )
    closed = f"http://127.0.0.1:{free_port()}"
    said(llmtasks("status", "abc", "--api-url", closed), FAILED, closed, "did not answer", "make up")
    said(llmtasks("status", "abc", "--api-url", "127.0.0.1:3000"), USAGE, "not an http(s) URL")


def test_operator_commands_name_an_endpoint_that_does_not_answer() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    said(llmtasks("stats", "--endpoint-url", closed), FAILED, closed, "does not answer", "--endpoint-url")


def test_keys_dev_prints_the_kept_key_or_says_where_it_looked(tmp_path: Path) -> None:
    said(llmtasks("keys", "dev", "--state-dir", str(tmp_path)), USAGE, str(tmp_path / "dev-key"), "make up")
    (tmp_path / "dev-key").write_text("lt_kept\n")
    done = llmtasks("keys", "dev", "--state-dir", str(tmp_path))
    assert (done.returncode, done.stdout) == (0, "lt_kept\n")


def test_a_usage_error_is_one_line_that_points_to_help() -> None:
    said(llmtasks("submit"), USAGE, "Missing argument 'PROMPT'", "llmtasks submit --help")


# --- make and the scripts: a Python that is not there ----------------------------------------------


def bare_path(tmp_path: Path) -> str:
    """A PATH with the shell tools the scripts use and no Python, no pyenv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (
        "bash",
        "env",
        "dirname",
        "ls",
        "grep",
        "mktemp",
        "rm",
        "tail",
        "cat",
        "make",
        "cksum",
        "cut",
    ):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.mark.parametrize(
    ("command", "words"),
    [
        (["scripts/check-template"], ["needs Python 3.12", "pyenv install 3.12"]),
        (["scripts/localstack-tests"], ["needs Python 3.13", "pyenv install 3.13"]),
    ],
)
def test_a_missing_python_fails_the_check_with_the_way_to_get_it(
    tmp_path: Path, command: list[str], words: list[str]
) -> None:
    env = {"PATH": bare_path(tmp_path), "PYENV_ROOT": str(tmp_path / "no-pyenv"), "HOME": str(tmp_path)}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=60, check=False)
    said(done, USAGE, *words)


def test_make_names_a_python_too_old_or_missing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    for python in (str(tmp_path / "python-that-is-not-there"), "python3.9-missing"):
        done = subprocess.run(
            ["make", "--no-print-directory", "venv", f"VENV={venv}", f"PYTHON={python}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0
        assert lines[0].startswith("Error: llmtasks needs Python 3.11 or newer"), done.stderr
        assert "PYTHON=" in lines[0]
        assert not venv.exists()


@pytest.mark.parametrize("amount", ["-1", "lots", "nan"])
def test_a_budget_that_is_not_a_non_negative_amount_is_refused_before_any_key_is_made(amount: str) -> None:
    # The endpoint does not answer: a refusal that reached it would say so instead
    closed = f"http://127.0.0.1:{free_port()}"
    done = llmtasks("keys", "create", "--tenant", "t", "--budget-usd-month", amount, "--endpoint-url", closed)
    said(done, USAGE, "--budget-usd-month")
