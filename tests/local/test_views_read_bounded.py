"""The views of a deployment (the console's routes, `llmtasks stats`, `llmtasks dlq list`) read
a bounded amount whatever TasksTable holds, and never Scan it: counted here, call by call, on a
crowded table (issue 78: a Scan of one stalled the batch it watched)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError
from click.testing import CliRunner
from moto.core import DEFAULT_ACCOUNT_ID
from moto.dynamodb.models import dynamodb_backends

from llmtasks.aws.task_counts import COUNTS_PK
from llmtasks.domain.errors import BackendError
from llmtasks.ops.deadletters import DeadLetters
from llmtasks.ops.stats import overview, read_bound
from llmtasks_local.cli import ops as cli_ops
from llmtasks_local.cli.options import Target
from llmtasks_local.emulator import console as console_module
from llmtasks_local.emulator.console import Console
from llmtasks_local.sam.provision import local_deployment
from tests.conftest import Aws
from tests.helpers import HANG_S, eventually

pytestmark = pytest.mark.unit
TASKS = 20_000
SOME = 500
TENANTS = 11  # under the overview's TENANTS: the newest tasks of all are among those it reads
STATUSES = ("completed", "completed", "completed", "failed", "pending", "processing")


@dataclass
class Calls:
    """Every AWS call made in the test's process: its operation and table, and the items (or
    index entries) its reply held."""

    made: list[tuple[str, str | None, int]] = field(default_factory=list)

    def items_read(self) -> int:
        return sum(items for _, _, items in self.made)

    def operations(self) -> set[tuple[str, str | None]]:
        return {(operation, table) for operation, table, _ in self.made}


def _items(operation: str, reply: dict[str, Any]) -> int:
    if operation in ("Query", "Scan"):
        return len(reply.get("Items", []))
    if operation == "GetItem":
        return 1 if reply.get("Item") else 0
    if operation == "BatchGetItem":
        return sum(len(items) for items in reply.get("Responses", {}).values())
    return 0


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    recorded = Calls()
    make_api_call = BaseClient._make_api_call

    def recording(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        reply = make_api_call(client, operation, params)
        table = params.get("TableName") or next(iter(params.get("RequestItems") or {}), None)
        recorded.made.append((operation, table, _items(operation, reply)))
        return reply

    monkeypatch.setattr(BaseClient, "_make_api_call", recording)
    return recorded


@pytest.fixture
def crowded(aws: Aws) -> str:
    """TasksTable with TASKS tasks in it: the table's name."""
    return stocked(aws, TASKS)


@pytest.fixture
def busy(aws: Aws) -> str:
    """TasksTable with SOME tasks in it, for the tests of what a view does in time."""
    return stocked(aws, SOME)


def stocked(aws: Aws, tasks: int) -> str:
    """TasksTable with `tasks` tasks of TENANTS tenants in it, and the counters BatchFunction
    would have made of them, written straight to moto's backend (through the API it took
    minutes): the table's name."""
    table = aws.resources.table_names["TasksTable"]
    backend = dynamodb_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    now = time.time()
    counters: dict[str, int] = {}
    for i in range(tasks):
        tenant, status = f"tenant-{i % TENANTS}", STATUSES[i % len(STATUSES)]
        backend.put_item(
            table,
            {
                "pk": {"S": f"task#t{i}"},
                "task_id": {"S": f"t{i}"},
                "tenant_id": {"S": tenant},
                "status": {"S": status},
                "priority": {"S": "normal"},
                "created_at": {"N": str(now - tasks + i)},
                "expires_at": {"N": str(int(now) + 3600)},
                "request": {"M": {"prompt": {"S": "p"}, "model": {"S": "m"}}},
                "batch_id": {"S": f"b{i % 7}"},
            },
        )
        for name in (f"status|{status}", f"tenant|{tenant}|{status}", f"priority|normal|{status}"):
            counters[name] = counters.get(name, 0) + 1
    backend.put_item(table, {"pk": {"S": COUNTS_PK}, **{k: {"N": str(v)} for k, v in counters.items()}})
    return table


def test_one_overview_of_20000_tasks_reads_a_fixed_number_of_items_and_scans_nothing(
    aws: Aws, crowded: str, calls: Calls
) -> None:
    view = overview(aws.dynamodb, aws.sqs, local_deployment(aws.sqs), now=time.time())

    assert calls.items_read() <= read_bound() < TASKS // 10
    assert not [call for call in calls.made if call[0] == "Scan"]
    # The counts are the whole table's; the newest tasks are the newest of all
    assert view["tasks"]["total"] == TASKS
    completed = sum(STATUSES[i % len(STATUSES)] == "completed" for i in range(TASKS))
    assert view["tasks"]["by_status"]["completed"] == completed
    assert len(view["scheduling"]["tenants"]) == TENANTS
    assert [task["task_id"] for task in view["recent"][:3]] == [
        f"t{TASKS - 1}",
        f"t{TASKS - 2}",
        f"t{TASKS - 3}",
    ]


