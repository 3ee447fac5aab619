"""TasksTable transitions: every change is conditional, none happens twice or backwards."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from llmtasks.aws.store import ClaimRefused, TaskStore
from llmtasks.aws.webhook_records import MAX_WEBHOOK_LOG
from llmtasks.domain.errors import StaleWrite, TaskConflict, TaskNotFound
from llmtasks.domain.llm_request import LLMRequest
from llmtasks.domain.messages import Completion
from llmtasks.domain.models import (
    AttemptRecord,
    Lease,
    Task,
    TaskStatus,
    Usage,
    WebhookAttempt,
    WebhookOutcome,
    WebhookStatus,
)
from tests.conftest import Aws
from tests.helpers import NEVER, pending_task

pytestmark = pytest.mark.unit
NOW = 1_800_000_000.0


def new_task(store: TaskStore, task_id: str = "t1", *, tenant: str = "acme", ttl: int = 3600) -> Task:
    task = pending_task(
        task_id,
        tenant=tenant,
        now=NOW,
        ttl_s=ttl,
        request=LLMRequest(prompt="hello", temperature=0.2),
        metadata={"nested": {"ratio": 0.5}},
    )
    store.create(task)
    return task


def claimed(store: TaskStore) -> Task:
    """Task t1, created and claimed at NOW under lease L1 (for a minute, message m1's first delivery)."""
    new_task(store)
    return store.claim(
        "t1",
        Lease("L1", until=NOW + 60, message_id="m1", receive_count=1, dead_letter_at=NEVER),
        now=NOW,
    )


@pytest.fixture
def store(aws: Aws) -> TaskStore:
    return TaskStore(aws.resources.table_names["TasksTable"], aws.dynamodb)


def test_a_created_task_reads_back_equal_floats_included(store: TaskStore) -> None:
    task = new_task(store)
    assert store.get("t1", now=NOW) == task


def test_a_task_id_cannot_be_created_twice(store: TaskStore) -> None:
    first = new_task(store)
    again = pending_task("t1", tenant="other", now=NOW + 5, request=LLMRequest(prompt="another"))
    assert store.create(again) is False
    assert store.get("t1", now=NOW) == first


def test_an_expired_task_reads_as_missing_before_dynamodb_deletes_it(store: TaskStore) -> None:
    new_task(store, ttl=10)
    assert store.get("t1", now=NOW + 9) is not None
    assert store.get("t1", now=NOW + 10) is None


def test_claim_moves_pending_to_processing_under_a_lease(store: TaskStore) -> None:
    new_task(store)
    task = store.claim(
        "t1",
        Lease("L1", until=NOW + 60, message_id="m1", receive_count=1, dead_letter_at=NEVER),
        now=NOW,
    )
    assert (task.status, task.lease_id, task.attempts, task.started_at) == (
        TaskStatus.PROCESSING,
        "L1",
        1,
        NOW,
    )


def test_a_second_claim_while_the_lease_lives_is_refused_and_says_who_holds_it(store: TaskStore) -> None:
    claimed(store)
    with pytest.raises(ClaimRefused) as refused:
        store.claim(
            "t1",
            Lease("L2", until=NOW + 70, message_id="m1", receive_count=1, dead_letter_at=NEVER),
            now=NOW + 10,
        )
    assert refused.value.current is not None
    assert refused.value.current.lease_id == "L1"


def test_an_expired_lease_is_taken_over_and_the_old_holder_can_no_longer_write(store: TaskStore) -> None:
    claimed(store)
    task = store.claim(
        "t1",
        Lease("L2", until=NOW + 200, message_id="m1", receive_count=1, dead_letter_at=NEVER),
        now=NOW + 61,
    )
    assert (task.lease_id, task.attempts, task.started_at) == ("L2", 2, NOW)
    completion = Completion(text="late", model="m", usage=Usage())
    with pytest.raises(StaleWrite):
        store.complete("t1", lease_id="L1", completion=completion, now=NOW + 62)


def test_complete_stores_result_and_usage_and_drops_the_lease(store: TaskStore) -> None:
    claimed(store)
    usage = Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)
    store.complete("t1", lease_id="L1", completion=Completion(text="hi", model="m", usage=usage), now=NOW + 5)
    task = store.get("t1", now=NOW + 5)
    assert task is not None
    assert (task.status, task.result, task.usage, task.completed_at) == (
        TaskStatus.COMPLETED,
        "hi",
        usage,
        NOW + 5,
    )
    assert task.lease_id is None
    assert task.lease_until is None


