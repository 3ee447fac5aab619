"""`llmtasks up --record-aws-calls FILE`: each AWS call a function makes, as IAM authorizes it.

One JSON line a call: the function, the IAM action and the resource ARN, e.g.
`{"function": "SubmitFunction", "action": "sqs:SendMessage", "resource": "arn:aws:sqs:..."}`.
Together they are what the function's policy must allow (the local counterpart of IAM Access
Analyzer's policy generation from CloudTrail); tests/e2e/test_iam.py checks them against the
template's policies. Each sandbox process records its own calls (local/sandbox_main.py); the
calls the stack makes for itself (its pollers, provisioning) are not recorded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from botocore.client import BaseClient

from llmtasks_local.sam.function_spec import PSEUDO_PARAMETERS

# Batch and transaction calls are authorized action by action, as IAM does.
_ACTION_OF = {
    ("sqs", "SendMessageBatch"): "SendMessage",
    ("sqs", "DeleteMessageBatch"): "DeleteMessage",
    ("sqs", "ChangeMessageVisibilityBatch"): "ChangeMessageVisibility",
    ("s3", "HeadObject"): "GetObject",
    ("s3", "ListObjectsV2"): "ListBucket",
}
_TRANSACT_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}


def iam_requests(service: str, operation: str, params: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The (action, resource ARN) pairs IAM checks for one API call."""
    region, account = PSEUDO_PARAMETERS["AWS::Region"], PSEUDO_PARAMETERS["AWS::AccountId"]
    if service == "dynamodb":

        def table(name: str, index: str | None = None) -> str:
            arn = f"arn:aws:dynamodb:{region}:{account}:table/{name}"
            return f"{arn}/index/{index}" if index else arn

        if operation == "TransactWriteItems":
            for item in params.get("TransactItems", []):
                ((kind, body),) = item.items()
                yield f"dynamodb:{_TRANSACT_ACTIONS[kind]}", table(body["TableName"])
        elif operation in ("BatchGetItem", "BatchWriteItem"):
            for name in params.get("RequestItems", {}):
                yield f"dynamodb:{operation}", table(name)
        else:
            yield f"dynamodb:{operation}", table(params.get("TableName", "*"), params.get("IndexName"))
    elif service == "sqs":
        name = str(params.get("QueueUrl", "*")).rstrip("/").rsplit("/", 1)[-1]
        action = _ACTION_OF.get((service, operation), operation)
        yield f"sqs:{action}", f"arn:aws:sqs:{region}:{account}:{name}"
    elif service == "s3":
        action = _ACTION_OF.get((service, operation), operation)
        bucket = params.get("Bucket", "*")
        key = params.get("Key")
        source = params.get("CopySource")
        if operation == "CopyObject" and isinstance(source, dict):
            # IAM has no CopyObject action: a copy reads its source and writes its target.
            yield "s3:GetObject", f"arn:aws:s3:::{source.get('Bucket', '*')}/{source.get('Key')}"
            action = "PutObject"
        yield f"s3:{action}", f"arn:aws:s3:::{bucket}/{key}" if key is not None else f"arn:aws:s3:::{bucket}"
    else:
        yield f"{service}:{operation}", str(params.get("SecretId") or params.get("modelId") or "*")


def install(path: Path, *, function: str) -> None:
    """Records every call this process (a sandbox of `function`) makes from now on, appending
    to `path`. Sandboxes append to one file at once: each call's lines go in one write to a file
    opened for appending, so they never interleave."""
    lock = threading.Lock()
    original = BaseClient._make_api_call  # type: ignore[attr-defined]

    def recorded(client: BaseClient, operation: str, params: dict[str, Any]) -> Any:
        service = client.meta.service_model.signing_name or client.meta.service_model.service_name
        lines = "".join(
            json.dumps({"function": function, "action": action, "resource": resource}) + "\n"
            for action, resource in iam_requests(service, operation, params)
        )
        with lock, path.open("a") as out:
            out.write(lines)
        return original(client, operation, params)

    BaseClient._make_api_call = recorded  # type: ignore[attr-defined]
