"""The first code of a sandbox process: `python -m llmtasks_local.emulator.sandbox_main HANDLER FUNCTION`.

It runs AWS's own runtime client (awslambdaric, what Lambda's Python base images run) against
the Runtime API the stack serves for this sandbox, after four things only the emulator needs:
`--record-aws-calls` (each AWS call the function makes, aws_calls.py), the stop's grace (a
stopping stack cuts the running invocation's remaining time, so the worker takes no new work it
could not finish), the CPU the handler takes (written to a file the stack reads for its CPU
account, cpu_account.py: the rest of the sandbox's CPU is the transport around the handler),
and the libraries it imported (listed in its site, for the fork server to preload). None
touches the handler: each wraps what awslambdaric does around it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

RECORD_AWS_CALLS = "LLMTASKS_RECORD_AWS_CALLS"  # a file: each AWS call appended as a JSON line
CUT_FILE = "LLMTASKS_SANDBOX_CUT_FILE"  # where the stack writes the deadline (epoch ms) of a stop
CUT_SIGNAL = signal.SIGUSR1  # "read the cut file": the stack is stopping
CPU_FILE = "LLMTASKS_SANDBOX_CPU_FILE"  # init and handler CPU so far, microseconds
# The function's site (function_site.py), where each function's sandboxes list the libraries
# they imported (in PRELOAD_LISTS, a file a function): what a fork server preloads
# (sandbox_forks.py).
LIST_LIBRARIES_IN = "LLMTASKS_LIST_LIBRARIES_IN"
PRELOAD_LISTS = ".llmtasks-preload"


def _cut_remaining_time(bootstrap: Any) -> None:
    """On CUT_SIGNAL, the context of the invocation in flight ends no later than the deadline
    the stack wrote; later invocations' contexts too."""
    contexts: list[Any] = []
    cut: list[int] = []
    create = bootstrap.create_lambda_context

    def create_and_keep(*args: Any) -> Any:
        context = create(*args)
        if cut:
            context._epoch_deadline_time_in_ms = min(context._epoch_deadline_time_in_ms, cut[0])
        contexts[:] = [context]
        return context

    def on_cut(_signum: int, _frame: Any) -> None:
        try:
            deadline_ms = int(Path(os.environ[CUT_FILE]).read_text())
        except (KeyError, OSError, ValueError):
            return
        cut[:] = [deadline_ms]
        for context in contexts:
            context._epoch_deadline_time_in_ms = min(context._epoch_deadline_time_in_ms, deadline_ms)

    bootstrap.create_lambda_context = create_and_keep
    signal.signal(CUT_SIGNAL, on_cut)


def _count_cpu(bootstrap: Any, path: str) -> None:
    """After each invocation, the CPU this process had taken when its first invocation began (its
    init) and what the handler has taken in all (the process's CPU, so threads it started count
    too), in microseconds, are written over `path`: one write, the same length each time."""
    descriptor = os.open(path, os.O_WRONLY)
    init_us: list[int] = []
    spent = [0]
    get_handler = bootstrap._get_handler

    def get_counted_handler(handler: str) -> Any:
        request_handler = get_handler(handler)

        def counted(event: Any, context: Any) -> Any:
            started = time.process_time_ns()
            if not init_us:
                init_us.append(started // 1000)
            try:
                return request_handler(event, context)
            finally:
                spent[0] += (time.process_time_ns() - started) // 1000
                os.pwrite(descriptor, b"%020d %020d" % (init_us[0], spent[0]), 0)

        return counted

    bootstrap._get_handler = get_counted_handler


def preload_list(site: Path, code_dir: str) -> Path:
    """Where the sandboxes of the function whose code is in `code_dir` list their libraries."""
    import hashlib

    return site / PRELOAD_LISTS / f"{hashlib.sha256(code_dir.encode()).hexdigest()[:16]}.json"


def _list_libraries(bootstrap: Any, site: Path) -> None:
    """After the first invocation (the handler's imports and its first call done), the modules
    imported from the function's site and the standard library, none of its own code, are
    added to its function's list (written only when this sandbox imported one it lacked)."""
    get_handler = bootstrap._get_handler
    roots = (f"{site}/", os.path.dirname(os.__file__) + "/")
    code_dir = os.environ["LAMBDA_TASK_ROOT"]

    def get_listing_handler(handler: str) -> Any:
        request_handler = get_handler(handler)
        first = [True]

        def listing(event: Any, context: Any) -> Any:
            try:
                return request_handler(event, context)
            finally:
                if first:
                    first.clear()
                    _add_to_list(preload_list(site, code_dir), code_dir, roots)

        return listing

    bootstrap._get_handler = get_listing_handler


def _add_to_list(path: Path, code_dir: str, roots: tuple[str, ...]) -> None:
    import json

    imported = [
        name
        for name, module in list(sys.modules.items())
        if name != "__main__" and (getattr(module, "__file__", None) or "").startswith(roots)
    ]
    try:
        listed = json.loads(path.read_text())["modules"]
    except (OSError, ValueError, KeyError, TypeError):
        listed = []
    known = set(listed)
    added = [name for name in imported if name not in known]
    if not added:
        return
    writing = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(exist_ok=True)
        writing.write_text(json.dumps({"code_dir": code_dir, "modules": listed + added}))
        writing.replace(path)
    except OSError:
        writing.unlink(missing_ok=True)


def main() -> None:
    recording = os.environ.pop(RECORD_AWS_CALLS, None)
    if recording:
        from llmtasks_local.emulator import aws_calls

        aws_calls.install(Path(recording), function=os.environ["AWS_LAMBDA_FUNCTION_NAME"])
    from awslambdaric import __main__ as ric
    from awslambdaric import bootstrap

    _cut_remaining_time(bootstrap)
    cpu_file = os.environ.pop(CPU_FILE, None)
    if cpu_file:
        _count_cpu(bootstrap, cpu_file)
    site = os.environ.pop(LIST_LIBRARIES_IN, None)
    if site:
        _list_libraries(bootstrap, Path(site))
    # The function's code comes first on sys.path, as /var/task does in Lambda (PYTHONPATH
    # holds it too, for the modules the handler's module imports).
    sys.path.insert(0, os.environ["LAMBDA_TASK_ROOT"])
    ric.main(sys.argv[:2])  # the handler; the function's name is there for `ps` alone


if __name__ == "__main__":
    main()
