"""A function's parts are built as its handler module is imported in a Lambda sandbox (its init
phase: a sandbox started ahead serves its first invocation as fast as its next), and only there:
imported elsewhere, nothing is built until a handler uses it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from llmtasks.wiring import adapters, api, authorizer, batch, webhook, worker
from tests.conftest import Aws
from tests.helpers import load_handler

WIRINGS: tuple[ModuleType, ...] = (adapters, api, authorizer, batch, webhook, worker)


def unbuild_every_part() -> None:
    for module in WIRINGS:
        for part in vars(module).values():
            if hasattr(part, "cache_clear"):
                part.cache_clear()


@pytest.fixture(autouse=True)
def nothing_built() -> Iterator[None]:
    """Every part unbuilt before and after: those built here hold this test's moto clients."""
    unbuild_every_part()
    yield
    unbuild_every_part()


@pytest.mark.parametrize(
    ("function_id", "parts"),
    [
        ("SubmitFunction", (api.task_service,)),
        ("StatusFunction", (api.task_service,)),
        ("AuthorizerFunction", (authorizer.api_keys,)),
        ("WorkerFunction", (worker.task_runner,)),
        ("WebhookFunction", (webhook.webhook_relay, webhook.webhook_delivery)),
        ("BatchFunction", (batch.batch_fanout, batch.batch_progress)),
    ],
)
def test_a_function_s_parts_are_built_at_init_in_lambda_and_at_first_use_elsewhere(
    aws: Aws, function_id: str, parts: tuple[Callable[[], Any], ...]
) -> None:
    spec = aws.function(function_id)
    for in_lambda in (False, True):
        unbuild_every_part()
        with pytest.MonkeyPatch.context() as environment:
            for name, value in spec.environment.items():
                environment.setenv(name, value)
            if in_lambda:
                environment.setenv("LAMBDA_TASK_ROOT", str(spec.code_dir))
            else:
                environment.delenv("LAMBDA_TASK_ROOT", raising=False)
            load_handler(spec)
        assert [part.cache_info().currsize for part in parts] == [int(in_lambda)] * len(parts)  # type: ignore[attr-defined]
