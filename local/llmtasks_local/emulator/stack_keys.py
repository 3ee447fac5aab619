"""The local stack's API keys, made with the operator's keys tool (`llmtasks.ops.keys`) on the
authorizer's keys table, as `llmtasks keys create` makes them: the development key `llmtasks up`
prints (tenant `dev`, kept in the state dir), and a key of each tenant whose batch the console
retries through the HTTP API."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import boto3

from llmtasks.ops.keys import Keys
from llmtasks_local.sam.function_spec import FunctionSpec

DEV_KEY = "dev-key"  # the development key's file in the state dir
KEYS_TABLE = "API_KEYS_TABLE_NAME"  # the authorizer's variable: where its keys are


class StackKeys:
    """None for every key under `--no-auth` (the gateway names the tenant), or when no function
    has a keys table."""

    def __init__(self, functions: Mapping[str, FunctionSpec], *, auth: bool, kept: Path | None) -> None:
        table = next(
            (spec.environment[KEYS_TABLE] for spec in functions.values() if KEYS_TABLE in spec.environment),
            None,
        )
        self._keys = Keys(table, boto3.client("dynamodb")) if table and auth else None
        self._kept = kept
        self._by_tenant: dict[str, str | None] = {}
        self._lock = threading.Lock()

    def dev_key(self) -> str | None:
        """A key for this run, tenant `dev`; with a state dir, the one it kept (its table is kept
        too)."""
        if self._keys is None:
            return None
        if self._kept is not None and self._kept.exists():
            return self._kept.read_text().strip()
        key, _ = self._keys.create("dev", name="llmtasks up")
        if self._kept is not None:
            self._kept.write_text(key)
        return key

    def of_tenant(self, tenant: str) -> str | None:
        """A key of `tenant` for the console's calls to the API, made at its first call and kept
        for the run."""
        with self._lock:
            if tenant not in self._by_tenant:
                made = None if self._keys is None else self._keys.create(tenant, name="llmtasks console")[0]
                self._by_tenant[tenant] = made
            return self._by_tenant[tenant]
