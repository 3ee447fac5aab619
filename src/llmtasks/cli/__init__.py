"""The `llmtasks` command, one group with a module per audience: `local` (the stack on this
machine: up, invoke, mock-llm), `ops` (operators of a stack: dlq, stats, keys) and `tasks`
(users of the API: submit, status, wait, cancel, list, batch).

An expected failure ends a command with one line, `Error: <what> (<where>): <the way out>`, and
an exit code from the table in the README; the traceback is kept for `--debug` (or
LLMTASKS_DEBUG=1).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from llmtasks.cli import local, ops, tasks
from llmtasks.tool_errors import EXIT_FAILED, EXIT_USAGE, ToolError

DEBUG_FLAG = "--debug"


def _debugging(args: list[str]) -> bool:
    return DEBUG_FLAG in args or os.environ.get("LLMTASKS_DEBUG", "").lower() in ("1", "true", "yes")


class Commands(click.Group):
    """Click's group, with every failure said in one or two lines (click's own usage errors
    included, which otherwise print the usage first)."""

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


@click.group(cls=Commands)
@click.version_option(package_name="llmtasks")
@click.option(DEBUG_FLAG, is_flag=True, help="Show the traceback of a failure (also LLMTASKS_DEBUG=1).")
def main(debug: bool) -> None:
    """llmtasks: long LLM calls, asynchronously, on AWS serverless or on this machine."""


for module in (local, ops, tasks):
    for command in module.COMMANDS:
        main.add_command(command)

__all__ = ["main"]
