"""How `llmtasks up` runs: the options of one local stack, and where it keeps its state."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from llmtasks_local.emulator.lambda_api import EVENT_RETRY_BASE_S
from llmtasks_local.emulator.ttl import DEFAULT_SWEEP_S


@dataclass
class StackOptions:
    template: Path = Path("template.yaml")
    host: str = "127.0.0.1"
    port: int = 3000
    endpoint_url: str | None = None  # None: start the embedded moto server
    moto_port: int = 4566
    llm_base_url: str | None = None  # None: start the mock LLM
    mock_port: int = 8800
    mock_latency_s: float = 0.0
    parameter_overrides: dict[str, str] = field(default_factory=dict)
    quiet_children: bool = True
    auth: bool = True  # False: `--no-auth`, the gateway makes every request NO_AUTH_TENANT's
    report_invocations: bool = False  # `--report`: Lambda's START, END and REPORT lines
    # `--record-aws-calls`: each AWS call of each function, as IAM authorizes it (aws_calls.py)
    record_aws_calls: Path | None = None
    # Where tables, queues, objects and stream positions are kept across restarts (None: nowhere).
    state_dir: Path | None = None
    reset: bool = False  # start empty, whatever state_dir holds
    # How long a stop lets the invocations in flight finish (Celery's warm shutdown).
    grace_s: float = 30.0
    ttl_sweep_s: float = DEFAULT_SWEEP_S  # how often expired items are deleted (DynamoDB TTL)
    # SAM CLI's --warm-containers: "eager" starts a sandbox of every function before the stack is
    # Ready (`LambdaFunctions.warm_up`); "lazy" starts each at its first invocation.
    warm_containers: Literal["eager", "lazy"] = "lazy"
    # The Lambda API's own port (`sam local start-lambda`'s convention); None: a free one, which
    # Lambda calls reach through the embedded AWS endpoint.
    lambda_port: int | None = None
    # Lambda waits a minute before trying a failed asynchronous invocation again, then two.
    event_retry_base_s: float = EVENT_RETRY_BASE_S


def default_state_dir(template: Path) -> Path:
    """Where a stack keeps its state unless told otherwise: .llmtasks/state beside the template."""
    return template.resolve().parent / ".llmtasks" / "state"
