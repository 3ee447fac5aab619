"""What a template declares about each function, as the local stack runs it: its code and
handler, its limits and environment, the HTTP routes it serves (behind which authorizer) and the
event sources that invoke it. template.py reads these from template.yaml."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# The pseudo parameters' values on the local stack (here, not in template.py, for what runs in a
# sandbox: aws_calls.py names ARNs with them, and a sandbox cannot import the YAML reader).
PSEUDO_PARAMETERS = {
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::StackName": "llmtasks-local",
    "AWS::Partition": "aws",
    "AWS::URLSuffix": "amazonaws.com",
}


@dataclass(frozen=True)
class LambdaAuthorizer:
    """An HttpApi's Lambda authorizer as API Gateway runs it: a request without every identity
    header is refused before the function runs, and its decision is kept per identity."""

    function_id: str  # logical id
    identity_headers: tuple[str, ...] = ()  # Identity.Headers; none: the function always runs
    ttl_s: int = 0  # Identity.ReauthorizeEvery; 0 caches nothing


@dataclass(frozen=True)
class HttpRoute:
    function_id: str
    method: str  # upper case, or ANY
    path: str  # /tasks/{task_id}; {proxy+} is greedy
    authorizer: LambdaAuthorizer | None = None

    @property
    def route_key(self) -> str:
        return f"{self.method} {self.path}"

    def match(self, method: str, path: str) -> dict[str, str] | None:
        """The path parameters when this route serves the request, else None."""
        if self.method not in ("ANY", method.upper()):
            return None
        pattern = ""
        for part in re.split(r"(\{[^}]+\})", self.path):
            if part.startswith("{") and part.endswith("+}"):
                pattern += f"(?P<{part[1:-2]}>.+)"
            elif part.startswith("{"):
                pattern += f"(?P<{part[1:-1]}>[^/]+)"
            else:
                pattern += re.escape(part)
        # A decoded path may hold any character, a newline too.
        found = re.fullmatch(pattern, path, flags=re.DOTALL)
        return found.groupdict() if found else None


@dataclass(frozen=True)
class SqsSource:
    function_id: str
    name: str
    queue_arn: str
    batch_size: int = 10
    batching_window_s: float = 0
    report_batch_item_failures: bool = False
    maximum_concurrency: int | None = None
    enabled: bool = True


@dataclass(frozen=True)
class StreamSource:
    function_id: str
    name: str
    stream_arn: str
    starting_position: str = "LATEST"
    batch_size: int = 100
    batching_window_s: float = 0
    maximum_retry_attempts: int = -1
    bisect_on_error: bool = False
    report_batch_item_failures: bool = False
    filter_patterns: tuple[str, ...] = ()
    on_failure_arn: str | None = None
    enabled: bool = True


@dataclass(frozen=True)
class EventInvokeConfig:
    """What Lambda does with an asynchronous (Event) invocation that fails: it tries it again up
    to `maximum_retry_attempts` times, then sends a record of it to the on-failure destination,
    if there is one (of `on_failure_type`: SQS is the one the local stack sends to)."""

    maximum_retry_attempts: int = 2
    on_failure_type: str | None = None
    on_failure_arn: str | None = None


@dataclass(frozen=True)
class FunctionSpec:
    logical_id: str
    code_dir: Path
    handler: str  # module.function, relative to code_dir
    timeout_s: int
    memory_mb: int
    environment: dict[str, str]
    # The source folders of its layers (ContentUri): on sys.path, as Lambda puts a layer's.
    layer_dirs: tuple[Path, ...] = ()
    routes: tuple[HttpRoute, ...] = ()
    sqs_sources: tuple[SqsSource, ...] = ()
    stream_sources: tuple[StreamSource, ...] = ()
    runtime: str = "python3.12"
    architecture: str = "x86_64"
    event_invoke: EventInvokeConfig = EventInvokeConfig()

    @property
    def handler_file(self) -> Path:
        module = self.handler.rsplit(".", 1)[0]
        return self.code_dir / (module.replace(".", "/") + ".py")
