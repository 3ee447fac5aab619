"""The one place where configuration is read from the environment.

Two kinds of model. Settings sections: how a part of the service behaves (`SubmitSettings` for
the API's services, `RunnerSettings` and `LlmSettings` for the worker, `WebhookSettings`,
`FanoutSettings`), every field with a default; `Settings` holds them all. And one resource
model per function (`WorkerResources`, `ApiResources`, ...): the tables, queues and bucket that
function uses and nothing more, every name required. Each handler module validates its own
models when it is imported (`wiring.cold_start`), so a deploy that lacks a variable fails the
cold start with a message naming it, never the first request; each part is given only the
section it uses, and a function never reads variables of parts it does not run.
template.yaml sets the variables (Globals for the shared resources, per function for the rest);
the local stack sets the same names.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files as resources_files
from typing import Annotated, Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from llmtasks.domain.pricing import PriceTable
from llmtasks.domain.rules import SizeLimits

KIB = 1024


# --- what each function uses: its resources -------------------------------------------------------


class FunctionResources(BaseSettings):
    """The resources of one function, by their environment variables (upper-case names)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)


class TasksTable(FunctionResources):
    tasks_table_name: str = Field(min_length=1)
    # Results too large for the task item (and batch manifests).
    results_bucket: str = Field(min_length=1)


class TaskLanesQueues(FunctionResources):
    """The task queues, one per lane (domain.rules.Lane)."""

    task_queue_url: str = Field(min_length=1)
    # High-priority tasks run from a queue of their own, with invocations kept for them.
    high_task_queue_url: str = Field(min_length=1)
    # Batch items and low-priority tasks, so a batch never holds up single tasks.
    batch_task_queue_url: str = Field(min_length=1)


class BatchFanoutQueue(FunctionResources):
    # One message per chunk of a batch's items: SubmitFunction sends, BatchFunction reads.
    batch_fanout_queue_url: str = Field(min_length=1)


class Limits(FunctionResources):
    # A key's limits and the tenants' running calls are counted here; unset: nothing is counted.
    limits_table_name: str | None = None


class WebhookQueue(FunctionResources):
    # The events to deliver: WebhookFunction's relay and retries, SubmitFunction's replays.
    webhook_queue_url: str = Field(min_length=1)


class ApiResources(TasksTable, TaskLanesQueues, BatchFanoutQueue, Limits, WebhookQueue):
    """SubmitFunction and StatusFunction."""

    # Idempotency-Key records (SubmitFunction only: StatusFunction never reads them).
    idempotency_table_name: str | None = None


class WorkerResources(TasksTable, TaskLanesQueues, Limits):
    """WorkerFunction."""


class BatchResources(TasksTable, TaskLanesQueues, BatchFanoutQueue, Limits):
    """BatchFunction: fans a batch's items out to the lanes, counts them."""


class WebhookResources(TasksTable, Limits, WebhookQueue):
    """WebhookFunction: relays ended tasks and batches, delivers them (each endpoint's open
    deliveries counted in LimitsTable)."""

    webhook_dlq_url: str = Field(min_length=1)


class AuthorizerResources(FunctionResources):
    """AuthorizerFunction: the API keys, nothing else."""

    api_keys_table_name: str = Field(min_length=1)


Resources = TypeVar("Resources", bound=FunctionResources)


class MissingConfiguration(RuntimeError):
    """A function started without a variable it needs (a cold start's error)."""


def resources(model: type[Resources]) -> Resources:
    """`model` read from the environment, once per process; MissingConfiguration names every
    variable that is missing or wrong."""
    read: Resources = _read_once(model)  # functools.cache keeps no type variable: typed here
    return read


Model = TypeVar("Model", bound=BaseSettings)


def _read(model: type[Model]) -> Model:
    try:
        return model()
    except ValidationError as error:
        problems = "; ".join(
            f"{'_'.join(str(part) for part in e['loc']).upper()}: {e['msg']}" for e in error.errors()
        )
        raise MissingConfiguration(f"{model.__name__} cannot start: {problems}") from None


# One read per model and process.
_read_once = cache(_read)


def forget_configuration() -> None:
    """The next read of each model reads the environment again (tests that change it)."""
    _read_once.cache_clear()


# --- how the service behaves: a section for each part, read by the functions that run it ------------


