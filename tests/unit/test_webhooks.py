"""Webhooks: SSRF guard, Standard Webhooks signatures, the stream relay and delivery with retries."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import random
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from llmtasks.aws.batch_store import BatchStore, change_of
from llmtasks.aws.limits import Take, endpoint_places
from llmtasks.aws.queues import Queue
from llmtasks.aws.store import TaskStore
from llmtasks.domain.batches import Batch, BatchStatus
from llmtasks.domain.errors import BackendError, InvalidInput, RetryLater, TaskConflict
from llmtasks.domain.llm_request import FunctionCall, ToolCall
from llmtasks.domain.messages import Completion, WebhookMessage, new_webhook_secret, webhook_id
from llmtasks.domain.models import BATCH_COMPLETED, Lease, SubmitTaskRequest, TaskStatus, Usage, WebhookStatus
from llmtasks.domain.runs import RequiredAction
from llmtasks.observability import trace_id
from llmtasks.records import sqs_record
from llmtasks.services import webhook_places
from llmtasks.services.tasks import TaskService
from llmtasks.services.webhook_controls import WebhookControls
from llmtasks.services.webhook_places import PLACE_MARGIN_S, EndpointPlaces
from llmtasks.services.webhook_urls import (
    check_webhook_url,
    endpoint_of,
    no_lookups,
    resolver_from_settings,
    system_resolver,
)
from llmtasks.services.webhooks import (
    DEFER_BASE_S,
    WebhookDelivery,
    WebhookRelay,
    WebhookSender,
)
from llmtasks.settings import Settings
from llmtasks_client import WebhookVerificationError, verify_webhook
from llmtasks_local.mock_llm import reply_text
from llmtasks_local.sam.events import pattern_matcher, stream_record
from tests.conftest import Aws
from tests.helpers import (
    HANG_S,
    NEVER,
    SpanJitter,
    WebhookReceiver,
    blobs,
    emf_records,
    load_event,
    task_lanes,
)

pytestmark = pytest.mark.unit


def resolver(*addresses: str) -> Any:
    def resolve(host: str, port: int) -> list[str]:
        return list(addresses)

    return resolve


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.1",
        "172.16.4.4",
        "192.168.1.1",
        "127.0.0.1",
        "169.254.169.254",
        "fd00:ec2::254",
        "::1",
        "::ffff:127.0.0.1",
        "224.0.0.1",
        "0.0.0.0",
        "100.64.0.1",
    ],
)
def test_urls_resolving_inside_the_network_are_refused(address: str) -> None:
    with pytest.raises(InvalidInput, match="non-public"):
        check_webhook_url("https://hooks.example.com/x", allowed_hosts=frozenset(), resolve=resolver(address))


# Every spelling of an address that reaches inside: what a DNS answer (or the URL itself) may
# hold, and the inside address it reaches. Each is refused, at submit and at send alike.
SSRF_TABLE = [
    ("NAT64 well-known prefix", "64:ff9b::a9fe:a9fe", "169.254.169.254"),
    ("NAT64 well-known prefix, private", "64:ff9b::a00:1", "10.0.0.1"),
    ("NAT64 local-use prefix", "64:ff9b:1::a9fe:a9fe", "169.254.169.254"),
    ("6to4", "2002:a9fe:a9fe::1", "169.254.169.254"),
    ("6to4, loopback", "2002:7f00:1::1", "127.0.0.1"),
    ("Teredo", "2001:0:4136:e378:8000:63bf:3fff:fdd2", "a tunnel to an IPv4 host"),
    ("IPv4-mapped", "::ffff:169.254.169.254", "169.254.169.254"),
    ("IPv4-compatible", "::a9fe:a9fe", "169.254.169.254"),
    ("IPv4-compatible, loopback", "::7f00:1", "127.0.0.1"),
]


@pytest.mark.parametrize(("form", "address", "inside"), SSRF_TABLE, ids=[row[0] for row in SSRF_TABLE])
def test_ipv6_forms_that_embed_an_inside_address_are_refused(form: str, address: str, inside: str) -> None:
    with pytest.raises(InvalidInput, match="non-public"):
        check_webhook_url("https://hooks.example.com/x", allowed_hosts=frozenset(), resolve=resolver(address))
    with pytest.raises(InvalidInput, match="non-public"):
        check_webhook_url(f"https://[{address}]/x", allowed_hosts=frozenset(), resolve=no_lookups)


@pytest.mark.parametrize(
    "host",
    [
        "2852039166",
        "0xa9.0xfea9fe",
        "0251.0376.0251.0376",
        "0xa9.254.0251.254",
        "127.1",
        "0x7f000001",
        "017700000001",
    ],
)
def test_ipv4_spelled_in_decimal_octal_or_hex_is_read_as_the_address_it_is(host: str) -> None:
    """The C resolver reads these as 169.254.169.254 or 127.0.0.1; so does the guard, whatever
    the resolver (the names never reach it)."""

    def must_not_resolve(name: str, port: int) -> list[str]:
        raise AssertionError(f"{name} was looked up")

    for resolve in (must_not_resolve, no_lookups):
        with pytest.raises(InvalidInput, match="non-public"):
            check_webhook_url(f"https://{host}/x", allowed_hosts=frozenset(), resolve=resolve)


def test_public_ipv6_and_a_public_address_spelled_in_decimal_pass() -> None:
    check_webhook_url(
        "https://h.example/x", allowed_hosts=frozenset(), resolve=resolver("2606:4700::6810:84e5")
    )
    # A public IPv6 address whose last 32 bits spell a private IPv4 one embeds nothing
    check_webhook_url("https://h.example/x", allowed_hosts=frozenset(), resolve=resolver("2606:4700::a00:1"))
    check_webhook_url("https://1572395042/x", allowed_hosts=frozenset(), resolve=no_lookups)  # 93.184.216.34
    check_webhook_url(
        "https://h.example/x", allowed_hosts=frozenset(), resolve=resolver("64:ff9b::5db8:d822")
    )


def test_the_settings_choose_the_resolver_and_the_system_one_answers_addresses(settings: Settings) -> None:
    on, off = (settings.model_copy(update={"webhook_resolve_names": flag}) for flag in (True, False))
    assert (resolver_from_settings(on), resolver_from_settings(off)) == (system_resolver, no_lookups)
    # Numeric hosts and /etc/hosts' localhost: the C resolver answers without sending a query
    assert system_resolver("127.0.0.1", 443) == ["127.0.0.1"]
    assert "127.0.0.1" in system_resolver("localhost", 443)


def test_a_link_local_answer_with_its_zone_is_refused_not_an_error() -> None:
    with pytest.raises(InvalidInput, match="non-public"):
        check_webhook_url("https://h.example/x", allowed_hosts=frozenset(), resolve=resolver("fe80::1%eth0"))


def test_one_private_address_among_public_ones_is_enough_to_refuse() -> None:
    with pytest.raises(InvalidInput):
        check_webhook_url(
            "https://h.example/x", allowed_hosts=frozenset(), resolve=resolver("93.184.216.34", "10.1.1.1")
        )


def test_a_public_https_url_passes() -> None:
    check_webhook_url("https://h.example/x", allowed_hosts=frozenset(), resolve=resolver("93.184.216.34"))


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://h.example/x", "webhook_url must use https."),
        ("ftp://h.example/x", "webhook_url must use https."),
        ("https:///nohost", "webhook_url has no host."),
        ("https://h.example:99999/", "webhook_url is not a valid URL"),
    ],
)
def test_only_https_urls_with_a_host(url: str, said: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_webhook_url(url, allowed_hosts=frozenset(), resolve=resolver("93.184.216.34"))
    assert refused.value.detail.startswith(said)


def test_the_lookup_is_for_the_url_s_port_else_https_s() -> None:
    asked: list[tuple[str, int]] = []

    def recording(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return ["93.184.216.34"]

    check_webhook_url("https://h.example/x", allowed_hosts=frozenset(), resolve=recording)
    check_webhook_url("https://h.example:8443/x", allowed_hosts=frozenset(), resolve=recording)
    assert asked == [("h.example", 443), ("h.example", 8443)]
    with pytest.raises(InvalidInput) as refused:
        check_webhook_url("https://gone.example/x", allowed_hosts=frozenset(), resolve=resolver())
    assert refused.value.detail == "webhook_url's host 'gone.example' does not resolve."


def test_an_unresolvable_host_is_refused() -> None:
    def fail(host: str, port: int) -> list[str]:
        raise OSError("no such host")

    with pytest.raises(InvalidInput, match="does not resolve"):
        check_webhook_url("https://nowhere.invalid/x", allowed_hosts=frozenset(), resolve=fail)


def test_with_lookups_off_names_are_refused_and_literal_addresses_still_checked() -> None:
    with pytest.raises(InvalidInput) as refused:
        check_webhook_url("https://example.com/x", allowed_hosts=frozenset(), resolve=no_lookups)
    assert refused.value.detail == (
        "webhook_url's host 'example.com' is a name, and this deployment looks no names up"
        " (WEBHOOK_RESOLVE_NAMES=false): use an address or one of its allowed hosts."
    )
    with pytest.raises(InvalidInput, match="non-public"):
        check_webhook_url("https://10.0.0.1/x", allowed_hosts=frozenset(), resolve=no_lookups)
    with pytest.raises(InvalidInput, match="non-public"):
        check_webhook_url("https://[::1]/x", allowed_hosts=frozenset(), resolve=no_lookups)
    check_webhook_url("https://93.184.216.34/x", allowed_hosts=frozenset(), resolve=no_lookups)


def test_allowed_hosts_pass_without_a_lookup_even_over_http() -> None:
    check_webhook_url("http://127.0.0.1:9/x", allowed_hosts=frozenset({"127.0.0.1"}), resolve=resolver())
    # Host names compare without case, as DNS does
    check_webhook_url("http://LocalHost:9/x", allowed_hosts=frozenset({"localhost"}), resolve=resolver())


def test_a_url_without_a_host_says_so() -> None:
    with pytest.raises(InvalidInput, match="no host"):
        check_webhook_url("https:///nohost", allowed_hosts=frozenset(), resolve=resolver("93.184.216.34"))


def test_a_new_secret_is_standard_webhooks_shape_with_32_random_bytes() -> None:
    secret = new_webhook_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"))) == 32
    assert new_webhook_secret() != secret


@pytest.mark.parametrize("address", ["10.0.0.1", "169.254.169.254", "127.0.0.1"])
def test_submit_refuses_a_webhook_resolving_inside_with_a_422_problem_and_stores_nothing(
    aws: Aws, settings: Settings, handler: Any, address: str
) -> None:
    # Given no allowance for any host, and a name that resolves (by injection) inside the network
    strict = settings.model_copy(update={"webhook_allowed_hosts": frozenset()})
    store = TaskStore(strict.tasks_table_name, aws.dynamodb)
    service = TaskService(
        strict, store, task_lanes(strict, aws.sqs), results=blobs(strict), resolve=resolver(address)
    )
    submit, context = handler("SubmitFunction")
    event = load_event("submit_task.json")
    event["body"] = json.dumps({"prompt": "p", "webhook_url": "https://innocent.example/hook"})
    reply = submit(event, context, service=service)
    assert reply["statusCode"] == 422
    assert reply["headers"]["Content-Type"] == "application/problem+json"
    assert "non-public" in json.loads(reply["body"])["detail"]
    assert aws.messages("TaskQueue") == []


@pytest.mark.parametrize("address", ["10.0.0.1", "169.254.169.254", "127.0.0.1"])
def test_a_host_that_resolves_inside_by_send_time_gets_nothing(address: str) -> None:
    import asyncio

    from llmtasks.domain.events import WebhookEvent
    from llmtasks.domain.models import TaskView

    # A recording fake transport: even a broken check could not send a packet anywhere
    sent: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda request: sent.append(request) or httpx.Response(200))
    sender = WebhookSender(
        timeout_s=1, allowed_hosts=frozenset(), resolve=resolver(address), transport=transport
    )
    view = TaskView.model_validate(
        {"task_id": "t", "status": "completed", "attempts": 1, "created_at": 0, "expires_at": 10}
    )
    event = WebhookEvent(type="task.completed", timestamp=view.created_at, data=view)
    result = asyncio.run(
        sender.send(
            "https://rebound.example/h",
            message_id="msg_1",
            body=event.model_dump_json(),
            secrets=["whsec_" + "A" * 32],
        )
    )
    assert (result.delivered, result.gone) == (False, True)
    assert (
        result.error
        == "webhook_url's host 'rebound.example' resolves to a non-public address; it is refused."
    )
    assert sent == []


def test_the_stream_filter_passes_only_terminal_transitions_of_tasks_with_a_webhook(aws: Aws) -> None:
    matches = pattern_matcher(aws.function("WebhookFunction").stream_sources[0].filter_patterns)
    [record] = load_event("webhook_stream.json")["Records"]
    assert matches(record)
    redelivered = json.loads(json.dumps(record))
    redelivered["dynamodb"]["OldImage"]["status"] = {"S": "completed"}  # the webhook's own status write
    assert not matches(redelivered)
    no_hook = json.loads(json.dumps(record))
    del no_hook["dynamodb"]["NewImage"]["webhook_url"]
    assert not matches(no_hook)
    still_running = json.loads(json.dumps(record))
    still_running["dynamodb"]["NewImage"]["status"] = {"S": "processing"}
    assert not matches(still_running)


class Hooks:
    """The webhook function wired to moto and a real receiver on 127.0.0.1."""

    def __init__(self, aws: Aws, handler: Any, settings: Settings, url: str) -> None:
        self.aws = aws
        self.settings = settings
        self.store = TaskStore(settings.tasks_table_name, aws.dynamodb)
        self.service = TaskService(
            settings, self.store, task_lanes(settings, aws.sqs), results=blobs(settings)
        )
        self.webhook_queue = Queue(settings.webhook_queue_url, aws.sqs)
        self.places = endpoint_places(aws.resources.table_names["LimitsTable"], aws.dynamodb)
        self.fn, self.context = handler("WebhookFunction")
        self.url = url

    def finish_task(
        self,
        prompt: str = "hello",
        *,
        result_ref: str | None = None,
        events: list[Any] | None = None,
        trace_header: str | None = None,
    ) -> str:
        """A task with a webhook that the worker completed."""
        request = SubmitTaskRequest(prompt=prompt, webhook_url=self.url, webhook_events=events)
        task = self.service.submit("default", request, trace_header=trace_header).task
        self.store.claim(
            task.task_id,
            Lease("L", until=time.time() + 60, message_id="m1", receive_count=1, dead_letter_at=NEVER),
            now=time.time(),
        )
        completion = Completion(text=reply_text(prompt), model="m", usage=Usage(total_tokens=3))
        self.store.complete(
            task.task_id, lease_id="L", completion=completion, now=time.time(), result_ref=result_ref
        )
        return task.task_id

    def stream_event(self) -> dict[str, Any]:
        arn = self.aws.resources.attributes[("TasksTable", "StreamArn")]
        shard = self.aws.streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
        iterator = self.aws.streams.get_shard_iterator(
            StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        records = self.aws.streams.get_records(ShardIterator=iterator)["Records"]
        matches = pattern_matcher(self.aws.function("WebhookFunction").stream_sources[0].filter_patterns)
        return {"Records": [r for r in (stream_record(dict(r), arn) for r in records) if matches(r)]}

    def relay(self) -> dict[str, Any]:
        relay = WebhookRelay(self.webhook_queue)
        return self.fn(self.stream_event(), self.context, relay=relay)  # type: ignore[no-any-return]

    def deliver(
        self,
        messages: list[dict[str, Any]],
        transport: httpx.AsyncBaseTransport | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        settings = self.settings.model_copy(update=overrides)
        sender = WebhookSender(
            timeout_s=settings.webhook_timeout_s,
            allowed_hosts=settings.webhook_allowed_hosts,
            transport=transport,
        )
        dlq = Queue(settings.webhook_dlq_url, self.aws.sqs)
        delivery = WebhookDelivery(
            settings,
            self.store,
            dlq,
            sender,
            results=blobs(settings),
            places=self.places,
            requeue=self.webhook_queue,
        )
        arn = self.aws.resources.attributes[("WebhookQueue", "Arn")]
        event = {"Records": [sqs_record(m, arn) for m in messages]}  # type: ignore[arg-type]
        return self.fn(event, self.context, delivery=delivery, queue=self.webhook_queue)  # type: ignore[no-any-return]

    def secret(self) -> str:
        return self.service.webhook_secret("default").key


@pytest.fixture
def hooks(aws: Aws, handler: Any, settings: Settings, receiver: tuple[WebhookReceiver, str]) -> Hooks:
    # Five attempts, no waits between them
    schedule = {"webhook_retry_schedule": (0.0,) * 4}
    return Hooks(aws, handler, settings.model_copy(update=schedule), receiver[1])


def test_a_completed_task_is_relayed_once_and_delivered_signed(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, _ = receiver
    task_id = hooks.finish_task("signed please")
    assert hooks.relay() == {"batchItemFailures": []}
    [message] = aws.messages("WebhookQueue")
    assert hooks.deliver([message]) == {"batchItemFailures": []}
    [delivery] = hook.deliveries
    event = Webhook(hooks.secret()).verify(delivery.body, delivery.headers)  # raises if the signature is bad
    assert event["type"] == "task.completed"
    assert event["data"]["task_id"] == task_id
    assert event["data"]["result"] == reply_text("signed please")
    assert delivery.headers["webhook-id"].startswith("msg_")
    assert delivery.headers["content-type"] == "application/json"
    assert delivery.headers["user-agent"] == "llmtasks-webhooks/1"
    task = hooks.store.get(task_id, now=time.time())
    assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.DELIVERED, 1)
    # The delivery status write is itself a MODIFY on the stream; the filter keeps it out.
    assert len(hooks.stream_event()["Records"]) == 1


def a_batch(
    status: BatchStatus, *, webhook_url: str | None = "https://h.example/hook", **fields: Any
) -> Batch:
    ended = status is BatchStatus.COMPLETED
    defaults: dict[str, Any] = {
        "batch_id": "b" * 32,
        "tenant_id": "default",
        "total": 1,
        "pending": 0 if ended else 1,
        "completed": 1 if ended else 0,
        "manifest_ref": "batches/b.jsonl",
        "chunk_size": 100,
        "chunk_offsets": [0, 20],
        "created_at": 1.0,
        "expires_at": 2,
    }
    return Batch(status=status, webhook_url=webhook_url, **(defaults | fields))


def test_a_batch_s_webhook_is_relayed_once_when_it_ends_and_only_if_it_asked_for_one(aws: Aws) -> None:
    relay = WebhookRelay(Queue(aws.queue_url("WebhookQueue"), aws.sqs))
    running, ended = a_batch(BatchStatus.PENDING), a_batch(BatchStatus.COMPLETED)
    # The write that ends it (or an item inserted already ended) queues batch.completed
    assert relay.relay_batch(running, ended) is True
    assert relay.relay_batch(None, ended) is True
    messages = [WebhookMessage.model_validate_json(m["Body"]) for m in aws.messages("WebhookQueue")]
    expected = webhook_id("b" * 32, BATCH_COMPLETED)
    assert [(m.batch_id, m.task_id, m.event_type, m.webhook_id) for m in messages] == [
        ("b" * 32, None, BATCH_COMPLETED, expected)
    ] * 2
    # Nothing for a later write to the ended batch, one still running, or one without the webhook
    assert relay.relay_batch(ended, ended) is False
    assert relay.relay_batch(running, running) is False
    assert relay.relay_batch(running, a_batch(BatchStatus.COMPLETED, webhook_url=None)) is False
    assert relay.relay_batch(running, a_batch(BatchStatus.COMPLETED, webhook_events=["task.failed"])) is False
    assert aws.messages("WebhookQueue") == []


def test_the_relay_reads_both_images_and_queues_only_the_write_that_ends_the_task(
    hooks: Hooks, aws: Aws
) -> None:
    # Given every record a task's life wrote, unfiltered: insert, claim, completion, and the
    # delivery-status write that follows a completion
    task_id = hooks.finish_task("imaged")
    hooks.store.record_webhook_outcome(task_id, status=WebhookStatus.DELIVERED, attempt=None, log=[])
    arn = aws.resources.attributes[("TasksTable", "StreamArn")]
    shard = aws.streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = aws.streams.get_shard_iterator(StreamArn=arn, ShardId=shard, ShardIteratorType="TRIM_HORIZON")
    raw = aws.streams.get_records(ShardIterator=iterator["ShardIterator"])["Records"]
    records = [
        stream_record(dict(r), arn) for r in raw if r["dynamodb"]["Keys"]["pk"]["S"] == f"task#{task_id}"
    ]
    # When the relay reads each, old image and new
    relay = WebhookRelay(hooks.webhook_queue)
    # Then only the completion queues task.completed, under the task's stable webhook-id
    assert [relay.relay_change(*change_of(r)) for r in records] == [False, False, True, False]
    [message] = [WebhookMessage.model_validate_json(m["Body"]) for m in aws.messages("WebhookQueue")]
    assert (message.task_id, message.event_type) == (task_id, "task.completed")
    assert message.webhook_id == webhook_id(task_id, "task.completed")


def test_a_batch_s_webhook_is_delivered_signed_with_its_status_object_and_recorded(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    # Given an ended batch that asked for its webhook, and one that did not
    hook, url = receiver
    settings = hooks.settings
    batches = BatchStore(settings.tasks_table_name, aws.dynamodb)
    live = int(time.time()) + 3600
    wanted = a_batch(BatchStatus.COMPLETED, webhook_url=url, expires_at=live)
    silent = a_batch(BatchStatus.COMPLETED, webhook_url=None, expires_at=live, batch_id="c" * 32)
    for batch in (wanted, silent):
        batches.create(batch)
    sender = WebhookSender(timeout_s=2, allowed_hosts=settings.webhook_allowed_hosts)
    dead_letters = Queue(settings.webhook_dlq_url, aws.sqs)
    delivery = WebhookDelivery(
        settings, hooks.store, dead_letters, sender, results=blobs(settings), batches=batches
    )

    def event_of(batch_id: str) -> WebhookMessage:
        return WebhookMessage(
            webhook_id=webhook_id(batch_id, BATCH_COMPLETED), batch_id=batch_id, event_type=BATCH_COMPLETED
        )

    # When each is delivered, and one for a batch that is gone
    for batch_id in ("b" * 32, "c" * 32, "d" * 32):
        asyncio.run(delivery.deliver(event_of(batch_id), receive_count=1))
    # Then only the first reached the receiver: signed for the batch's tenant, its status inside
    [sent] = hook.deliveries
    event = Webhook(hooks.secret()).verify(sent.body, sent.headers)
    assert event["type"] == "batch.completed"
    data = event["data"]
    assert (data["batch_id"], data["status"], data["total"], data["completed"]) == (
        "b" * 32,
        "completed",
        1,
        1,
    )
    assert sent.headers["webhook-id"] == webhook_id("b" * 32, BATCH_COMPLETED)
    stored = batches.get("b" * 32, now=time.time())
    assert stored is not None
    assert (stored.webhook_status, stored.webhook_attempts) == (WebhookStatus.DELIVERED, 1)
    assert aws.messages("WebhookDLQ") == []


def test_the_submit_s_trace_header_rides_on_every_message_about_the_task(hooks: Hooks, aws: Aws) -> None:
    """AWSTraceHeader on the task's message and on its webhook's: the functions those queues
    trigger continue the submit request's X-Ray trace."""
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    hooks.finish_task("traced", trace_header=header)
    [task_message] = aws.messages("TaskQueue")
    assert task_message["Attributes"]["AWSTraceHeader"] == header
    hooks.relay()
    [webhook_message] = aws.messages("WebhookQueue")
    assert webhook_message["Attributes"]["AWSTraceHeader"] == header
    assert trace_id(header) == "1-5759e988-bd862e3fe1be46a994272793"


