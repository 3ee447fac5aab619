"""The counters of tasks per status, tenant and priority (aws/task_counts.py), kept by
BatchFunction from TasksTable's stream: exact however often a record comes, read as one item."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import ValidationError

from llmtasks.aws.store import TaskStore
from llmtasks.aws.stream_skips import StreamSkips
from llmtasks.aws.task_counts import TaskCounts
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import AttemptRecord, Lease, Usage
from tests.conftest import Aws
from tests.helpers import NEVER, count_tasks, pending_task, stream_records

pytestmark = pytest.mark.unit


def table(aws: Aws) -> str:
    return aws.resources.table_names["TasksTable"]


def lease(task_id: str) -> Lease:
    return Lease(
        lease_id=f"lease-{task_id}",
        until=time.time() + 60,
        message_id=f"m-{task_id}",
        receive_count=1,
        dead_letter_at=NEVER,
    )


def test_counts_follow_each_task_through_its_statuses_once_however_often_records_come(
    aws: Aws, handler: Any
) -> None:
    store = TaskStore(table(aws), aws.dynamodb)
    counts = TaskCounts(table(aws), aws.dynamodb)
    now = time.time()
    tenants = ["acme", "acme", "acme", "globex", "globex"]
    tasks = [
        pending_task(f"t{i}", tenant=tenant, now=now, priority="high" if i == 4 else "normal")
        for i, tenant in enumerate(tenants)
    ]
    for task in tasks:
        assert store.create(task)
    count_tasks(aws, handler)
    assert counts.read().by_status["pending"] == 5
    # Given one completes, one fails, one is cancelled, one runs and one waits, each record
    # handed over again at every step (count_tasks reads the stream from its start)
    for task in tasks[:4]:
        store.claim(task.task_id, lease(task.task_id), now=now)
        count_tasks(aws, handler)
    usage = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    store.complete(
        "t0", lease_id="lease-t0", completion=Completion(text="a", model="m", usage=usage), now=now
    )
    count_tasks(aws, handler)
    store.fail("t1", lease_id="lease-t1", error="no", error_code="llm_http_400", now=now)
    store.cancel("t2", tenant_id="acme", now=now)
    # A write that keeps the status (a discarded answer's attempt) counts nothing
    store.record_discarded("t2", AttemptRecord(attempt=1, started_at=now, ended_at=now, outcome="discarded"))
    count_tasks(aws, handler)
    count_tasks(aws, handler)

    view = counts.read()
    assert view.by_status == {
        "pending": 1,
        "processing": 1,
        "requires_action": 0,
        "completed": 1,
        "failed": 1,
        "cancelled": 1,
    }
    assert view.by_tenant == {
        "acme": {"completed": 1, "failed": 1, "cancelled": 1},
        "globex": {"processing": 1, "pending": 1},
    }
    assert view.by_priority == {
        "normal": {"completed": 1, "failed": 1, "cancelled": 1, "processing": 1},
        "high": {"pending": 1},
    }


def test_a_task_deleted_by_its_ttl_is_counted_out_once(aws: Aws, handler: Any) -> None:
    store = TaskStore(table(aws), aws.dynamodb)
    counts = TaskCounts(table(aws), aws.dynamodb)
    now = time.time()
    store.create(pending_task("old", now=now - 120, ttl_s=60))
    store.create(pending_task("new", now=now))
    count_tasks(aws, handler)
    assert counts.read().by_status["pending"] == 2
    # When TTL deletes the expired one, its REMOVE record (twice) counts it out
    aws.dynamodb.delete_item(TableName=table(aws), Key={"pk": {"S": "task#old"}})
    count_tasks(aws, handler)
    count_tasks(aws, handler)
    assert counts.read().by_status["pending"] == 1
    assert counts.read().by_tenant == {"default": {"pending": 1}}


def test_a_task_deletion_that_cannot_be_read_holds_the_counter_until_an_operator_skips_it(
    aws: Aws, handler: Any
) -> None:
    counts = TaskCounts(table(aws), aws.dynamodb)
    skips = StreamSkips(table(aws), aws.dynamodb)
    now = time.time()
    # Given an item a bug wrote without its request, marked skipped once it held the counter
    bad = {"pk": {"S": "task#bad"}, "task_id": {"S": "bad"}, "status": {"S": "pending"}}
    aws.dynamodb.put_item(TableName=table(aws), Item=bad | {"expires_at": {"N": str(int(now) + 60)}})
    with pytest.raises(ValidationError):
        count_tasks(aws, handler)
    [insert] = stream_records(aws)
    skips.mark(insert["dynamodb"]["SequenceNumber"], reason="a bug's", now=now)
    count_tasks(aws, handler)
    # When it is deleted, its deletion's record holds the counter too, until it is skipped
    aws.dynamodb.delete_item(TableName=table(aws), Key={"pk": bad["pk"]})
    with pytest.raises(ValidationError):
        count_tasks(aws, handler)
    removal = stream_records(aws)[-1]
    assert removal["eventName"] == "REMOVE"
    skips.mark(removal["dynamodb"]["SequenceNumber"], reason="a bug's", now=now)
    count_tasks(aws, handler)
    assert counts.read().by_status["pending"] == 0
