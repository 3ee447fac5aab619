"""API keys: stored as hashes, checked by the authorizer (allow with the key's tenant and limits,
or deny); per-key limits counted by the functions, refused with 429 problems."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from llmtasks.aws.apikeys import ApiKeys, presented_key
from llmtasks.aws.batch_store import BatchStore
from llmtasks.aws.limits import UNSTORED_GRACE_S, Held, KeyLimits, work_ended
from llmtasks.aws.store import TaskStore
from llmtasks.domain.batches import BatchStatus
from llmtasks.domain.caller import Caller, caller_of
from llmtasks.domain.errors import InvalidInput, TooManyRequests
from llmtasks.domain.models import Lease, SubmitTaskRequest, TaskStatus
from llmtasks.services.tasks import TaskService
from llmtasks.settings import Settings
from tests.conftest import Aws
from tests.helpers import blobs, load_event, pending_task, stored_batch, task_lanes

pytestmark = pytest.mark.unit


@pytest.fixture
def api_keys(aws: Aws) -> ApiKeys:
    return ApiKeys(aws.resources.table_names["ApiKeysTable"], aws.dynamodb)


def test_only_a_hash_of_the_key_is_stored(aws: Aws, api_keys: ApiKeys) -> None:
    key, record = api_keys.create("acme", name="ci")
    assert key.startswith(f"lt_{record.key_id}_")
    [item] = aws.dynamodb.scan(TableName=api_keys.table_name)["Items"]
    stored = json.dumps(item)
    assert key not in stored
    assert key.split("_", 2)[2] not in stored
    assert set(item) == {"key_id", "key_hash", "tenant_id", "name", "created_at"}


def test_keys_authenticate_to_their_tenant_until_revoked(api_keys: ApiKeys) -> None:
    key, record = api_keys.create("acme", rps=5, max_in_flight=20)
    found = api_keys.authenticate(key).key
    assert found is not None
    assert (found.tenant_id, found.key_id, found.rps, found.max_in_flight) == ("acme", record.key_id, 5, 20)
    assert api_keys.authenticate(key[:-1] + ("A" if key[-1] != "A" else "B")).refusal == "unknown"
    assert api_keys.authenticate(None).refusal == "missing"
    assert api_keys.authenticate("sk-proj-123").refusal == "malformed"
    assert api_keys.authenticate("lt_" + "x" * 300).refusal == "malformed"
    assert api_keys.revoke(record.key_id) is not None
    assert api_keys.authenticate(key).refusal == "revoked"
    assert api_keys.revoke("nosuchkey") is None
    assert [k.revoked_at is not None for k in api_keys.all()] == [True]


@pytest.mark.parametrize(
    ("headers", "presented"),
    [
        ({"Authorization": "Bearer lt_a_b"}, "lt_a_b"),
        ({"authorization": "bearer   lt_a_b  "}, "lt_a_b"),
        ({"AUTHORIZATION": "Bearer lt_a b"}, "lt_a b"),  # the scheme is the first word
        ({"Authorization": "Basic lt_a_b"}, None),
        ({"Authorization": "Bearer "}, None),
        ({"Authorization": "lt_a_b"}, None),
        ({"x-api-key": "lt_a_b"}, None),  # not the identity source any more
        ({}, None),
    ],
)
def test_the_key_is_read_from_authorization_bearer_only(
    headers: dict[str, str], presented: str | None
) -> None:
    assert presented_key(headers) == presented


@pytest.mark.parametrize(
    ("key", "refusal"),
    [
        ("xlt_abc_def", "malformed"),  # something before the prefix
        ("lt__secret", "malformed"),  # no key id
        ("lt_abc_", "malformed"),  # no secret
        ("lt_abc", "malformed"),
        ("lt_abc_" + "s" * 194, "malformed"),  # 201 characters
        ("lt_abc_" + "s" * 193, "unknown"),  # 200: read and looked up
        ("lt_abc_lt_def", "unknown"),  # the prefix is the first one
    ],
)
def test_a_key_s_shape_is_checked_before_it_is_looked_up(api_keys: ApiKeys, key: str, refusal: str) -> None:
    assert api_keys.authenticate(key).refusal == refusal


def test_keys_are_random_of_a_fixed_shape_and_listed_newest_first(api_keys: ApiKeys) -> None:
    made = [api_keys.create("acme", now=at) for at in (3.0, 1.0, 2.0)]
    key, record = made[0]
    assert len(record.key_id) == 12  # 48 random bits, shown in listings
    assert len(key.split("_", 2)[2]) == 43  # 256 random bits
    assert record.name == ""
    named = api_keys.create("acme", name="ci", now=4.0)[1]
    assert [k.created_at for k in api_keys.all()] == [4.0, 3.0, 2.0, 1.0]
    assert api_keys.all()[0].name == named.name == "ci"


def test_the_authorizer_allows_a_valid_key_with_its_tenant_and_limits_and_denies_the_rest(
    handler: Any, api_keys: ApiKeys
) -> None:
    authorize, context = handler("AuthorizerFunction")
    key, record = api_keys.create("acme", rps=3, max_in_flight=7, tpm=20_000)
    plain, plain_record = api_keys.create("beta")
    revoked, revoked_record = api_keys.create("gone")
    api_keys.revoke(revoked_record.key_id)
    event = load_event("authorizer_request.json")
    for refused in ("lt_0123456789ab_notthesecret", "hello", revoked):
        event["headers"]["authorization"] = f"Bearer {refused}"
        assert authorize(event, context, keys=api_keys) == {"isAuthorized": False}
    event["headers"]["authorization"] = "Basic dXNlcjpwYXNz"
    assert authorize(event, context, keys=api_keys) == {"isAuthorized": False}
    event["headers"]["authorization"] = f"Bearer {key}"
    allowed = authorize(event, context, keys=api_keys)
    assert allowed == {
        "isAuthorized": True,
        "context": {
            "tenant_id": "acme",
            "key_id": record.key_id,
            "rps": 3,
            "max_in_flight": 7,
            "tpm": 20_000,
        },
    }
    event["headers"]["authorization"] = f"bearer {plain}"
    assert authorize(event, context, keys=api_keys)["context"] == {
        "tenant_id": "beta",
        "key_id": plain_record.key_id,
    }
    # What a function reads back from that context
    event = {"requestContext": {"authorizer": {"lambda": allowed["context"]}}}
    assert caller_of(event) == Caller("acme", record.key_id, rps=3, max_in_flight=7, tpm=20_000)
    assert caller_of({"requestContext": {}}) is None


def submit_as(handler: Any, service: TaskService, verdict: dict[str, Any] | None) -> dict[str, Any]:
    submit, context = handler("SubmitFunction")
    event = load_event("submit_task.json")
    if verdict is not None:
        event["requestContext"]["authorizer"] = {"lambda": verdict}
    else:
        event["requestContext"].pop("authorizer", None)
    return submit(event, context, service=service)  # type: ignore[no-any-return]


def limits(aws: Aws, settings: Settings, clock: list[float], ended: Any = None) -> KeyLimits:
    assert settings.limits_table_name is not None
    return KeyLimits(
        settings.limits_table_name,
        aws.dynamodb,
        ended=ended or (lambda held, now: []),
        clock=lambda: clock[0],
    )


def test_a_request_without_the_authorizer_s_tenant_is_a_401_problem_and_changes_nothing(
    aws: Aws, settings: Settings, handler: Any
) -> None:
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    service = TaskService(settings, store, task_lanes(settings, aws.sqs), results=blobs(settings))
    for verdict in (None, {}, {"refusal": "revoked"}):
        reply = submit_as(handler, service, verdict)
        assert reply["statusCode"] == 401
        assert reply["headers"]["WWW-Authenticate"] == 'Bearer realm="llmtasks"'
        assert "authorizer" in json.loads(reply["body"])["detail"]
    assert aws.messages("TaskQueue") == []
    accepted = submit_as(handler, service, {"tenant_id": "acme", "key_id": "k1"})
    assert accepted["statusCode"] == 202
    task = store.get(json.loads(accepted["body"])["task_id"], now=0)
    assert task is not None
    assert task.tenant_id == "acme"


def test_a_key_s_requests_a_second_are_counted_per_second_and_refused_with_retry_after(
    aws: Aws, settings: Settings, handler: Any
) -> None:
    clock = [1000.2]
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    service = TaskService(
        settings,
        store,
        task_lanes(settings, aws.sqs),
        results=blobs(settings),
        limits=limits(aws, settings, clock),
        clock=lambda: clock[0],
    )
    fast = {"tenant_id": "acme", "key_id": "fast", "rps": 2}
    other = {"tenant_id": "acme", "key_id": "other", "rps": 2}
    assert [submit_as(handler, service, fast)["statusCode"] for _ in range(2)] == [202, 202]
    refused = submit_as(handler, service, fast)
    assert refused["statusCode"] == 429
    assert refused["headers"]["Retry-After"] == "1"
    assert refused["headers"]["Content-Type"] == "application/problem+json"
    assert "2 request(s) a second" in json.loads(refused["body"])["detail"]
    assert len(aws.messages("TaskQueue")) == 2  # the refused one sent nothing
    assert submit_as(handler, service, other)["statusCode"] == 202  # another key: its own count
    assert submit_as(handler, service, {"tenant_id": "acme", "key_id": "free"})["statusCode"] == 202
    clock[0] = 1001.0  # the next second
    assert submit_as(handler, service, fast)["statusCode"] == 202
    # Each second's count is an item that expires a minute later
    window = aws.dynamodb.get_item(TableName=settings.limits_table_name, Key={"pk": {"S": "rate#fast#1000"}})
    assert (window["Item"]["n"]["N"], window["Item"]["expires_at"]["N"]) == ("2", "1060")


def test_a_file_batch_held_as_one_is_weighed_as_its_items_once_read(aws: Aws, settings: Settings) -> None:
    clock = [1000.0]
    counters = limits(aws, settings, clock)
    capped = Caller("acme", "files", max_in_flight=12)
    counters.hold(capped, "t", "task-1", weight=4)
    counters.hold(capped, "b", "batch-1")  # a file not read yet
    assert counters.reweigh("files", 12, "batch-1", weight=6)  # 4 + 6
    assert counters.reweigh("files", 12, "batch-1", weight=6)  # read again (a redelivery): no change
    assert {(h.work_id, h.weight) for h in counters.held("files")} == {("task-1", 4), ("batch-1", 6)}
    counters.hold(capped, "b", "batch-2")
    counters.hold(capped, "t", "task-2")  # 12: full
    with pytest.raises(TooManyRequests):
        counters.hold(capped, "t", "task-3")
    assert not counters.reweigh("files", 12, "batch-2", weight=2)  # 13 would be over 12
    assert not counters.reweigh("files", 12, "batch-2", weight=13)  # over the cap alone
    assert counters.reweigh("files", 12, "batch-3", weight=5)  # no entry (released): nothing to weigh
    assert sum(h.weight for h in counters.held("files")) == 12


def test_a_key_s_tasks_in_flight_are_capped_until_some_end(aws: Aws, settings: Settings) -> None:
    clock = [1000.0]
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    ended_asks: list[list[str]] = []

    def ended(held: list[Held], now: float) -> list[Held]:
        assert now == clock[0]  # asked as of the limits' clock
        ended_asks.append(sorted(h.work_id for h in held))
        tasks = store.get_many([h.work_id for h in held])
        return [h for h in held if h.work_id in tasks and tasks[h.work_id].status.is_terminal]

    service = TaskService(
        settings,
        store,
        task_lanes(settings, aws.sqs),
        results=blobs(settings),
        limits=limits(aws, settings, clock, ended),
        clock=lambda: clock[0],
    )
    capped = Caller("acme", "capped", max_in_flight=2)
    first, second = (
        service.submit("acme", SubmitTaskRequest(prompt=f"p{i}"), caller=capped).task for i in range(2)
    )
    with pytest.raises(TooManyRequests) as full:
        service.submit("acme", SubmitTaskRequest(prompt="p2"), caller=capped)
    assert full.value.retry_after_s > 0
    assert ended_asks == [sorted([first.task_id, second.task_id])]  # it looked, and nothing had ended
    assert len(aws.messages("TaskQueue")) == 2
    # Another key of the same tenant has its own cap; no cap means none
    service.submit("acme", SubmitTaskRequest(prompt="other"), caller=Caller("acme", "other", max_in_flight=1))
    service.submit("acme", SubmitTaskRequest(prompt="free"), caller=Caller("acme", "free"))
    # A task that ends makes room
    service.cancel("acme", first.task_id)
    third = service.submit("acme", SubmitTaskRequest(prompt="p3"), caller=capped).task
    assert third.status is TaskStatus.PENDING
    held = {h.work_id for h in limits(aws, settings, clock).held("capped")}
    assert held == {second.task_id, third.task_id}


def test_a_batch_weighs_its_items_and_one_larger_than_the_cap_is_refused(
    aws: Aws, settings: Settings
) -> None:
    clock = [1000.0]
    counters = limits(aws, settings, clock)
    capped = Caller("acme", "capped", max_in_flight=10)
    counters.hold(capped, "b", "batch-1", weight=8)
    counters.hold(capped, "b", "batch-1", weight=8)  # the same batch again (an Idempotency-Key replay)
    with pytest.raises(TooManyRequests):
        counters.hold(capped, "t", "task-1", weight=3)
    counters.hold(capped, "t", "task-2")
    counters.hold(capped, "t", "task-3")  # 10 of 10
    with pytest.raises(TooManyRequests) as full:
        counters.hold(capped, "t", "task-4")
    assert (full.value.retry_after_s, full.value.detail) == (
        10,
        "This API key has 10 task(s) in flight, its limit: submit again when some have ended.",
    )
    with pytest.raises(InvalidInput) as too_big:
        counters.hold(capped, "b", "batch-2", weight=11)
    assert (too_big.value.field, too_big.value.detail) == (
        "items",
        "11 items are more than this API key may have in flight (10).",
    )
    assert counters.held("nobody") == []
    assert sorted((h.kind, h.work_id, h.weight, h.since) for h in counters.held("capped")) == [
        ("b", "batch-1", 8, 1000.0),
        ("t", "task-2", 1, 1000.0),
        ("t", "task-3", 1, 1000.0),
    ]


def test_the_rest_of_a_flood_is_refused_without_a_write_until_the_next_second(
    aws: Aws, settings: Settings
) -> None:
    writes: list[str] = []

    class Counting:
        """The table's client, counting the writes a refusal costs."""

        def update_item(self, **request: Any) -> Any:
            writes.append(request["Key"]["pk"]["S"])
            return aws.dynamodb.update_item(**request)

    clock = [1000.5]
    assert settings.limits_table_name is not None
    counters = KeyLimits(
        settings.limits_table_name, Counting(), ended=lambda held, now: [], clock=lambda: clock[0]
    )  # type: ignore[arg-type]
    flood = Caller("acme", "flood", rps=2)
    counters.count_request(flood)
    counters.count_request(flood)
    for _ in range(50):
        with pytest.raises(TooManyRequests):
            counters.count_request(flood)
    assert len(writes) == 3  # two counted, one refused by the table; the other 49 from memory
    counters.count_request(Caller("acme", "other", rps=2))  # another key is counted as ever
    clock[0] = 1001.0
    counters.count_request(flood)  # a new second: counted again
    assert writes[-1] == "rate#flood#1001"