def test_a_tampered_body_fails_verification(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    hooks.finish_task()
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    [delivery] = receiver[0].deliveries
    with pytest.raises(Exception, match="signature"):
        Webhook(hooks.secret()).verify(delivery.body.replace(b"completed", b"failed"), delivery.headers)


def test_a_failing_receiver_is_retried_with_the_same_webhook_id(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str], capsys: pytest.CaptureFixture[str]
) -> None:
    hook, _ = receiver
    hook.answers = [500, 503]
    task_id = hooks.finish_task()
    hooks.relay()
    for attempt in (1, 2):
        [message] = aws.messages("WebhookQueue")
        assert int(message["Attributes"]["ApproximateReceiveCount"]) == attempt
        assert len(hooks.deliver([message])["batchItemFailures"]) == 1
        task = hooks.store.get(task_id, now=time.time())
        assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.RETRYING, attempt)
    [message] = aws.messages("WebhookQueue")
    assert hooks.deliver([message]) == {"batchItemFailures": []}
    assert len({d.headers["webhook-id"] for d in hook.deliveries}) == 1
    assert len(hook.deliveries) == 3
    assert hooks.store.get(task_id, now=time.time()).webhook_status is WebhookStatus.DELIVERED
    emf = emf_records(capsys.readouterr().out)
    assert (len(emf["WebhookAttempts"]), len(emf["WebhookFailures"])) == (3, 2)