def test_a_terminal_task_is_never_claimed_again(store: TaskStore) -> None:
    claimed(store)
    store.fail("t1", lease_id="L1", error="boom", error_code="llm_http_400", now=NOW + 1)
    with pytest.raises(ClaimRefused) as refused:
        store.claim(
            "t1",
            Lease("L2", until=NOW + 999, message_id="m1", receive_count=1, dead_letter_at=NEVER),
            now=NOW + 500,
        )
    assert refused.value.current is not None
    assert refused.value.current.status is TaskStatus.FAILED


def test_a_failed_task_keeps_its_error_its_end_and_the_attempt_that_failed(store: TaskStore) -> None:
    claimed(store)
    attempt = AttemptRecord(
        attempt=1, started_at=NOW, ended_at=NOW + 1, outcome="failed", error_code="llm_http_400"
    )
    store.fail("t1", lease_id="L1", error="boom", error_code="llm_http_400", now=NOW + 1, attempt=attempt)
    task = store.get("t1", now=NOW + 2)
    assert task is not None
    assert (task.status, task.error, task.error_code, task.completed_at) == (
        TaskStatus.FAILED,
        "boom",
        "llm_http_400",
        NOW + 1,
    )
    assert task.attempt_log == [attempt]
    # and nothing of its lease or its run is left on it
    assert (task.lease_id, task.lease_until, task.lease_message_id, task.dead_letter_at) == (None,) * 4
    assert (task.partial_result, task.progress_at, task.attempt_started_at) == (None,) * 3


def test_claiming_a_missing_or_expired_task_reports_nothing_current(store: TaskStore) -> None:
    with pytest.raises(ClaimRefused) as missing:
        store.claim(
            "nope",
            Lease("L", until=NOW + 1, message_id="m1", receive_count=1, dead_letter_at=NEVER),
            now=NOW,
        )
    assert missing.value.current is None
    new_task(store, ttl=5)
    with pytest.raises(ClaimRefused) as expired:
        store.claim(
            "t1",
            Lease("L", until=NOW + 60, message_id="m1", receive_count=1, dead_letter_at=NEVER),
            now=NOW + 6,
        )
    assert expired.value.current is None


def test_release_returns_the_task_to_pending_with_the_next_attempt_time(store: TaskStore) -> None:
    claimed(store)
    store.release("t1", lease_id="L1", error="503", error_code="llm_http_503", next_attempt_at=NOW + 8)
    task = store.get("t1", now=NOW + 5)
    assert task is not None
    assert (task.status, task.next_attempt_at, task.last_error_code, task.attempts) == (
        TaskStatus.PENDING,
        NOW + 8,
        "llm_http_503",
        1,
    )
    assert (
        store.claim(
            "t1",
            Lease("L2", until=NOW + 90, message_id="m1", receive_count=1, dead_letter_at=NEVER),
            now=NOW + 9,
        ).next_attempt_at
        is None
    )


def test_cancel_wins_over_a_late_result(store: TaskStore) -> None:
    claimed(store)
    assert store.cancel("t1", tenant_id="acme", now=NOW + 1).status is TaskStatus.CANCELLED
    with pytest.raises(StaleWrite):
        store.complete(
            "t1", lease_id="L1", completion=Completion(text="x", model="m", usage=Usage()), now=NOW + 2
        )
    assert store.get("t1", now=NOW + 3).status is TaskStatus.CANCELLED  # type: ignore[union-attr]


def test_a_created_item_holds_the_set_fields_alone_and_the_metadata_exactly(
    store: TaskStore, aws: Aws
) -> None:
    task = pending_task(
        "t2", tenant="acme", now=NOW, ttl_s=3600, request=LLMRequest(prompt="x"), metadata={"k": None}
    )
    store.create(task)
    item = aws.dynamodb.get_item(TableName=store.table_name, Key={"pk": {"S": "task#t2"}})["Item"]
    # No attribute for a field never set (an item's size is what DynamoDB bills and caps)
    assert set(item) == {"pk", *task.model_dump(exclude_none=True)}
    assert item["metadata"] == {"S": '{"k":null}'}  # as JSON text: the client's nulls kept
    assert store.get("t2", now=NOW) == task


def test_metadata_written_as_a_map_before_reads_as_it_was(store: TaskStore, aws: Aws) -> None:
    task = pending_task("t3", tenant="acme", now=NOW, ttl_s=3600, request=LLMRequest(prompt="x"))
    store.create(task)
    aws.dynamodb.update_item(
        TableName=store.table_name,
        Key={"pk": {"S": "task#t3"}},
        UpdateExpression="SET metadata = :m",
        ExpressionAttributeValues={":m": {"M": {"k": {"S": "v"}}}},
    )
    read = store.get("t3", now=NOW)
    assert read is not None
    assert read.metadata == {"k": "v"}


