"""What the OpenAPI document says beyond what Powertools derives from the routes' signatures:
metadata's one named schema (models refer to it, so that client generators make one type of it),
the upload's multipart body (the route reads its raw body, see openai_batches.py) and the links
from each operation that creates or lists a resource to the operations that read, cancel or
page it, so that a client generator or a stateful tester (schemathesis) can follow them. The
Swagger UI page (/docs) shows this same document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_lambda_powertools.event_handler.openapi import swagger_ui
from aws_lambda_powertools.event_handler.openapi.swagger_ui.html import generate_swagger_html

from llmtasks.api.openai_batches import MAX_FILE_BYTES

# (method, path, status) of the operation whose reply names the resource -> the links it offers:
# name -> (method, path of the operation linked to, its parameters as runtime expressions).
_Link = tuple[str, str, dict[str, str]]
LINKS: dict[tuple[str, str, str], dict[str, _Link]] = {
    ("post", "/tasks", "202"): {
        "GetTask": ("get", "/tasks/{task_id}", {"task_id": "$response.body#/task_id"}),
        "CancelTask": ("post", "/tasks/{task_id}/cancel", {"task_id": "$response.body#/task_id"}),
        "TaskOutput": ("get", "/tasks/{task_id}/output", {"task_id": "$response.body#/task_id"}),
        "TaskWebhookAttempts": (
            "get",
            "/tasks/{task_id}/webhook/attempts",
            {"task_id": "$response.body#/task_id"},
        ),
        "ReplayTaskWebhook": (
            "post",
            "/tasks/{task_id}/webhook/replay",
            {"task_id": "$response.body#/task_id"},
        ),
    },
    ("get", "/tasks", "200"): {
        "GetFirstTask": ("get", "/tasks/{task_id}", {"task_id": "$response.body#/data/0/task_id"}),
        "NextPage": ("get", "/tasks", {"cursor": "$response.body#/next_cursor"}),
    },
    ("get", "/tasks/{task_id}/output", "200"): {
        "ReadOn": (
            "get",
            "/tasks/{task_id}/output",
            {"task_id": "$request.path.task_id", "after": "$response.body#/after"},
        ),
    },
    ("get", "/batches/{batch_id}/events", "200"): {
        "ReadOn": (
            "get",
            "/batches/{batch_id}/events",
            {"batch_id": "$request.path.batch_id", "after": "$response.body#/after"},
        ),
    },
    ("get", "/tasks/{task_id}/webhook/attempts", "200"): {
        "NextPage": (
            "get",
            "/tasks/{task_id}/webhook/attempts",
            {"task_id": "$request.path.task_id", "cursor": "$response.body#/next_cursor"},
        ),
    },
    ("post", "/batches", "202"): {
        "GetBatch": ("get", "/batches/{batch_id}", {"batch_id": "$response.body#/batch_id"}),
        "BatchResults": ("get", "/batches/{batch_id}/results", {"batch_id": "$response.body#/batch_id"}),
        "BatchEvents": ("get", "/batches/{batch_id}/events", {"batch_id": "$response.body#/batch_id"}),
        "BatchRefusedLines": (
            "get",
            "/batches/{batch_id}/refused",
            {"batch_id": "$response.body#/batch_id"},
        ),
        "CancelBatch": ("post", "/batches/{batch_id}/cancel", {"batch_id": "$response.body#/batch_id"}),
        "RetryBatch": ("post", "/batches/{batch_id}/retry", {"batch_id": "$response.body#/batch_id"}),
        "BatchWebhookAttempts": (
            "get",
            "/batches/{batch_id}/webhook/attempts",
            {"batch_id": "$response.body#/batch_id"},
        ),
        "ReplayBatchWebhook": (
            "post",
            "/batches/{batch_id}/webhook/replay",
            {"batch_id": "$response.body#/batch_id"},
        ),
    },
    ("post", "/v1/responses", "200"): {
        "RetrieveResponse": ("get", "/v1/responses/{response_id}", {"response_id": "$response.body#/id"}),
        "CancelResponse": (
            "post",
            "/v1/responses/{response_id}/cancel",
            {"response_id": "$response.body#/id"},
        ),
    },
    ("post", "/v1/files", "200"): {
        "RetrieveFile": ("get", "/v1/files/{file_id}", {"file_id": "$response.body#/id"}),
        "FileContent": ("get", "/v1/files/{file_id}/content", {"file_id": "$response.body#/id"}),
    },
    ("post", "/v1/uploads", "200"): {
        "AddUploadPart": ("post", "/v1/uploads/{upload_id}/parts", {"upload_id": "$response.body#/id"}),
        "CompleteUpload": ("post", "/v1/uploads/{upload_id}/complete", {"upload_id": "$response.body#/id"}),
        "CancelUpload": ("post", "/v1/uploads/{upload_id}/cancel", {"upload_id": "$response.body#/id"}),
    },
    ("post", "/v1/batches", "200"): {
        "RetrieveBatch": ("get", "/v1/batches/{batch_id}", {"batch_id": "$response.body#/id"}),
        "CancelBatch": ("post", "/v1/batches/{batch_id}/cancel", {"batch_id": "$response.body#/id"}),
    },
}

UPLOAD_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file", "purpose"],
                "properties": {
                    "file": {
                        "type": "string",
                        "format": "binary",
                        "minLength": 1,
                        "description": "purpose batch: JSON Lines, one request a line, as OpenAI's"
                        " Batch API reads them; user_data or vision: an image or a document (PDF)"
                        " that tasks name by file_id. At most"
                        f" {MAX_FILE_BYTES} bytes here (larger ones through /v1/uploads).",
                    },
                    "purpose": {
                        "enum": ["batch", "user_data", "vision"],
                        "description": "batch: a batch's input; user_data or vision: a task's"
                        " image or document.",
                    },
                },
            }
        }
    },
}

PART_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["data"],
                "properties": {
                    "data": {
                        "type": "string",
                        "format": "binary",
                        "minLength": 1,
                        "description": "A part of the file's bytes: at most about 4.5 MB (the request's 6 MB"
                        " holds its body base64-encoded).",
                    },
                },
            }
        }
    },
}


METADATA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": True,
    "description": "Any JSON object, up to MAX_METADATA_BYTES (2 KiB by default) as JSON text; echoed back.",
}


def complete(document: dict[str, Any]) -> dict[str, Any]:
    """`document` (as Powertools made it) with the metadata's schema, the upload's body and the
    links added."""
    document["components"]["schemas"]["Metadata"] = METADATA
    paths = document["paths"]
    paths["/v1/files"]["post"]["requestBody"] = UPLOAD_BODY
    paths["/v1/uploads/{upload_id}/parts"]["post"]["requestBody"] = PART_BODY
    for (method, path, status), links in LINKS.items():
        response = paths[path][method]["responses"][status]
        response["links"] = {
            name: {"operationId": paths[to_path][to_method]["operationId"], "parameters": parameters}
            for name, (to_method, to_path, parameters) in links.items()
        }
    return document


def swagger_page(document_text: str) -> str:
    """The Swagger UI page on `document_text`, with Powertools' bundled script and style."""
    assets = Path(swagger_ui.__file__).parent
    return generate_swagger_html(
        # Escaped so that no string of the document closes the page's <script>.
        spec=document_text.replace("</", "<\\/"),
        swagger_js=(assets / "swagger-ui-bundle.min.js").read_text(encoding="utf-8"),
        swagger_css=(assets / "swagger-ui.min.css").read_text(encoding="utf-8"),
        swagger_base_url="",
        oauth2_config=None,
    )