def test_410_stops_at_once_and_parks_the_event_in_the_dlq(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    receiver[0].answers = [410]
    task_id = hooks.finish_task()
    hooks.relay()
    assert hooks.deliver(aws.messages("WebhookQueue")) == {"batchItemFailures": []}
    [parked] = aws.messages("WebhookDLQ")
    assert WebhookMessage.model_validate_json(parked["Body"]).task_id == task_id
    task = hooks.store.get(task_id, now=time.time())
    assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.FAILED, 1)
    assert len(receiver[0].deliveries) == 1


def test_the_last_failed_attempt_parks_the_event_in_the_dlq(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    receiver[0].answers = [500, 500]
    task_id = hooks.finish_task()
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"), webhook_retry_schedule=(0.0,))  # two attempts
    hooks.deliver(aws.messages("WebhookQueue"), webhook_retry_schedule=(0.0,))
    assert aws.messages("WebhookQueue") == []
    assert len(aws.messages("WebhookDLQ")) == 1
    assert hooks.store.get(task_id, now=time.time()).webhook_status is WebhookStatus.FAILED


def on_the_default_schedule(
    hooks: Hooks, aws: Aws, rng: random.Random
) -> tuple[WebhookDelivery, WebhookMessage, str]:
    """The delivery as the settings' own schedule makes it, the event of a finished task, and
    that task's id."""
    settings = hooks.settings.model_copy(
        update={"webhook_retry_schedule": Settings.model_fields["webhook_retry_schedule"].default}
    )
    assert settings.webhook_attempts == 6
    task_id = hooks.finish_task("on schedule")
    hooks.relay()
    [message] = aws.messages("WebhookQueue")
    sender = WebhookSender(timeout_s=settings.webhook_timeout_s, allowed_hosts=settings.webhook_allowed_hosts)
    delivery = WebhookDelivery(
        settings,
        hooks.store,
        Queue(settings.webhook_dlq_url, aws.sqs),
        sender,
        rng=rng,
        results=blobs(settings),
    )
    return delivery, WebhookMessage.model_validate_json(message["Body"]), task_id


def test_the_default_schedule_is_svix_s_with_jitter_and_the_sixth_failure_goes_to_the_dlq(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    # Given a receiver that always fails, and the settings' own schedule
    hook, _ = receiver
    hook.answers = [500] * 7
    rng = SpanJitter(at=0.75)  # three quarters of its span: 1.1
    delivery, webhook, task_id = on_the_default_schedule(hooks, aws, rng)
    # When each of the first five attempts fails, the next waits 5 s, 5 min, 30 min, 2 h, 5 h,
    # each times a jitter drawn from 0.8-1.2 (here 1.1)
    delays = []
    for attempt in range(1, 6):
        with pytest.raises(RetryLater) as retry:
            asyncio.run(delivery.deliver(webhook, receive_count=attempt))
        delays.append(retry.value.delay_s)
    assert delays == pytest.approx([5 * 1.1, 300 * 1.1, 1800 * 1.1, 7200 * 1.1, 18000 * 1.1])
    assert rng.spans == [(0.8, 1.2)] * 5
    assert aws.messages("WebhookDLQ") == []
    # Then the sixth failure is the last: the event waits in WebhookDLQ, the task says failed
    asyncio.run(delivery.deliver(webhook, receive_count=6))
    [parked] = aws.messages("WebhookDLQ")
    assert WebhookMessage.model_validate_json(parked["Body"]).webhook_id == webhook.webhook_id
    task = hooks.store.get(task_id, now=time.time())
    assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.FAILED, 6)
    assert len(hook.deliveries) == 6


def test_a_receiver_s_retry_after_waits_longer_than_the_schedule_never_shorter(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, _ = receiver
    hook.answers = [429, 503]
    hook.answer_headers = {"Retry-After": "30"}
    delivery, webhook, _ = on_the_default_schedule(hooks, aws, SpanJitter(at=0.75))
    delays = []
    for attempt in (1, 2):
        with pytest.raises(RetryLater) as retry:
            asyncio.run(delivery.deliver(webhook, receive_count=attempt))
        delays.append(retry.value.delay_s)
    # The first: the schedule's 5 s (jittered to 5.5), the receiver's 30 s; the second: 330 s
    assert delays == pytest.approx([30, 300 * 1.1])


def test_a_hanging_receiver_counts_as_a_failed_attempt(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    receiver[0].hang_s = 1.5
    task_id = hooks.finish_task()
    hooks.relay()
    reply = hooks.deliver(aws.messages("WebhookQueue"), webhook_timeout_s=0.3)
    assert len(reply["batchItemFailures"]) == 1
    assert hooks.store.get(task_id, now=time.time()).webhook_status is WebhookStatus.RETRYING


def test_the_sample_delivery_event_for_a_task_that_is_gone_is_dropped(
    hooks: Hooks, receiver: tuple[WebhookReceiver, str]
) -> None:
    sender = WebhookSender(timeout_s=1, allowed_hosts=hooks.settings.webhook_allowed_hosts)
    delivery = WebhookDelivery(
        hooks.settings,
        hooks.store,
        Queue(hooks.settings.webhook_dlq_url, hooks.aws.sqs),
        sender,
        results=blobs(hooks.settings),
    )
    reply = hooks.fn(
        load_event("webhook_delivery.json"), hooks.context, delivery=delivery, queue=hooks.webhook_queue
    )
    assert reply == {"batchItemFailures": []}
    assert receiver[0].deliveries == []


def test_the_sample_stream_event_is_relayed_to_the_webhook_queue(hooks: Hooks, aws: Aws) -> None:
    reply = hooks.fn(
        load_event("webhook_stream.json"), hooks.context, relay=WebhookRelay(hooks.webhook_queue)
    )
    assert reply == {"batchItemFailures": []}
    [message] = aws.messages("WebhookQueue")
    assert WebhookMessage.model_validate_json(message["Body"]).event_type == "task.completed"


def test_cancelled_tasks_get_a_task_cancelled_event(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    task = hooks.service.submit("default", SubmitTaskRequest(prompt="stop", webhook_url=hooks.url)).task
    hooks.service.cancel("default", task.task_id)
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    [delivery] = receiver[0].deliveries
    assert json.loads(delivery.body)["type"] == "task.cancelled"
    assert json.loads(delivery.body)["data"]["status"] == TaskStatus.CANCELLED


def test_a_result_kept_in_s3_is_sent_whole_in_the_webhook(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    from llmtasks.aws.results import ResultBlobs

    blobs = ResultBlobs(hooks.settings.results_bucket)
    big = "y" * 200_000
    task_id = hooks.finish_task(result_ref=blobs.put("pending-id", big))
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    [delivery] = receiver[0].deliveries
    data = Webhook(hooks.secret()).verify(delivery.body, delivery.headers)["data"]
    assert (data["task_id"], data["result"]) == (task_id, big)


def test_an_event_replayed_from_the_dlq_is_delivered_with_the_same_webhook_id(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    # Given an event parked in WebhookDLQ after a 410
    hook, _ = receiver
    hook.answers = [410]
    task_id = hooks.finish_task()
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    [parked] = aws.messages("WebhookDLQ")
    # When it is moved back to WebhookQueue (what SQS redrive does) and the receiver is fixed
    aws.sqs.send_message(QueueUrl=aws.queue_url("WebhookQueue"), MessageBody=parked["Body"])
    assert hooks.deliver(aws.messages("WebhookQueue")) == {"batchItemFailures": []}
    # Then it arrives, under the same webhook-id, and the task says so
    assert [d.headers["webhook-id"] for d in hook.deliveries] == [
        hook.deliveries[0].headers["webhook-id"]
    ] * 2
    task = hooks.store.get(task_id, now=time.time())
    assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.DELIVERED, 2)


def test_during_a_rotation_both_secrets_verify_and_after_it_only_the_new_one(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    old = hooks.secret()
    hooks.finish_task("rotating")
    new = hooks.service.rotate_webhook_secret("default").key
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    [delivery] = receiver[0].deliveries
    # Two signatures, space-separated; each secret verifies, with the package and with the SDK
    assert len(delivery.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        Webhook(secret).verify(delivery.body, delivery.headers)
        assert verify_webhook(delivery.body, delivery.headers, secret).type == "task.completed"
    # Once the overlap is over, only the new secret signs
    overlap_over = hooks.settings.model_copy(update={"webhook_secret_overlap_s": 0})
    TaskService(
        overlap_over, hooks.store, task_lanes(overlap_over, aws.sqs), results=blobs(overlap_over)
    ).rotate_webhook_secret("default")
    newest = hooks.secret()
    hooks.finish_task("after the overlap")
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    latest = receiver[0].deliveries[-1]
    assert len(latest.headers["webhook-signature"].split(" ")) == 1
    verify_webhook(latest.body, latest.headers, newest)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(latest.body, latest.headers, new)


def test_verify_webhook_returns_the_event_and_refuses_a_tampered_one(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    task_id = hooks.finish_task("verify me")
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    [delivery] = receiver[0].deliveries
    upper = {k.title(): v for k, v in delivery.headers.items()}  # header case does not matter
    event = verify_webhook(delivery.body, upper, hooks.secret())
    assert (event.data.task_id, event.data.status, event.data.result) == (
        task_id,
        TaskStatus.COMPLETED,
        reply_text("verify me"),
    )
    with pytest.raises(WebhookVerificationError):
        verify_webhook(delivery.body.replace(b"verify", b"forged"), delivery.headers, hooks.secret())


def test_a_task_gets_only_the_events_it_asked_for(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    # Given a task that wants only failures, and it completes
    quiet = hooks.finish_task("only failures", events=["task.failed"])
    hooks.relay()
    # Then nothing is queued or sent, and its webhook reads as skipped
    assert aws.messages("WebhookQueue") == []
    view = hooks.service.get("default", quiet)
    assert view.webhook_state is WebhookStatus.SKIPPED
    # While one that wants completions gets its event
    wanted = hooks.finish_task("completions please", events=["task.completed", "task.failed"])
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    [delivery] = receiver[0].deliveries
    assert json.loads(delivery.body)["data"]["task_id"] == wanted


def test_a_delivery_that_dies_mid_send_is_retried(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    task_id = hooks.finish_task("crash while sending")
    hooks.relay()
    [message] = aws.messages("WebhookQueue")

    def die(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("the function died mid-send")

    # When the function dies while posting, the record is reported failed and comes back
    assert len(hooks.deliver([message], transport=httpx.MockTransport(die))["batchItemFailures"]) == 1
    # Then its next delivery sends it, under the same webhook-id
    assert hooks.deliver([message]) == {"batchItemFailures": []}
    [delivery] = receiver[0].deliveries
    assert delivery.headers["webhook-id"] == WebhookMessage.model_validate_json(message["Body"]).webhook_id
    assert hooks.store.get(task_id, now=time.time()).webhook_status is WebhookStatus.DELIVERED


def test_a_429_s_retry_after_sets_the_next_attempt(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    receiver[0].answers = [429]
    receiver[0].answer_headers = {"Retry-After": "30"}
    hooks.finish_task("slow down")
    hooks.relay()
    assert len(hooks.deliver(aws.messages("WebhookQueue"))["batchItemFailures"]) == 1
    # The schedule says now (0 s); the receiver said 30 s: the event is not visible yet
    assert aws.messages("WebhookQueue") == []


def test_a_redirect_is_a_failed_attempt_and_is_not_followed(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    hook.answers = [307]
    hook.answer_headers = {"Location": url + "?elsewhere"}
    task_id = hooks.finish_task("moved")
    hooks.relay()
    assert len(hooks.deliver(aws.messages("WebhookQueue"))["batchItemFailures"]) == 1
    assert len(hook.deliveries) == 1
    task = hooks.store.get(task_id, now=time.time())
    assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.RETRYING, 1)


def test_sam_s_generic_stream_sample_is_passed_over_not_failed(hooks: Hooks, aws: Aws) -> None:
    # `sam local generate-event dynamodb update`: an insert, a modify and a remove of another
    # table's items (key `Id`). Reported failed, a stream would retry them and hold the shard.
    reply = hooks.fn(
        load_event("foreign_stream.json"), hooks.context, relay=WebhookRelay(hooks.webhook_queue)
    )
    assert reply == {"batchItemFailures": []}
    assert aws.messages("WebhookQueue") == []


# --- one endpoint's open deliveries under a cap --------------------------------------------


def test_an_endpoint_is_its_scheme_host_and_port() -> None:
    assert endpoint_of("https://Hooks.Example.com/a?b=c") == "https://hooks.example.com:443"
    assert endpoint_of("http://127.0.0.1:8080/hook") == "http://127.0.0.1:8080"
    assert endpoint_of("http://example.com/x") == "http://example.com:80"


def test_an_event_whose_endpoint_has_every_place_taken_is_put_off_without_an_attempt(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str], capsys: pytest.CaptureFixture[str]
) -> None:
    hook, url = receiver
    endpoint = endpoint_of(url)
    task_id = hooks.finish_task()
    hooks.relay()
    [message] = aws.messages("WebhookQueue")
    assert message["Attributes"]["MessageGroupId"] == endpoint  # the fair queue's group
    # Given the endpoint's one place held by another delivery, begun 5 s ago (a hang, by now)
    until = time.time() - 5 + hooks.settings.webhook_timeout_s + PLACE_MARGIN_S
    assert hooks.places.take(endpoint, "msg_other", cap=1, until=until)
    # When the event comes, it is handled (its message deleted) without a request, and with one
    # write (the refused take, which says who holds the places): nothing is read
    calls: list[str] = []

    def count(model: Any, **_: Any) -> None:
        calls.append(model.name)

    aws.dynamodb.meta.events.register("before-call.dynamodb.*", count)
    assert hooks.deliver([message], webhook_endpoint_concurrency=1) == {"batchItemFailures": []}
    aws.dynamodb.meta.events.unregister("before-call.dynamodb.*", count)
    assert calls == ["UpdateItem"]
    assert hook.deliveries == []
    task = hooks.store.get(task_id, now=time.time())
    assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.PENDING, 0)
    # and comes back as a new message a second or so later, its attempt count kept
    [later] = aws.messages("WebhookQueue", wait_s=3)
    deferred = WebhookMessage.model_validate_json(later["Body"])
    assert (deferred.attempts_before, deferred.deferrals) == (0, 1)
    assert deferred.webhook_id == WebhookMessage.model_validate_json(message["Body"]).webhook_id
    assert later["Attributes"]["MessageGroupId"] == endpoint
    # Once the place is free, it is delivered as its first attempt, and gives its place back
    hooks.places.give_back(endpoint, "msg_other")
    assert hooks.deliver([later], webhook_endpoint_concurrency=1) == {"batchItemFailures": []}
    assert len(hook.deliveries) == 1
    task = hooks.store.get(task_id, now=time.time())
    assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.DELIVERED, 1)
    assert hooks.places.running(endpoint) == {}
    assert len(emf_records(capsys.readouterr().out)["WebhookDeferrals"]) == 1


def test_a_place_held_by_a_delivery_that_died_is_taken_back_once_its_lease_lapses(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, url = receiver
    hooks.finish_task()
    hooks.relay()
    # Given the place held by a sandbox that died mid-delivery (its lease lapsed)
    assert hooks.places.take(endpoint_of(url), "msg_dead", cap=1, until=time.time() - 1)
    assert hooks.deliver(aws.messages("WebhookQueue"), webhook_endpoint_concurrency=1) == {
        "batchItemFailures": []
    }
    assert len(hook.deliveries) == 1


def test_a_deferred_event_counts_the_attempts_made_before_it_was_put_off(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    # Given an event put off after four failed attempts (of five), whose endpoint still fails
    hook, _ = receiver
    hook.answers = [500]
    task_id = hooks.finish_task()
    hooks.relay()
    [message] = aws.messages("WebhookQueue")
    body = WebhookMessage.model_validate_json(message["Body"]).model_copy(
        update={"attempts_before": 4, "deferrals": 1}
    )
    hooks.webhook_queue.send(body)
    [resent] = aws.messages("WebhookQueue")
    # When its new message's first delivery fails, that is the last attempt: parked in the DLQ
    assert hooks.deliver([resent], webhook_endpoint_concurrency=1) == {"batchItemFailures": []}
    [parked] = aws.messages("WebhookDLQ")
    assert WebhookMessage.model_validate_json(parked["Body"]).webhook_id == body.webhook_id
    assert hooks.store.get(task_id, now=time.time()).webhook_status is WebhookStatus.FAILED


def test_an_event_is_put_off_longer_each_time_but_never_past_its_endpoint_s_oldest_timeout(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = receiver
    endpoint = endpoint_of(url)
    hooks.finish_task()
    hooks.relay()
    [message] = aws.messages("WebhookQueue")
    timeout_s = 15.0  # the default: a delivery may take 15 s

    def put_off_for(started_ago_s: float, deferrals: int) -> float:
        """The delay an event put off `deferrals` times gets while the endpoint's one place is
        held by a delivery this old."""
        until = time.time() - started_ago_s + timeout_s + PLACE_MARGIN_S
        assert hooks.places.take(endpoint, "msg_other", cap=1, until=until)
        body = WebhookMessage.model_validate_json(message["Body"]).model_copy(update={"deferrals": deferrals})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="llmtasks"):
            reply = hooks.deliver(
                [{**message, "Body": body.model_dump_json()}],
                webhook_endpoint_concurrency=1,
                webhook_timeout_s=timeout_s,
            )
            assert reply == {"batchItemFailures": []}
        hooks.places.give_back(endpoint, "msg_other")
        [said] = [r for r in caplog.records if r.getMessage().startswith("webhook deferred")]
        return float(said.delay_s)  # type: ignore[attr-defined]

    def about(delay_s: float) -> tuple[float, float]:
        return (0.8 * delay_s - 0.05, 1.2 * delay_s + 0.05)  # the jitter; the log rounds to 0.1 s

    # A first put-off waits briefly, the next ones twice as long each time
    for deferrals, wanted in ((0, DEFER_BASE_S), (1, 2 * DEFER_BASE_S), (3, 8 * DEFER_BASE_S)):
        low, high = about(wanted)
        assert low <= put_off_for(2.0, deferrals) <= high  # a delivery begun 2 s ago: a hang
    # but never past the timeout of the delivery that holds the place (2 s away, less the time
    # the delivery itself took): then a place is free. Five put-offs would wait 9.6 s.
    assert about(DEFER_BASE_S)[0] <= put_off_for(13.0, deferrals=5) <= about(timeout_s - 13)[1]


def test_a_busy_endpoint_s_event_waits_in_its_invocation_for_a_place_and_goes_out(
    hooks: Hooks,
    aws: Aws,
    receiver: tuple[WebhookReceiver, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook, url = receiver
    endpoint = endpoint_of(url)
    hooks.finish_task()
    hooks.relay()
    # Given the endpoint's one place held by a delivery that has just begun (its place holds a
    # minute: young however slowly this runs), which ends right after the event's first refusal
    assert hooks.places.take(endpoint, "msg_other", cap=1, until=time.time() + 60)
    take = hooks.places.take
    refusals: list[Take] = []

    def take_then_the_other_ends(*args: Any, **kwargs: Any) -> Take:
        place = take(*args, **kwargs)
        if not place and not refusals:
            refusals.append(place)
            hooks.places.give_back(endpoint, "msg_other")
        return place

    monkeypatch.setattr(hooks.places, "take", take_then_the_other_ends)
    # When the event comes, it waits in its invocation for the place and is delivered: not put off
    assert hooks.deliver(aws.messages("WebhookQueue"), webhook_endpoint_concurrency=1) == {
        "batchItemFailures": []
    }
    assert len(refusals) == 1
    assert len(hook.deliveries) == 1
    assert aws.messages("WebhookQueue", wait_s=2) == []
    assert "WebhookDeferrals" not in emf_records(capsys.readouterr().out)
    assert hooks.places.running(endpoint) == {}


class PlaceWrites:
    """The endpoint places' writes a delivery makes, by kind, in order: each take with whose it
    was and whether it was granted, each hand-over and whether it was written, each give-back."""

    def __init__(self, hooks: Hooks, monkeypatch: pytest.MonkeyPatch, on_refusal: Any = None) -> None:
        self.takes: list[tuple[str, bool]] = []
        self.hand_overs: list[bool] = []
        self.give_backs = 0
        places = hooks.places
        take, hand_over, give_back = places.take, places.hand_over, places.give_back

        def counted_take(endpoint: str, webhook_id: str, **kwargs: Any) -> Take:
            place = take(endpoint, webhook_id, **kwargs)
            self.takes.append((webhook_id, bool(place)))
            if not place and on_refusal is not None:
                on_refusal(self.refused)
            return place

        def counted_hand_over(*args: Any, **kwargs: Any) -> bool:
            self.hand_overs.append(hand_over(*args, **kwargs))
            return self.hand_overs[-1]

        def counted_give_back(*args: Any) -> None:
            self.give_backs += 1
            give_back(*args)

        monkeypatch.setattr(places, "take", counted_take)
        monkeypatch.setattr(places, "hand_over", counted_hand_over)
        monkeypatch.setattr(places, "give_back", counted_give_back)

    @property
    def refused(self) -> int:
        return sum(not granted for _, granted in self.takes)

    @property
    def total(self) -> int:
        return len(self.takes) + len(self.hand_overs) + self.give_backs


def test_one_invocation_s_deliveries_to_an_endpoint_hand_its_places_on_without_asking_again(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook, url = receiver
    # The first deliveries hold their places until two are open at once: however slowly a loaded
    # machine sends them, the two places overlap
    hook.hold_until_open, hook.hang_s = 2, HANG_S
    for i in range(10):
        hooks.finish_task(f"line {i}")
    hooks.relay()
    messages = aws.messages("WebhookQueue")
    # A line that has not moved for PLACE_WAIT_S is put off (the next test); here it never
    # stalls that long, however slowly a loaded machine turns each place over.
    monkeypatch.setattr(webhook_places, "PLACE_WAIT_S", HANG_S)
    writes = PlaceWrites(hooks, monkeypatch)
    # When ten events of one endpoint with two places come in one invocation
    assert hooks.deliver(messages, webhook_endpoint_concurrency=2) == {"batchItemFailures": []}
    # every one is delivered, never more than two at once, and none put off
    assert len(hook.deliveries) == 10
    assert hook.most_open == 2
    assert aws.messages("WebhookQueue", wait_s=1) == []
    # with a write each, none refused: two takes, eight hand-overs down the line, two give-backs
    assert (writes.refused, len(writes.takes), writes.hand_overs, writes.give_backs) == (0, 2, [True] * 8, 2)
    assert hooks.places.running(endpoint_of(url)) == {}


class SteppedClock:
    """Wall and monotonic time moved on by steps (on top of the real ones, so the event loop's
    own timeouts still pass), with an event set when the monotonic time is read after a step."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.read = asyncio.Event()

    def step(self, seconds: float) -> None:
        self.offset += seconds
        self.read.clear()

    def wall(self) -> float:
        return time.time() + self.offset

    def monotonic(self) -> float:
        self.read.set()
        return time.monotonic() + self.offset


def test_a_line_that_keeps_moving_waits_past_place_wait_s_and_is_not_put_off(aws: Aws) -> None:
    places = endpoint_places(aws.resources.table_names["LimitsTable"], aws.dynamodb)
    clock = SteppedClock()
    line = EndpointPlaces(places, cap=1, timeout_s=15.0, clock=clock.wall, monotonic=clock.monotonic)
    endpoint = "http://127.0.0.1:9"

    async def scenario() -> tuple[bool, bool]:
        assert await line.take(endpoint, "msg_a")
        second = asyncio.create_task(line.take(endpoint, "msg_b"))
        third = asyncio.create_task(line.take(endpoint, "msg_c"))
        await asyncio.sleep(0)  # both in line behind msg_a
        # Given a line whose places turn over slowly (each holds 0.8 s of this clock), so that
        # the third delivery has waited past PLACE_WAIT_S before its turn comes
        clock.step(0.8 * webhook_places.PLACE_WAIT_S)
        await line.give_back(endpoint, "msg_a")  # handed to msg_b
        assert await second
        clock.step(0.8 * webhook_places.PLACE_WAIT_S)
        # the waiter looks at the clock again (it polls as the line's first)
        await asyncio.wait_for(clock.read.wait(), HANG_S)
        # Then it is still in line (the line moved within PLACE_WAIT_S), and takes its turn
        still_waiting = not third.done()
        await line.give_back(endpoint, "msg_b")
        taken = (await third).taken
        await line.give_back(endpoint, "msg_c")
        return still_waiting, taken

    assert asyncio.run(scenario()) == (True, True)
    assert places.running(endpoint) == {}


def test_a_line_that_stops_moving_puts_its_waiter_off_after_place_wait_s(aws: Aws) -> None:
    places = endpoint_places(aws.resources.table_names["LimitsTable"], aws.dynamodb)
    clock = SteppedClock()
    line = EndpointPlaces(places, cap=1, timeout_s=15.0, clock=clock.wall, monotonic=clock.monotonic)
    endpoint = "http://127.0.0.1:9"

    async def scenario() -> Take:
        assert await line.take(endpoint, "msg_a")
        waiting = asyncio.create_task(line.take(endpoint, "msg_b"))
        await asyncio.sleep(0)
        # Given a holder still young by its entry (began under PLACE_WAIT_S ago by the wall
        # clock's reading of its place) but a line that has not moved for longer than PLACE_WAIT_S
        clock.step(1.5 * webhook_places.PLACE_WAIT_S)
        refused = await asyncio.wait_for(waiting, HANG_S)
        await line.give_back(endpoint, "msg_a")
        return refused

    refused = asyncio.run(scenario())
    assert not refused
    assert set(refused.held) == {"msg_a"}


def test_a_line_waiting_for_another_sandbox_s_place_asks_through_its_first_alone(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hook, url = receiver
    endpoint = endpoint_of(url)
    for i in range(5):
        hooks.finish_task(f"line {i}")
    hooks.relay()
    messages = aws.messages("WebhookQueue")
    monkeypatch.setattr(webhook_places, "PLACE_WAIT_S", HANG_S)  # waits end on the place, not a clock
    # Given the endpoint's one place held by another sandbox's delivery that has just begun,
    # which ends after the second refusal this sandbox gets
    assert hooks.places.take(endpoint, "msg_other", cap=1, until=time.time() + 60)

    give_back = hooks.places.give_back  # the other sandbox's, not counted

    def the_other_ends_at_the_second(refused: int) -> None:
        if refused == 2:
            give_back(endpoint, "msg_other")

    writes = PlaceWrites(hooks, monkeypatch, on_refusal=the_other_ends_at_the_second)
    # When five events of that endpoint come in one invocation
    assert hooks.deliver(messages, webhook_endpoint_concurrency=1) == {"batchItemFailures": []}
    # the first asks and is refused; the others wait behind it without asking; the line's first
    # asks again after a back-off, and takes the place once it is free
    assert len(hook.deliveries) == 5
    assert [granted for _, granted in writes.takes] == [False, False, True]
    assert len({webhook_id for webhook_id, _ in writes.takes[1:]}) == 1
    # then hands it down the line: eight writes for five deliveries, none put off
    assert (writes.hand_overs, writes.give_backs, writes.total) == ([True] * 4, 1, 8)
    assert aws.messages("WebhookQueue", wait_s=1) == []
    assert hooks.places.running(endpoint) == {}


def test_a_place_whose_entry_lapsed_is_not_handed_on_and_the_waiter_asks_for_its_own(
    aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook_places, "PLACE_WAIT_S", HANG_S)
    places = endpoint_places(aws.resources.table_names["LimitsTable"], aws.dynamodb)
    line = EndpointPlaces(places, cap=1, timeout_s=15.0)
    endpoint = "http://127.0.0.1:9"

    async def scenario() -> tuple[bool, bool, dict[str, float]]:
        assert await line.take(endpoint, "msg_a")
        waiting = asyncio.create_task(line.take(endpoint, "msg_b"))
        await asyncio.sleep(0)  # msg_b is in line behind msg_a
        # msg_a's entry is cleared behind its back (as a take clears a lapsed one)
        places.give_back(endpoint, "msg_a")
        await line.give_back(endpoint, "msg_a")  # a hand-over that finds no entry writes nothing
        place = await waiting  # msg_b asks for the place itself, and gets it
        held = places.running(endpoint)
        await line.give_back(endpoint, "msg_b")
        return place.taken, "msg_a" in held, held

    taken, a_held, held = asyncio.run(scenario())
    assert (taken, a_held, list(held)) == (True, False, ["msg_b"])
    assert places.running(endpoint) == {}


def test_a_hand_over_that_fails_leaves_its_waiter_to_ask_for_itself(
    aws: Aws, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook_places, "PLACE_WAIT_S", 0.5)  # the waiter's own asks, then its refusal
    places = endpoint_places(aws.resources.table_names["LimitsTable"], aws.dynamodb)
    line = EndpointPlaces(places, cap=1, timeout_s=15.0)
    endpoint = "http://127.0.0.1:9"

    def down(*_: Any, **__: Any) -> bool:
        raise BackendError("DynamoDB write failed: down")

    async def scenario() -> Take:
        assert await line.take(endpoint, "msg_a")
        waiting = asyncio.create_task(line.take(endpoint, "msg_b"))
        await asyncio.sleep(0)  # msg_b is in line behind msg_a
        monkeypatch.setattr(places, "hand_over", down)
        with pytest.raises(BackendError):
            await line.give_back(endpoint, "msg_a")
        return await asyncio.wait_for(waiting, HANG_S)  # not left waiting for the failed write

    refused = asyncio.run(scenario())
    assert not refused
    assert set(refused.held) == {"msg_a"}  # the write failed: msg_a's entry holds until it lapses


# --- the delivery log, replay, and disabled endpoints ---------------------------------------


def controls(hooks: Hooks, resolve: Any = None) -> WebhookControls:
    """The replays and enables as SubmitFunction builds them, on the test's WebhookQueue."""
    return WebhookControls(hooks.settings, hooks.store.endpoints, hooks.webhook_queue, resolve=resolve)


def test_every_attempt_of_a_retried_delivery_is_logged_with_its_answer_and_the_next_attempt(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    receiver[0].answers = [500, 503]
    task_id = hooks.finish_task()
    hooks.relay()
    before = datetime.now(tz=UTC)
    for _ in range(3):
        [message] = aws.messages("WebhookQueue")
        hooks.deliver([message], webhook_retry_schedule=(30.0, 30.0))
        # A retry waits out its visibility delay (30 s); the test makes it due at once.
        if receiver[0].answers or len(receiver[0].deliveries) < 3:
            aws.sqs.change_message_visibility(
                QueueUrl=aws.queue_url("WebhookQueue"),
                ReceiptHandle=message["ReceiptHandle"],
                VisibilityTimeout=0,
            )
    task = hooks.store.get(task_id, now=time.time())
    assert task is not None
    log = task.webhook_log
    assert [(a.outcome, a.status_code, a.trigger) for a in log] == [
        ("retrying", 500, "scheduled"),
        ("retrying", 503, "scheduled"),
        ("delivered", 200, "scheduled"),
    ]
    assert [a.error for a in log] == ["receiver answered 500", "receiver answered 503", None]
    assert before <= log[0].at <= log[1].at <= log[2].at
    # A retry's next attempt is its schedule's 30 s (jittered by a fifth) after it was sent
    for retried in log[:2]:
        assert retried.next_attempt_at is not None
        assert 23 <= (retried.next_attempt_at - retried.at).total_seconds() <= 37
    assert log[2].next_attempt_at is None
    assert all(a.latency_ms >= 0 for a in log)
    assert (task.webhook_status, task.webhook_attempts) == (WebhookStatus.DELIVERED, 3)


def test_a_replay_is_one_attempt_under_the_same_webhook_id_with_a_fresh_signature(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    hook, _ = receiver
    task_id = hooks.finish_task("again please")
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    task = hooks.store.get(task_id, now=time.time())
    assert task is not None
    # When the tenant asks for the event again
    replay = controls(hooks).replay_task(task)
    [message] = aws.messages("WebhookQueue")
    assert WebhookMessage.model_validate_json(message["Body"]).replay is True
    assert hooks.deliver([message]) == {"batchItemFailures": []}
    # Then the receiver has it twice, under one webhook-id, each signed on its own and verified
    first, again = hook.deliveries
    assert first.headers["webhook-id"] == again.headers["webhook-id"] == replay.webhook_id
    secret = Webhook(hooks.secret())
    events = [secret.verify(d.body, d.headers) for d in (first, again)]
    assert [e["data"]["task_id"] for e in events] == [task_id, task_id]
    assert first.headers["webhook-signature"] != again.headers["webhook-signature"]
    assert events[0]["timestamp"] < events[1]["timestamp"]
    task = hooks.store.get(task_id, now=time.time())
    assert task is not None
    assert [(a.trigger, a.outcome) for a in task.webhook_log] == [
        ("scheduled", "delivered"),
        ("replay", "delivered"),
    ]


def test_a_failed_replay_is_logged_and_neither_retried_nor_parked(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    task_id = hooks.finish_task()
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"))
    receiver[0].answers = [500]
    task = hooks.store.get(task_id, now=time.time())
    assert task is not None
    controls(hooks).replay_task(task)
    assert hooks.deliver(aws.messages("WebhookQueue")) == {"batchItemFailures": []}
    assert (aws.messages("WebhookQueue"), aws.messages("WebhookDLQ")) == ([], [])
    task = hooks.store.get(task_id, now=time.time())
    assert task is not None
    assert (task.webhook_log[-1].trigger, task.webhook_log[-1].outcome) == ("replay", "failed")
    assert task.webhook_status is WebhookStatus.FAILED


def test_a_replay_needs_an_ended_task_with_a_webhook_and_a_url_the_guard_still_passes(
    hooks: Hooks, aws: Aws
) -> None:
    pending = hooks.service.submit("default", SubmitTaskRequest(prompt="p", webhook_url=hooks.url)).task
    with pytest.raises(TaskConflict, match="is pending: its event is sent when it ends"):
        controls(hooks).replay_task(pending)
    bare = hooks.service.submit("default", SubmitTaskRequest(prompt="p")).task
    with pytest.raises(TaskConflict, match="has no webhook_url"):
        controls(hooks).replay_task(bare)
    unwanted = hooks.store.get(hooks.finish_task(events=["task.failed"]), now=time.time())
    assert unwanted is not None
    with pytest.raises(TaskConflict, match=r"leave out task\.completed"):
        controls(hooks).replay_task(unwanted)
    # A host that resolves inside the network by now (its URL is not an allowed host here)
    ended = hooks.store.get(hooks.finish_task(), now=time.time())
    assert ended is not None
    moved = ended.model_copy(update={"webhook_url": "https://hooks.example.com/x"})
    with pytest.raises(TaskConflict, match=r"refused now: .*non-public"):
        controls(hooks, resolve=resolver("169.254.169.254")).replay_task(moved)
    with pytest.raises(TaskConflict, match="is processing"):
        controls(hooks).replay_batch(a_batch(BatchStatus.PROCESSING))
    hooks.relay()  # the ended tasks' own events, queued by the relay, are all there is
    assert all(not WebhookMessage.model_validate_json(m["Body"]).replay for m in aws.messages("WebhookQueue"))


def test_a_url_failing_for_the_disable_period_is_disabled_until_its_tenant_enables_it(
    hooks: Hooks,
    aws: Aws,
    receiver: tuple[WebhookReceiver, str],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hook, _ = receiver
    hook.answers = [500] * 3
    # A disable period compressed to a millisecond: the second failure of a streak disables
    disable = {"webhook_endpoint_disable_after_s": 0.001}
    first = hooks.finish_task("first")
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"), **disable)  # fails: the streak starts
    with caplog.at_level(logging.WARNING, logger="llmtasks"):
        hooks.deliver(aws.messages("WebhookQueue"), **disable)  # fails again: disabled
    task = hooks.store.get(first, now=time.time())
    assert task is not None
    assert task.webhook_status is WebhookStatus.ENDPOINT_DISABLED
    assert [a.outcome for a in task.webhook_log] == ["retrying", "endpoint_disabled"]
    assert (aws.messages("WebhookQueue"), aws.messages("WebhookDLQ")) == ([], [])  # no retry, not parked
    assert [r.message for r in caplog.records if "disabled" in r.message] == [
        "webhook endpoint disabled: it failed for the whole disable period with no success;"
        " its tenant enables it again (POST /webhooks/endpoints/enable) and replays what it missed"
    ]
    assert len(emf_records(capsys.readouterr().out)["WebhookEndpointsDisabled"]) == 1
    # Later events to the URL are not attempted, and say why
    later = hooks.finish_task("later")
    hooks.relay()
    hooks.deliver(aws.messages("WebhookQueue"), **disable)
    assert len(hook.deliveries) == 2
    task = hooks.store.get(later, now=time.time())
    assert task is not None
    assert (task.webhook_status, task.webhook_attempts, task.webhook_log) == (
        WebhookStatus.ENDPOINT_DISABLED,
        0,
        [],
    )
    with pytest.raises(TaskConflict, match="is disabled"):
        controls(hooks).replay_task(task)
    # Another tenant's events to the same URL still go
    other = hooks.service.submit("other", SubmitTaskRequest(prompt="o", webhook_url=hooks.url)).task
    hooks.store.claim(
        other.task_id,
        Lease("L", until=time.time() + 60, message_id="m", receive_count=1, dead_letter_at=NEVER),
        now=time.time(),
    )
    hooks.store.complete(
        other.task_id,
        lease_id="L",
        completion=Completion(text="o", model="m", usage=Usage(total_tokens=1)),
        now=time.time(),
    )
    hooks.relay()
    hook.answers = []
    hooks.deliver(aws.messages("WebhookQueue"), **disable)
    assert len(hook.deliveries) == 3
    # When the tenant enables the URL and replays what it missed, it is delivered
    controls(hooks).enable("default", hooks.url)
    controls(hooks).replay_task(task)
    hooks.deliver(aws.messages("WebhookQueue"), **disable)
    task = hooks.store.get(later, now=time.time())
    assert task is not None
    assert task.webhook_status is WebhookStatus.DELIVERED
    assert hooks.store.endpoints.health("default", hooks.url).disabled is False


def test_a_success_ends_a_url_s_failing_streak(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    receiver[0].answers = [500]
    hooks.finish_task()
    hooks.relay()
    disable = {"webhook_endpoint_disable_after_s": 3600.0}
    hooks.deliver(aws.messages("WebhookQueue"), **disable)
    failing = hooks.store.endpoints.health("default", hooks.url)
    assert (failing.failing_since is not None, failing.last_error) == (True, "receiver answered 500")
    hooks.deliver(aws.messages("WebhookQueue"), **disable)  # the retry: 200
    assert hooks.store.endpoints.health("default", hooks.url).failing_since is None


def test_a_run_s_wait_for_its_client_is_an_event_of_its_own_each_time(
    hooks: Hooks, aws: Aws, receiver: tuple[WebhookReceiver, str]
) -> None:
    # Given a run with a webhook that stops for its client's function
    hook, url = receiver
    tool = {"type": "function", "name": "confirm", "parameters": {"type": "object"}}
    body = SubmitTaskRequest.model_validate(
        {"prompt": "go", "tools": [tool], "max_steps": 3, "webhook_url": url}
    )
    task = hooks.service.submit("default", body).task
    lease = Lease("L", until=time.time() + 60, message_id="m1", receive_count=1, dead_letter_at=NEVER)
    hooks.store.claim(task.task_id, lease, now=time.time())
    call = ToolCall(id="call_1", function=FunctionCall(name="confirm", arguments="{}"))
    action = RequiredAction(tool_calls=[call])
    hooks.store.await_action(task.task_id, lease_id="L", action=action, model_step=0, usage=Usage())

    # When the relay and the delivery run, the receiver gets task.requires_action with the calls
    assert hooks.relay() == {"batchItemFailures": []}
    [message] = aws.messages("WebhookQueue")
    assert hooks.deliver([message]) == {"batchItemFailures": []}
    [delivery] = hook.deliveries
    event = Webhook(hooks.secret()).verify(delivery.body, delivery.headers)
    assert event["type"] == "task.requires_action"
    assert event["data"]["required_action"]["tool_calls"][0]["id"] == "call_1"
    # The attempt is logged; the webhook's status waits for the terminal event's
    waiting = hooks.store.get(task.task_id, now=time.time())
    assert (waiting.webhook_status, waiting.webhook_attempts) == (WebhookStatus.PENDING, 1)
    # Another wait, at a later step, is another event (another webhook-id)
    later = WebhookMessage.of_task(task.task_id, "task.requires_action", endpoint="e", occurrence="step-4")
    assert later.webhook_id not in (
        delivery.headers["webhook-id"],
        webhook_id(task.task_id, "task.requires_action"),
    )