class SettingsSection(BaseSettings):
    """Variables one part of the service reads; each has a default. A field two parts read lives
    in a small base of its own, so that it is declared once."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)


class ModelDefault(SettingsSection):
    # The model of a task that names none: the calls', and the metrics' dimension.
    llm_model: str = "gpt-4o-mini"
    # openai: any OpenAI-compatible server (the mock included); bedrock: Converse, LLM_MODEL is
    # the model id and the function's role must be allowed to invoke it. On bedrock a submit
    # refuses what the model cannot take (domain.bedrock_models).
    llm_provider: Literal["openai", "mock", "bedrock"] = "openai"


class CallTimeout(SettingsSection):
    llm_timeout_s: float = Field(default=600.0, gt=0)


class SubmitGrace(SettingsSection):
    # Submit sends the message before it writes the item; a worker that finds no item waits this
    # long (from the message's send time) before it takes the message for an abandoned submit.
    unwritten_task_grace_s: float = Field(default=60.0, ge=0)


class WebhookTargets(SettingsSection):
    """Which webhook URLs pass the SSRF guard: at submit, and again at each delivery."""

    # Hosts allowed past the SSRF guard (and over plain http): the local stack allows 127.0.0.1.
    webhook_allowed_hosts: Annotated[frozenset[str], NoDecode] = frozenset()
    # False: webhook hosts are never looked up in DNS (only allowed hosts and literal addresses
    # pass); the test suites run so, so that fuzzed URLs cannot send a packet off the machine.
    webhook_resolve_names: bool = True

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            return frozenset(part.strip().lower() for part in value.split(",") if part.strip())
        return value


def default_price_table() -> PriceTable:
    """The repository's table (llmtasks/prices.json), dated and sourced."""
    return PriceTable.model_validate_json(resources_files("llmtasks").joinpath("prices.json").read_text())


class Prices(SettingsSection):
    # Per model: USD per million input, cached-input and output tokens (domain.pricing). The
    # template's PriceTable parameter replaces the default whole, as JSON ({"models": {...}}).
    price_table: Annotated[PriceTable, NoDecode] = Field(default_factory=default_price_table)

    @field_validator("price_table", mode="before")
    @classmethod
    def _parse_table(cls, value: object) -> object:
        if isinstance(value, str):
            return default_price_table() if not value.strip() else PriceTable.model_validate_json(value)
        return value


class ItemLimits(ModelDefault):
    """How large a task body may be, and on Bedrock what its model takes: checked at submit, and
    for a batch's file as it is read."""

    max_prompt_bytes: int = Field(default=200 * KIB, ge=1)
    max_metadata_bytes: int = Field(default=2 * KIB, ge=0)

    @property
    def size_limits(self) -> SizeLimits:
        """The part of these the submit rules apply (domain.rules)."""
        return SizeLimits(
            max_prompt_bytes=self.max_prompt_bytes,
            max_metadata_bytes=self.max_metadata_bytes,
            bedrock_model=self.llm_model if self.llm_provider == "bedrock" else None,
        )


class SubmitSettings(ItemLimits, WebhookTargets, Prices):
    """The API's submits and reads (TaskService, BatchService): SubmitFunction, StatusFunction."""

    # How long an Idempotency-Key's record lasts (SubmitFunction).
    idempotency_ttl_s: int = Field(default=24 * 3600, ge=60)
    task_ttl_seconds: int = Field(default=24 * 3600, ge=60)
    # Items a fan-out message creates (or cancels): one BatchFunction invocation's work.
    batch_chunk_size: int = Field(default=100, ge=1, le=1000)
    # A provider batch's chunk: its items become tasks in one message and one or more provider
    # jobs (split further by the provider's per-job limits). Larger: fewer jobs, longer messages.
    provider_batch_chunk_size: int = Field(default=1000, ge=1, le=50_000)
    # After a rotation, the previous secret still signs (beside the new one) this long.
    webhook_secret_overlap_s: float = Field(default=24 * 3600, ge=0)
    # The secret (whsec_...) OpenAI signs its webhooks with: set, POST /provider-webhooks/openai
    # takes the end of a run's background call and wakes the run; unset, that route is a 404.
    openai_webhook_secret: str | None = None


class FanoutSettings(ItemLimits, SubmitGrace, Prices):
    """A batch's fan-out into tasks (BatchFanout): BatchFunction."""

    # The first look at a provider batch's job after it is sent; each later one waits 1.5 times
    # longer, up to SQS's 900 s (domain/provider_batches.py).
    provider_batch_look_s: float = Field(default=30.0, ge=0, le=900)
    # A provider batch's answers longer than this go to ResultsBucket, as the worker's do.
    max_inline_result_bytes: int = Field(default=100 * KIB, ge=0)


