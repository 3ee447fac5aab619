"""The local stack's API keys, made with the operator's keys tool (`llmtasks.ops.keys`) on the
authorizer's keys table, as `llmtasks keys create` makes them: the development key `llmtasks up`
prints (tenant `dev`), and a key of each tenant whose batch the console retries through the HTTP
API. With a state dir both are kept there, beside the keys table they are rows of, so a restart
uses them again instead of making more."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping
from pathlib import Path

import boto3

from llmtasks.ops.keys import Keys
from llmtasks_local.sam.function_spec import FunctionSpec

DEV_KEY = "dev-key"  # the development key's file in the state dir
CONSOLE_KEYS = "console-keys.json"  # the console's key of each tenant, in the state dir
KEYS_TABLE = "API_KEYS_TABLE_NAME"  # the authorizer's variable: where its keys are


class StackKeys:
    """None for every key under `--no-auth` (the gateway names the tenant), or when no function
    has a keys table."""

    def __init__(
        self,
        functions: Mapping[str, FunctionSpec],
        *,
        auth: bool,
        state_dir: Path | None,
        keeps_table: bool = True,  # whether the state dir keeps the keys table too (not another endpoint's)
    ) -> None:
        table = next(
            (spec.environment[KEYS_TABLE] for spec in functions.values() if KEYS_TABLE in spec.environment),
            None,
        )
        self._keys = Keys(table, boto3.client("dynamodb")) if table and auth else None
        self._kept = None if state_dir is None else state_dir / DEV_KEY
        self._kept_by_tenant = None if state_dir is None or not keeps_table else state_dir / CONSOLE_KEYS
        self._by_tenant: dict[str, str] = {}
        if self._keys is not None and self._kept_by_tenant is not None and self._kept_by_tenant.exists():
            with contextlib.suppress(ValueError):  # cut short by a crash: the keys are made again
                kept = json.loads(self._kept_by_tenant.read_text())
                if isinstance(kept, dict):
                    self._by_tenant = {str(tenant): str(key) for tenant, key in kept.items()}
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

    def of_tenant(self, tenant: str, renew: bool = False) -> str | None:
        """A key of `tenant` for the console's calls to the API, made at its first call and kept
        for the run (with a state dir, for the next runs too); `renew` makes a new one, as when the
        API refused the one kept."""
        if self._keys is None:
            return None
        with self._lock:
            if renew or tenant not in self._by_tenant:
                self._by_tenant[tenant] = self._keys.create(tenant, name="llmtasks console")[0]
                if self._kept_by_tenant is not None:  # whole or not at all, as a crash may come
                    written = self._kept_by_tenant.with_suffix(".tmp")
                    written.write_text(json.dumps(self._by_tenant))
                    written.replace(self._kept_by_tenant)
            return self._by_tenant[tenant]
