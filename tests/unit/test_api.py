"""The HTTP routes, through the very handlers the template names, with payload 2.0 events."""

from __future__ import annotations

import base64
import copy
import importlib.metadata
import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

from llmtasks.aws import store as store_module
from llmtasks.aws.idempotency import IdempotencyKeys
from llmtasks.aws.queues import Queue
from llmtasks.aws.store import TaskStore
from llmtasks.domain.errors import TaskConflict
from llmtasks.domain.messages import Completion, WebhookMessage, webhook_id
from llmtasks.domain.models import Lease, SubmitTaskRequest, Usage, WebhookAttempt, WebhookStatus
from llmtasks.services.batches import BatchService
from llmtasks.services.tasks import TaskService
from llmtasks.services.webhook_controls import WebhookControls
from llmtasks.settings import Settings
from tests.conftest import Aws
from tests.helpers import NEVER, blobs, load_event, task_lanes

pytestmark = pytest.mark.unit


class Api:
    """Calls SubmitFunction or StatusFunction as API Gateway would and decodes the reply."""

    def __init__(
        self,
        aws: Aws,
        handler: Any,
        service: TaskService,
        batches: BatchService | None = None,
        webhooks: WebhookControls | None = None,
    ) -> None:
        self.aws = aws
        self.service = service
        self.batches = batches
        self.webhooks = webhooks
        self.submit_fn, self.submit_ctx = handler("SubmitFunction")
        self.status_fn, self.status_ctx = handler("StatusFunction")

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: str | None = None,
        query: str = "",
        headers: dict[str, str] | None = None,
        base64_body: bool = False,
        tenant: str = "default",
        key: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        template = "submit_task.json" if method == "POST" else "get_task.json"
        event = copy.deepcopy(load_event(template))
        route = self.aws.function("SubmitFunction").routes + self.aws.function("StatusFunction").routes
        matched = [(r, r.match(method, path)) for r in route]
        chosen = [(r, p) for r, p in matched if p is not None]
        route_key, params = (chosen[0][0].route_key, chosen[0][1]) if chosen else (f"{method} {path}", {})
        event.update(rawPath=path, routeKey=route_key, rawQueryString=query)
        event["requestContext"].update(routeKey=route_key)
        event["requestContext"]["http"].update(method=method, path=path)
        # What the Api's authorizer puts in the context for a key of the tenant
        event["requestContext"]["authorizer"] = {"lambda": key or {"tenant_id": tenant, "key_id": "unit"}}
        event.pop("pathParameters", None)
        event.pop("queryStringParameters", None)
        if params:
            event["pathParameters"] = params
        if query:
            event["queryStringParameters"] = dict(p.split("=", 1) for p in query.split("&"))
        event["headers"] = {**event.get("headers", {}), **(headers or {})}
        event.pop("body", None)
        if raw is not None or body is not None:
            event["body"] = raw if raw is not None else json.dumps(body)
            event["isBase64Encoded"] = base64_body
        if method == "POST":
            reply = self.submit_fn(
                event, self.submit_ctx, service=self.service, batches=self.batches, webhooks=self.webhooks
            )
        else:
            reply = self.status_fn(event, self.status_ctx, service=self.service, batches=self.batches)
        is_json = reply.get("headers", {}).get("Content-Type", "").endswith("json")
        reply["json"] = json.loads(reply["body"]) if is_json and reply.get("body") else None
        return reply


@pytest.fixture
def api(aws: Aws, handler: Any, settings: Settings) -> Api:
    return Api(aws, handler, task_service(aws, settings), webhooks=webhook_controls(aws, settings))


def webhook_controls(aws: Aws, settings: Settings) -> WebhookControls:
    """Replays and enables as SubmitFunction builds them, on moto."""
    endpoints = TaskStore(settings.tasks_table_name, aws.dynamodb).endpoints
    return WebhookControls(settings, endpoints, Queue(settings.webhook_queue_url, aws.sqs))


def task_service(aws: Aws, settings: Settings, queue: Queue | None = None) -> TaskService:
    """The service as SubmitFunction builds it, with Idempotency-Key records in moto."""
    assert settings.idempotency_table_name is not None
    persistence = DynamoDBPersistenceLayer(
        table_name=settings.idempotency_table_name, boto3_client=aws.dynamodb
    )
    return TaskService(
        settings,
        TaskStore(settings.tasks_table_name, aws.dynamodb),
        task_lanes(settings, aws.sqs, normal=queue),
        idempotency=IdempotencyKeys(persistence, ttl_s=settings.idempotency_ttl_s),
        results=blobs(settings),
    )


def assert_problem(reply: dict[str, Any], status: int) -> dict[str, Any]:
    assert reply["statusCode"] == status, reply
    assert reply["headers"]["Content-Type"] == "application/problem+json"
    problem = reply["json"]
    assert {"type", "title", "status", "detail"} <= set(problem)
    assert problem["status"] == status
    return problem


