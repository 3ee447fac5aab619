"""The `llmtasks` command, one group with a module per audience: `local` (the stack on this
machine: up, invoke, mock-llm), `ops` (operators of a stack: dlq, stats, keys) and `tasks`
(users of the API: submit, status, wait, cancel, list, batch, webhooks).

An expected failure ends a command with one line, `Error: <what> (<where>): <the way out>`, and
an exit code from the table in docs/sdk-cli.md; the traceback is kept for `--debug` (or
LLMTASKS_DEBUG=1).

The group imports a command's module only when that command runs: `--help` and `--version`
load click alone, and `status` the SDK but not boto3 or the emulator.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from llmtasks_local.tool_errors import EXIT_FAILED, EXIT_USAGE, ToolError

# httpx imports its own command line whenever click, rich and pygments are installed, as they are
# beside this one, a large part of every API command's start-up. This process never runs
# httpx's command line, so its import fails here and httpx keeps its stub.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

DEBUG_FLAG = "--debug"


def _debugging(args: list[str]) -> bool:
    return DEBUG_FLAG in args or os.environ.get("LLMTASKS_DEBUG", "").lower() in ("1", "true", "yes")


# Each command: the module that defines it, its function there, and its summary for `--help`
# (its docstring's first sentence; tests/unit/test_cli_errors.py holds them equal).
LAZY_COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("local", "up", "Run the whole application locally, from template.yaml, until Ctrl-C."),
    "invoke": (
        "local",
        "invoke",
        "Run one function of the template with one event, as `sam local invoke` does but without"
        " Docker: logs on stderr, the return value on stdout.",
    ),
    "mock-llm": (
        "local",
        "mock_llm",
        "Serve the mock OpenAI-compatible LLM (knobs also at PUT /_mock/config).",
    ),
    "dlq": ("ops", "dlq", "Dead-letter queues: what is in them, and replaying them."),
    "streams": ("ops", "streams", "TasksTable's stream consumers: unblocking one held on a record."),
    "stats": (
        "ops",
        "stats",
        "Tasks by status, queue and DLQ depths, backlog and in flight per priority and per tenant,"
        " latency p50/p95/p99 over the last hour, batches: the numbers of the local console"
        " (`llmtasks up`, /console), read from the tables and queues.",
    ),
    "keys": ("ops", "keys", "API keys: each maps to a tenant; only their SHA-256 is stored."),
    "submit": (
        "tasks",
        "submit",
        "Submit PROMPT (or - to read it from stdin); print the task id, or with --wait the result.",
    ),
    "status": ("tasks", "status", "A task's status (its result once completed)."),
    "wait": (
        "tasks",
        "wait_for",
        "Print a task's reply as it is written, then its outcome (exit 1 if it failed, 3 on timeout).",
    ),
    "cancel": ("tasks", "cancel", "Cancel a pending or processing task."),
    "tool-outputs": (
        "tasks",
        "tool_outputs",
        "Answer the calls a run in requires_action waits for: CALL_ID=OUTPUT each; the run goes on.",
    ),
    "list": ("tasks", "list_tasks", "Your tasks, newest first."),
    "usage": (
        "tasks",
        "usage",
        "What your LLM calls cost: billed calls, tokens and USD by day, model or API key.",
    ),
    "webhooks": (
        "tasks",
        "webhooks",
        "Webhooks: a task's or batch's delivery attempts, an event sent again, a URL enabled again.",
    ),
    "batch": (
        "tasks",
        "batch",
        "Batches: many prompts as one job (submit a JSON Lines file, follow it, read its results).",
    ),
}


def _cut(summary: str, limit: int) -> str:
    """A summary cut at a word to `limit` characters, ending "...", as click cuts a short help."""
    if len(summary) <= limit:
        return summary
    return summary[: limit - 3].rsplit(" ", 1)[0] + "..."


class Commands(click.Group):
    """Click's group, with every failure said in one or two lines (click's own usage errors
    included, which otherwise print the usage first), and its commands imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(LAZY_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAZY_COMMANDS:
            return None
        module, attribute, _ = LAZY_COMMANDS[cmd_name]
        command: click.Command = getattr(importlib.import_module(f"llmtasks_local.cli.{module}"), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands' list in `--help`, cut as click cuts it, from LAZY_COMMANDS: no command
        module imported."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, _cut(LAZY_COMMANDS[name][2], limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(  # type: ignore[override]  # one signature: it never exits standalone
        self, args: Sequence[str] | None = None, prog_name: str | None = None, **options: Any
    ) -> Any:
        given = list(sys.argv[1:] if args is None else args)
        # --debug anywhere before a `--`, as SAM CLI takes it on every command.
        end = given.index("--") if "--" in given else len(given)
        debug = _debugging(given[:end])
        given = [arg for arg in given[:end] if arg != DEBUG_FLAG] + given[end:]
        try:
            code = super().main(given, prog_name or "llmtasks", standalone_mode=False, **options)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(EXIT_FAILED)
        except click.UsageError as error:
            if debug:
                traceback.print_exc()
            command = error.ctx.command_path if error.ctx else "llmtasks"
            click.echo(f"Error: {error.format_message()} (see `{command} --help`)", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as error:
            click.echo(f"Error: {error.format_message()}", err=True)
            sys.exit(error.exit_code)
        except ToolError as error:
            if debug:
                traceback.print_exc()
            click.echo(f"Error: {error}", err=True)
            sys.exit(error.exit_code)
        except Exception as error:
            if debug:
                raise
            said = f"unexpected {type(error).__name__}: {error}"
            click.echo(f"Error: {said} (run again with --debug for the traceback)", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(code if isinstance(code, int) else 0)


def _show_versions(ctx: click.Context, _param: click.Parameter, given: bool) -> None:
    """`--version`: the three distributions' releases, read from their metadata when asked
    (importlib.metadata's imports are not paid by every other command; nor is the SDK's, for
    its version)."""
    if not given or ctx.resilient_parsing:
        return
    from importlib.metadata import version

    click.echo(
        f"llmtasks-local {version('llmtasks-local')} (service llmtasks {version('llmtasks')},"
        f" SDK llmtasks-client {version('llmtasks-client')})"
    )
    ctx.exit()


@click.group(cls=Commands)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_versions,
    help="Show the version and exit.",
)
@click.option(DEBUG_FLAG, is_flag=True, help="Show the traceback of a failure (also LLMTASKS_DEBUG=1).")
def main(debug: bool) -> None:
    """llmtasks: long LLM calls, asynchronously, on AWS serverless or on this machine."""


__all__ = ["main"]
