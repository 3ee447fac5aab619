"""A real AWS endpoint over HTTP: the moto server the local stack embeds, or the endpoint that
AWS_ENDPOINT_URL names, with the template's resources under a fresh prefix. boto3's per-service
variables split it: with AWS_ENDPOINT_URL_SQS naming a LocalStack (scripts/localstack-tests), SQS
is LocalStack's and the rest moto's."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from llmtasks_local.sam.provision import LocalResources, provision
from llmtasks_local.sam.template import Template
from tests.helpers import TEMPLATE, endpoint_or_moto


@pytest.fixture(scope="session")
def endpoint_url() -> Iterator[str]:
    with endpoint_or_moto("AWS_ENDPOINT_URL") as url:
        yield url


@pytest.fixture
def remote(endpoint_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", os.environ.get("AWS_ACCESS_KEY_ID", "testing"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # No endpoint_url argument: it would win over AWS_ENDPOINT_URL_<SERVICE>.
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint_url)
    dynamodb, sqs, s3 = boto3.client("dynamodb"), boto3.client("sqs"), boto3.client("s3")
    resources: LocalResources = provision(
        Template.load(TEMPLATE), dynamodb=dynamodb, sqs=sqs, s3=s3, prefix=f"it-{uuid.uuid4().hex[:8]}"
    )
    return {"dynamodb": dynamodb, "sqs": sqs, "resources": resources}