def test_sample_submit_event_is_accepted_with_location_and_retry_after(api: Api, aws: Aws) -> None:
    submit, context = api.submit_fn, api.submit_ctx
    reply = submit(load_event("submit_task.json"), context, service=api.service)
    body = json.loads(reply["body"])
    assert reply["statusCode"] == 202
    assert reply["headers"]["Location"] == f"/tasks/{body['task_id']}"
    assert int(reply["headers"]["Retry-After"]) > 0
    assert "Idempotent-Replayed" not in reply["headers"]  # no key, so nothing to replay
    assert body["status"] == "pending"
    assert body["expires_at"] > body["created_at"]
    [message] = aws.messages("TaskQueue")
    assert json.loads(message["Body"]) == {"task_id": body["task_id"]}


def test_a_submitted_task_reads_back_pending_with_its_metadata(api: Api) -> None:
    task_id = api.call("POST", "/tasks", {"prompt": "hi", "metadata": {"k": [1, 2]}})["json"]["task_id"]
    reply = api.call("GET", f"/tasks/{task_id}")
    assert reply["statusCode"] == 200
    assert reply["headers"]["Retry-After"] == "2"
    assert reply["json"]["status"] == "pending"
    assert reply["json"]["metadata"] == {"k": [1, 2]}
    assert reply["json"]["attempts"] == 0


def test_messages_are_accepted_instead_of_a_prompt(api: Api) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "system": "be brief", "temperature": 0.3}
    assert api.call("POST", "/tasks", body)["statusCode"] == 202


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "body"),
        ({"prompt": "a", "surprise": 1}, "surprise"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "a", "max_retries": 11}, "max_retries"),
        ({"prompt": "a", "temperature": 3}, "temperature"),
        ({"prompt": "a", "priority": "urgent"}, "priority"),
        ({"prompt": "a", "webhook_url": "http://example.com/hook"}, "webhook_url"),
        ({"prompt": "a", "metadata": {"blob": "x" * 3000}}, "metadata"),
        ({"messages": [{"role": "wizard", "content": "b"}]}, "messages.0.role"),
    ],
)
def test_invalid_bodies_are_422_problems_naming_the_field_and_store_nothing(
    api: Api, aws: Aws, body: dict[str, Any], field: str
) -> None:
    problem = assert_problem(api.call("POST", "/tasks", body), 422)
    assert any(e["field"].startswith(field) for e in problem["errors"]), problem
    assert aws.messages("TaskQueue") == []
    assert aws.dynamodb.scan(TableName=api.service._store.table_name)["Count"] == 0


def test_malformed_json_is_400(api: Api) -> None:
    assert_problem(api.call("POST", "/tasks", raw='{"prompt": "unterminated'), 400)


def test_a_prompt_over_the_cap_is_413_and_stores_nothing(api: Api, aws: Aws) -> None:
    problem = assert_problem(api.call("POST", "/tasks", {"prompt": "x" * (200 * 1024 + 1)}), 413)
    assert "limit" in problem["detail"]
    assert aws.messages("TaskQueue") == []


def test_unknown_task_is_404_problem(api: Api) -> None:
    assert_problem(api.call("GET", "/tasks/does-not-exist"), 404)


def test_cancel_then_cancel_again_is_409(api: Api) -> None:
    task_id = api.call("POST", "/tasks", {"prompt": "hi"})["json"]["task_id"]
    first = api.call("POST", f"/tasks/{task_id}/cancel")
    assert first["statusCode"] == 200
    assert first["json"]["status"] == "cancelled"
    assert "Retry-After" not in first["headers"]
    assert_problem(api.call("POST", f"/tasks/{task_id}/cancel"), 409)
    assert_problem(api.call("POST", "/tasks/nope/cancel"), 404)


def test_a_task_of_another_tenant_is_404(api: Api) -> None:
    task_id = api.call("POST", "/tasks", {"prompt": "hi"})["json"]["task_id"]
    event = load_event("get_task.json")
    event["pathParameters"] = {"task_id": task_id}
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/tasks/{task_id}"
    event["requestContext"]["authorizer"] = {"lambda": {"tenant_id": "intruder"}}
    reply = api.status_fn(event, api.status_ctx, service=api.service)
    assert reply["statusCode"] == 404


def test_wait_returns_as_soon_as_the_task_is_terminal(api: Api) -> None:
    task_id = api.call("POST", "/tasks", {"prompt": "hi"})["json"]["task_id"]
    api.call("POST", f"/tasks/{task_id}/cancel")
    reply = api.call("GET", f"/tasks/{task_id}", query="wait=20")
    assert reply["json"]["status"] == "cancelled"


def test_wait_beyond_25_seconds_is_422(api: Api) -> None:
    assert_problem(api.call("GET", "/tasks/x", query="wait=26"), 422)


