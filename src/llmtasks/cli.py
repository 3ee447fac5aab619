"""The `llmtasks` command."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llmtasks.client import DEFAULT_URL
from llmtasks.deadletters import QUEUE_NAMES
from llmtasks.deployment import Deployment, QueueName
from llmtasks.models import ITEM_COUNTS, BatchStatus, BatchView, TaskStatus, TaskView

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from llmtasks.apikeys import ApiKeys
    from llmtasks.client import Client
    from llmtasks.deadletters import DeadLetters

# Where `llmtasks up` serves its embedded AWS endpoint.
LOCAL_ENDPOINT = "http://127.0.0.1:4566"


def _overrides(values: tuple[str, ...]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        for item in value.split():
            name, sep, setting = item.partition("=")
            if not sep:
                raise click.BadParameter(
                    f"expected Name=Value, got {item!r}", param_hint="--parameter-overrides"
                )
            pairs[name.removeprefix("ParameterKey=")] = setting
    return pairs


def _split_endpoints(values: tuple[str, ...]) -> str | None:
    """The endpoint for every service (None: the embedded moto), from `--endpoint-url` values
    and AWS_ENDPOINT_URL; each SERVICE=URL becomes boto3's own AWS_ENDPOINT_URL_<SERVICE>, which
    every client the stack and its functions create then honours."""
    everything = os.environ.get("AWS_ENDPOINT_URL") or None
    for value in values:
        service, sep, url = value.partition("=")
        if sep and "://" not in service:
            os.environ[f"AWS_ENDPOINT_URL_{service.upper()}"] = url
        else:
            everything = value
    return everything


_template_option = click.option(
    "--template",
    "-t",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default="template.yaml",
    show_default=True,
    help="The SAM template.",
)


class _Commands(click.Group):
    """API errors end a command with their problem's words, not a traceback: exit 2 when the
    request was wrong (4xx), 1 when the service or the network failed."""

    def invoke(self, ctx: click.Context) -> Any:
        import httpx

        from llmtasks.client import ProblemError

        try:
            return super().invoke(ctx)
        except ProblemError as problem:
            click.echo(f"Error: {problem}", err=True)
            ctx.exit(2 if problem.status < 500 else 1)
        except httpx.HTTPError as failure:
            click.echo(f"Error: the API did not answer: {failure}", err=True)
            ctx.exit(1)


@click.group(cls=_Commands)
@click.version_option(package_name="llmtasks")
def main() -> None:
    """llmtasks: long LLM calls, asynchronously, on AWS serverless or on this machine."""


@main.command()
@_template_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Where the HTTP API listens.")
@click.option("--port", default=3000, show_default=True, help="The HTTP API's port.")
@click.option(
    "--endpoint-url",
    multiple=True,
    help="Use this AWS endpoint (e.g. a LocalStack) instead of the embedded moto server; as"
    " SERVICE=URL (e.g. sqs=http://127.0.0.1:4599), for that service alone, the rest staying on"
    " moto. Repeatable. AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE> say the same.",
)
@click.option("--moto-port", default=4566, show_default=True, help="Port of the embedded moto server.")
@click.option(
    "--llm-base-url",
    envvar="LLM_BASE_URL",
    default=None,
    help="An OpenAI-compatible API to use instead of the mock LLM.",
)
@click.option("--mock-port", default=8800, show_default=True, help="Port of the mock LLM.")
@click.option(
    "--mock-latency", type=float, default=1.0, show_default=True, help="Seconds each mock call takes."
)
@click.option(
    "--parameter-overrides", multiple=True, help="Template parameters, as Name=Value (SAM's format)."
)
@click.option("--no-auth", is_flag=True, help="Serve the API without API keys (local experiments).")
@click.option("--verbose", is_flag=True, help="Show the output of moto and the mock LLM.")
@click.option(
    "--report",
    is_flag=True,
    help="Print Lambda's START, END and REPORT lines (duration, memory) for each invocation.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep tables, queues and objects here across restarts [default: .llmtasks/state beside"
    " the template].",
)
@click.option("--reset", is_flag=True, help="Start empty, forgetting what the state dir holds.")
@click.option("--no-state", is_flag=True, help="Keep nothing: every start is empty.")
@click.option(
    "--grace",
    type=float,
    default=30.0,
    show_default=True,
    help="On Ctrl-C, seconds the calls in flight get to finish (a second Ctrl-C stops at once).",
)
@click.option(
    "--ttl-sweep",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds between deletions of expired items (DynamoDB TTL; 0: never).",
)
def up(
    template: Path,
    host: str,
    port: int,
    endpoint_url: tuple[str, ...],
    moto_port: int,
    llm_base_url: str | None,
    mock_port: int,
    mock_latency: float,
    parameter_overrides: tuple[str, ...],
    no_auth: bool,
    verbose: bool,
    report: bool,
    state_dir: Path | None,
    reset: bool,
    no_state: bool,
    grace: float,
    ttl_sweep: float,
) -> None:
    """Run the whole application locally, from template.yaml, until Ctrl-C. Tasks, queues and
    results are kept in the state dir: a restart goes on where the stack stopped."""
    from llmtasks.local.stack import LocalStack, StackOptions

    if not no_state and state_dir is None:
        state_dir = template.resolve().parent / ".llmtasks" / "state"
    options = StackOptions(
        template=template,
        host=host,
        port=port,
        endpoint_url=_split_endpoints(endpoint_url),
        moto_port=moto_port,
        llm_base_url=llm_base_url,
        mock_port=mock_port,
        mock_latency_s=mock_latency,
        parameter_overrides=_overrides(parameter_overrides),
        quiet_children=not verbose,
        auth=not no_auth,
        report_invocations=report,
        state_dir=None if no_state else state_dir,
        reset=reset,
        grace_s=grace,
        ttl_sweep_s=ttl_sweep,
    )
    stack = LocalStack(options)
    stopped = threading.Event()

    def on_signal(*_: object) -> None:
        # The first stops taking work and lets the calls in flight finish; the second hurries.
        if stopped.is_set():
            stack.hurry.set()
        stopped.set()

    # Both set explicitly: a shell starts background jobs with SIGINT ignored, and Python then
    # raises no KeyboardInterrupt, so `kill -INT` would do nothing.
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, on_signal)
    click.echo("Starting the llmtasks local stack ...")
    stack.start()
    click.echo(f"  API          {stack.api_url}   (docs: {stack.api_url}/docs)")
    click.echo(f"  console      {stack.api_url}/console")
    click.echo(f"  AWS endpoint {stack.endpoint_url}")
    for name, url in sorted(os.environ.items()):
        if name.startswith("AWS_ENDPOINT_URL_"):
            click.echo(f"    {name.removeprefix('AWS_ENDPOINT_URL_').lower():10} {url}")
    click.echo(f"  LLM          {stack.llm_base_url}")
    click.echo(f"  functions    {', '.join(stack.functions)}")
    click.echo(f"  state        {options.state_dir or 'not kept (--no-state)'}")
    if stack.dev_key:
        click.echo(f"  API key      {stack.dev_key}   (tenant 'dev'; more: llmtasks keys create)")
        auth = f' -H "Authorization: Bearer {stack.dev_key}"'
    else:
        click.echo("  auth         off (--no-auth): every request is the default tenant")
        auth = ""
    click.echo(f'Try: curl -X POST {stack.api_url}/tasks{auth} -d \'{{"prompt": "hello"}}\'')
    click.echo("Ready. Ctrl-C stops.")
    try:
        stopped.wait()
    finally:
        click.echo(f"Stopping: the calls in flight get up to {grace:g} s (Ctrl-C again stops at once) ...")
        stack.stop()


@main.command()
@click.argument("function_id", metavar="FUNCTION_LOGICAL_ID")
@click.option(
    "--event",
    "-e",
    type=click.File("r"),
    default=None,
    help="A JSON file with the event ('-' reads stdin); without it the event is {}.",
)
@click.option(
    "--env-vars",
    "-n",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help='SAM\'s env-vars file: {"Parameters": {...}, "FunctionLogicalId": {...}}.',
)
@_template_option
@click.option(
    "--parameter-overrides", multiple=True, help="Template parameters, as Name=Value (SAM's format)."
)
@click.option(
    "--endpoint-url",
    envvar="AWS_ENDPOINT_URL",
    default=None,
    help="The AWS endpoint with the resources (a running `llmtasks up`: http://127.0.0.1:4566);"
    " without it, an empty moto in this process.",
)
def invoke(
    function_id: str,
    event: Any,
    env_vars: Path | None,
    template: Path,
    parameter_overrides: tuple[str, ...],
    endpoint_url: str | None,
) -> None:
    """Run one function of the template with one event, as `sam local invoke` does but without
    Docker: logs on stderr, the return value on stdout. Exit 1 on a function error or timeout."""
    from llmtasks.local.invoke import invoke as invoke_function
    from llmtasks.local.invoke import read_env_vars
    from llmtasks.local.template import TemplateError

    try:
        payload = json.load(event) if event is not None else {}
    except ValueError as error:
        raise click.BadParameter(f"not JSON: {error}", param_hint="--event") from error
    try:
        result = invoke_function(
            template,
            function_id,
            payload,
            env_vars=read_env_vars(env_vars) if env_vars else None,
            parameter_overrides=_overrides(parameter_overrides),
            endpoint_url=endpoint_url,
        )
    except TemplateError as error:
        raise click.UsageError(str(error)) from error
    click.echo(json.dumps(result.reply()))
    if not result.invocation.ok:
        sys.exit(1)


@dataclass(frozen=True)
class Target:
    """The deployment an operator command works on, with clients for it."""

    deployment: Deployment
    sqs: SQSClient
    dynamodb: DynamoDBClient


def _target_of(stack_name: str | None, endpoint_url: str | None) -> Target:
    import boto3

    from llmtasks.deployment import Deployment
    from llmtasks.local.template import PSEUDO_PARAMETERS

    if stack_name:
        sqs, dynamodb = boto3.client("sqs"), boto3.client("dynamodb")
        return Target(Deployment.of_stack(stack_name), sqs, dynamodb)
    # The local stack: moto's keys are fixed, and a real account's must never reach it.
    session = boto3.session.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106 - moto's
        region_name=PSEUDO_PARAMETERS["AWS::Region"],
    )
    url = endpoint_url or LOCAL_ENDPOINT
    # As boto3 itself would: a per-service endpoint (SQS on a LocalStack) wins.
    sqs = session.client("sqs", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_SQS") or url)
    dynamodb = session.client("dynamodb", endpoint_url=os.environ.get("AWS_ENDPOINT_URL_DYNAMODB") or url)
    return Target(Deployment.local(sqs), sqs, dynamodb)


def _dead_letters(stack_name: str | None, endpoint_url: str | None) -> DeadLetters:
    from llmtasks.deadletters import DeadLetters
    from llmtasks.store import TaskStore

    target = _target_of(stack_name, endpoint_url)
    store = TaskStore(target.deployment.tasks_table, target.dynamodb)
    return DeadLetters(target.deployment, store=store, sqs=target.sqs)


def _api_keys(stack_name: str | None, endpoint_url: str | None) -> ApiKeys:
    from llmtasks.apikeys import ApiKeys

    target = _target_of(stack_name, endpoint_url)
    return ApiKeys(target.deployment.api_keys_table, target.dynamodb)


_target = [
    click.option(
        "--stack-name", default=None, help="A deployed stack (sam deploy); default: the local stack."
    ),
    click.option(
        "--endpoint-url",
        envvar="AWS_ENDPOINT_URL",
        default=None,
        help=f"The local stack's AWS endpoint [default: {LOCAL_ENDPOINT}].",
    ),
]


def _targeted(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(_target):
        command = option(command)
    return command


@main.group()
def dlq() -> None:
    """Dead-letter queues: what is in them, and replaying them."""


@dlq.command("list")
@click.option(
    "--queue", "queues", type=click.Choice(QUEUE_NAMES), multiple=True, help="Only this DLQ (default: all)."
)
@click.option("--limit", default=100, show_default=True, help="Messages shown per queue.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@_targeted
def dlq_list(
    queues: tuple[QueueName, ...], limit: int, as_json: bool, stack_name: str | None, endpoint_url: str | None
) -> None:
    """Show each DLQ's depth and its messages with their tasks' last errors."""
    dead_letters = _dead_letters(stack_name, endpoint_url)
    for queue in queues or QUEUE_NAMES:
        letters = dead_letters.letters(queue, limit=limit)
        if as_json:
            for letter in letters:
                click.echo(letter.model_dump_json())
            continue
        click.echo(f"{queue} DLQ: {dead_letters.depth(queue)} message(s)")
        for letter in letters:
            click.echo(
                f"  {letter.task_id or '(no task)':32}  {letter.task_status or 'gone':30}"
                f"  attempts={letter.attempts if letter.attempts is not None else '-'}"
                f"  {(letter.error or '')[:100]}"
            )


@dlq.command("redrive")
@click.option(
    "--queue", type=click.Choice(QUEUE_NAMES), default="tasks", show_default=True, help="Which DLQ to replay."
)
@_targeted
def dlq_redrive(queue: QueueName, stack_name: str | None, endpoint_url: str | None) -> None:
    """Move a DLQ's messages back to their queue (SQS StartMessageMoveTask); their tasks run again."""
    redrive = _dead_letters(stack_name, endpoint_url).redrive(queue)
    if redrive.task_handle is None:
        click.echo(f"The {queue} DLQ is empty; nothing to redrive.")
        return
    click.echo(
        f"Redriving {redrive.messages} message(s) from the {queue} DLQ (task handle"
        f" {redrive.task_handle[:24]}...); {len(redrive.requeued_tasks)} task(s) back to pending."
    )


