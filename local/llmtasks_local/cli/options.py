"""Options that several commands share, and the clients they lead to.

Light to import (click alone): every command module imports this one, and a command pays only
for the clients it uses (the SDK for the API's commands, boto3 for the operators'), inside it."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from llmtasks_local.tool_errors import EXIT_FAILED, EXIT_USAGE, ServiceDownError, ToolError

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

    from llmtasks.ops.deployment import Deployment
    from llmtasks_client import Client

# Where `llmtasks up` serves its embedded AWS endpoint: also a LocalStack's, by default.
LOCAL_ENDPOINT = "http://127.0.0.1:4566"
# Where `llmtasks up` serves the API: the SDK's DEFAULT_URL too (a unit test holds them equal;
# the SDK itself is imported only by the commands that call the API).
API_URL = "http://127.0.0.1:3000"


def parse_overrides(values: tuple[str, ...]) -> dict[str, str]:
    """SAM's --parameter-overrides: `Name=Value` pairs (or `ParameterKey=Name,...`), space-separated."""
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


parameter_overrides_option = click.option(
    "--parameter-overrides", multiple=True, help="Template parameters, as Name=Value (SAM's format)."
)

template_option = click.option(
    "--template",
    "-t",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default="template.yaml",
    show_default=True,
    help="The SAM template.",
)


def _stacked(options: list[Callable[[Any], Any]]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


# --- operator commands: a deployment's tables and queues ---------------------------------------


@dataclass(frozen=True)
class Target:
    """The deployment an operator command works on, with clients for it."""

    deployment: Deployment
    sqs: SQSClient
    dynamodb: DynamoDBClient
    cloudwatch: CloudWatchClient


def endpoint_for(service: str, endpoint_url: str | None) -> str:
    """Where an operator command finds `service` on this machine. As boto3 itself would: a
    per-service endpoint (SQS on a LocalStack) wins, then --endpoint-url; without any,
    LocalStack's conventions (LOCALSTACK_HOST), whose default is `llmtasks up`'s moto."""
    from llmtasks_local.emulator.endpoints import localstack_endpoint, resolved

    named = os.environ.get(f"AWS_ENDPOINT_URL_{service.upper()}") or endpoint_url
    return resolved(named, service) if named else localstack_endpoint(service)


def target_of(stack_name: str | None, endpoint_url: str | None) -> Target:
    import boto3

    from llmtasks.ops.deployment import Deployment
    from llmtasks_local.sam.function_spec import PSEUDO_PARAMETERS
    from llmtasks_local.sam.provision import local_deployment

    if stack_name:
        sqs, dynamodb = boto3.client("sqs"), boto3.client("dynamodb")
        return Target(Deployment.of_stack(stack_name), sqs, dynamodb, boto3.client("cloudwatch"))
    # The local stack: moto's keys are fixed, and a real account's must never reach it.
    session = boto3.session.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106 - moto's
        region_name=PSEUDO_PARAMETERS["AWS::Region"],
    )
    sqs = session.client("sqs", endpoint_url=endpoint_for("sqs", endpoint_url))
    dynamodb = session.client("dynamodb", endpoint_url=endpoint_for("dynamodb", endpoint_url))
    cloudwatch = session.client("cloudwatch", endpoint_url=endpoint_for("cloudwatch", endpoint_url))
    return Target(local_deployment(sqs), sqs, dynamodb, cloudwatch)  # `targeted` says a silent endpoint


@contextmanager
def aws_errors(endpoint: str) -> Iterator[None]:
    """An endpoint that does not answer, said as one line instead of botocore's traceback."""
    from botocore.exceptions import EndpointConnectionError

    try:
        yield
    except EndpointConnectionError as error:
        raise ServiceDownError(
            f"the AWS endpoint {endpoint} does not answer",
            where="--endpoint-url",
            fix="start the local stack (make up), or name its endpoint with --endpoint-url",
        ) from error


def targeted(command: Callable[..., None]) -> Callable[..., None]:
    """--stack-name and --endpoint-url; a refused connection to the endpoint is one clear line."""

    @functools.wraps(command)
    def run(*args: Any, stack_name: str | None, endpoint_url: str | None, **kwargs: Any) -> None:
        with aws_errors(endpoint_for("sqs", endpoint_url)):
            command(*args, stack_name=stack_name, endpoint_url=endpoint_url, **kwargs)

    return _stacked(
        [
            click.option(
                "--stack-name", default=None, help="A deployed stack (sam deploy); default: the local stack."
            ),
            click.option(
                "--endpoint-url",
                envvar="AWS_ENDPOINT_URL",
                default=None,
                help="The local stack's AWS endpoint, or `localstack` [default: LOCALSTACK_HOST's, as"
                f" localstack-client resolves it: {LOCAL_ENDPOINT} unless it is set].",
            ),
        ]
    )(run)


# --- API commands: the HTTP API, as a client ---------------------------------------------------


def with_api(command: Callable[..., None]) -> Callable[..., None]:
    """--api-url, --api-key and --json; the API's refusals and silences as one clear line."""

    @functools.wraps(command)
    def run(*args: Any, api_url: str, api_key: str | None, **kwargs: Any) -> None:
        import httpx

        from llmtasks_client import ProblemError

        try:
            command(*args, api_url=api_url, api_key=api_key, **kwargs)
        except ProblemError as problem:
            if problem.status in (401, 403):
                given = "the API key was refused" if api_key else "no API key was given"
                raise ToolError(
                    f"{problem}; {given}",
                    where="--api-key, LLMTASKS_API_KEY",
                    fix="use the key `make up` printed (`.venv/bin/llmtasks keys dev` prints it again)",
                ) from problem
            raise ToolError(
                str(problem), exit_code=EXIT_USAGE if problem.status < 500 else EXIT_FAILED
            ) from problem
        except httpx.HTTPError as failure:
            raise ServiceDownError(
                f"the API at {api_url} did not answer ({type(failure).__name__}: {failure})",
                where="--api-url, LLMTASKS_API_URL",
                fix="start the local stack with `make up`, or name the API with --api-url",
            ) from failure

    return _stacked(
        [
            click.option(
                "--api-url",
                envvar="LLMTASKS_API_URL",
                default=API_URL,
                show_default=True,
                help="The API (LLMTASKS_API_URL).",
            ),
            click.option(
                "--api-key", envvar="LLMTASKS_API_KEY", default=None, help="An API key (LLMTASKS_API_KEY)."
            ),
            click.option("--json", "as_json", is_flag=True, help="Print the reply as JSON."),
        ]
    )(run)


def client_of(api_url: str, api_key: str | None) -> Client:
    from llmtasks_client import Client

    if not api_url.startswith(("http://", "https://")):
        raise ToolError(
            f"the API URL {api_url!r} is not an http(s) URL",
            where="--api-url, LLMTASKS_API_URL",
            fix=f"give one such as {API_URL}",
        )
    return Client(api_url, api_key or None)