def test_health_and_openapi_describe_the_routes(api: Api) -> None:
    health = api.call("GET", "/health")["json"]
    # The service's release, as its distribution carries it (tests/integration/test_distributions.py)
    assert health == {"status": "ok", "version": importlib.metadata.version("llmtasks")}
    document = api.call("GET", "/openapi.json")["json"]
    assert {"/tasks", "/tasks/{task_id}", "/tasks/{task_id}/cancel", "/webhooks/secret"} <= set(
        document["paths"]
    )
    schema = document["components"]["schemas"]["SubmitTaskRequest"]
    # One closed object for each way the fields go together (prompt or messages, with or without
    # a webhook URL): tests/unit/test_openapi.py holds the document to what the routes accept
    assert [branch["additionalProperties"] for branch in schema["anyOf"]] == [False] * 4
    # Auth as the API does it: Authorization: Bearer, on every route but the public ones; the
    # refusals API Gateway gives itself in its plain JSON, a key's limits as a problem
    assert set(document["components"]["securitySchemes"]) == {"bearer"}
    for path, route in [
        ("/tasks", "post"),
        ("/tasks", "get"),
        ("/tasks/{task_id}", "get"),
        ("/webhooks/secret", "get"),
    ]:
        operation = document["paths"][path][route]
        assert operation["security"] == [{"bearer": []}]
        responses = operation["responses"]
        for status in ("401", "403"):
            assert set(responses[status]["content"]) == {"application/json"}, status
            assert "API Gateway" in responses[status]["description"]
        assert set(responses["429"]["content"]) == {"application/problem+json"}
    assert "security" not in document["paths"]["/health"]["get"]
    assert set(document["paths"]["/tasks"]["post"]["responses"]) >= {
        "202",
        "400",
        "401",
        "409",
        "413",
        "422",
        "503",
    }
    docs = api.call("GET", "/docs")
    assert docs["statusCode"] == 200
    assert "swagger" in docs["body"].lower()
    # The page shows the document /openapi.json serves, its added parts too
    assert '"Metadata":' in docs["body"]
    assert '"links":' in docs["body"]


def test_webhook_secret_is_a_stable_whsec(api: Api) -> None:
    first = api.call("GET", "/webhooks/secret")["json"]["key"]
    assert first.startswith("whsec_")
    assert api.call("GET", "/webhooks/secret")["json"]["key"] == first


def test_a_tenant_s_first_rotation_just_creates_its_secret(api: Api) -> None:
    first = api.call("POST", "/webhooks/secret/rotate")
    assert first["statusCode"] == 200
    assert first["json"]["previous_key_expires_at"] is None
    assert api.call("GET", "/webhooks/secret")["json"]["key"] == first["json"]["key"]


def test_a_body_that_is_not_utf8_is_a_400_problem(api: Api) -> None:
    event_body = base64.b64encode(b'{"prompt": "\xff\xfe"}').decode()
    reply = api.call("POST", "/tasks", raw=event_body, base64_body=True)
    assert_problem(reply, 400)


def test_rotating_the_webhook_secret_keeps_the_old_one_signing_for_a_day(api: Api) -> None:
    old = api.call("GET", "/webhooks/secret")["json"]
    assert old["previous_key_expires_at"] is None
    rotated = api.call("POST", "/webhooks/secret/rotate")
    assert rotated["statusCode"] == 200
    new = rotated["json"]
    assert new["key"].startswith("whsec_")
    assert new["key"] != old["key"]
    overlap = datetime.fromisoformat(new["previous_key_expires_at"]).timestamp() - time.time()
    assert 24 * 3600 - 60 < overlap <= 24 * 3600
    assert api.call("GET", "/webhooks/secret")["json"] == new


def test_webhook_events_need_a_webhook_url(api: Api) -> None:
    reply = api.call("POST", "/tasks", {"prompt": "p", "webhook_events": ["task.failed"]})
    assert "webhook_url" in assert_problem(reply, 422)["detail"] + json.dumps(reply["json"])
    unknown = api.call(
        "POST",
        "/tasks",
        {"prompt": "p", "webhook_url": "http://127.0.0.1/h", "webhook_events": ["task.exploded"]},
    )
    assert_problem(unknown, 422)


def test_an_unknown_route_is_a_404_problem(api: Api) -> None:
    assert_problem(api.call("GET", "/nowhere"), 404)


def test_when_the_queue_refuses_nothing_is_stored_and_the_client_is_told_to_retry(
    aws: Aws, handler: Any, settings: Settings
) -> None:
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    broken_queue = Queue(settings.task_queue_url + "-gone", aws.sqs)
    api = Api(
        aws,
        handler,
        TaskService(
            settings, store, task_lanes(settings, aws.sqs, normal=broken_queue), results=blobs(settings)
        ),
    )
    reply = api.call("POST", "/tasks", {"prompt": "hi"})
    problem = assert_problem(reply, 503)
    assert problem["detail"] == "The task could not be stored or queued; nothing was kept. Retry."
    assert reply["headers"]["Retry-After"] == "1"
    assert aws.dynamodb.scan(TableName=settings.tasks_table_name)["Count"] == 0


def test_wait_holds_the_reply_until_the_task_turns_terminal(api: Api) -> None:
    import threading
    import time

    task_id = api.call("POST", "/tasks", {"prompt": "hi"})["json"]["task_id"]
    threading.Timer(0.8, lambda: api.service.cancel("default", task_id)).start()
    started = time.monotonic()
    reply = api.call("GET", f"/tasks/{task_id}", query="wait=10")
    held = time.monotonic() - started
    assert reply["json"]["status"] == "cancelled"
    assert 0.7 < held < 9  # back when the task ended, not when the 10 s ran out
    assert "Retry-After" not in reply["headers"]


