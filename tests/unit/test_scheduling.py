"""Priority lanes, tenant groups and the per-tenant running cap: which queue a task's messages
travel on, with which MessageGroupId, and how many calls a tenant may have running at once."""

from __future__ import annotations

import json

import pytest

from llmtasks.aws.limits import RunningCalls
from llmtasks.aws.store import TaskStore
from llmtasks.aws.task_counts import TaskCountsView
from llmtasks.domain.batches import SubmitBatchRequest
from llmtasks.domain.caller import Caller
from llmtasks.domain.models import SubmitTaskRequest
from llmtasks.domain.rules import Lane, lane_of
from llmtasks.ops.stats import scheduling
from llmtasks.services.batch_items import item_task
from llmtasks.services.tasks import TaskService
from llmtasks.settings import Settings
from tests.conftest import Aws
from tests.helpers import blobs, pending_task, stored_batch, task_lanes


@pytest.mark.parametrize(
    ("priority", "batch_item", "lane"),
    [
        ("high", False, Lane.HIGH),
        ("high", True, Lane.HIGH),
        ("normal", False, Lane.NORMAL),
        ("normal", True, Lane.BACKGROUND),
        ("low", False, Lane.BACKGROUND),
        ("low", True, Lane.BACKGROUND),
    ],
)
def test_each_priority_has_its_lane(priority: str, batch_item: bool, lane: Lane) -> None:
    task = pending_task("t" * 32, now=0, priority=priority, batch_id="b" * 32 if batch_item else None)
    assert lane_of(task) is lane


def queued(aws: Aws, logical_id: str) -> list[tuple[str, str]]:
    """(task id, MessageGroupId) of each message on a queue."""
    return sorted(
        (json.loads(m["Body"])["task_id"], m["Attributes"].get("MessageGroupId", ""))
        for m in aws.messages(logical_id)
    )


def test_a_submit_sends_on_its_lane_with_its_tenant_as_the_message_group(
    aws: Aws, settings: Settings
) -> None:
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    service = TaskService(settings, store, task_lanes(settings, aws.sqs), results=blobs(settings))
    urgent = service.submit("acme", SubmitTaskRequest(prompt="now", priority="high")).task.task_id
    usual = service.submit("acme", SubmitTaskRequest(prompt="soon")).task.task_id
    background = service.submit("globex", SubmitTaskRequest(prompt="whenever", priority="low")).task.task_id
    assert queued(aws, "HighTaskQueue") == [(urgent, "acme")]
    assert queued(aws, "TaskQueue") == [(usual, "acme")]
    assert queued(aws, "BatchTaskQueue") == [(background, "globex")]


def test_batch_items_take_the_batch_s_priority_unless_they_give_their_own(
    aws: Aws, settings: Settings
) -> None:
    body = SubmitBatchRequest.model_validate(
        {"priority": "high", "items": [{"prompt": "a"}, {"prompt": "b", "priority": "normal"}]}
    )
    assert [item.priority for item in body.items] == ["high", "normal"]
    assert [i.priority for i in SubmitBatchRequest.model_validate({"items": [{"prompt": "a"}]}).items] == [
        "normal"
    ]
    batch = stored_batch("b" * 32, now=0, total=2, tenant_id="acme")
    items = [item_task(batch, index, item, cancelled_at=None) for index, item in enumerate(body.items)]
    task_lanes(settings, aws.sqs).send_many(items)
    assert queued(aws, "HighTaskQueue") == [(items[0].task_id, "acme")]
    assert queued(aws, "BatchTaskQueue") == [(items[1].task_id, "acme")]


def test_a_key_s_max_running_is_stored_with_its_tasks(aws: Aws, settings: Settings) -> None:
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    service = TaskService(settings, store, task_lanes(settings, aws.sqs), results=blobs(settings))
    capped = Caller(tenant_id="acme", key_id="k1", max_running=3)
    task = service.submit("acme", SubmitTaskRequest(prompt="p"), caller=capped).task
    assert store.get(task.task_id, now=task.created_at).max_running == 3  # type: ignore[union-attr]
    free = service.submit("acme", SubmitTaskRequest(prompt="p"), caller=Caller(tenant_id="acme")).task
    assert store.get(free.task_id, now=free.created_at).max_running is None  # type: ignore[union-attr]


