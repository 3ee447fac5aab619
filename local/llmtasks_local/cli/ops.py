"""Operating a stack, local or deployed: `dlq`, `stats`, `keys`."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from llmtasks.ops.deadletters import QUEUE_NAMES
from llmtasks.ops.deployment import QueueName
from llmtasks.ops.keys import MAX_IN_FLIGHT
from llmtasks_local.cli.options import target_of, targeted
from llmtasks_local.tool_errors import ToolError

if TYPE_CHECKING:
    from llmtasks.ops.deadletters import DeadLetters
    from llmtasks.ops.keys import Keys


def _dead_letters(stack_name: str | None, endpoint_url: str | None) -> DeadLetters:
    from llmtasks.ops.deadletters import DeadLetters

    target = target_of(stack_name, endpoint_url)
    return DeadLetters(target.deployment, dynamodb=target.dynamodb, sqs=target.sqs)


def _api_keys(stack_name: str | None, endpoint_url: str | None) -> Keys:
    from llmtasks.ops.keys import Keys

    target = target_of(stack_name, endpoint_url)
    return Keys(target.deployment.api_keys_table, target.dynamodb)


@click.group()
def dlq() -> None:
    """Dead-letter queues: what is in them, and replaying them."""


@dlq.command("list")
@click.option(
    "--queue", "queues", type=click.Choice(QUEUE_NAMES), multiple=True, help="Only this DLQ (default: all)."
)
@click.option("--limit", default=100, show_default=True, help="Messages shown per queue.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@targeted
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


@click.group()
def streams() -> None:
    """TasksTable's stream consumers: unblocking one held on a record."""


@streams.command("skip")
@click.argument("sequence_number")
@click.option(
    "--reason", required=True, help="Why: kept with the mark, and logged when the record is passed over."
)
@targeted
def streams_skip(sequence_number: str, reason: str, stack_name: str | None, endpoint_url: str | None) -> None:
    """Let the stream consumers pass over the record SEQUENCE_NUMBER, which they cannot read (the
    `stream record unreadable` ERROR line names it): its retries hold their shard until then."""
    from llmtasks.ops.streams import skip_record

    target = target_of(stack_name, endpoint_url)
    mark = skip_record(
        target.dynamodb, target.deployment.tasks_table, sequence_number, reason=reason, now=time.time()
    )
    click.echo(
        f"stream record {mark.sequence_number} marked to be skipped ({mark.reason}); the consumer"
        " passes it over at its next retry and logs `stream record skipped, as an operator asked`"
    )


@dlq.command("redrive")
@click.option(
    "--queue", type=click.Choice(QUEUE_NAMES), default="tasks", show_default=True, help="Which DLQ to replay."
)
@targeted
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


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the whole overview as JSON.")
@targeted
def stats(as_json: bool, stack_name: str | None, endpoint_url: str | None) -> None:
    """Tasks by status, queue and DLQ depths, backlog and in flight per priority and per tenant,
    latency p50/p95/p99 over the last hour, batches:
    the numbers of the local console (`llmtasks up`, /console), read from the tables and queues."""
    from llmtasks.ops.stats import overview

    target = target_of(stack_name, endpoint_url)
    summary = overview(
        target.dynamodb, target.sqs, target.deployment, now=time.time(), cloudwatch=target.cloudwatch
    )
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo("tasks      " + "  ".join(f"{k}={v}" for k, v in summary["tasks"]["by_status"].items()))
    click.echo("queues     " + "  ".join(f"{k}={v}" for k, v in summary["queues"].items()))
    for priority, counts in summary["scheduling"]["priorities"].items():
        click.echo(f"priority   {priority:8} backlog={counts['backlog']}  in_flight={counts['in_flight']}")
    for tenant in summary["scheduling"]["tenants"]:
        click.echo(
            f"tenant     {tenant['tenant_id']:8} backlog={tenant['backlog']}  in_flight={tenant['in_flight']}"
        )
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
    for function, health in summary["functions"].items():
        line = f"function   {function:18} errors={health['errors']}  throttles={health['throttles']}"
        if "lag_s" in health:  # a stream consumer: how far behind its stream it is
            lag = "-" if health["lag_s"] is None else f"{health['lag_s']} s"
            line += f"  stream lag={lag}"
        click.echo(line + "  (last 15 minutes)")