def test_wait_gives_up_after_n_seconds_with_the_current_status(api: Api) -> None:
    task_id = api.call("POST", "/tasks", {"prompt": "hi"})["json"]["task_id"]
    reply = api.call("GET", f"/tasks/{task_id}", query="wait=1")
    assert reply["json"]["status"] == "pending"
    assert reply["headers"]["Retry-After"] == "2"


def test_when_the_table_refuses_the_client_is_told_to_retry_and_no_task_exists(
    aws: Aws, handler: Any, settings: Settings
) -> None:
    broken_store = TaskStore(settings.tasks_table_name + "-gone", aws.dynamodb)
    api = Api(
        aws,
        handler,
        TaskService(settings, broken_store, task_lanes(settings, aws.sqs), results=blobs(settings)),
    )
    assert_problem(api.call("POST", "/tasks", {"prompt": "hi"}), 503)
    assert aws.dynamodb.scan(TableName=settings.tasks_table_name)["Count"] == 0
    # Its message was sent first; the worker drops it once the grace has passed (test_worker).
    assert len(aws.messages("TaskQueue")) == 1


@pytest.mark.parametrize(
    "raw",
    [
        '{"prompt": "a", "metadata": {"x": NaN}}',
        '{"prompt": "a", "metadata": {"x": Infinity}}',
        '{"prompt": "a", "metadata": {"x": 1e400}}',
        '{"prompt": "a", "metadata": {"k": "\\udc00"}}',
        '{"prompt": "\\ud800"}',
        '{"messages": [{"role": "user", "content": "\\ud800"}]}',
        '{"prompt": "a", "temperature": NaN}',
        '{"prompt": "a", "temperature": 2.225073858507e-311}',
        '{"prompt": "a", "timeout_s": 1e-300}',
        '{"prompt": "a", "webhook_url": "https://[::1"}',
        "[1, 2]",
        '"just a string"',
        "null",
    ],
)
def test_bodies_the_table_could_not_store_are_refused_with_4xx_not_5xx(api: Api, aws: Aws, raw: str) -> None:
    reply = api.call("POST", "/tasks", raw=raw)
    assert 400 <= reply["statusCode"] < 500, (raw, reply)
    assert reply["headers"]["Content-Type"] == "application/problem+json"
    assert aws.messages("TaskQueue") == []


def test_any_json_object_is_metadata_echoed_back_exactly(api: Api) -> None:
    # Kept as JSON text: what a DynamoDB map refuses (empty keys, 40 levels, 42 digits, 1e-200) too
    deep: dict[str, object] = {"end": 1}
    for _ in range(40):
        deep = {"a": deep}
    metadata = {
        "big": 10**37,
        "small": 1.5e-100,
        "deep": {"a": {"b": [1, {"c": None}]}},
        "text": "ünïcødé ✓",
        "": "an empty key",
        "tiny": 1e-200,
        "huge": 123456789012345678901234567890123456789012,
        "nested": deep,
    }
    task_id = api.call("POST", "/tasks", {"prompt": "a", "metadata": metadata})["json"]["task_id"]
    assert api.call("GET", f"/tasks/{task_id}")["json"]["metadata"] == metadata


def api_without_a_table(aws: Aws, handler: Any, settings: Settings) -> Api:
    """The API on a tasks table that does not exist: every read and write of it fails."""
    store = TaskStore("no-such-table", aws.dynamodb)
    return Api(
        aws, handler, TaskService(settings, store, task_lanes(settings, aws.sqs), results=blobs(settings))
    )


def test_a_failing_table_is_a_503_problem_with_retry_after_not_a_500(
    aws: Aws, handler: Any, settings: Settings
) -> None:
    api = api_without_a_table(aws, handler, settings)
    for method, path in (("GET", "/webhooks/secret"), ("GET", f"/tasks/{'a' * 32}")):
        reply = api.call(method, path)
        assert_problem(reply, 503)
        assert reply["headers"]["Retry-After"] == "1"


@pytest.mark.parametrize("task_id", ["x" * 3000, "%00", "ABCDEF0123456789ABCDEF0123456789", "nope"])
def test_ids_that_cannot_name_a_task_are_404_without_a_table_lookup(
    aws: Aws, handler: Any, settings: Settings, task_id: str
) -> None:
    # A table that does not exist: any lookup would fail, so a 404 proves none was made
    # (real DynamoDB refuses keys over 2048 bytes with an error; moto does not check).
    api = api_without_a_table(aws, handler, settings)
    assert_problem(api.call("GET", f"/tasks/{task_id}"), 404)
    assert_problem(api.call("POST", f"/tasks/{task_id}/cancel"), 404)


# --- listing ----------------------------------------------------------------------------------


def submit_n(api: Api, count: int, **body: Any) -> list[str]:
    return [api.call("POST", "/tasks", {"prompt": f"p{i}", **body})["json"]["task_id"] for i in range(count)]


