"""The HTTP API, as its users call it: `submit`, `status`, `wait`, `cancel`, `tool-outputs`,
`list`, `usage`, `batch`, `webhooks`.

Long because every command a user calls on the HTTP API is here, each a few lines over the
same showing and waiting helpers."""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llmtasks_client.models import ITEM_COUNTS, BatchStatus, BatchView, TaskStatus, TaskView, UsageRow
from llmtasks_client.parts import LocalFile, file_part, image_part, text_part
from llmtasks_local.cli.options import client_of, with_api
from llmtasks_local.tool_errors import EXIT_FAILED, EXIT_TIMEOUT, ToolError

if TYPE_CHECKING:
    from llmtasks_client import Client

MAX_RESULTS_PAGE = 1000  # the API's largest results page


def _show(task: TaskView, as_json: bool) -> None:
    if as_json:
        click.echo(task.model_dump_json())
    elif task.status is TaskStatus.COMPLETED and task.parsed is not None:
        click.echo(json.dumps(task.parsed, ensure_ascii=False))
    elif task.status is TaskStatus.COMPLETED and task.result is not None:
        click.echo(task.result)
    else:
        reason = f"  {task.error_code}: {task.error}" if task.error_code else ""
        click.echo(f"{task.task_id}  {task.status.value}  attempts={task.attempts}{reason}")
        # A run waiting for its client: the calls to answer, the MCP calls to approve (llmtasks
        # tool-outputs).
        for call in task.required_action.tool_calls if task.required_action else []:
            click.echo(f"  {call.id}  {call.function.name}({call.function.arguments})")
        for asked in (task.required_action.mcp_approval_requests or []) if task.required_action else []:
            click.echo(f"  {asked.id}  approve? {asked.server_label}: {asked.name}({asked.arguments})")


def _wait_and_show(
    client: Client, task_id: str, timeout: float | None, as_json: bool, after: int = 0
) -> None:
    """Prints the reply's text on stdout as it is written, each chunk once (after chunk `after`),
    with a spinner on a terminal; then the outcome; exits 0, 1 (failed or cancelled) or 3 (timed
    out). A retry's text starts over: a line on stderr says so before it. A run's steps are a
    line each on stderr, in order among its text (`step 3 tool_call search({...}) [endpoint] ->
    ...`); a run that stops for its client is shown with the calls to answer (exit 0)."""
    from rich.console import Console

    from llmtasks_client import TaskFailedError, WaitTimeoutError

    console = Console(stderr=True)
    started = time.monotonic()
    attempt: int | None = None
    shown = mid_line = paused = False
    try:
        with console.status("", spinner="dots") as spinner:
            spinner.update(f"{task_id}  waiting")
            for chunk in client.stream(task_id, after=after, timeout=timeout):
                paused = chunk.event is not None and chunk.event.type == "requires_action"
                if as_json:
                    continue
                if chunk.event is not None:
                    _end_line(mid_line)
                    mid_line = False
                    console.print(chunk.event.line(), markup=False, highlight=False, soft_wrap=True)
                    attempt = None  # the text after a step is the next model call's, not a retry's
                    continue
                if attempt is not None and chunk.attempt != attempt:
                    console.print(f"\n[attempt {chunk.attempt}: the reply starts over]")
                attempt = chunk.attempt
                mid_line = bool(chunk.text) and not chunk.text.endswith("\n")
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
                shown = shown or bool(chunk.text)
                elapsed = time.monotonic() - started
                spinner.update(f"{task_id}  chunk {chunk.sequence}  {elapsed:.0f} s")
    except TaskFailedError:
        _end_line(shown)
        _show(client.get(task_id), as_json)
        raise SystemExit(EXIT_FAILED) from None
    except WaitTimeoutError as timed_out:
        _end_line(shown)
        _show(timed_out.task, as_json)
        raise SystemExit(EXIT_TIMEOUT) from None
    if as_json:
        _show(client.get(task_id), as_json)
    elif paused:
        _end_line(mid_line)
        _show(client.get(task_id), as_json)  # waiting for its client: the calls to answer
    elif shown:
        click.echo()  # the text's last line
    elif after == 0:
        _show(client.get(task_id), as_json)  # no text at all: the task as it ended


def _end_line(shown: bool) -> None:
    if shown:
        click.echo()