def test_a_limits_table_that_fails_is_a_503_with_retry_after_and_nothing_runs(
    aws: Aws, settings: Settings, handler: Any
) -> None:
    class Down:
        def update_item(self, **_: Any) -> Any:
            raise EndpointConnectionError(endpoint_url="http://dynamodb")

    assert settings.limits_table_name is not None
    service = TaskService(
        settings,
        TaskStore(settings.tasks_table_name, aws.dynamodb),
        task_lanes(settings, aws.sqs),
        results=blobs(settings),
        limits=KeyLimits(settings.limits_table_name, Down(), ended=lambda held, now: []),  # type: ignore[arg-type]
    )
    reply = submit_as(handler, service, {"tenant_id": "acme", "key_id": "k", "rps": 5})
    assert (reply["statusCode"], reply["headers"]["Retry-After"]) == (503, "1")
    assert aws.messages("TaskQueue") == []


def test_what_a_key_holds_has_ended_when_its_task_or_batch_has_or_was_never_stored(
    aws: Aws, settings: Settings
) -> None:
    now = 10_000.0
    tasks = TaskStore(settings.tasks_table_name, aws.dynamodb)
    batches = BatchStore(settings.tasks_table_name, aws.dynamodb)
    for task_id in ("running", "done", "dead"):
        tasks.create(pending_task(task_id, now=now, ttl_s=3600))
    tasks.cancel("done", tenant_id="default", now=now)
    # A task whose last delivery died: it reads as dead-lettered (failed) once that is due
    last = Lease("L", until=now - 5, message_id="m", receive_count=5, dead_letter_at=now - 1)
    tasks.claim("dead", last, now=now - 60)
    for batch_id, status in (("b-running", BatchStatus.PENDING), ("b-done", BatchStatus.COMPLETED)):
        batches.create(stored_batch(batch_id, now=now, status=status, total=3))
    held = [
        Held("t", "running", 1, since=now),
        Held("t", "done", 1, since=now),
        Held("t", "never-stored-old", 1, since=now - UNSTORED_GRACE_S - 1),
        Held("t", "never-stored-new", 1, since=now - UNSTORED_GRACE_S + 5),
        Held("t", "never-stored-at-the-grace", 1, since=now + 1 - UNSTORED_GRACE_S),
        Held("t", "dead", 1, since=now),
        Held("b", "b-running", 3, since=now),
        Held("b", "b-done", 3, since=now),
        Held("b", "b-never-stored-old", 3, since=now - UNSTORED_GRACE_S - 1),
        Held("b", "b-never-stored-new", 3, since=now - 1),
    ]
    ended = work_ended(tasks, batches)(held, now + 1)
    assert sorted(h.work_id for h in ended) == [
        "b-done",
        "b-never-stored-old",
        "dead",
        "done",
        "never-stored-old",
    ]
    # A task expired (its TTL passed, not yet deleted) has ended too
    assert [h.work_id for h in work_ended(tasks, batches)(held[:1], now + 3601)] == ["running"]