def test_cancel_of_a_terminal_task_is_a_conflict(store: TaskStore) -> None:
    new_task(store)
    store.cancel("t1", tenant_id="acme", now=NOW)
    with pytest.raises(TaskConflict) as conflict:
        store.cancel("t1", tenant_id="acme", now=NOW + 1)
    assert str(conflict.value) == "Task 't1' is already cancelled."  # the 409's detail


def test_many_tasks_are_read_a_hundred_keys_a_request(store: TaskStore, aws: Aws) -> None:
    ids = [f"t{i}" for i in range(250)]
    for task_id in ids:
        new_task(store, task_id)
    requests: list[int] = []
    aws.dynamodb.meta.events.register(
        "provide-client-params.dynamodb.BatchGetItem",
        lambda params, **_: requests.append(len(params["RequestItems"][store.table_name]["Keys"])),
    )
    found = store.get_many([*ids, "missing"])
    assert sorted(found) == sorted(ids)  # every one, the missing one left out
    assert sorted(requests) == [51, 100, 100]  # BatchGetItem's limit, no key asked twice


def test_many_new_tasks_are_written_a_hundred_a_transaction_each_once(store: TaskStore, aws: Aws) -> None:
    def task(i: int, prompt: str = "hello") -> Task:
        return pending_task(f"t{i}", tenant="acme", now=NOW, request=LLMRequest(prompt=prompt))

    existing = [new_task(store, f"t{i}") for i in (3, 150)]
    transactions: list[int] = []
    aws.dynamodb.meta.events.register(
        "provide-client-params.dynamodb.TransactWriteItems",
        lambda params, **_: transactions.append(len(params["TransactItems"])),
    )
    tasks = [task(i, "x" * 40_000 if 200 <= i < 280 else "hello") for i in range(280)]
    created = store.create_many(tasks)
    # Each group is refused whole for its one task that exists, then written without it; the
    # tasks of 40 KB prompts go 3 MB a transaction (DynamoDB takes 4 MB)
    assert [t.task_id for t in created] == [t.task_id for t in tasks if t.task_id not in ("t3", "t150")]
    assert transactions[:4] == [100, 99, 100, 99]
    assert sum(transactions[4:]) == 80
    assert max(transactions[4:]) < 80
    assert store.get("t3", now=NOW) == existing[0]  # the task that existed is left as it was
    assert store.get_many([t.task_id for t in tasks]).keys() == {t.task_id for t in tasks}
    assert store.create_many(tasks) == []  # again: every one exists


@pytest.mark.parametrize(
    ("task_id", "tenant", "now"), [("t1", "other", NOW), ("zz", "acme", NOW), ("t1", "acme", NOW + 4000)]
)
def test_cancel_of_a_foreign_missing_or_expired_task_is_not_found(
    store: TaskStore, task_id: str, tenant: str, now: float
) -> None:
    new_task(store)
    with pytest.raises(TaskNotFound):
        store.cancel(task_id, tenant_id=tenant, now=now)
    assert store.get("t1", now=NOW).status is TaskStatus.PENDING  # type: ignore[union-attr]


def an_attempt(n: int, outcome: WebhookOutcome = "retrying") -> WebhookAttempt:
    """The n-th HTTP attempt of a webhook (its latency is n, to tell attempts apart)."""
    at = datetime.fromtimestamp(NOW + n, tz=UTC)
    return WebhookAttempt(at=at, trigger="scheduled", outcome=outcome, status_code=500, latency_ms=n)


def test_every_webhook_attempt_is_counted_logged_and_the_latest_outcome_kept(store: TaskStore) -> None:
    new_task(store)
    log: list[WebhookAttempt] = []
    outcomes: list[tuple[WebhookStatus, WebhookOutcome]] = [
        (WebhookStatus.RETRYING, "retrying"),
        (WebhookStatus.FAILED, "failed"),
        # A redrive from the webhook DLQ that then succeeds:
        (WebhookStatus.DELIVERED, "delivered"),
    ]
    for n, (status, outcome) in enumerate(outcomes):
        task = store.record_webhook_outcome("t1", status=status, attempt=an_attempt(n, outcome), log=log)
        assert task is not None
        log = task.webhook_log
    assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.DELIVERED, 3)
    assert [(a.latency_ms, a.outcome, a.at) for a in task.webhook_log] == [
        (n, outcome, datetime.fromtimestamp(NOW + n, tz=UTC)) for n, (_, outcome) in enumerate(outcomes)
    ]
    # A status set with no attempt (its endpoint is disabled) neither counts nor logs one
    task = store.record_webhook_outcome("t1", status=WebhookStatus.ENDPOINT_DISABLED, attempt=None, log=log)
    assert task is not None
    assert (task.webhook_status, task.webhook_attempts, task.webhook_log) == (
        WebhookStatus.ENDPOINT_DISABLED,
        3,
        log,
    )
    assert store.record_webhook_outcome("gone", status=WebhookStatus.DELIVERED, attempt=None, log=[]) is None


