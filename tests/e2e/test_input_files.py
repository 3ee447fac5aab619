"""A 20 MB PDF classified end to end on the local stack: uploaded in parts through /v1/uploads,
named by file id in a task with a JSON schema, read into the call by the worker, and never
carried by the task's item."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmtasks_local.sam.provision import local_name
from tests.documents import pdf_document
from tests.e2e.conftest import RunningStack, wait_terminal
from tests.helpers import local_client

pytestmark = pytest.mark.e2e

PART_BYTES = 3_000_000  # a request through the gateway holds about 4.5 MB of bytes
LABEL = {
    "type": "object",
    "properties": {"label": {"type": "string", "enum": ["contract", "invoice", "letter"]}},
    "required": ["label"],
    "additionalProperties": False,
}


def upload(stack: RunningStack, data: bytes, filename: str) -> str:
    """What a client of OpenAI's Uploads API does; the file's id."""
    with stack.client() as client:
        body = {
            "bytes": len(data),
            "filename": filename,
            "mime_type": "application/pdf",
            "purpose": "user_data",
        }
        made = client.post("/v1/uploads", json=body)
        assert made.status_code == 200, made.text
        upload_id = made.json()["id"]
        parts = []
        for start in range(0, len(data), PART_BYTES):
            piece = data[start : start + PART_BYTES]
            added = client.post(f"/v1/uploads/{upload_id}/parts", files={"data": ("part", piece)})
            assert added.status_code == 200, added.text
            parts.append(added.json()["id"])
        completed = client.post(f"/v1/uploads/{upload_id}/complete", json={"part_ids": parts})
        assert completed.status_code == 200, completed.text
        file: dict[str, Any] = completed.json()["file"]
        assert (file["bytes"], file["purpose"]) == (len(data), "user_data")
        return str(file["id"])


def test_a_20_mb_pdf_is_classified_by_file_id_and_no_item_carries_it(fresh_mock: RunningStack) -> None:
    # Given a 20 MB PDF uploaded in parts
    document = pdf_document("This is an invoice for services rendered.", pages=3, size=20_000_000)
    assert len(document) >= 19_900_000
    file_id = upload(fresh_mock, document, "invoice.pdf")

    # When a task names it, with a schema of labels
    task_body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Classify this document."},
                    {"type": "file", "file": {"file_id": file_id}},
                ],
            }
        ],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "label", "schema": LABEL, "strict": True},
        },
    }
    with fresh_mock.client() as client:
        submitted = client.post("/tasks", json=task_body)
        assert submitted.status_code == 202, submitted.text
        task_id = submitted.json()["task_id"]
        task = wait_terminal(client, task_id)

    # Then it completes with the label parsed, the mock got the whole file, and the task's item
    # holds its id, not its bytes
    assert task["status"] == "completed", task
    assert task["parsed"] == {"label": "invoice"}
    stats = fresh_mock.mock_stats()
    assert (stats["files"], stats["file_bytes"]) == (1, len(document))
    dynamodb = local_client("dynamodb", fresh_mock.endpoint)
    item = dynamodb.get_item(TableName=local_name("TasksTable"), Key={"pk": {"S": f"task#{task_id}"}})["Item"]
    stored = json.dumps(item)
    assert file_id in stored
    assert len(stored) < 20_000
