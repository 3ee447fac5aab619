"""`llmtasks invoke`: one function, one event, as `sam local invoke` runs it, without Docker.

The function is read from the template as the local stack reads it (Handler, CodeUri, Layers,
Environment with its Refs resolved to the local resources, Timeout, MemorySize); SAM's env-vars
file and parameter overrides apply with SAM's meaning. The handler runs in a sandbox of the
emulator's runtime. As with `sam local invoke`, the logs and Lambda's START, END and REPORT lines
go to stderr and the function's return value alone to stdout.

The resources live on `endpoint_url` (a running `llmtasks up` serves them on
http://127.0.0.1:4566, LocalStack on its own port); without one, on an empty moto in this
process, created for the invocation and gone with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from llmtasks_local.emulator.processes import check_answers
from llmtasks_local.emulator.runtime import FunctionRuntime, Invocation, print_to_stderr
from llmtasks_local.sam.function_spec import PSEUDO_PARAMETERS, FunctionSpec
from llmtasks_local.sam.provision import provision
from llmtasks_local.sam.template import Template, TemplateError


@dataclass(frozen=True)
class InvokeResult:
    invocation: Invocation
    request_id: str

    def reply(self) -> Any:
        """What `sam local invoke` prints on stdout: the return value, or Lambda's error object."""
        invocation = self.invocation
        if invocation.timed_out:
            return {"errorMessage": f"{self.request_id} Task timed out", "errorType": "TimeoutError"}
        if invocation.error is not None:
            error_type, _, message = invocation.error.partition(": ")
            return {"errorMessage": message or error_type, "errorType": error_type}
        return invocation.payload


def read_env_vars(path: Path) -> dict[str, dict[str, str]]:
    """SAM's env-vars file: `{"Parameters": {...}, "FunctionLogicalId": {...}}`."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise TemplateError(f"not a JSON env-vars file ({error})", where=f"{path}, --env-vars") from error
    if not isinstance(body, dict) or not all(isinstance(v, dict) for v in body.values()):
        raise TemplateError(
            "not an env-vars file",
            where=f"{path}, --env-vars",
            fix='SAM\'s form is {"Parameters": {...}, "FunctionLogicalId": {...}}',
        )
    return {str(k): {str(name): str(value) for name, value in v.items()} for k, v in body.items()}


def function_environment(spec: FunctionSpec, env_vars: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The template's variables of the function, overridden by the env-vars file as SAM does it:
    "Parameters" for every function, then the function's own section, and only for variables
    the template declares (SAM ignores the rest)."""
    variables = dict(spec.environment)
    for section in ("Parameters", spec.logical_id):
        for name, value in (env_vars.get(section) or {}).items():
            if name in variables:
                variables[name] = value
    return variables


def ignored_variables(spec: FunctionSpec, env_vars: Mapping[str, Mapping[str, str]]) -> list[str]:
    given = {name for section in ("Parameters", spec.logical_id) for name in env_vars.get(section) or {}}
    return sorted(given - set(spec.environment))


@contextlib.contextmanager
def _environment(variables: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _backend(endpoint_url: str | None) -> Iterator[dict[str, str]]:
    """The AWS variables the function sees; without an endpoint, a moto of this process's own,
    served on 127.0.0.1 (the sandbox is a process of its own) while the block runs."""
    aws = {
        "AWS_DEFAULT_REGION": PSEUDO_PARAMETERS["AWS::Region"],
        "AWS_REGION": PSEUDO_PARAMETERS["AWS::Region"],
        "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
        "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
    }
    if endpoint_url is not None:
        with _environment({**aws, "AWS_ENDPOINT_URL": endpoint_url}):
            yield aws | {"AWS_ENDPOINT_URL": endpoint_url}
        return
    from moto.server import ThreadedMotoServer

    from llmtasks_local import moto_patches

    moto_patches.install()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    # Never a real account's credentials, even by mistake.
    local = aws | {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
    }
    try:
        with _environment(local):
            os.environ.pop("AWS_PROFILE", None)
            os.environ.pop("AWS_SESSION_TOKEN", None)
            yield local
    finally:
        server.stop()


def invoke(
    template_path: Path,
    function_id: str,
    event: Any,
    *,
    env_vars: Mapping[str, Mapping[str, str]] | None = None,
    parameter_overrides: Mapping[str, str] | None = None,
    endpoint_url: str | None = None,
) -> InvokeResult:
    template = Template.load(template_path, parameter_overrides)
    functions_declared = template.resources("AWS::Serverless::Function")
    if function_id not in functions_declared:
        raise TemplateError(
            f"{function_id} is not a function of the template",
            where=str(template_path),
            fix=f"name one of {', '.join(functions_declared)}",
        )
    template.check()
    if endpoint_url is not None:
        check_answers(endpoint_url)
    request_id = str(uuid.uuid4())
    with _backend(endpoint_url) as aws:
        resources = provision(
            template, dynamodb=boto3.client("dynamodb"), sqs=boto3.client("sqs"), s3=boto3.client("s3")
        )
        spec = template.functions(resources.refs, resources.attributes)[function_id]
        for name in ignored_variables(spec, env_vars or {}):
            print(
                f"env-vars: {name} is not in {function_id}'s Environment; ignored (as SAM does)",
                file=sys.stderr,
            )
        spec = dataclasses.replace(spec, environment=function_environment(spec, env_vars or {}))
        # The sandbox sees the AWS variables above beneath the function's own, as in the stack.
        runtime = FunctionRuntime(
            spec, concurrency=1, report=True, environment={**os.environ, **aws}, on_line=print_to_stderr
        )
        # The handler's output (its logs) goes to stderr, as sam local invoke prints it.
        with contextlib.redirect_stdout(sys.stderr):
            print(f"Invoking {spec.handler} ({spec.logical_id}, timeout {spec.timeout_s} s)")
            invocation = runtime.invoke(event, request_id=request_id, synchronous=True)
        runtime.close()
    return InvokeResult(invocation, request_id)
