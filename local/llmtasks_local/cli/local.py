"""The local stack on this machine: `up`, `invoke`, `mock-llm`."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from llmtasks_local.cli.options import parameter_overrides_option, parse_overrides, template_option
from llmtasks_local.emulator.endpoints import resolved


def _split_endpoints(values: tuple[str, ...]) -> str | None:
    """The endpoint for every service (None: the embedded moto), from `--endpoint-url` values
    and AWS_ENDPOINT_URL; each SERVICE=URL becomes boto3's own AWS_ENDPOINT_URL_<SERVICE>, which
    every client the stack and its functions create then honours."""
    everything = os.environ.get("AWS_ENDPOINT_URL") or None
    for value in values:
        service, sep, url = value.partition("=")
        if sep and "://" not in service:
            os.environ[f"AWS_ENDPOINT_URL_{service.upper()}"] = resolved(url, service)
        else:
            everything = resolved(value, "dynamodb")
    return everything


@click.command()
@template_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Where the HTTP API listens.")
@click.option("--port", default=3000, show_default=True, help="The HTTP API's port.")
@click.option(
    "--endpoint-url",
    multiple=True,
    help="Use this AWS endpoint (e.g. a LocalStack) instead of the embedded moto server; as"
    " SERVICE=URL (e.g. sqs=http://127.0.0.1:4599), for that service alone, the rest staying on"
    " moto. `localstack` for a URL: the LocalStack that LOCALSTACK_HOST (and USE_SSL) name, as"
    " localstack-client resolves it. Repeatable. AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE>"
    " say the same.",
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
    "--lambda-port",
    type=int,
    default=None,
    help="Serve the Lambda API on this port too, as `sam local start-lambda` does (3001 there)"
    " [default: a free port; Lambda calls reach it through the AWS endpoint].",
)
@click.option(
    "--event-retry-delay",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds before a failed asynchronous (Event) invocation is tried again, doubled for the"
    " second try (Lambda's: a minute, then two).",
)
@click.option(
    "--mock-latency", type=float, default=1.0, show_default=True, help="Seconds each mock call takes."
)
@parameter_overrides_option
@click.option("--no-auth", is_flag=True, help="Serve the API without API keys (local experiments).")
@click.option("--verbose", is_flag=True, help="Show the output of moto and the mock LLM.")
@click.option(
    "--report",
    is_flag=True,
    help="Print Lambda's START, END and REPORT lines (duration, memory) for each invocation.",
)
@click.option(
    "--record-aws-calls",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append each function's AWS calls to this file, one JSON line each (function, IAM action,"
    " resource): what its policy must allow.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep tables, queues and objects here across restarts [default: .llmtasks/state beside"
    " the template].",
)
@click.option(
    "--warm-containers",
    type=click.Choice(["eager", "lazy"], case_sensitive=False),
    default="lazy",
    show_default=True,
    help="SAM CLI's: eager starts a sandbox of every function once the stack is Ready (each"
    " reported as the cold start it is), so the first requests pay none; lazy starts each at its"
    " first invocation.",
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
@click.option(
    "--log-format",
    type=click.Choice(["compact", "json"]),
    default="compact",
    show_default=True,
    help="compact: one line a log record (time, function, request id, level, message);"
    " json: the functions' raw lines, EMF metrics included.",
)
def up(
    template: Path,
    host: str,
    port: int,
    endpoint_url: tuple[str, ...],
    moto_port: int,
    llm_base_url: str | None,
    mock_port: int,
    lambda_port: int | None,
    event_retry_delay: float,
    mock_latency: float,
    parameter_overrides: tuple[str, ...],
    no_auth: bool,
    verbose: bool,
    report: bool,
    record_aws_calls: Path | None,
    warm_containers: str,
    state_dir: Path | None,
    reset: bool,
    no_state: bool,
    grace: float,
    ttl_sweep: float,
    log_format: str,
) -> None:
    """Run the whole application locally, from template.yaml, until Ctrl-C. Tasks, queues and
    results are kept in the state dir: a restart goes on where the stack stopped."""
    from llmtasks_local.emulator.logs import CompactStdout
    from llmtasks_local.emulator.stack import LocalStack
    from llmtasks_local.emulator.stack_keys import DEV_KEY
    from llmtasks_local.emulator.stack_options import StackOptions, default_state_dir

    if not no_state and state_dir is None:
        state_dir = default_state_dir(template)
    options = StackOptions(
        template=template,
        host=host,
        port=port,
        endpoint_url=_split_endpoints(endpoint_url),
        moto_port=moto_port,
        llm_base_url=llm_base_url,
        mock_port=mock_port,
        lambda_port=lambda_port,
        event_retry_base_s=event_retry_delay,
        mock_latency_s=mock_latency,
        parameter_overrides=parse_overrides(parameter_overrides),
        quiet_children=not verbose,
        auth=not no_auth,
        report_invocations=report,
        record_aws_calls=record_aws_calls,
        state_dir=None if no_state else state_dir,
        reset=reset,
        grace_s=grace,
        ttl_sweep_s=ttl_sweep,
        warm_containers="eager" if warm_containers.lower() == "eager" else "lazy",
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
    if log_format == "compact":
        # Before the handlers load: their loggers keep the stdout they find.
        sys.stdout = CompactStdout(sys.stdout)
    stack.start()
    click.echo(f"  AWS endpoint {stack.endpoint_url}")
    for name, url in sorted(os.environ.items()):
        if name.startswith("AWS_ENDPOINT_URL_"):
            click.echo(f"    {name.removeprefix('AWS_ENDPOINT_URL_').lower():10} {url}")
    click.echo(f"  Lambda API   {stack.lambda_url}   (and through the AWS endpoint)")
    click.echo(f"  LLM          {stack.llm_base_url}")
    click.echo(f"  functions    {', '.join(stack.functions)}")
    click.echo(f"  state        {options.state_dir or 'not kept (--no-state)'}")
    # The block a user needs, last, so that it stays in view above the logs.
    click.echo("")
    click.echo(f"  API      {stack.api_url}   (docs: {stack.api_url}/docs)")
    click.echo(f"  console  {stack.console_url}")
    if stack.dev_key:
        kept = (
            f"kept in {options.state_dir / DEV_KEY}: .venv/bin/llmtasks keys dev prints it"
            if options.state_dir
            else "not kept: --no-state"
        )
        click.echo(f"  API key  {stack.dev_key}")
        click.echo(f"           (tenant 'dev'; {kept})")
        auth = f' -H "Authorization: Bearer {stack.dev_key}"'
    else:
        click.echo("  API key  none needed (--no-auth): every request is the default tenant")
        auth = ""
    click.echo(f'  try      curl -X POST {stack.api_url}/tasks{auth} -d \'{{"prompt": "hello"}}\'')
    click.echo("")
    logs = "one line each" if log_format == "compact" else "raw JSON"
    click.echo(f"Ready. Ctrl-C stops. The functions' logs follow, {logs} (--log-format).")
    try:
        stopped.wait()
    finally:
        click.echo(f"Stopping: the calls in flight get up to {grace:g} s (Ctrl-C again stops at once) ...")
        stack.stop()


@click.command()
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
@template_option
@parameter_overrides_option
@click.option(
    "--endpoint-url",
    envvar="AWS_ENDPOINT_URL",
    default=None,
    help="The AWS endpoint with the resources (a running `llmtasks up`: http://127.0.0.1:4566, or"
    " `localstack`: the one LOCALSTACK_HOST names); without it, an empty moto in this process.",
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
    from llmtasks_local.emulator.invoke import invoke as invoke_function
    from llmtasks_local.emulator.invoke import read_env_vars

    try:
        payload = json.load(event) if event is not None else {}
    except ValueError as error:
        raise click.BadParameter(f"{event.name} is not JSON: {error}", param_hint="--event") from error
    result = invoke_function(
        template,
        function_id,
        payload,
        env_vars=read_env_vars(env_vars) if env_vars else None,
        parameter_overrides=parse_overrides(parameter_overrides),
        endpoint_url=resolved(endpoint_url, "dynamodb") if endpoint_url else None,
    )
    click.echo(json.dumps(result.reply()))
    if not result.invocation.ok:
        sys.exit(1)


@click.command("mock-llm")
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
@click.option("--tpm", type=int, default=None, help="Tokens a minute each key may use (MOCK_LLM_TPM).")
@click.option("--rpm", type=int, default=None, help="Requests a minute each key may make (MOCK_LLM_RPM).")
@click.option(
    "--webhook-url",
    default=None,
    help="Where background responses' webhook events go, as OpenAI sends them (MOCK_LLM_WEBHOOK_URL).",
)
@click.option(
    "--webhook-secret",
    default=None,
    help="Their signing secret, whsec_ and base64 (MOCK_LLM_WEBHOOK_SECRET).",
)
@click.option(
    "--fd", type=int, default=None, hidden=True, help="A listening socket handed over by `llmtasks up`."
)
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
    tpm: int | None,
    rpm: int | None,
    webhook_url: str | None,
    webhook_secret: str | None,
    fd: int | None,
) -> None:
    """Serve the mock OpenAI-compatible LLM (knobs also at PUT /_mock/config)."""
    from llmtasks_local.emulator.processes import check_port_free
    from llmtasks_local.mock_llm import MockConfig, serve

    if fd is None:
        check_port_free(host, port, "--port", "the mock LLM")
    given = {
        "latency_s": latency,
        "rate_429": rate_429,
        "retry_after_s": retry_after,
        "rate_500": rate_500,
        "rate_hang": rate_hang,
        "hang_s": hang,
        "max_rps": max_rps,
        "tpm": tpm,
        "rpm": rpm,
        "webhook_url": webhook_url,
        "webhook_secret": webhook_secret,
    }
    config = MockConfig.model_validate({k: v for k, v in given.items() if v is not None})
    click.echo(f"mock LLM on http://{host}:{port}/v1 ({config.model_dump(exclude={'webhook_secret'})})")
    serve(host, port, config, fd=fd)


COMMANDS = [up, invoke, mock_llm]