def test_no_view_of_the_console_or_the_cli_scans_the_tasks_table(
    aws: Aws, crowded: str, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    deployment = local_deployment(aws.sqs)
    cloudwatch = boto3.client("cloudwatch")
    letters = DeadLetters(deployment, dynamodb=aws.dynamodb, sqs=aws.sqs)
    console = Console(aws.dynamodb, aws.sqs, deployment, letters, cloudwatch=cloudwatch, token="t")
    target = Target(deployment, aws.sqs, aws.dynamodb, cloudwatch)
    monkeypatch.setattr(cli_ops, "target_of", lambda *_: target)

    monkeypatch.setattr(console_module, "IDLE_S", 0.5)
    eventually(
        lambda: console._answer("GET", "/api/overview"),
        lambda answer: answer[1] == 200 and "tasks" in answer[0],
        timeout_s=HANG_S,
        what="the console's first view",
    )
    body, status = console._answer("GET", "/api/dlq")
    assert status == 200, body
    eventually(
        lambda: console._reader, lambda reader: reader is None, timeout_s=HANG_S, what="the reader stops"
    )
    stats = CliRunner().invoke(cli_ops.stats, ["--json"])
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.output)["tasks"]["total"] == TASKS
    listed = CliRunner().invoke(cli_ops.dlq_list, [])
    assert listed.exit_code == 0, listed.output
    assert "tasks DLQ: 0 message(s)" in listed.output

    assert calls.made  # the recorder saw them
    assert ("Scan", crowded) not in calls.operations()
    assert not [call for call in calls.made if call[0] == "Scan"]


def test_an_overview_out_of_time_answers_with_what_it_read_and_names_the_rest(
    aws: Aws, busy: str, calls: Calls
) -> None:
    # Given a deadline that passes once the counters are read
    ticks = iter([0.0, 5.0, 5.0, 5.0, 5.0])
    view = overview(
        aws.dynamodb,
        aws.sqs,
        local_deployment(aws.sqs),
        now=time.time(),
        deadline=1.0,
        clock=lambda: next(ticks),
    )
    assert view["tasks"]["total"] == SOME
    assert (view["recent"], view["batches"], view["queues"]) == ([], [], {})
    assert view["incomplete"] == {name: "not read: out of time" for name in ("recent", "queues", "batches")}
    assert [call[0] for call in calls.made if call[1] == busy] == ["GetItem"]  # the counters alone


def test_a_read_the_stack_refuses_leaves_its_part_out_and_says_why(
    aws: Aws, busy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*_: Any, **__: Any) -> Any:
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "Query")

    monkeypatch.setattr(aws.dynamodb, "query", refused)
    view = overview(aws.dynamodb, aws.sqs, local_deployment(aws.sqs), now=time.time())
    assert view["incomplete"] == {"recent": "not read: BackendError"}
    assert view["tasks"]["total"] == SOME
    assert view["queues"]


def test_the_console_answers_at_once_from_one_reader_that_stops_when_no_page_polls(
    aws: Aws, busy: str, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(console_module, "REFRESH_S", 0.2)
    monkeypatch.setattr(console_module, "IDLE_S", 1.0)
    deployment = local_deployment(aws.sqs)
    letters = DeadLetters(deployment, dynamodb=aws.dynamodb, sqs=aws.sqs)
    console = Console(aws.dynamodb, aws.sqs, deployment, letters, token="t")
    # Given a page that polls until the first view is read
    first = eventually(
        lambda: console._answer("GET", "/api/overview"),
        lambda answer: answer[1] == 200 and "tasks" in answer[0],
        timeout_s=HANG_S,
        what="the first view",
    )[0]
    assert first["tasks"]["total"] == SOME
    assert first["stale"] is False
    # When pages poll many times at once, each answers with the reader's newest view, at once:
    # the reads are the reader's alone, one every REFRESH_S, not one a poll
    calls.made.clear()
    started = time.monotonic()
    for _ in range(50):
        body, status = console._answer("GET", "/api/overview")
        assert status == 200
        assert body["tasks"]["total"] == SOME
    polled_s = time.monotonic() - started
    counter_reads = [call for call in calls.made if call[0] == "GetItem" and call[1] == busy]
    assert len(counter_reads) <= 2 + polled_s / console_module.REFRESH_S
    # Then with no page polling, the reader stops within IDLE_S and reads nothing more
    eventually(
        lambda: console._reader, lambda reader: reader is None, timeout_s=HANG_S, what="the reader stops"
    )
    calls.made.clear()
    time.sleep(0.5)
    assert calls.made == []
    # A later poll answers at once with the last view, its age said, and wakes the reader
    late, status = console._answer("GET", "/api/overview")
    assert (status, late["tasks"]["total"]) == (200, SOME)
    assert late["age_s"] >= 0.5


def test_a_view_the_stack_refuses_is_a_503_that_says_why(
    aws: Aws, busy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = local_deployment(aws.sqs)
    letters = DeadLetters(deployment, dynamodb=aws.dynamodb, sqs=aws.sqs)
    console = Console(aws.dynamodb, aws.sqs, deployment, letters, token="t")

    def refused(*_: Any, **__: Any) -> Any:
        raise BackendError("DynamoDB read failed: timed out")

    monkeypatch.setattr(letters, "letters", refused)
    body, status = console._answer("GET", "/api/dlq")
    assert (status, body["message"]) == (503, "The stack did not answer this view: BackendError.")