@pytest.fixture
def running(aws: Aws, settings: Settings) -> RunningCalls:
    assert settings.limits_table_name is not None
    return RunningCalls(settings.limits_table_name, aws.dynamodb, clock=lambda: 1000.0)


def test_a_tenant_s_running_calls_stay_under_its_cap(running: RunningCalls) -> None:
    assert running.take("acme", "t1", cap=2, until=2000)
    assert running.take("acme", "t2", cap=2, until=2000)
    assert not running.take("acme", "t3", cap=2, until=2000)
    assert running.take("globex", "t4", cap=2, until=2000)  # another tenant counts apart
    # The same task again (a redelivery) keeps its place and moves its end
    assert running.take("acme", "t2", cap=2, until=2500)
    assert running.running("acme") == {"t1": 2000.0, "t2": 2500.0}
    running.give_back("acme", "t1")
    running.give_back("acme", "t1")  # twice: nothing more is given back
    assert running.take("acme", "t3", cap=2, until=2000)
    assert not running.take("acme", "t5", cap=2, until=2000)
    assert set(running.running("acme")) == {"t2", "t3"}


def test_a_place_is_handed_over_in_one_write_only_from_its_holder_to_one_without_a_place(
    running: RunningCalls,
) -> None:
    assert running.take("acme", "t1", cap=2, until=2000)
    assert running.take("acme", "t2", cap=2, until=2000)
    assert running.hand_over("acme", "t1", "t3", until=2500)
    assert running.running("acme") == {"t2": 2000.0, "t3": 2500.0}
    assert not running.hand_over("acme", "t1", "t4", until=2500)  # t1 holds none any more
    assert not running.hand_over("acme", "t2", "t3", until=2500)  # t3 holds one already
    assert running.running("acme") == {"t2": 2000.0, "t3": 2500.0}
    # The count stayed two: the cap still holds
    assert not running.take("acme", "t5", cap=2, until=2000)
    running.give_back("acme", "t3")
    assert running.take("acme", "t5", cap=2, until=2000)


def test_a_place_whose_lease_lapsed_is_cleared_by_the_next_take_that_finds_the_cap_full(
    running: RunningCalls,
) -> None:
    # t1's sandbox died mid-call: its place held until its lease, 900 (the clock reads 1000)
    assert running.take("acme", "t1", cap=1, until=900)
    assert running.take("acme", "t2", cap=1, until=2000)
    assert set(running.running("acme")) == {"t2"}
    assert not running.take("acme", "t3", cap=1, until=2000)  # t2 is live


def test_the_scheduling_view_counts_waiting_and_running_tasks_per_tenant_and_priority() -> None:
    counts = TaskCountsView(
        by_status={"pending": 2, "processing": 2, "completed": 1},
        by_tenant={
            "flood": {"pending": 1, "processing": 2},
            "quiet": {"pending": 1, "completed": 1},
            "idle": {"completed": 4},
        },
        by_priority={
            "normal": {"pending": 1, "processing": 1, "completed": 1},
            "high": {"processing": 1},
            "low": {"pending": 1},
        },
    )
    view = scheduling(counts)
    # The busiest first; a tenant with nothing waiting or running is not a row
    assert view["tenants"] == [
        {"tenant_id": "flood", "backlog": 1, "in_flight": 2},
        {"tenant_id": "quiet", "backlog": 1, "in_flight": 0},
    ]
    assert view["priorities"] == {
        "high": {"backlog": 0, "in_flight": 1},
        "normal": {"backlog": 1, "in_flight": 1},
        "low": {"backlog": 1, "in_flight": 0},
    }
