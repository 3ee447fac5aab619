"""The expected failures of the local tools, said the way SAM CLI and LocalStack say them.

Each names what went wrong, where (a file and line, a port, an option) and the way out; the
CLI prints it as one line, `Error: <what> (<where>): <the way out>`, and keeps the traceback
for `--debug`. The exit codes are the CLI's table (docs/sdk-cli.md, "Exit codes").
"""

from __future__ import annotations

EXIT_FAILED = 1  # a task failed or was cancelled; a service or the network failed
EXIT_USAGE = 2  # a usage or input error; a request the API refused
EXIT_TIMEOUT = 3  # a wait ran out


class ToolError(Exception):
    """An expected failure with what, where and the way out."""

    exit_code = EXIT_USAGE

    def __init__(
        self, what: str, *, where: str | None = None, fix: str | None = None, exit_code: int | None = None
    ) -> None:
        self.what, self.where, self.fix = what, where, fix
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f" ({self.where})" if self.where else ""
        fix = f": {self.fix}" if self.fix else ""
        return f"{self.what}{where}{fix}"


class ServiceDownError(ToolError):
    """Something the command needs does not answer: an endpoint, the API, a child process."""

    exit_code = EXIT_FAILED
