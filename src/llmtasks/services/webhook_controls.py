"""What a tenant does with its webhooks beyond receiving them: replay an ended task's or batch's
event, and enable a URL that was disabled for failing (Svix's resend and endpoint recovery).

The routes read the task or batch first (tenant-scoped, by their services) and hand it here.
A replay is a WebhookQueue message like any delivery's, marked `replay`: WebhookFunction makes
one attempt with the event's own webhook-id, a fresh timestamp and signature, and logs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmtasks.domain.batches import Batch, BatchStatus
from llmtasks.domain.errors import TaskConflict
from llmtasks.domain.messages import WebhookMessage
from llmtasks.domain.models import EVENT_OF_STATUS, Task, TaskStatus, WebhookEndpoint, WebhookReplay
from llmtasks.observability import logger
from llmtasks.services.webhook_urls import (
    Resolver,
    UnsafeWebhookUrl,
    check_webhook_url,
    endpoint_of,
    resolver_from_settings,
)

if TYPE_CHECKING:
    from llmtasks.aws.queues import Queue
    from llmtasks.aws.webhook_records import WebhookEndpoints
    from llmtasks.settings import WebhookTargets


class WebhookControls:
    def __init__(
        self,
        settings: WebhookTargets,
        endpoints: WebhookEndpoints,
        webhook_queue: Queue,
        *,
        resolve: Resolver | None = None,
    ) -> None:
        self._settings = settings
        self._endpoints = endpoints
        self._queue = webhook_queue
        self._resolve = resolve or resolver_from_settings(settings)

    def replay_task(self, task: Task) -> WebhookReplay:
        """The task's terminal event again; 409 when it has none to send."""
        name = f"Task '{task.task_id}'"
        url = _ended_with_a_webhook(name, task.webhook_url, task.status)
        event_type = EVENT_OF_STATUS[task.status]
        if not task.wants_webhook(event_type):
            raise TaskConflict(
                f"{name}'s webhook_events leave out {event_type}: there is no event to replay."
            )
        message = WebhookMessage.of_task(task.task_id, event_type, endpoint=endpoint_of(url), replay=True)
        return self._replay(name, task.tenant_id, url, message)

    def replay_batch(self, batch: Batch) -> WebhookReplay:
        """The batch's batch.completed event again; 409 when it has none to send."""
        name = f"Batch '{batch.batch_id}'"
        url = _ended_with_a_webhook(name, batch.webhook_url, batch.status)
        if not batch.wants_webhook():
            raise TaskConflict(
                f"{name}'s webhook_events leave out batch.completed: there is no event to replay."
            )
        message = WebhookMessage.of_batch(
            batch.batch_id, endpoint=endpoint_of(url), retries=batch.retries, replay=True
        )
        return self._replay(name, batch.tenant_id, url, message)

    def enable(self, tenant_id: str, url: str) -> WebhookEndpoint:
        """Deliveries to the tenant's URL are attempted again, and its failures count from zero."""
        self._endpoints.enable(tenant_id, url)
        logger.info("webhook endpoint enabled", tenant_id=tenant_id, url=url)
        return WebhookEndpoint(url=url)

    def _replay(self, name: str, tenant_id: str, url: str, message: WebhookMessage) -> WebhookReplay:
        try:
            # The URL passed the guard when it was given; its host's addresses may have changed.
            check_webhook_url(url, allowed_hosts=self._settings.webhook_allowed_hosts, resolve=self._resolve)
        except UnsafeWebhookUrl as unsafe:
            raise TaskConflict(f"{name}'s webhook_url is refused now: {unsafe.detail}") from unsafe
        if self._endpoints.health(tenant_id, url).disabled:
            raise TaskConflict(
                f"{name}'s webhook_url is disabled (it failed for too long): enable it first"
                " (POST /webhooks/endpoints/enable), then replay."
            )
        self._queue.send(message, group=message.endpoint)
        logger.info(
            "webhook replay queued",
            webhook_id=message.webhook_id,
            task_id=message.task_id,
            batch_id=message.batch_id,
        )
        return WebhookReplay(webhook_id=message.webhook_id, event_type=message.event_type)


def _ended_with_a_webhook(name: str, url: str | None, status: TaskStatus | BatchStatus) -> str:
    """The subject's webhook URL, once it has ended; 409 while it runs or when it has none."""
    if not url:
        raise TaskConflict(f"{name} has no webhook_url: there is no event to replay.")
    if not status.is_terminal:
        raise TaskConflict(f"{name} is {status.value}: its event is sent when it ends.")
    return url
