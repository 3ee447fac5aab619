"""Idempotency-Key for `POST /tasks` (IETF draft "The Idempotency-Key HTTP Header Field"), on
Powertools Idempotency with its DynamoDB persistence layer.

A key is scoped to its tenant. The same key and body within the TTL replay the first result;
the same key with another body is refused; a duplicate that arrives while the first request is
still running is refused as a conflict.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyPersistenceLayerError,
    IdempotencyValidationError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.base import BasePersistenceLayer
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord
from pydantic import BaseModel

from llmtasks.domain.errors import InvalidInput, ServiceUnavailable, TaskConflict

M = TypeVar("M", bound=BaseModel)

_REPLAYED = "__replayed__"


def _mark_replay(response: Any, idempotent_data: DataRecord) -> Any:
    """Powertools calls this only when it returns a stored result instead of running again."""
    return {**response, _REPLAYED: True}


def _run(*, request: dict[str, Any], action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    return action()


class IdempotencyKeys:
    def __init__(self, persistence: BasePersistenceLayer, *, ttl_s: int) -> None:
        self.config = IdempotencyConfig(
            event_key_jmespath="[tenant, key]",
            payload_validation_jmespath="body",
            expires_after_seconds=ttl_s,
            hash_function="sha256",
            response_hook=_mark_replay,
        )
        self._once = idempotent_function(
            _run, data_keyword_argument="request", persistence_store=persistence, config=self.config
        )

    def register_lambda_context(self, context: Any) -> None:
        """Lets a request that dies mid-way free its key once the invocation's time is up, rather
        than after the whole TTL."""
        self.config.register_lambda_context(context)

    def once(
        self, action: Callable[[], dict[str, Any]], *, tenant: str, key: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """`action`'s result, computed at most once per (tenant, key); and whether it is a replay."""
        try:
            result: dict[str, Any] = self._once(
                request={"tenant": tenant, "key": key, "body": body}, action=action
            )
        except IdempotencyValidationError as exc:
            raise InvalidInput(
                "This Idempotency-Key was already used with a different body.", field="Idempotency-Key"
            ) from exc
        except IdempotencyAlreadyInProgressError as exc:
            raise TaskConflict(
                "A request with this Idempotency-Key is still being processed; retry in a moment."
            ) from exc
        except IdempotencyPersistenceLayerError as exc:
            raise ServiceUnavailable(
                "Idempotency records are unavailable; nothing was stored. Retry."
            ) from exc
        replayed = bool(result.pop(_REPLAYED, False))
        return result, replayed


def once_per_key(
    keys: IdempotencyKeys | None,
    create: Callable[[], M],
    model: type[M],
    *,
    tenant: str,
    key: str | None,
    body: BaseModel,
) -> tuple[M, bool]:
    """What `create` makes, made once per (tenant, Idempotency-Key), and whether this is a replay
    of it; without a key, made now. A 503 where this deployment keeps no Idempotency-Key records.
    The one submit path's run-once step, for tasks and batches alike."""
    if key is None:
        return create(), False
    if keys is None:
        raise ServiceUnavailable("Idempotency-Key is not configured on this deployment.")
    stored, replayed = keys.once(
        lambda: create().model_dump(mode="json"),
        tenant=tenant,
        key=key,
        body=body.model_dump(mode="json", exclude_unset=True),
    )
    return model.model_validate(stored), replayed