class BedrockBatchSettings(SettingsSection):
    """A provider batch on Bedrock (llm/bedrock_batch.py): BatchFunction."""

    # The service role a batch inference job runs as (template: BedrockBatchRole); "" off Bedrock.
    bedrock_batch_role_arn: str | None = None

    @field_validator("bedrock_batch_role_arn", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value


class LlmSettings(ModelDefault, CallTimeout):
    """The LLM provider and its keys (llm/): WorkerFunction."""

    llm_base_url: str = "https://api.openai.com/v1"
    llm_api_key: SecretStr | None = None
    # Several keys (a pool, see llm/keys.py): inline, or in a file (locally); in AWS the secret
    # at llm_api_key_secret_arn may hold the same formats.
    llm_keys: SecretStr | None = None
    llm_keys_file: str | None = None
    # In AWS the key lives in Secrets Manager; the worker reads it at cold start.
    llm_api_key_secret_arn: str | None = None

    @field_validator("llm_api_key_secret_arn", "llm_api_key", "llm_keys", "llm_keys_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        # CloudFormation cannot omit a variable conditionally without ceremony; "" means unset.
        return None if value == "" else value


class RunnerSettings(ModelDefault, CallTimeout, SubmitGrace, WebhookTargets, Prices):
    """A task's run (TaskRunner, call slots, the pace): WorkerFunction."""

    # Longer results go to ResultsBucket: with a 200 KiB prompt the item stays under 400 KB.
    max_inline_result_bytes: int = Field(default=100 * KIB, ge=0)
    # Backoff between LLM attempts: full jitter over base * 2**attempt, capped.
    retry_base_delay_s: float = Field(default=2.0, ge=0)
    # Both at most 900 s: a retry is an SQS message delay, and SQS delays go up to 15 minutes.
    retry_max_delay_s: float = Field(default=300.0, ge=0, le=900)
    # A model call in the provider's background mode is first looked at this long after its
    # start; each later look waits 1.5 times longer, up to SQS's 15-minute delay.
    background_first_look_s: float = Field(default=5.0, gt=0, le=900)
    # A provider's Retry-After beyond this fails the task instead of parking it for hours.
    retry_after_cap_s: float = Field(default=900.0, ge=0, le=900)
    # How long after its submit a flex task without a timeout_s waits for the provider's flex
    # tier to have capacity (its 429 Resource Unavailable); a task with one waits up to it.
    flex_wait_s: float = Field(default=86400.0, gt=0)
    # How much longer than the invocation's remaining time a claim's lease lives.
    lease_margin_s: float = Field(default=30.0, ge=0)
    # TaskQueue's maxReceiveCount and visibility timeout (template.yaml: TaskMaxReceiveCount,
    # TaskVisibilityTimeoutSeconds): when a message's last delivery is due.
    task_max_receive_count: int = Field(default=5, ge=2)
    task_visibility_timeout_s: float = Field(default=5400.0, gt=0)
    # How late a due redelivery may reach the worker before its task counts as dead-lettered.
    dead_letter_grace_s: float = Field(default=60.0, ge=0)
    # A shared pace for LLM calls across all worker sandboxes (template: LlmRequestsPerSecond);
    # 0 is no pace, the provider's 429s and their Retry-After alone hold the calls back.
    llm_requests_per_second: float = Field(default=0.0, ge=0)
    # Calls one worker invocation keeps in flight: as its calls end it takes more messages from
    # its queue itself while its time left can hold a whole call (template: WorkerCallSlots);
    # 0 runs only the records the event source hands it.
    worker_call_slots: int = Field(default=10, ge=0, le=100)
    # LLM calls one tenant may have running at once (template: TenantMaxRunning); 0 is no cap
    # beyond an API key's own max_running. Counted in LimitsTable.
    tenant_max_running: int = Field(default=0, ge=0)
    # While a call streams, the text it added is written as its output's next chunks at most this
    # often (readers see them, and `partial_result`); 0 turns streaming off (no progress writes).
    progress_interval_s: float = Field(default=2.0, ge=0)


class WebhookSettings(WebhookTargets):
    """Webhook deliveries (WebhookSender, WebhookDelivery): WebhookFunction."""

    webhook_timeout_s: float = Field(default=15.0, gt=0)
    # Deliveries one endpoint (scheme, host, port) may have open at once, across every sandbox
    # (template: WebhookEndpointConcurrency; counted in LimitsTable); 0 is no cap. An endpoint
    # that hangs then holds this many of WebhookFunction's invocations, and its other events
    # wait, put off without an attempt, while every other endpoint's go ahead.
    webhook_endpoint_concurrency: int = Field(default=0, ge=0)
    # A tenant's webhook URL that has failed this long with no success between is disabled: its
    # events are not attempted until the tenant enables it (template:
    # WebhookEndpointDisableAfterSeconds, Svix's five days); 0 never disables one.
    webhook_endpoint_disable_after_s: float = Field(default=0, ge=0)
    # Seconds to wait before each retry (Svix's schedule: 5 s, 5 min, 30 min, 2 h, 5 h): an event
    # gets one attempt more than the schedule has entries, then goes to WebhookDLQ.
    webhook_retry_schedule: Annotated[tuple[float, ...], NoDecode] = (5.0, 300.0, 1800.0, 7200.0, 18000.0)

    @property
    def webhook_attempts(self) -> int:
        return len(self.webhook_retry_schedule) + 1

    @field_validator("webhook_retry_schedule", mode="before")
    @classmethod
    def _split_schedule(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(float(part) for part in value.split(",") if part.strip())
        return value


class Settings(
    SubmitSettings, FanoutSettings, BedrockBatchSettings, LlmSettings, RunnerSettings, WebhookSettings
):
    """Every section in one: the whole list of variables, and what tests build services from.
    A function reads only its own sections (wiring)."""


Section = TypeVar("Section", bound=SettingsSection)


def section(model: type[Section]) -> Section:
    """One section read from the environment, once per process; MissingConfiguration names each
    variable that is wrong."""
    read: Section = _read_once(model)
    return read