def test_listing_pages_through_a_tenant_s_tasks_newest_first(api: Api) -> None:
    ids = submit_n(api, 5)
    first = api.call("GET", "/tasks", query="limit=2")["json"]
    assert [t["task_id"] for t in first["data"]] == ids[::-1][:2]
    second = api.call("GET", "/tasks", query=f"limit=2&cursor={first['next_cursor']}")["json"]
    third = api.call("GET", "/tasks", query=f"limit=2&cursor={second['next_cursor']}")["json"]
    seen = [t["task_id"] for page in (first, second, third) for t in page["data"]]
    assert seen == ids[::-1]
    assert third["next_cursor"] is None
    assert all(t["result"] is None for t in first["data"])


def test_listing_filters_by_status_and_shows_only_the_tenant_s_own(api: Api) -> None:
    pending = submit_n(api, 3)
    api.call("POST", f"/tasks/{pending[0]}/cancel")
    other = api.service.submit("globex", SubmitTaskRequest(prompt="not yours")).task.task_id
    cancelled = api.call("GET", "/tasks", query="status=cancelled")["json"]["data"]
    assert [t["task_id"] for t in cancelled] == [pending[0]]
    everything = [t["task_id"] for t in api.call("GET", "/tasks")["json"]["data"]]
    assert other not in everything
    assert set(everything) == set(pending)


def test_a_cursor_is_a_place_in_the_caller_s_own_listing_whoever_made_it(api: Api) -> None:
    # Given this tenant's five tasks and another tenant's page cursor, taken after its newest
    ids = submit_n(api, 5)
    for i in range(2):
        api.service.submit("globex", SubmitTaskRequest(prompt=f"not yours {i}"))
    globex_cursor = api.service.list_tasks("globex", limit=1)[1]
    assert globex_cursor is not None
    # When this tenant pages from it: the tasks older than that place, its own only
    page = api.call("GET", "/tasks", query=f"cursor={globex_cursor}")["json"]
    assert [t["task_id"] for t in page["data"]] == ids[::-1]
    # A place no page came from reads as it is: the newest first, or past the oldest, none
    newest = api.call("GET", "/tasks", query="limit=1&cursor=9999999999-" + "f" * 32)["json"]
    assert [t["task_id"] for t in newest["data"]] == ids[-1:]
    oldest = api.call("GET", "/tasks", query="cursor=0-" + "0" * 32)["json"]
    assert (oldest["data"], oldest["next_cursor"]) == ([], None)