# --- the API, as a client -------------------------------------------------------------------

EXIT_FAILED = 1  # the task failed or was cancelled (usage errors are click's 2)
EXIT_TIMEOUT = 3
MAX_RESULTS_PAGE = 1000  # the API's largest results page

_api = [
    click.option(
        "--api-url", envvar="LLMTASKS_API_URL", default=DEFAULT_URL, show_default=True, help="The API."
    ),
    click.option("--api-key", envvar="LLMTASKS_API_KEY", default=None, help="An API key (LLMTASKS_API_KEY)."),
    click.option("--json", "as_json", is_flag=True, help="Print the task as JSON."),
]


def _with_api(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(_api):
        command = option(command)
    return command


def _client(api_url: str, api_key: str | None) -> Client:
    from llmtasks.client import Client

    return Client(api_url, api_key)


def _show(task: TaskView, as_json: bool) -> None:
    if as_json:
        click.echo(task.model_dump_json())
    elif task.status is TaskStatus.COMPLETED and task.result is not None:
        click.echo(task.result)
    else:
        reason = f"  {task.error_code}: {task.error}" if task.error_code else ""
        click.echo(f"{task.task_id}  {task.status.value}  attempts={task.attempts}{reason}")


def _wait_and_show(client: Client, task_id: str, timeout: float | None, as_json: bool) -> None:
    """Waits with a spinner (status, elapsed) on a terminal, and the reply's text on stdout as it
    streams in; prints the outcome, exits 0/1/3."""
    from rich.console import Console

    console = Console(stderr=True)
    started = time.monotonic()
    shown = 0  # characters of the reply already printed
    task = client.get(task_id)
    with console.status("", spinner="dots") as spinner:
        while not task.status.is_terminal:
            elapsed = time.monotonic() - started
            if timeout is not None and elapsed >= timeout:
                _show(task, as_json)
                raise SystemExit(EXIT_TIMEOUT)
            if task.partial_result and not as_json and len(task.partial_result) > shown:
                sys.stdout.write(task.partial_result[shown:])
                sys.stdout.flush()
                shown = len(task.partial_result)
            tokens = f"  {task.progress.tokens} tokens" if task.progress else ""
            spinner.update(f"{task.task_id}  {task.status.value}  {elapsed:.0f} s{tokens}")
            # The server holds the read until the task ends or 2 s pass: the text grows between.
            task = client.get(task_id, wait=max(1.0, min(2.0, timeout - elapsed if timeout else 2.0)))
    if shown and task.status is TaskStatus.COMPLETED and task.result is not None and not as_json:
        click.echo(task.result[shown:])  # the rest of what was streamed
    else:
        _show(task, as_json)
    if task.status is not TaskStatus.COMPLETED:
        raise SystemExit(EXIT_FAILED)


@main.command()
@click.argument("prompt")
@click.option("--wait", "wait_", is_flag=True, help="Wait for the result and print it.")
@click.option(
    "--timeout", type=float, default=None, help="With --wait: give up after this many seconds (exit 3)."
)
@click.option("--webhook", default=None, help="A URL to POST the outcome to (signed).")
@click.option("--model", default=None, help="The provider's model id.")
@click.option("--system", default=None, help="A system prompt.")
@_with_api
def submit(
    prompt: str,
    wait_: bool,
    timeout: float | None,
    webhook: str | None,
    model: str | None,
    system: str | None,
    api_url: str,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Submit PROMPT (or - to read it from stdin); print the task id, or with --wait the result."""
    text = sys.stdin.read() if prompt == "-" else prompt
    with _client(api_url, api_key) as client:
        task = client.submit(text, webhook_url=webhook, model=model, system=system)
        if wait_:
            _wait_and_show(client, task.task_id, timeout, as_json)
        elif as_json:
            click.echo(task.model_dump_json())
        else:
            click.echo(task.task_id)


@main.command()
@click.argument("task_id")
@_with_api
def status(task_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """A task's status (its result once completed)."""
    with _client(api_url, api_key) as client:
        _show(client.get(task_id), as_json)


@main.command("wait")
@click.argument("task_id")
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit 3).")
@_with_api
def wait_for(task_id: str, timeout: float | None, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Wait for a task and print its result (exit 1 if it failed, 3 on timeout)."""
    with _client(api_url, api_key) as client:
        _wait_and_show(client, task_id, timeout, as_json)


@main.command()
@click.argument("task_id")
@_with_api
def cancel(task_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Cancel a pending or processing task."""
    with _client(api_url, api_key) as client:
        _show(client.cancel(task_id), as_json)


@main.command("list")
@click.option("--status", "status_", type=click.Choice([s.value for s in TaskStatus]), default=None)
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@_with_api
def list_tasks(status_: str | None, limit: int, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Your tasks, newest first."""
    with _client(api_url, api_key) as client:
        page = client.list(status=status_, limit=limit)
    for task in page.data:
        if as_json:
            click.echo(task.model_dump_json())
        else:
            created = task.created_at.strftime("%Y-%m-%d %H:%M:%S")
            click.echo(f"{task.task_id}  {task.status.value:10} {created}  attempts={task.attempts}")


@main.group()
def batch() -> None:
    """Batches: many prompts as one job (submit a JSON Lines file, follow it, read its results)."""


def _read_items(path: Path) -> list[dict[str, Any]]:
    """One task body a line (blank lines skipped); a line that is not a JSON object is a usage error."""
    items: list[dict[str, Any]] = []
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise click.BadParameter(f"line {number} is not JSON: {exc}", param_hint="FILE") from exc
        if not isinstance(item, dict):
            raise click.BadParameter(f"line {number} is not a JSON object", param_hint="FILE")
        items.append(item)
    if not items:
        raise click.BadParameter("the file has no items", param_hint="FILE")
    return items


def _show_batch(view: BatchView, as_json: bool) -> None:
    if as_json:
        click.echo(view.model_dump_json())
        return
    counts = "  ".join(f"{name}={getattr(view, name)}" for name in ITEM_COUNTS)
    click.echo(f"{view.batch_id}  {view.status.value}  total={view.total}  {counts}")


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

    from llmtasks.client import BatchWaitTimeoutError

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
@_with_api
def batch_submit(
    file: Path,
    wait_: bool,
    timeout: float | None,
    webhook: str | None,
    idempotency_key: str | None,
    api_url: str,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Submit FILE (JSON Lines: one task body a line, each with an optional custom_id; - reads
    stdin); print the batch id, or with --wait follow it to the end (exit 1 if items failed)."""
    items = _read_items(file)
    with _client(api_url, api_key) as client:
        view = client.submit_batch(items, idempotency_key=idempotency_key, webhook_url=webhook)
        if not wait_:
            click.echo(view.model_dump_json() if as_json else view.batch_id)
            return
        view = _follow_batch(client, view.batch_id, timeout)
    _show_batch(view, as_json)
    if view.status is not BatchStatus.COMPLETED:
        raise SystemExit(EXIT_FAILED)


@batch.command("status")
@click.argument("batch_id")
@_with_api
def batch_status(batch_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """A batch's status and its counts by item status."""
    with _client(api_url, api_key) as client:
        _show_batch(client.get_batch(batch_id), as_json)


@batch.command("results")
@click.argument("batch_id")
@_with_api
def batch_results(batch_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Every item in submission order as JSON Lines (custom_id, status, result or error)."""
    with _client(api_url, api_key) as client:
        for row in client.batch_results(batch_id, page_size=MAX_RESULTS_PAGE):
            click.echo(row.model_dump_json())


@batch.command("cancel")
@click.argument("batch_id")
@_with_api
def batch_cancel(batch_id: str, api_url: str, api_key: str | None, as_json: bool) -> None:
    """Cancel a batch: pending items are cancelled, running ones finish or are discarded."""
    with _client(api_url, api_key) as client:
        _show_batch(client.cancel_batch(batch_id), as_json)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the whole overview as JSON.")
@_targeted
def stats(as_json: bool, stack_name: str | None, endpoint_url: str | None) -> None:
    """Tasks by status, queue and DLQ depths, latency p50/p95/p99 over the last hour, batches:
    the numbers of the local console (`llmtasks up`, /console), read from the tables and queues."""
    from llmtasks.stats import overview

    target = _target_of(stack_name, endpoint_url)
    summary = overview(target.dynamodb, target.sqs, target.deployment, now=time.time())
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo("tasks      " + "  ".join(f"{k}={v}" for k, v in summary["tasks"]["by_status"].items()))
    click.echo("queues     " + "  ".join(f"{k}={v}" for k, v in summary["queues"].items()))
    for name, label in (
        ("queue_wait_s", "queue wait"),
        ("llm_s", "LLM time"),
        ("end_to_end_s", "end to end"),
    ):
        cut = summary["latency"][name]
        cuts = "  ".join(f"{p}={cut[p]} s" for p in ("p50", "p95", "p99"))
        click.echo(f"{label:10} {cuts}  (n={cut['n']}, last hour)")
    for batch in summary["batches"]:
        progress = f"{batch['finished']}/{batch['total']}  failed={batch['failed']}"
        click.echo(f"batch      {batch['batch_id']}  {batch['status']}  {progress}")


@main.group()
def keys() -> None:
    """API keys: each maps to a tenant; only their SHA-256 is stored."""


@keys.command("create")
@click.option("--tenant", required=True, help="The tenant whose tasks the key reaches.")
@click.option("--name", default="", help="A note to recognise the key by (who or what uses it).")
@_targeted
def keys_create(tenant: str, name: str, stack_name: str | None, endpoint_url: str | None) -> None:
    """Create a key; it is printed once and cannot be shown again."""
    key, record = _api_keys(stack_name, endpoint_url).create(tenant, name=name)
    click.echo(key)
    click.echo(f"(key id {record.key_id}, tenant {tenant}; keep the key: only its hash is stored)", err=True)


@keys.command("list")
@_targeted
def keys_list(stack_name: str | None, endpoint_url: str | None) -> None:
    """Every key: id, tenant, name, created, revoked (never the key itself)."""
    for record in _api_keys(stack_name, endpoint_url).all():
        created = datetime.fromtimestamp(record.created_at, tz=UTC).strftime("%Y-%m-%d %H:%M")
        revoked = "revoked" if record.revoked_at is not None else "active"
        click.echo(f"{record.key_id}  {record.tenant_id:20} {revoked:8} {created}  {record.name}")


@keys.command("revoke")
@click.argument("key_id")
@_targeted
def keys_revoke(key_id: str, stack_name: str | None, endpoint_url: str | None) -> None:
    """Revoke a key by its id (the part after lt_ and before the next _)."""
    if _api_keys(stack_name, endpoint_url).revoke(key_id) is None:
        raise click.ClickException(f"no key with id {key_id}")
    click.echo(f"revoked {key_id}; requests with it are refused within the authorizer's cache time")


@main.command("mock-llm")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8800, show_default=True)
@click.option("--latency", type=float, default=None, help="Seconds per call (MOCK_LLM_LATENCY_S).")
@click.option("--rate-429", type=float, default=None, help="Share of calls answered 429 (MOCK_LLM_RATE_429).")
@click.option(
    "--retry-after", type=float, default=None, help="Retry-After of each 429 (MOCK_LLM_RETRY_AFTER_S)."
)
@click.option("--rate-500", type=float, default=None, help="Share of calls answered 500 (MOCK_LLM_RATE_500).")
@click.option("--rate-hang", type=float, default=None, help="Share of calls that hang (MOCK_LLM_RATE_HANG).")
@click.option("--hang", type=float, default=None, help="Seconds a hanging call lasts (MOCK_LLM_HANG_S).")
@click.option("--max-rps", type=float, default=None, help="Calls per second before 429s (MOCK_LLM_MAX_RPS).")
def mock_llm(
    host: str,
    port: int,
    latency: float | None,
    rate_429: float | None,
    retry_after: float | None,
    rate_500: float | None,
    rate_hang: float | None,
    hang: float | None,
    max_rps: float | None,
) -> None:
    """Serve the mock OpenAI-compatible LLM (knobs also at PUT /_mock/config)."""
    from llmtasks.llm.mock import MockConfig, serve

    given = {
        "latency_s": latency,
        "rate_429": rate_429,
        "retry_after_s": retry_after,
        "rate_500": rate_500,
        "rate_hang": rate_hang,
        "hang_s": hang,
        "max_rps": max_rps,
    }
    config = MockConfig.model_validate({k: v for k, v in given.items() if v is not None})
    click.echo(f"mock LLM on http://{host}:{port}/v1 ({config.model_dump()})")
    serve(host, port, config)


if __name__ == "__main__":
    main()
