"""LocalStack's endpoint conventions (localstack-client), as `--endpoint-url localstack` and the
operator commands' default endpoint read them."""

from __future__ import annotations

import pytest

from llmtasks_local.cli.options import endpoint_for
from llmtasks_local.emulator.endpoints import LOCALSTACK, localstack_endpoint, resolved

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def no_endpoint_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_SQS",
        "AWS_ENDPOINT_URL_DYNAMODB",
        "LOCALSTACK_HOST",
        "USE_SSL",
    ):
        monkeypatch.delenv(name, raising=False)


def test_without_settings_it_is_this_machine_s_4566_where_llmtasks_up_serves_moto() -> None:
    assert localstack_endpoint("sqs") == "http://127.0.0.1:4566"


def test_localstack_host_and_use_ssl_name_another_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSTACK_HOST", "127.0.0.1:4599")
    assert localstack_endpoint("dynamodb") == "http://127.0.0.1:4599"
    monkeypatch.setenv("USE_SSL", "true")
    assert localstack_endpoint("sqs") == "https://127.0.0.1:4599"
    monkeypatch.setenv("LOCALSTACK_HOST", "localhost:4510")
    assert localstack_endpoint("sqs") == "https://127.0.0.1:4510"  # by address, never by name


def test_aws_endpoint_url_wins_as_localstack_client_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSTACK_HOST", "127.0.0.1:4599")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4700")
    assert localstack_endpoint("sqs") == "http://127.0.0.1:4700"


def test_only_the_keyword_is_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSTACK_HOST", "127.0.0.1:4599")
    assert resolved(LOCALSTACK, "sqs") == "http://127.0.0.1:4599"
    assert resolved("http://127.0.0.1:5000", "sqs") == "http://127.0.0.1:5000"


def test_the_operator_commands_default_to_localstack_s_conventions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSTACK_HOST", "127.0.0.1:4599")
    assert endpoint_for("sqs", None) == endpoint_for("dynamodb", None) == "http://127.0.0.1:4599"
    assert endpoint_for("sqs", "http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", "http://127.0.0.1:4601")  # a service's own wins
    assert endpoint_for("sqs", "localstack") == "http://127.0.0.1:4601"
    assert endpoint_for("dynamodb", "localstack") == "http://127.0.0.1:4599"