@pytest.mark.parametrize("window", [store_module.STATUS_WINDOW, 2, 1])
def test_a_filtered_page_holds_at_most_its_limit_and_the_next_page_goes_on_from_it(
    api: Api, window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given, newest first: a cancelled task, then four pending ones; and a query that looks
    # through `window` index entries (so with 2 or 1, a page takes several queries)
    monkeypatch.setattr(store_module, "STATUS_WINDOW", window)
    older = submit_n(api, 4)
    newest = submit_n(api, 1)[0]
    api.call("POST", f"/tasks/{newest}/cancel")
    # When two pending ones are asked for
    first = api.call("GET", "/tasks", query="status=pending&limit=2")["json"]
    # Then the page has two, not every pending task the further reads found, and the next one
    # starts where it stopped
    assert [t["task_id"] for t in first["data"]] == older[::-1][:2]
    rest = api.call("GET", "/tasks", query=f"status=pending&limit=2&cursor={first['next_cursor']}")["json"]
    assert [t["task_id"] for t in rest["data"]] == older[::-1][2:]


def test_a_filtered_listing_looks_through_twice_its_page_first_then_twice_as_many_each_query(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a pending task behind 30 cancelled ones, and queries that look through 16 entries at most
    monkeypatch.setattr(store_module, "STATUS_WINDOW", 16)
    pending = submit_n(api, 1)
    for task_id in submit_n(api, 30):
        api.call("POST", f"/tasks/{task_id}/cancel")
    limits: list[int] = []

    def note_limit(params: dict[str, Any], **_: Any) -> None:
        limits.append(params["Limit"])

    api.aws.dynamodb.meta.events.register("provide-client-params.dynamodb.Query", note_limit)
    try:
        # When a page of two cancelled tasks, then one of two pending tasks, is asked for
        cancelled = api.call("GET", "/tasks", query="status=cancelled&limit=2")["json"]["data"]
        found = api.call("GET", "/tasks", query="status=pending&limit=2")["json"]["data"]
    finally:
        api.aws.dynamodb.meta.events.unregister("provide-client-params.dynamodb.Query", note_limit)
    # Then the cancelled page reads four entries; the pending one 4, 8, then 16 a query
    assert len(cancelled) == 2
    assert [t["task_id"] for t in found] == pending
    assert limits == [4, 4, 8, 16, 16]


def test_an_expired_task_not_yet_deleted_is_a_404_and_is_not_listed(api: Api, settings: Settings) -> None:
    # Given a task submitted a TTL and a minute ago: DynamoDB has not deleted it yet
    ttl = settings.task_ttl_seconds
    then = TaskService(
        settings,
        TaskStore(settings.tasks_table_name, api.aws.dynamodb),
        task_lanes(settings, api.aws.sqs),
        clock=lambda: time.time() - ttl - 60,
        results=blobs(settings),
    )
    expired = then.submit("default", SubmitTaskRequest(prompt="old")).task.task_id
    fresh = submit_n(api, 1)[0]
    stored = api.aws.dynamodb.get_item(
        TableName=settings.tasks_table_name, Key={"pk": {"S": f"task#{expired}"}}
    )
    assert "Item" in stored
    # Then it reads as gone, and the listing shows only the live one
    assert_problem(api.call("GET", f"/tasks/{expired}"), 404)
    assert [t["task_id"] for t in api.call("GET", "/tasks")["json"]["data"]] == [fresh]


def test_a_dead_lettered_task_is_listed_as_failed_not_as_processing(api: Api, settings: Settings) -> None:
    # Given a task whose lease, taken on its message's last delivery, has lapsed
    task_id = submit_n(api, 1)[0]
    now = time.time()
    last = Lease(
        "L",
        until=now - 5,
        message_id="m1",
        receive_count=settings.task_max_receive_count,
        dead_letter_at=now - 1,
    )
    TaskStore(settings.tasks_table_name, api.aws.dynamodb).claim(task_id, last, now=now - 65)
    # Then the listing reads it as failed with error_code dead_lettered, and filters it so
    failed = api.call("GET", "/tasks", query="status=failed")["json"]["data"]
    assert [(t["task_id"], t["status"], t["error_code"]) for t in failed] == [
        (task_id, "failed", "dead_lettered")
    ]
    assert api.call("GET", "/tasks", query="status=processing")["json"]["data"] == []


@pytest.mark.parametrize(
    "query",
    [
        "status=exploded",
        "limit=0",
        "limit=101",
        "limit=ten",
        "cursor=not-a-cursor",
        "cursor=10",  # a batch results cursor
        "cursor=1733140000.5-" + "A" * 32,
        "cursor=" + "1" * 17 + "-" + "a" * 32,
    ],
)
def test_bad_listing_parameters_are_422_problems(api: Api, query: str) -> None:
    assert_problem(api.call("GET", "/tasks", query=query), 422)


# --- Idempotency-Key ----------------------------------------------------------------------------


def test_the_same_key_and_body_return_the_same_task_once(api: Api, aws: Aws) -> None:
    key = {"idempotency-key": "order-42"}
    first = api.call("POST", "/tasks", {"prompt": "once"}, headers=key)
    again = api.call("POST", "/tasks", {"prompt": "once"}, headers=key)
    assert first["statusCode"] == again["statusCode"] == 202
    assert again["json"] == first["json"]
    assert again["headers"]["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first["headers"]
    assert len(aws.messages("TaskQueue")) == 1


def test_a_task_with_a_json_schema_is_made_and_replayed_under_a_key(api: Api, aws: Aws) -> None:
    # The stored result keeps the schema as JSON text, as a task's item does: read back as one
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}}, "required": ["kind"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "Kind", "schema": schema, "strict": True}}
    key = {"idempotency-key": "order-44"}
    first = api.call("POST", "/tasks", {"prompt": "kind?", "response_format": fmt}, headers=key)
    again = api.call("POST", "/tasks", {"prompt": "kind?", "response_format": fmt}, headers=key)
    assert first["statusCode"] == again["statusCode"] == 202
    assert again["json"] == first["json"]
    assert again["headers"]["Idempotent-Replayed"] == "true"
    assert len(aws.messages("TaskQueue")) == 1


def test_the_same_key_with_another_body_is_422_and_changes_nothing(api: Api, aws: Aws) -> None:
    key = {"idempotency-key": "order-43"}
    api.call("POST", "/tasks", {"prompt": "first"}, headers=key)
    other = api.call("POST", "/tasks", {"prompt": "second"}, headers=key)
    problem = assert_problem(other, 422)
    assert problem["detail"] == "This Idempotency-Key was already used with a different body."
    assert problem["errors"] == [{"field": "Idempotency-Key", "message": problem["detail"]}]
    assert len(aws.messages("TaskQueue")) == 1


def test_a_body_that_states_a_default_it_left_out_before_is_another_body(api: Api, aws: Aws) -> None:
    # The body as sent is what the key was used with: a field added, even at its default value,
    # is another request (and a default that changes between deploys changes no stored body).
    key = {"idempotency-key": "order-47"}
    api.call("POST", "/tasks", {"prompt": "p"}, headers=key)
    default_retries = SubmitTaskRequest.model_fields["max_retries"].default
    stated = api.call("POST", "/tasks", {"prompt": "p", "max_retries": default_retries}, headers=key)
    assert_problem(stated, 422)
    assert len(aws.messages("TaskQueue")) == 1


def test_two_keys_of_one_tenant_are_two_requests(api: Api, aws: Aws) -> None:
    # The key is half of what a stored result is found by: another key is another request,
    # whatever its body.
    first = api.service.submit("acme", SubmitTaskRequest(prompt="one"), idempotency_key="k1")
    second = api.service.submit("acme", SubmitTaskRequest(prompt="two"), idempotency_key="k2")
    assert first.task.task_id != second.task.task_id
    assert not first.replayed
    assert not second.replayed
    assert len(aws.messages("TaskQueue")) == 2