def _wait_whole(client: Client, task_id: str, timeout: float | None, as_json: bool) -> None:
    """Waits for the task, then prints it as `status` does (a structured answer as its parsed
    JSON, once); exits 0, 1 (failed or cancelled) or 3 (timed out)."""
    from llmtasks_client import TaskFailedError, WaitTimeoutError

    try:
        task = client.wait(task_id, timeout=timeout)
    except TaskFailedError as failed:
        _show(failed.task, as_json)
        raise SystemExit(EXIT_FAILED) from None
    except WaitTimeoutError as timed_out:
        _show(timed_out.task, as_json)
        raise SystemExit(EXIT_TIMEOUT) from None
    _show(task, as_json)


def _schema_format(path: Path) -> dict[str, Any]:
    """A JSON Schema file as response_format json_schema, strict, named after the file's stem."""
    try:
        schema = json.loads(path.read_text())
    except OSError as error:
        raise ToolError(f"cannot read the schema: {error.strerror}", where=str(path)) from error
    except ValueError as error:
        raise ToolError(f"the schema is not JSON ({error})", where=str(path)) from error
    if not isinstance(schema, dict):
        raise ToolError("the schema is not a JSON object", where=str(path), fix="give a JSON Schema")
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", path.stem)[:64] or "schema"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _media_parts(images: tuple[str, ...], files: tuple[Path, ...]) -> list[dict[str, Any] | LocalFile]:
    """The --image and --file parts, in that order: inline, or uploaded by submit when large."""
    parts: list[dict[str, Any] | LocalFile] = []
    for image in images:
        try:
            parts.append(image_part(image))
        except (OSError, ValueError) as error:
            raise ToolError(f"cannot attach the image: {error}", where=image) from error
    for file in files:
        parts.append(file_part(file))
    return parts


@click.command()
@click.argument("prompt")
@click.option("--wait", "wait_", is_flag=True, help="Wait for the result and print it.")
@click.option(
    "--timeout", type=float, default=None, help="With --wait: give up after this many seconds (exit 3)."
)
@click.option("--webhook", default=None, help="A URL to POST the outcome to (signed).")
@click.option("--model", default=None, help="The provider's model id.")
@click.option("--system", default=None, help="A system prompt.")
@click.option(
    "--max-retries",
    type=click.IntRange(0, 10),
    default=None,
    help="Retries of transient LLM errors (0-10; the API's default 3). 0: fail at the first.",
)
@click.option(
    "--schema",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A JSON Schema file the answer must fit (response_format json_schema, strict, named after"
    " the file); --wait prints the parsed JSON.",
)
@click.option(
    "--image",
    "images",
    multiple=True,
    help="An image (a path, or an http(s) URL) beside the prompt in the user message; repeatable.",
)
@click.option(
    "--file",
    "files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A document (a PDF, a text file) beside the prompt in the user message; repeatable.",
)
@with_api
def submit(
    prompt: str,
    wait_: bool,
    timeout: float | None,
    webhook: str | None,
    model: str | None,
    system: str | None,
    max_retries: int | None,
    schema: Path | None,
    images: tuple[str, ...],
    files: tuple[Path, ...],
    api_url: str,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Submit PROMPT (or - to read it from stdin); print the task id, or with --wait the result.
    Small images and files go inline; larger ones are uploaded first (Files API)."""
    text = sys.stdin.read() if prompt == "-" else prompt
    response_format = None if schema is None else _schema_format(schema)
    parts = _media_parts(images, files)
    given: dict[str, Any] = (
        {"messages": [{"role": "user", "content": [text_part(text), *parts]}]} if parts else {"prompt": text}
    )
    with client_of(api_url, api_key) as client:
        task = client.submit(
            **given,
            response_format=response_format,
            webhook_url=webhook,
            model=model,
            system=system,
            max_retries=max_retries,
        )
        if wait_ and response_format is not None:
            _wait_whole(client, task.task_id, timeout, as_json)
        elif wait_:
            _wait_and_show(client, task.task_id, timeout, as_json)
        elif as_json:
            click.echo(task.model_dump_json())
        else:
            click.echo(task.task_id)


@click.command()
@click.argument("task_id")
@with_api
def status(task_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """A task's status (its result once completed)."""
    with client_of(api_url, api_key) as client:
        _show(client.get(task_id), as_json)


@click.command("wait")
@click.argument("task_id")
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit 3).")
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=0,
    help="Print the reply from after this chunk (its sequence number): resume where you left off.",
)
@with_api
def wait_for(
    task_id: str, timeout: float | None, after: int, api_url: str, api_key: str | None, as_json: bool
) -> None:
    """Print a task's reply as it is written, then its outcome (exit 1 if it failed, 3 on timeout)."""
    with client_of(api_url, api_key) as client:
        _wait_and_show(client, task_id, timeout, as_json, after)


