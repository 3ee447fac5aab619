"""The local stack's own keys (emulator/stack_keys.py): the dev key and the console's key of each
tenant, made as `llmtasks keys create` makes them and, with a state dir, used again by the next
run rather than made anew."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws

from llmtasks.ops.keys import Keys
from llmtasks_local.emulator.stack_keys import CONSOLE_KEYS, KEYS_TABLE, StackKeys

pytestmark = pytest.mark.unit

TABLE = "ApiKeysTable"


@pytest.fixture
def functions(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        boto3.client("dynamodb").create_table(
            TableName=TABLE,
            AttributeDefinitions=[{"AttributeName": "key_id", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "key_id", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield {"AuthorizerFunction": SimpleNamespace(environment={KEYS_TABLE: TABLE})}


def names() -> list[tuple[str, str]]:
    return sorted((key.tenant_id, key.name) for key in Keys(TABLE, boto3.client("dynamodb")).all())


def test_a_restart_with_the_state_dir_uses_the_same_keys(functions: dict[str, Any], tmp_path: Path) -> None:
    first = StackKeys(functions, auth=True, state_dir=tmp_path)
    dev, acme = first.dev_key(), first.of_tenant("acme")
    assert first.of_tenant("acme") == acme  # one key a tenant for the run

    again = StackKeys(functions, auth=True, state_dir=tmp_path)

    assert (again.dev_key(), again.of_tenant("acme")) == (dev, acme)
    assert again.of_tenant("other") not in (None, acme)
    assert names() == [("acme", "llmtasks console"), ("dev", "llmtasks up"), ("other", "llmtasks console")]


def test_without_a_state_dir_each_run_makes_its_own(functions: dict[str, Any]) -> None:
    first, second = (StackKeys(functions, auth=True, state_dir=None) for _ in range(2))

    assert first.of_tenant("acme") != second.of_tenant("acme")
    assert names() == [("acme", "llmtasks console"), ("acme", "llmtasks console")]


def test_no_keys_under_no_auth(functions: dict[str, Any], tmp_path: Path) -> None:
    keys = StackKeys(functions, auth=False, state_dir=tmp_path)

    assert (keys.dev_key(), keys.of_tenant("acme")) == (None, None)
    assert names() == []


def test_a_key_file_cut_short_is_made_again_and_another_endpoints_table_keeps_none(
    functions: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / CONSOLE_KEYS).write_text('{"acme": "lt_cut')  # a crash in the middle of a write

    keys = StackKeys(functions, auth=True, state_dir=tmp_path)
    acme = keys.of_tenant("acme")

    assert acme is not None
    assert acme.startswith("lt_")
    assert acme != "lt_cut"
    assert json.loads((tmp_path / CONSOLE_KEYS).read_text()) == {"acme": acme}
    # An endpoint of your own keeps (or not) its keys table: its console keys are not kept here
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    StackKeys(functions, auth=True, state_dir=elsewhere, keeps_table=False).of_tenant("acme")
    assert not (elsewhere / CONSOLE_KEYS).exists()


def test_a_key_the_api_refused_is_made_anew_and_kept_in_its_place(
    functions: dict[str, Any], tmp_path: Path
) -> None:
    keys = StackKeys(functions, auth=True, state_dir=tmp_path)
    refused = keys.of_tenant("acme")

    renewed = keys.of_tenant("acme", renew=True)

    assert renewed not in (None, refused)
    assert keys.of_tenant("acme") == renewed
    assert StackKeys(functions, auth=True, state_dir=tmp_path).of_tenant("acme") == renewed
