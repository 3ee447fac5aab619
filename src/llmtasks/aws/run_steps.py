"""TasksTable's items of a run's journal: `step#<task id>#<n>`, one a finished step (domain/steps.py).

Each is written once, on the condition that it does not exist: a redelivery that repeats a step
finds the recorded one and takes it instead (`record` returns the step that stands). A step too
large for an item keeps its text in ResultsBucket (`text_ref`), read back with the steps. Steps
expire with their task, and carry no `tenant_id` or `task#` key, so the listing index and the
stream's consumers pass over them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.aws.dynamo import batch_get, deserialize, dynamodb_errors, is_condition_failure, serialize
from llmtasks.aws.results import ResultBlobs
from llmtasks.domain.errors import BackendError
from llmtasks.domain.steps import RunStep

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# Steps read together (BatchGetItem's limit); the journal reads windows until one is empty.
WINDOW = 100
# A step's text past this many bytes goes to ResultsBucket (an item holds 400 KB in all); a
# client's output never does (domain.runs.MAX_CLIENT_OUTPUT_BYTES): only the worker writes there.
MAX_INLINE_STEP_BYTES = 100_000


def _prefix(task_id: str) -> str:
    return f"step#{task_id}#"


class RunJournal:
    def __init__(self, table_name: str, client: DynamoDBClient, results: ResultBlobs) -> None:
        self.table_name = table_name
        self._client = client
        self._results = results

    def record(self, task_id: str, step: RunStep, *, expires_at: int) -> RunStep:
        """Writes the step unless it exists; the step as recorded (this one, or the one another
        delivery wrote first)."""
        stored = self._offloaded(task_id, step)
        fields = stored.model_dump(mode="json", exclude_none=True)
        item = serialize(
            {"pk": f"{_prefix(task_id)}{step.step}", "body": json.dumps(fields), "expires_at": expires_at}
        )
        try:
            self._client.put_item(
                TableName=self.table_name, Item=item, ConditionExpression="attribute_not_exists(pk)"
            )
        except ClientError as exc:
            if not is_condition_failure(exc):
                raise BackendError(f"DynamoDB put failed: {exc}") from exc
            found = self.get(task_id, step.step)
            if found is None:  # expired between the two: nothing to keep
                raise BackendError(f"step {step.step} of {task_id} vanished") from exc
            return found
        except BotoCoreError as exc:
            raise BackendError(f"DynamoDB put failed: {exc}") from exc
        return step

    def _offloaded(self, task_id: str, step: RunStep) -> RunStep:
        """The step as its item keeps it: a text past MAX_INLINE_STEP_BYTES in ResultsBucket."""
        if step.output is not None and len(step.output.encode()) > MAX_INLINE_STEP_BYTES:
            ref = self._results.put(f"{task_id}/step-{step.step}", step.output)
            return step.model_copy(update={"output": None, "text_ref": ref})
        done = step.completion
        if done is not None and len(done.text.encode()) > MAX_INLINE_STEP_BYTES:
            ref = self._results.put(f"{task_id}/step-{step.step}", done.text)
            return step.model_copy(
                update={"completion": done.model_copy(update={"text": ""}), "text_ref": ref}
            )
        return step

    def _read(self, item: dict[str, Any]) -> RunStep:
        step = RunStep.model_validate_json(deserialize(item)["body"])
        if step.text_ref is None:
            return step
        text = self._results.get(step.text_ref)
        if step.completion is not None:
            return step.model_copy(update={"completion": step.completion.model_copy(update={"text": text})})
        return step.model_copy(update={"output": text})

    def get(self, task_id: str, number: int) -> RunStep | None:
        with dynamodb_errors("read"):
            reply = self._client.get_item(
                TableName=self.table_name,
                Key={"pk": {"S": f"{_prefix(task_id)}{number}"}},
                ConsistentRead=True,
            )
        item = reply.get("Item")
        return self._read(dict(item)) if item else None

    def steps(self, task_id: str, *, first: int = 0, limit: int | None = None) -> list[RunStep]:
        """The task's recorded steps from `first`, in order (a client's unanswered call leaves a
        gap), up to `limit`."""
        found: list[RunStep] = []
        start = first
        while limit is None or len(found) < limit:
            keys: Any = [{"pk": {"S": f"{_prefix(task_id)}{n}"}} for n in range(start, start + WINDOW)]
            with dynamodb_errors("read"):
                items = batch_get(self._client, self.table_name, keys)
            if not items:
                break
            window = sorted((self._read(item) for item in items.values()), key=lambda step: step.step)
            found += window
            start += WINDOW
        return found if limit is None else found[:limit]


def recorded_steps(client: DynamoDBClient, table_name: str, task_id: str, *, limit: int) -> list[RunStep]:
    """The task's first `limit` steps (WINDOW at most), in order, as their items hold them: a text
    kept in ResultsBucket is not read (only its `text_ref`), for views of the steps' facts."""
    keys: Any = [{"pk": {"S": f"{_prefix(task_id)}{n}"}} for n in range(min(limit, WINDOW))]
    with dynamodb_errors("read"):
        items = batch_get(client, table_name, keys)
    steps = (RunStep.model_validate_json(deserialize(item)["body"]) for item in items.values())
    return sorted(steps, key=lambda step: step.step)