def test_the_webhook_log_keeps_the_newest_attempts(store: TaskStore) -> None:
    new_task(store)
    log: list[WebhookAttempt] = []
    for n in range(MAX_WEBHOOK_LOG + 2):
        task = store.record_webhook_outcome(
            "t1", status=WebhookStatus.RETRYING, attempt=an_attempt(n), log=log
        )
        assert task is not None
        log = task.webhook_log
    assert [a.latency_ms for a in log] == list(range(2, MAX_WEBHOOK_LOG + 2))
    assert task.webhook_attempts == MAX_WEBHOOK_LOG + 2  # the count is of them all


def test_a_tenant_keeps_the_first_webhook_secret(store: TaskStore) -> None:
    first = store.tenants.secrets("acme", new_secret="whsec_first").webhook_secret
    again = store.tenants.secrets("acme", new_secret="whsec_second").webhook_secret
    other = store.tenants.secrets("globex", new_secret="whsec_third").webhook_secret
    assert (first, again, other) == ("whsec_first", "whsec_first", "whsec_third")


def test_a_listing_page_reads_what_the_index_points_to_and_asks_again_for_the_rest(
    aws: Aws, store: TaskStore
) -> None:
    # Given three tasks, and a DynamoDB that leaves one key of the page's read unprocessed
    now = 1_800_000_000.0
    for i, task_id in enumerate(("a" * 32, "b" * 32, "c" * 32)):
        store.create(pending_task(task_id, now=now + i))
    index_keys = aws.dynamodb.query(
        TableName=store.table_name,
        IndexName="by_tenant_with_status",
        KeyConditionExpression="tenant_id = :t",
        ExpressionAttributeValues={":t": {"S": "default"}},
    )["Items"]
    assert all(set(item) == {"pk", "tenant_id", "created_at", "status"} for item in index_keys)
    real_batch_get = aws.dynamodb.batch_get_item
    calls: list[int] = []

    def throttled_once(**request: Any) -> Any:
        keys = request["RequestItems"][store.table_name]["Keys"]
        calls.append(len(keys))
        if len(calls) > 1:
            return real_batch_get(**request)
        request["RequestItems"][store.table_name]["Keys"] = keys[1:]
        reply = real_batch_get(**request)
        reply["UnprocessedKeys"] = {store.table_name: {"Keys": keys[:1], "ConsistentRead": True}}
        return reply

    aws.dynamodb.batch_get_item = throttled_once
    # When the tenant's first page is read
    page, _ = store.tenant_tasks("default", limit=3)
    # Then it has every task, newest first, the unprocessed one asked for again
    assert [t.task_id for t in page] == ["c" * 32, "b" * 32, "a" * 32]
    assert calls == [3, 1]


def test_a_listing_by_status_reads_only_the_tasks_stored_with_it(aws: Aws, store: TaskStore) -> None:
    # Given 30 tasks of which every sixth is pending and the rest cancelled
    now = 1_800_000_000.0
    ids = [f"{i:032x}" for i in range(30)]
    for i, task_id in enumerate(ids):
        store.create(pending_task(task_id, now=now + i))
        if i % 6:
            store.cancel(task_id, tenant_id="default", now=now + i)
    pending = [task_id for i, task_id in enumerate(ids) if i % 6 == 0][::-1]  # newest first
    real_batch_get = aws.dynamodb.batch_get_item
    read: list[str] = []

    def counted(**request: Any) -> Any:
        read.extend(
            key["pk"]["S"].removeprefix("task#") for key in request["RequestItems"][store.table_name]["Keys"]
        )
        return real_batch_get(**request)

    aws.dynamodb.batch_get_item = counted
    # When the pending ones are listed two a page, each page one query through a window of
    # STATUS_WINDOW entries (a listing's fifth query or later)
    pages, start = [], None
    while True:
        page, start = store.tenant_tasks(
            "default", limit=2, start=start, statuses=frozenset({TaskStatus.PENDING}), queries_before=10
        )
        pages.append([task.task_id for task in page])
        if start is None:
            break
    # Then each page holds the next pending tasks, newest first, none twice, and only they were read
    assert pages == [pending[0:2], pending[2:4], pending[4:]]
    assert read == pending
    # And without the filter a page is the newest tasks, whatever their status
    newest, _ = store.tenant_tasks("default", limit=3)
    assert [task.task_id for task in newest] == ids[:-4:-1]