def _finite(_ctx: click.Context, _param: click.Parameter, value: float | None) -> float | None:
    """An amount of USD: FloatRange lets NaN through (it compares with nothing)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not an amount")
    return value


FC = TypeVar("FC", bound=Callable[..., object])


def _budget_option(period: str) -> Callable[[FC], FC]:
    return click.option(
        f"--budget-usd-{period}",
        type=click.FloatRange(min=0, max=1e9),
        callback=_finite,
        default=None,
        help=f"What its tasks may cost a UTC {period}, in USD; submits past it get 429 [default: no budget].",
    )


@click.group()
def keys() -> None:
    """API keys: each maps to a tenant; only their SHA-256 is stored."""


@keys.command("create")
@click.option("--tenant", required=True, help="The tenant whose tasks the key reaches.")
@click.option("--name", default="", help="A note to recognise the key by (who or what uses it).")
@click.option(
    "--rps",
    type=click.IntRange(min=1),
    default=None,
    help="Requests a second the key may make [default: no limit].",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1, max=MAX_IN_FLIGHT),
    default=None,
    help="Its tasks that may be unfinished at once (a batch counts its items) [default: no limit].",
)
@click.option(
    "--max-running",
    type=click.IntRange(min=1, max=MAX_IN_FLIGHT),
    default=None,
    help="Its tasks whose LLM calls may run at once; the rest wait queued [default: TenantMaxRunning].",
)
@click.option(
    "--tpm",
    type=click.IntRange(min=1),
    default=None,
    help="LLM tokens a minute its tenant's calls may use, of the provider keys' [default: no share].",
)
@_budget_option("day")
@_budget_option("month")
@targeted
def keys_create(
    tenant: str,
    name: str,
    rps: int | None,
    max_in_flight: int | None,
    max_running: int | None,
    tpm: int | None,
    budget_usd_day: float | None,
    budget_usd_month: float | None,
    stack_name: str | None,
    endpoint_url: str | None,
) -> None:
    """Create a key; it is printed once and cannot be shown again."""
    key, record = _api_keys(stack_name, endpoint_url).create(
        tenant,
        name=name,
        rps=rps,
        max_in_flight=max_in_flight,
        max_running=max_running,
        tpm=tpm,
        budget_usd_day=None if budget_usd_day is None else Decimal(repr(budget_usd_day)),
        budget_usd_month=None if budget_usd_month is None else Decimal(repr(budget_usd_month)),
    )
    click.echo(key)
    click.echo(f"(key id {record.key_id}, tenant {tenant}; keep the key: only its hash is stored)", err=True)


@keys.command("dev")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The local stack's state dir [default: .llmtasks/state beside template.yaml].",
)
def keys_dev(state_dir: Path | None) -> None:
    """The local stack's development key (tenant `dev`), as `llmtasks up` printed it."""
    from llmtasks_local.emulator.stack_keys import DEV_KEY
    from llmtasks_local.emulator.stack_options import default_state_dir

    kept = (state_dir or default_state_dir(Path("template.yaml"))) / DEV_KEY
    if not kept.is_file():
        raise ToolError(
            "no development key is kept here",
            where=str(kept),
            fix="start the local stack (make up) from this folder; with --no-state its key is only printed",
        )
    click.echo(kept.read_text().strip())


@keys.command("list")
@targeted
def keys_list(stack_name: str | None, endpoint_url: str | None) -> None:
    """Every key: id, tenant, name, created, revoked (never the key itself)."""
    for record in _api_keys(stack_name, endpoint_url).all():
        created = datetime.fromtimestamp(record.created_at, tz=UTC).strftime("%Y-%m-%d %H:%M")
        revoked = "revoked" if record.revoked_at is not None else "active"
        limits = ", ".join(
            f"{name} {value}"
            for name, value in (
                ("rps", record.rps),
                ("max in flight", record.max_in_flight),
                ("max running", record.max_running),
                ("tpm", record.tpm),
                ("budget USD/day", record.budget and record.budget.day_usd),
                ("budget USD/month", record.budget and record.budget.month_usd),
            )
            if value is not None
        )
        click.echo(
            f"{record.key_id}  {record.tenant_id:20} {revoked:8} {created}  {record.name}  {limits}".rstrip()
        )


@keys.command("revoke")
@click.argument("key_id")
@targeted
def keys_revoke(key_id: str, stack_name: str | None, endpoint_url: str | None) -> None:
    """Revoke a key by its id (the part after lt_ and before the next _)."""
    if _api_keys(stack_name, endpoint_url).revoke(key_id) is None:
        raise click.ClickException(f"no key with id {key_id}")
    click.echo(
        f"revoked {key_id}; requests with it are refused within the authorizer's cache time"
        " (the template's AuthCacheSeconds)"
    )


COMMANDS = [dlq, streams, stats, keys]
