"""What the HTTP API does with tasks: submit, read (with a long-poll), list and cancel them for
one tenant at a time; the listing's cursor.

Everything here talks to the table and the queues through their adapters, never to boto3, and
takes its clock and ids from the constructor so tests can pin them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from llmtasks.aws.budgets import KeyBudgets
from llmtasks.aws.idempotency import IdempotencyKeys
from llmtasks.aws.limits import KeyLimits
from llmtasks.aws.queues import TaskLanes
from llmtasks.aws.results import ResultBlobs
from llmtasks.aws.store import TaskStore
from llmtasks.aws.usage import utc_day
from llmtasks.domain.caller import Caller
from llmtasks.domain.cursors import TaskPosition
from llmtasks.domain.errors import InvalidInput, TaskNotFound
from llmtasks.domain.input_files import FileFacts
from llmtasks.domain.messages import WebhookSecret, new_webhook_secret
from llmtasks.domain.models import SubmitTaskRequest, Task, TaskStatus, stored_as
from llmtasks.domain.output import TaskOutputPage
from llmtasks.domain.rules import Clock, check_limits, dimensions_of, is_task_id, new_task_id
from llmtasks.domain.usage import GroupBy, UsageReport, days_read, default_first
from llmtasks.observability import Metric, emit, logger, task_keys
from llmtasks.services.input_files import InputFiles
from llmtasks.services.runs import RunService
from llmtasks.services.submits import Held, SubmitSequence
from llmtasks.services.task_output import OutputReader
from llmtasks.services.webhook_urls import (
    Resolver,
    UnsafeWebhookUrl,
    check_webhook_url,
    resolver_from_settings,
)
from llmtasks.settings import SubmitSettings

WAIT_POLL_S = 0.5
WAIT_FIRST_POLL_S = 0.05
# Queries one listing may make to fill a page when a status filter skips most tasks (each
# looks through more index entries than the one before, up to the store's STATUS_WINDOW).
MAX_LIST_PAGES = 10


@dataclass(frozen=True)
class Submission:
    task: Task
    replayed: bool = False  # an Idempotency-Key replay: the task existed already


class TaskService:
    """What the HTTP API does: submit, read and cancel tasks for one tenant at a time."""

    def __init__(
        self,
        settings: SubmitSettings,
        store: TaskStore,
        lanes: TaskLanes,
        *,
        clock: Clock = time.time,
        resolve: Resolver | None = None,
        results: ResultBlobs,
        idempotency: IdempotencyKeys | None = None,
        limits: KeyLimits | None = None,
        budgets: KeyBudgets | None = None,
        job_ended: Callable[[str], bool] | None = None,
    ) -> None:
        self._job_ended = job_ended  # the provider's webhook of a provider batch's job
        self._settings = settings
        self._store = store
        self._lanes = lanes
        self._clock = clock
        self._resolve = resolve or resolver_from_settings(settings)
        self._results = results
        # The API registers each invocation's context with these, and counts each request
        # against the limits (api/app.py).
        self.idempotency = idempotency
        self.limits = limits
        self._submits = SubmitSequence(idempotency, limits, budgets)
        self._output = OutputReader(store.output, results, self.owned, clock)

    def submit(
        self,
        tenant_id: str,
        body: SubmitTaskRequest,
        *,
        idempotency_key: str | None = None,
        trace_header: str | None = None,
        caller: Caller | None = None,
    ) -> Submission:
        """A new task; with an Idempotency-Key, the task this key already made (a replay). A
        caller's key with a max_in_flight holds the task (none: no limit)."""
        # Before the key is recorded: a refused body leaves no trace.
        check_limits(body, self._settings.size_limits)
        files = InputFiles(self._results).check(tenant_id, body.llm_request())
        if body.webhook_url is not None:
            check_webhook_url(
                body.webhook_url, allowed_hosts=self._settings.webhook_allowed_hosts, resolve=self._resolve
            )
        self._check_tool_urls(body)
        if body.provider_background and self._settings.llm_provider == "bedrock":
            raise InvalidInput(
                "provider_background: this deployment's provider (Bedrock) has no background mode.",
                field="provider_background",
            )
        task_id = new_task_id()  # unused by a replay, which returns the task the key made
        task, replayed = self._submits.run(
            lambda: self._create(task_id, tenant_id, body, trace_header, caller),
            Task,
            what="task",
            tenant=tenant_id,
            key=idempotency_key,
            body=body,
            caller=caller,
            held=Held("t", task_id, most_cost=self._most_cost(body, files)),
        )
        return Submission(task, replayed=replayed)

    def _check_tool_urls(self, body: SubmitTaskRequest) -> None:
        """The run's endpoints and MCP servers pass the webhooks' SSRF guard (the worker checks
        again at each call)."""
        for name, url in (body.tool_urls or {}).items():
            try:
                check_webhook_url(
                    url, allowed_hosts=self._settings.webhook_allowed_hosts, resolve=self._resolve
                )
            except UnsafeWebhookUrl as exc:
                detail = exc.detail.replace("webhook_url", f"The url of tool '{name}'", 1)
                raise InvalidInput(detail, field="tools") from exc
        for server in body.mcp_servers or []:
            try:
                check_webhook_url(
                    server.server_url,
                    allowed_hosts=self._settings.webhook_allowed_hosts,
                    resolve=self._resolve,
                )
            except UnsafeWebhookUrl as exc:
                label = f"The server_url of MCP server '{server.server_label}'"
                raise InvalidInput(exc.detail.replace("webhook_url", label, 1), field="tools") from exc

    @property
    def runs(self) -> RunService:
        """What the API does with runs: their tool outputs and steps."""
        return RunService(
            self._store,
            self._lanes,
            self._results,
            clock=self._clock,
            openai_webhook_secret=self._settings.openai_webhook_secret,
            job_ended=self._job_ended,
        )

    def _most_cost(self, body: SubmitTaskRequest, files: dict[str, FileFacts]) -> Decimal:
        request = body.llm_request()
        model = request.model or self._settings.llm_model
        return self._settings.price_table.most_cost(request, model, files)

    def _create(
        self,
        task_id: str,
        tenant_id: str,
        body: SubmitTaskRequest,
        trace_header: str | None,
        caller: Caller | None,
    ) -> Task:
        now = self._clock()
        task = Task.submitted(
            body,
            task_id=task_id,
            tenant_id=tenant_id,
            created_at=now,
            expires_at=int(now + self._settings.task_ttl_seconds),
            trace_header=trace_header,
            max_running=caller.max_running if caller is not None else None,
            tpm=caller.tpm if caller is not None else None,
            key_id=caller.key_id if caller is not None else None,
            budget=caller.budget if caller is not None else None,
        )
        # The message first, then the item: a stored task always has its message, whatever dies
        # in between. A message whose item never arrives is dropped by the worker after a grace.
        self._lanes.send(task)
        self._store.create(task)
        logger.info("submitted", **task_keys(task))
        emit(Metric.SUBMITTED, **dimensions_of(task, self._settings.llm_model))
        return task

    def get(self, tenant_id: str, task_id: str, *, wait_s: float = 0) -> Task:
        """The tenant's task; with `wait_s`, once it is terminal (or a run waits for the client's
        tool outputs) or when `wait_s` has passed."""
        give_up = time.monotonic() + wait_s
        for reads in itertools.count():
            task = self.owned(tenant_id, task_id)
            left = give_up - time.monotonic()
            if task.status.is_terminal:
                return self._results.hydrate(task)
            if task.status is TaskStatus.REQUIRES_ACTION:
                return task  # the client's turn: a wait ends here too
            if left <= 0:
                return self._with_progress(task)
            # Reads 0.05, 0.1, 0.2, 0.4 s apart, then one per half second: a short task is seen
            # done within a few tens of milliseconds, and a long wait costs what client polling would.
            time.sleep(min(WAIT_POLL_S, WAIT_FIRST_POLL_S * 2**reads, left))
        raise AssertionError("unreachable: the loop returns")

    def _with_progress(self, task: Task) -> Task:
        """A running task with its text so far (`partial_result`) and `progress`, read from its
        output's head and chunks: its progress is written there, not on the task's item (items
        written by releases before 0.3 carry the text themselves)."""
        if task.status is not TaskStatus.PROCESSING or task.partial_result:
            return task
        return self._output.so_far(task)

    def output(
        self, tenant_id: str, task_id: str, *, after: int, wait_s: float = 0, past_end_ok: bool = False
    ) -> TaskOutputPage:
        """The chunks of the tenant's task's output after `after`; with `wait_s`, held until one
        exists or the task ends, or `wait_s` has passed (see OutputReader.read)."""
        return self._output.read(tenant_id, task_id, after=after, wait_s=wait_s, past_end_ok=past_end_ok)

    def owned(self, tenant_id: str, task_id: str) -> Task:
        """The tenant's task as clients read it, without its result when that is kept in
        ResultsBucket (reads of its other fields fetch nothing more)."""
        if not is_task_id(task_id):
            raise TaskNotFound(task_id[:64])
        now = self._clock()
        stored = self._store.get(task_id, now=now)
        if stored is None or stored.tenant_id != tenant_id:
            raise TaskNotFound(task_id)
        return stored.as_read(now)

    def list_tasks(
        self, tenant_id: str, *, limit: int, status: TaskStatus | None = None, cursor: str | None = None
    ) -> tuple[list[Task], str | None]:
        """Up to `limit` of the tenant's tasks, newest first, as clients read them, and the cursor
        of the next page (None on the last). The status filter applies to the status as read,
        so dead-lettered tasks count as failed; a page may come back short when few match."""
        start = TaskPosition.of(cursor) if cursor is not None else None
        statuses = stored_as(status) if status is not None else None
        now = self._clock()
        found: list[Task] = []
        for queries in range(MAX_LIST_PAGES):
            page, start = self._store.tenant_tasks(
                tenant_id, limit=limit - len(found), start=start, statuses=statuses, queries_before=queries
            )
            for stored in page:
                task = stored.as_read(now)
                if not task.is_expired(now) and (status is None or task.status is status):
                    found.append(task)
            if start is None or len(found) >= limit:
                break
        return found, start.cursor if start else None

    def cancel(self, tenant_id: str, task_id: str) -> Task:
        if not is_task_id(task_id):
            raise TaskNotFound(task_id[:64])
        task = self._store.cancel(
            task_id,
            tenant_id=tenant_id,
            now=self._clock(),
        )
        logger.info("cancelled", task_id=task_id, tenant_id=tenant_id)
        emit(Metric.CANCELLED, **dimensions_of(task, self._settings.llm_model))
        if task.provider_call is not None:
            # A call running in the provider's background mode: the worker, which holds the
            # provider's keys, cancels it there when this message finds the task cancelled.
            self._lanes.send(task)
        return task

    def usage(
        self, tenant_id: str, *, first: date | None, last: date | None, group_by: GroupBy
    ) -> UsageReport:
        """The tenant's billed calls from `first` to `last` (UTC days, both included; by default
        the last 30 days to today), summed by day, model or key from the daily counters. Any
        span is answered: only its days that can have counters are read (days_read)."""
        today = utc_day(self._clock())
        last = last or today
        first = first or default_first(last)
        read = days_read(first, last, today)
        days = self._store.usage.days(tenant_id, *read) if read else {}
        return UsageReport.of(days, first=first, last=last, group_by=group_by)

    def webhook_secret(self, tenant_id: str) -> WebhookSecret:
        secrets = self._store.tenants.secrets(tenant_id, new_secret=new_webhook_secret())
        return WebhookSecret.of(secrets, self._clock())

    def rotate_webhook_secret(self, tenant_id: str) -> WebhookSecret:
        now = self._clock()
        secrets = self._store.tenants.rotate(
            tenant_id,
            new_secret=new_webhook_secret(),
            previous_until=now + self._settings.webhook_secret_overlap_s,
        )
        logger.info("webhook secret rotated", tenant_id=tenant_id)
        return WebhookSecret.of(secrets, now)
