"""Classify a folder of documents (text and PDF) into a JSON schema with one batch.

The seed's own case: a team's documents, each read by the model and given a label that must fit a
schema. Every item asks for `response_format` json_schema (strict), so each result comes back as
`parsed`, an object already validated against the schema; a model answer that does not fit is
retried, and fails as `invalid_output` only after its retries. PDFs travel as file parts: inline
when small, uploaded (POST /v1/files) and named by file_id when large, which the SDK decides.

    export LLMTASKS_API_URL=http://127.0.0.1:3000 LLMTASKS_API_KEY=lt_...   # the key make up printed
    python examples/classify_documents.py path/to/folder
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

import llmtasks_client

INSTRUCTIONS = "Classify the document: invoice, contract, report or letter. Give a one-line summary."


class Label(BaseModel):
    """What each document gets: its category and a line about it."""

    model_config = ConfigDict(extra="forbid")

    category: Literal["invoice", "contract", "report", "letter"]
    summary: str


@dataclass(frozen=True)
class Classified:
    name: str
    label: Label | None
    error: str | None
    tokens: int
    cost_usd: Decimal


def item(path: Path, model: str) -> dict[str, Any]:
    """One batch item: the document as a text part, or a PDF as a file part; the answer a Label
    (the SDK turns the model class into a strict json_schema response_format)."""
    if path.suffix.lower() == ".pdf":
        document = llmtasks_client.file_part(path)
    else:
        document = llmtasks_client.text_part(path.read_text(encoding="utf-8", errors="replace"))
    return {
        "custom_id": path.name,
        "model": model,
        "messages": [
            {"role": "developer", "content": INSTRUCTIONS},
            {"role": "user", "content": [document]},
        ],
        "response_format": Label,
        "max_completion_tokens": 200,
    }


def classify(
    client: llmtasks_client.Client, folder: Path, *, model: str
) -> tuple[llmtasks_client.BatchView, list[Classified]]:
    """Every .txt, .md and .pdf of `folder`, classified by one batch: the batch as it ended, and
    a row a document, in the folder's order."""
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in {".txt", ".md", ".pdf"})
    batch = client.submit_batch([item(path, model) for path in paths])
    ended = client.wait_batch(batch.batch_id)
    rows = []
    for result in client.batch_results(batch.batch_id):
        parsed = getattr(result, "parsed", None)
        usage = result.usage
        rows.append(
            Classified(
                name=result.custom_id or result.task_id,
                label=Label.model_validate(parsed) if parsed is not None else None,
                error=result.error_code,
                tokens=usage.total_tokens if usage else 0,
                cost_usd=Decimal(repr(usage.cost_usd)) if usage and usage.cost_usd else Decimal(0),
            )
        )
    return ended, rows


if __name__ == "__main__":
    api = os.environ.get("LLMTASKS_API_URL", "http://127.0.0.1:3000")
    with llmtasks_client.Client(api, os.environ["LLMTASKS_API_KEY"]) as client:
        folder, model = Path(sys.argv[1]), os.environ.get("LLMTASKS_MODEL", "gpt-4o-mini")
        batch, rows = classify(client, folder, model=model)
    for row in rows:
        what = f"{row.label.category:<9} {row.label.summary[:60]}" if row.label else f"failed: {row.error}"
        print(f"{row.name:<32} {what}  {row.tokens} tokens  ${row.cost_usd}")
    print(f"{batch.status}: {batch.completed} of {batch.total} completed, {batch.failed} failed")
    print(f"{len(rows)} documents, {sum(r.tokens for r in rows)} tokens, ${sum(r.cost_usd for r in rows)}")