@click.command()
@click.argument("task_id")
@with_api
def cancel(task_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Cancel a pending or processing task."""
    with client_of(api_url, api_key) as client:
        _show(client.cancel(task_id), as_json)


@click.command("tool-outputs")
@click.argument("task_id")
@click.argument("outputs", nargs=-1)
@click.option("--approve", "approved", multiple=True, metavar="ID", help="Approve this MCP call.")
@click.option("--deny", "denied", multiple=True, metavar="ID", help="Deny this MCP call.")
@with_api
def tool_outputs(
    task_id: str,
    outputs: tuple[str, ...],
    approved: tuple[str, ...],
    denied: tuple[str, ...],
    api_url: str,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Answer the calls a run in requires_action waits for: CALL_ID=OUTPUT each; the run goes on."""
    pairs = [given.partition("=") for given in outputs]
    if any(not sep or not call for call, sep, _ in pairs):
        raise click.BadParameter("each output is CALL_ID=OUTPUT", param_hint="OUTPUTS")
    if not pairs and not approved and not denied:
        raise click.UsageError("give CALL_ID=OUTPUT, --approve ID or --deny ID")
    approvals = {**dict.fromkeys(approved, True), **dict.fromkeys(denied, False)}
    with client_of(api_url, api_key) as client:
        answered = client.submit_tool_outputs(
            task_id, {call: text for call, _, text in pairs}, approvals=approvals
        )
    _show(answered, as_json)


@click.command("list")
@click.option("--status", "status_", type=click.Choice([s.value for s in TaskStatus]), default=None)
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@with_api
def list_tasks(status_: str | None, limit: int, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Your tasks, newest first."""
    with client_of(api_url, api_key) as client:
        page = client.list(status=status_, limit=limit)
    for task in page.data:
        if as_json:
            click.echo(task.model_dump_json())
        else:
            created = task.created_at.strftime("%Y-%m-%d %H:%M:%S")
            click.echo(f"{task.task_id}  {task.status.value:10} {created}  attempts={task.attempts}")


@click.command()
@click.option(
    "--from", "first", type=click.DateTime(["%Y-%m-%d"]), help="First UTC day (default: 29 days before --to)"
)
@click.option(
    "--to", "last", type=click.DateTime(["%Y-%m-%d"]), help="Last UTC day, included (default: today)"
)
@click.option(
    "--by", "group_by", type=click.Choice(["day", "model", "key"]), default="day", show_default=True
)
@with_api
def usage(
    first: datetime | None,
    last: datetime | None,
    group_by: str,
    api_url: str,
    api_key: str | None,
    as_json: bool,
) -> None:
    """What your LLM calls cost: billed calls, tokens and USD by day, model or API key."""
    with client_of(api_url, api_key) as client:
        report = client.usage(
            first=first.date() if first else None, last=last.date() if last else None, group_by=group_by
        )
    if as_json:
        click.echo(report.model_dump_json(by_alias=True))
        return
    click.echo(f"{group_by:<28} {'calls':>8} {'prompt':>12} {'completion':>12} {'cost USD':>14}")
    for row in [*report.data, UsageRow(group="total", **report.total.model_dump())]:
        unknown = f"  ({row.cost_unknown_calls} unpriced)" if row.cost_unknown_calls else ""
        tokens = f"{row.prompt_tokens:>12} {row.completion_tokens:>12}"
        click.echo(f"{row.group or '(no key)':<28} {row.calls:>8} {tokens} {row.cost_usd:>14.6f}{unknown}")


@click.group()
def batch() -> None:
    """Batches: many prompts as one job (submit a JSON Lines file, follow it, read its results)."""


# Larger files go through an upload URL: a request's body is at most 6 MB.
INLINE_BATCH_BYTES = 4 * 1024 * 1024


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as error:
        raise ToolError(f"cannot read the batch file: {error.strerror}", where=str(path)) from error


def _read_items(path: Path) -> list[dict[str, Any]]:
    """One task body a line (blank lines skipped). A line that is not a JSON object stops the
    command before anything is sent, naming the file and the line."""
    items: list[dict[str, Any]] = []
    nothing_sent = "correct it; nothing was submitted"
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as error:
        raise ToolError(f"cannot read the batch file: {error.strerror}", where=str(path)) from error
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ToolError(
                f"line {number} is not JSON ({exc})", where=f"{path}:{number}", fix=nothing_sent
            ) from exc
        if not isinstance(item, dict):
            raise ToolError(
                f"line {number} is not a JSON object (a task body)",
                where=f"{path}:{number}",
                fix=nothing_sent,
            )
        items.append(item)
    if not items:
        raise ToolError("the batch file has no items", where=str(path), fix="give one task body a line")
    return items


def _show_batch(view: BatchView, as_json: bool) -> None:
    if as_json:
        click.echo(view.model_dump_json())
        return
    counts = "  ".join(f"{name}={getattr(view, name)}" for name in ITEM_COUNTS)
    click.echo(f"{view.batch_id}  {view.status.value}  total={view.total}  {counts}")
    if view.refused_lines:
        click.echo(
            f"{view.refused_lines} line(s) of its file are not items: GET /batches/{view.batch_id}/refused",
            err=True,
        )
    for error in view.errors or []:
        click.echo(f"Error: {error}", err=True)


def _follow_batch(client: Client, batch_id: str, timeout: float | None) -> BatchView:
    """Waits with a live progress bar on stderr: done/failed/total, rate and time left."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from llmtasks_client import BatchWaitTimeoutError

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        bar = progress.add_task(batch_id[:12], total=None, failed=0, rate="")
        started = time.monotonic()

        def show(view: BatchView) -> None:
            rate = view.finished / max(1e-9, time.monotonic() - started)
            progress.update(
                bar,
                total=view.total,
                completed=view.finished,
                failed=view.failed,
                rate=f"{rate:.1f}/s",
                description=f"{batch_id[:12]} {view.status.value}",
            )

        try:
            return client.wait_batch(batch_id, timeout=timeout, on_progress=show)
        except BatchWaitTimeoutError as late:
            _show_batch(late.batch, as_json=False)
            raise SystemExit(EXIT_TIMEOUT) from late


@batch.command("submit")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@click.option("--wait", "wait_", is_flag=True, help="Follow the batch with a progress bar until it ends.")
@click.option(
    "--timeout", type=float, default=None, help="With --wait: give up after this many seconds (exit 3)."
)
@click.option("--webhook", default=None, help="A URL to POST batch.completed to (signed).")
@click.option(
    "--idempotency-key", default=None, help="Send the same batch again safely: it fans out only once."
)
@click.option(
    "--upload",
    is_flag=True,
    help="Send FILE to storage through an upload URL and let the service read it (up to 256 MiB; its"
    " lines that are not items are reported, not fatal). Files over"
    f" {INLINE_BATCH_BYTES // 2**20} MiB always are.",
)
@with_api
def batch_submit(
    file: Path,
    wait_: bool,
    timeout: float | None,
    webhook: str | None,
    idempotency_key: str | None,
    upload: bool,
    api_url: str,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Submit FILE (JSON Lines: one task body a line, each with an optional custom_id; - reads
    stdin); print the batch id, or with --wait follow it to the end (exit 1 if items failed)."""
    uploaded = str(file) != "-" and (upload or _size_of(file) > INLINE_BATCH_BYTES)
    items = None if uploaded else _read_items(file)
    with client_of(api_url, api_key) as client:
        given = client.upload_batch_file(file) if items is None else items
        view = client.submit_batch(given, idempotency_key=idempotency_key, webhook_url=webhook)
        if not wait_:
            click.echo(view.model_dump_json() if as_json else view.batch_id)
            return
        view = _follow_batch(client, view.batch_id, timeout)
    _show_batch(view, as_json)
    if view.status is not BatchStatus.COMPLETED:
        raise SystemExit(EXIT_FAILED)


@batch.command("status")
@click.argument("batch_id")
@with_api
def batch_status(batch_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """A batch's status and its counts by item status."""
    with client_of(api_url, api_key) as client:
        _show_batch(client.get_batch(batch_id), as_json)


@batch.command("results")
@click.argument("batch_id")
@with_api
def batch_results(batch_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Every item in submission order as JSON Lines (custom_id, status, result or error)."""
    with client_of(api_url, api_key) as client:
        for row in client.batch_results(batch_id, page_size=MAX_RESULTS_PAGE):
            click.echo(row.model_dump_json())


@batch.command("cancel")
@click.argument("batch_id")
@with_api
def batch_cancel(batch_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Cancel a batch: pending items are cancelled, running ones finish or are discarded."""
    with client_of(api_url, api_key) as client:
        _show_batch(client.cancel_batch(batch_id), as_json)


@batch.command("retry")
@click.argument("batch_id")
@click.option(
    "--cancelled", is_flag=True, help="Run its cancelled items again too (or alone with --no-failed)."
)
@click.option("--failed/--no-failed", default=True, help="Run its failed items again (the default).")
@click.option(
    "--wait", "wait_", is_flag=True, help="Follow the batch with a progress bar until it ends again."
)
@with_api
def batch_retry(
    batch_id: str,
    cancelled: bool,
    failed: bool,
    wait_: bool,
    api_url: str,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Run an ended batch's failed (and with --cancelled, cancelled) items again, in the same
    batch: same ids and custom_ids, each a new attempt of its task."""
    statuses = [name for name, chosen in (("failed", failed), ("cancelled", cancelled)) if chosen]
    if not statuses:
        raise click.UsageError("Nothing to retry: --no-failed needs --cancelled.")
    with client_of(api_url, api_key) as client:
        view = client.retry_batch(batch_id, statuses=statuses)
        if wait_:
            view = _follow_batch(client, batch_id, timeout=None)
        _show_batch(view, as_json)


@click.group()
def webhooks() -> None:
    """Webhooks: a task's or batch's delivery attempts, an event sent again, a URL enabled again."""


_BATCH_FLAG = click.option("--batch", "is_batch", is_flag=True, help="ID is a batch's, not a task's.")


@webhooks.command("attempts")
@click.argument("subject_id", metavar="ID")
@_BATCH_FLAG
@with_api
def webhook_attempts(
    subject_id: str, is_batch: bool, api_url: str, api_key: str | None, as_json: bool
) -> None:
    """Every HTTP attempt at the webhook of task (or --batch) ID, newest first."""
    with client_of(api_url, api_key) as client:
        attempts = (
            client.batch_webhook_attempts(subject_id) if is_batch else client.webhook_attempts(subject_id)
        )
    for attempt in attempts:
        if as_json:
            click.echo(attempt.model_dump_json())
            continue
        answer = str(attempt.status_code) if attempt.status_code is not None else "-"
        when = f"{attempt.at:%Y-%m-%d %H:%M:%S}"
        line = f"{when}  {attempt.trigger:9} {answer:>3}  {attempt.latency_ms:>6} ms  {attempt.outcome}"
        if attempt.error:
            line += f"  ({attempt.error})"
        if attempt.next_attempt_at is not None:
            line += f"  next at {attempt.next_attempt_at:%H:%M:%S}"
        click.echo(line)


@webhooks.command("replay")
@click.argument("subject_id", metavar="ID")
@_BATCH_FLAG
@with_api
def webhook_replay(subject_id: str, is_batch: bool, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Send the ended task's (or --batch's) event again now: same webhook-id, fresh signature."""
    with client_of(api_url, api_key) as client:
        replay = client.replay_batch_webhook(subject_id) if is_batch else client.replay_webhook(subject_id)
    if as_json:
        click.echo(replay.model_dump_json())
    else:
        click.echo(f"{replay.event_type} {replay.webhook_id} queued")


@webhooks.command("enable")
@click.argument("url")
@with_api
def webhook_enable(url: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Attempt deliveries to URL again after it was disabled for failing (then replay what it missed)."""
    with client_of(api_url, api_key) as client:
        client.enable_webhook_endpoint(url)
    click.echo(json.dumps({"url": url, "status": "enabled"}) if as_json else f"{url} enabled")


COMMANDS = [submit, status, wait_for, cancel, tool_outputs, list_tasks, usage, batch, webhooks]
