"""WorkerFunction's parts: the task runner, its LLM provider and pace, the running calls."""

from __future__ import annotations

from functools import lru_cache

from llmtasks.aws.batch_store import BatchCancellations
from llmtasks.aws.key_limits import KeyRates
from llmtasks.aws.limits import RunningCalls
from llmtasks.aws.pacing import CallPacer
from llmtasks.llm import provider_from_settings
from llmtasks.llm.openai import OpenAIChat
from llmtasks.services.mcp_tools import McpTools
from llmtasks.services.tool_calls import EndpointTools
from llmtasks.services.webhook_urls import resolver_from_settings
from llmtasks.settings import (
    Limits,
    LlmSettings,
    RunnerSettings,
    TasksTable,
    WorkerResources,
    resources,
    section,
)
from llmtasks.wiring import build_in_lambda, check_configuration
from llmtasks.wiring.adapters import batch_store, dynamodb, key_budgets, result_blobs, task_lanes, task_store
from llmtasks.worker.runner import TaskRunner

__all__ = ["call_slots", "cold_start", "task_lanes", "task_runner"]


def cold_start() -> None:
    check_configuration(WorkerResources, RunnerSettings, LlmSettings)
    build_in_lambda(task_runner)


def call_slots() -> int:
    return section(RunnerSettings).worker_call_slots


@lru_cache(maxsize=1)
def task_runner() -> TaskRunner:
    settings = section(RunnerSettings)
    table = resources(TasksTable).tasks_table_name
    pacer = None
    if settings.llm_requests_per_second > 0:
        pacer = CallPacer(
            table,
            dynamodb(),
            calls_per_second=settings.llm_requests_per_second,
        )
    provider = provider_from_settings(section(LlmSettings), key_rates=KeyRates(table, dynamodb()))
    return TaskRunner(
        settings,
        task_store(),
        task_lanes(),
        provider,
        results=result_blobs(),
        pacer=pacer,
        cancellations=BatchCancellations(batch_store()),
        running=running_calls(),
        budgets=key_budgets(),
        tenant_rates=KeyRates(table, dynamodb(), prefix="tenantrate#"),
        tools=EndpointTools(
            allowed_hosts=settings.webhook_allowed_hosts, resolve=resolver_from_settings(settings)
        ),
        background=provider if isinstance(provider, OpenAIChat) else None,
        mcp=McpTools(allowed_hosts=settings.webhook_allowed_hosts, resolve=resolver_from_settings(settings)),
    )


def running_calls() -> RunningCalls | None:
    """The tenants' running calls, counted where a cap can apply (LimitsTable configured)."""
    table = resources(Limits).limits_table_name
    if table is None:
        if section(RunnerSettings).tenant_max_running:
            raise RuntimeError(
                "TENANT_MAX_RUNNING needs LIMITS_TABLE_NAME: the running calls are counted there"
            )
        return None
    return RunningCalls(table, dynamodb())
