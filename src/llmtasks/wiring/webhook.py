"""WebhookFunction's parts: the relay of ended tasks and batches, and the delivery."""

from __future__ import annotations

from functools import lru_cache

from llmtasks.aws.limits import RunningCalls, endpoint_places
from llmtasks.aws.queues import Queue
from llmtasks.services.webhook_urls import resolver_from_settings
from llmtasks.services.webhooks import WebhookDelivery, WebhookRelay, WebhookSender
from llmtasks.settings import WebhookResources, WebhookSettings, resources, section
from llmtasks.wiring import build_in_lambda, check_configuration
from llmtasks.wiring.adapters import batch_store, dynamodb, result_blobs, sqs, task_store


def cold_start() -> None:
    check_configuration(WebhookResources, WebhookSettings)
    build_in_lambda(webhook_relay, webhook_delivery)


def webhook_queue() -> Queue:
    return Queue(resources(WebhookResources).webhook_queue_url, sqs())


@lru_cache(maxsize=1)
def webhook_relay() -> WebhookRelay:
    return WebhookRelay(webhook_queue())


@lru_cache(maxsize=1)
def webhook_delivery() -> WebhookDelivery:
    settings = section(WebhookSettings)
    sender = WebhookSender(
        timeout_s=settings.webhook_timeout_s,
        allowed_hosts=settings.webhook_allowed_hosts,
        resolve=resolver_from_settings(settings),
    )
    dead_letters = Queue(resources(WebhookResources).webhook_dlq_url, sqs())
    return WebhookDelivery(
        settings,
        task_store(),
        dead_letters,
        sender,
        results=result_blobs(),
        batches=batch_store(),
        places=endpoint_places_of(settings),
        requeue=webhook_queue(),
    )


def endpoint_places_of(settings: WebhookSettings) -> RunningCalls | None:
    """Each endpoint's open deliveries, counted where a cap applies (LimitsTable configured)."""
    table = resources(WebhookResources).limits_table_name
    if not settings.webhook_endpoint_concurrency:
        return None
    if table is None:
        raise RuntimeError(
            "WEBHOOK_ENDPOINT_CONCURRENCY needs LIMITS_TABLE_NAME: the open deliveries are counted there"
        )
    return endpoint_places(table, dynamodb())