def test_a_key_is_kept_for_the_configured_time(api: Api, aws: Aws, settings: Settings) -> None:
    assert settings.idempotency_table_name is not None
    before = time.time()
    api.call("POST", "/tasks", {"prompt": "kept"}, headers={"idempotency-key": "order-45"})
    [record] = aws.dynamodb.scan(TableName=settings.idempotency_table_name)["Items"]
    # A day by default (not Powertools' own hour): a client retrying tomorrow morning still
    # finds its task
    assert settings.idempotency_ttl_s == 24 * 3600
    # (Powertools stamps it from the real clock, which no seam reaches: a margin of seconds.)
    assert int(record["expiration"]["N"]) == pytest.approx(before + 24 * 3600, abs=5)


def test_a_key_sent_where_no_records_are_kept_is_a_503_that_says_so(
    aws: Aws, handler: Any, settings: Settings
) -> None:
    store = TaskStore(settings.tasks_table_name, aws.dynamodb)
    keyless = TaskService(settings, store, task_lanes(settings, aws.sqs), results=blobs(settings))
    reply = Api(aws, handler, keyless).call(
        "POST", "/tasks", {"prompt": "once"}, headers={"idempotency-key": "order-46"}
    )
    assert assert_problem(reply, 503)["detail"] == "Idempotency-Key is not configured on this deployment."
    assert aws.messages("TaskQueue") == []


def test_keys_are_scoped_to_their_tenant(api: Api) -> None:
    body = SubmitTaskRequest(prompt="same")
    acme = api.service.submit("acme", body, idempotency_key="k1")
    globex = api.service.submit("globex", body, idempotency_key="k1")
    assert acme.task.task_id != globex.task.task_id
    assert not acme.replayed
    assert not globex.replayed


def test_a_refused_body_does_not_use_up_its_key(api: Api) -> None:
    key = {"idempotency-key": "order-44"}
    assert_problem(api.call("POST", "/tasks", {"prompt": "x" * 300_000}, headers=key), 413)
    assert api.call("POST", "/tasks", {"prompt": "fixed"}, headers=key)["statusCode"] == 202


@pytest.mark.parametrize("key", ["", "k" * 256])
def test_an_empty_or_overlong_key_is_422(api: Api, key: str) -> None:
    assert_problem(api.call("POST", "/tasks", {"prompt": "p"}, headers={"idempotency-key": key}), 422)


class HeldQueue(Queue):
    """A queue whose first send waits until the test lets it go, so that a duplicate arrives
    while the first request is still being created."""

    def __init__(self, url: str, sqs: Any) -> None:
        super().__init__(url, sqs)
        self.entered, self.release = threading.Event(), threading.Event()

    def send(self, body: Any, **options: Any) -> str:
        self.entered.set()
        assert self.release.wait(timeout=30)
        return super().send(body, **options)


def test_a_duplicate_while_the_first_is_being_created_is_a_conflict(aws: Aws, settings: Settings) -> None:
    queue = HeldQueue(settings.task_queue_url, aws.sqs)
    service = task_service(aws, settings, queue)
    outcomes: list[object] = []

    def submit() -> None:
        try:
            outcomes.append(service.submit("acme", SubmitTaskRequest(prompt="p"), idempotency_key="race"))
        except TaskConflict as conflict:
            outcomes.append(conflict)

    first = threading.Thread(target=submit)
    first.start()
    assert queue.entered.wait(timeout=30)  # the first is inside its send
    submit()  # the duplicate, meanwhile
    queue.release.set()
    first.join()
    assert sorted(type(o).__name__ for o in outcomes) == ["Submission", "TaskConflict"]
    conflict = next(o for o in outcomes if isinstance(o, TaskConflict))
    assert (
        conflict.detail == "A request with this Idempotency-Key is still being processed; retry in a moment."
    )
    assert len(aws.messages("TaskQueue")) == 1


def test_when_the_idempotency_records_fail_the_client_is_told_to_retry_and_nothing_is_stored(
    aws: Aws, handler: Any, settings: Settings
) -> None:
    gone = DynamoDBPersistenceLayer(table_name="no-such-idempotency-table", boto3_client=aws.dynamodb)
    service = TaskService(
        settings,
        TaskStore(settings.tasks_table_name, aws.dynamodb),
        task_lanes(settings, aws.sqs),
        idempotency=IdempotencyKeys(gone, ttl_s=settings.idempotency_ttl_s),
        results=blobs(settings),
    )
    reply = Api(aws, handler, service).call(
        "POST", "/tasks", {"prompt": "hi"}, headers={"idempotency-key": "k"}
    )
    problem = assert_problem(reply, 503)
    assert problem["detail"] == "Idempotency records are unavailable; nothing was stored. Retry."
    assert reply["headers"]["Retry-After"] == "1"
    assert aws.dynamodb.scan(TableName=settings.tasks_table_name)["Count"] == 0
    assert aws.messages("TaskQueue") == []


@pytest.mark.parametrize("content_type", ["text/plain", "application/octet-stream"])
def test_a_post_without_a_body_labelled_otherwise_is_a_422_not_a_500(api: Api, content_type: str) -> None:
    # A fuzzed request found this: Powertools refuses a non-JSON content type with an exception
    reply = api.call("POST", "/tasks", headers={"content-type": content_type})
    assert_problem(reply, 422)
    assert api.aws.messages("TaskQueue") == []


# --- a task's and a batch's webhook: its attempts, a replay, a disabled URL enabled ----------

HOOK = "http://127.0.0.1:9/hook"  # an allowed host (unit settings); nothing is sent to it here


def ended_task_with_a_webhook(api: Api, settings: Settings) -> str:
    task_id: str = api.call("POST", "/tasks", {"prompt": "hi", "webhook_url": HOOK})["json"]["task_id"]
    store = TaskStore(settings.tasks_table_name, api.aws.dynamodb)
    lease = Lease("L", until=time.time() + 60, message_id="m", receive_count=1, dead_letter_at=NEVER)
    store.claim(task_id, lease, now=time.time())
    completion = Completion(text="done", model="m", usage=Usage(total_tokens=1))
    store.complete(task_id, lease_id="L", completion=completion, now=time.time())
    return task_id


def test_a_task_s_webhook_attempts_are_paged_newest_first_for_its_tenant_alone(
    api: Api, settings: Settings
) -> None:
    task_id = ended_task_with_a_webhook(api, settings)
    store = TaskStore(settings.tasks_table_name, api.aws.dynamodb)
    log: list[WebhookAttempt] = []
    for n in range(3):
        attempt = WebhookAttempt(
            at=datetime.fromtimestamp(1_800_000_000 + n, tz=UTC),
            trigger="scheduled",
            outcome="retrying",
            status_code=500 + n,
            error=f"receiver answered {500 + n}",
            latency_ms=n,
        )
        task = store.record_webhook_outcome(task_id, status=WebhookStatus.RETRYING, attempt=attempt, log=log)
        assert task is not None
        log = task.webhook_log
    first = api.call("GET", f"/tasks/{task_id}/webhook/attempts", query="limit=2")
    assert first["statusCode"] == 200
    assert [a["status_code"] for a in first["json"]["data"]] == [502, 501]
    assert first["json"]["data"][0] == {
        "at": "2027-01-15T08:00:02Z",
        "trigger": "scheduled",
        "outcome": "retrying",
        "status_code": 502,
        "error": "receiver answered 502",
        "latency_ms": 2,
        "next_attempt_at": None,
    }
    rest = api.call(
        "GET", f"/tasks/{task_id}/webhook/attempts", query=f"limit=2&cursor={first['json']['next_cursor']}"
    )
    assert ([a["status_code"] for a in rest["json"]["data"]], rest["json"]["next_cursor"]) == ([500], None)
    # Another tenant's caller learns nothing of it, and a cursor off its pattern is refused
    assert_problem(api.call("GET", f"/tasks/{task_id}/webhook/attempts", tenant="intruder"), 404)
    assert_problem(api.call("GET", f"/tasks/{task_id}/webhook/attempts", query="cursor=x"), 422)
    assert_problem(api.call("GET", "/tasks/nope/webhook/attempts"), 404)


def test_a_replay_is_queued_for_an_ended_task_of_the_caller_s_and_refused_otherwise(
    api: Api, settings: Settings
) -> None:
    pending = api.call("POST", "/tasks", {"prompt": "hi", "webhook_url": HOOK})["json"]["task_id"]
    assert "is pending" in assert_problem(api.call("POST", f"/tasks/{pending}/webhook/replay"), 409)["detail"]
    bare = api.call("POST", "/tasks", {"prompt": "hi"})["json"]["task_id"]
    assert (
        "no webhook_url" in assert_problem(api.call("POST", f"/tasks/{bare}/webhook/replay"), 409)["detail"]
    )
    ended = ended_task_with_a_webhook(api, settings)
    assert_problem(api.call("POST", f"/tasks/{ended}/webhook/replay", tenant="intruder"), 404)
    assert api.aws.messages("WebhookQueue") == []  # the refusals queued nothing
    reply = api.call("POST", f"/tasks/{ended}/webhook/replay")
    assert reply["statusCode"] == 202
    assert reply["json"] == {
        "webhook_id": webhook_id(ended, "task.completed"),
        "event_type": "task.completed",
        "status": "queued",
    }
    [message] = api.aws.messages("WebhookQueue")
    queued = WebhookMessage.model_validate_json(message["Body"])
    assert (queued.task_id, queued.replay, message["Attributes"]["MessageGroupId"]) == (
        ended,
        True,
        "http://127.0.0.1:9",
    )


def test_a_disabled_url_is_enabled_for_its_own_tenant_only(api: Api, settings: Settings) -> None:
    endpoints = TaskStore(settings.tasks_table_name, api.aws.dynamodb).endpoints
    for tenant in ("default", "other"):
        endpoints.failed(tenant, HOOK, error="receiver answered 500", now=1.0, disable_after_s=0)
        assert endpoints.health(tenant, HOOK).disabled
    reply = api.call("POST", "/webhooks/endpoints/enable", {"url": HOOK})
    assert (reply["statusCode"], reply["json"]) == (200, {"url": HOOK, "status": "enabled"})
    assert not endpoints.health("default", HOOK).disabled
    assert endpoints.health("other", HOOK).disabled
    assert_problem(api.call("POST", "/webhooks/endpoints/enable", {}), 422)
    assert_problem(api.call("POST", "/webhooks/endpoints/enable", {"url": HOOK, "extra": 1}), 422)
