"""What TasksTable keeps of a task's output as it is written (see domain/output.py):

- `output#<task id>#<sequence>`: one chunk; written once, before the head points to it, and
  never changed after.
  A run's step event is a chunk with empty text and its `event` (JSON).
- `output#<task id>`: the head: the last chunk's sequence number, how far the latest attempt's
  chunks go, and once the task ended, its status; a run's also the last step it shows
  (`shown_step`) and its usage so far (`run_usage`, JSON). A waiting reader polls this small item (half a
  read unit), not the task's item with its prompt and text.

Both expire with their task (its `expires_at`). Neither has `tenant_id` or a `task#`/`batch#` key,
so the listing index and the stream consumers' filters pass over them; the head names its
tenant `owner_tenant` for that reason.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.aws.dynamo import (
    deserialize,
    dynamodb_errors,
    is_condition_failure,
    numbered_items,
    serialize,
    updated_if,
)
from llmtasks.domain.errors import BackendError
from llmtasks.domain.models import Task, TaskStatus, Usage
from llmtasks.domain.output import OutputChunk, OutputHead
from llmtasks.domain.steps import StepEvent
from llmtasks.observability import logger, task_keys

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

_STATUS = {"#status": "status"}


def _head_key(task_id: str) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"output#{task_id}"}}


def _chunks(task_id: str) -> str:
    """The keys of the task's chunks: this, then each one's number."""
    return f"output#{task_id}#"


def _chunk_key(task_id: str, sequence: int) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"{_chunks(task_id)}{sequence}"}}


def _head(item: dict[str, Any]) -> OutputHead:
    fields = deserialize(item)
    status = fields.get("status")
    return OutputHead(
        tenant_id=str(fields["owner_tenant"]),
        last_sequence=int(fields.get("last_sequence", 0)),
        attempt=int(fields.get("attempt", 1)),
        offset=int(fields.get("offset", 0)),
        tokens=int(fields.get("tokens", 0)),
        status=TaskStatus(status) if status else None,
        next_at=float(fields["next_at"]) if fields.get("next_at") is not None else None,
        first_sequence=int(fields["first_sequence"]) if fields.get("first_sequence") else None,
        written_at=float(fields["written_at"]) if fields.get("written_at") is not None else None,
        shown_step=int(fields["shown_step"]) if fields.get("shown_step") is not None else None,
        usage=Usage.model_validate_json(fields["run_usage"]) if fields.get("run_usage") else None,
    )


class TaskOutput:
    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table_name = table_name
        self._client = client

    def head(self, task_id: str, *, consistent: bool = False) -> OutputHead | None:
        """The output's head, or None before the task's first chunk or end. Read eventually
        consistent by waiting readers (half a read unit a poll): a head a moment old only makes
        them wait that moment longer."""
        with dynamodb_errors("read"):
            item = self._client.get_item(
                TableName=self.table_name, Key=_head_key(task_id), ConsistentRead=consistent
            ).get("Item")
        return _head(dict(item)) if item else None

    def chunks(self, task_id: str, first: int, last: int) -> list[OutputChunk]:
        """Chunks `first`..`last` (at most a hundred), in order, up to the first one missing
        (chunks exist before their head counts them, so only their TTL makes one missing)."""
        return [
            OutputChunk(
                sequence=sequence,
                text=str(fields["text"]),
                tokens=int(fields["tokens"]),
                attempt=int(fields["attempt"]),
                written_at=datetime.fromtimestamp(float(fields["written_at"]), UTC),
                event=StepEvent.model_validate_json(fields["event"]) if fields.get("event") else None,
            )
            for sequence, fields in numbered_items(
                self._client, self.table_name, _chunks(task_id), first, last
            )
        ]

    def append(
        self,
        task_id: str,
        chunk: OutputChunk,
        *,
        tenant_id: str,
        offset: int,
        tokens: int,
        expires_at: int,
        next_at: float,
        first_sequence: int,
        shown_step: int | None = None,
        usage: Usage | None = None,
    ) -> bool:
        """The chunk, then the head pointing to it (with the attempt's `offset` and `tokens` after
        it, its attempt's first chunk, when it was written and when the next chunk is due): the
        call's progress, which `GET /tasks/{id}` reads here. False when the task has ended
        meanwhile (a cancel writes the head) or a later attempt has written: the chunk stays
        unread (its head never counts it) and expires with the rest. A run's step event sets the
        head's `shown_step` (and a model call's, the run's `usage` so far)."""
        event = {"event": chunk.event.model_dump_json(exclude_none=True)} if chunk.event else {}
        run: dict[str, Any] = {":shown": shown_step} if shown_step is not None else {}
        run |= {":usage": usage.model_dump_json()} if usage is not None else {}
        with dynamodb_errors("write"):
            self._client.put_item(
                TableName=self.table_name,
                Item=serialize(
                    {
                        **deserialize(_chunk_key(task_id, chunk.sequence)),
                        "text": chunk.text,
                        "tokens": chunk.tokens,
                        "attempt": chunk.attempt,
                        "written_at": chunk.written_at.timestamp(),
                        "expires_at": expires_at,
                        **event,
                    }
                ),
            )
        updated = updated_if(
            self._client,
            self.table_name,
            _head_key(task_id),
            "SET owner_tenant = :tenant, last_sequence = :sequence, attempt = :attempt,"
            " #offset = :offset, tokens = :tokens, expires_at = :expires, next_at = :next,"
            " first_sequence = :first, written_at = :at"
            + (", shown_step = :shown" if ":shown" in run else "")
            + (", run_usage = :usage" if ":usage" in run else ""),
            # Not ended (a cancel writes the head), and no later attempt has written it.
            condition=(
                "attribute_not_exists(#status) AND (attribute_not_exists(attempt) OR attempt <= :attempt)"
            ),
            names={**_STATUS, "#offset": "offset"},
            values={
                ":tenant": tenant_id,
                ":sequence": chunk.sequence,
                ":attempt": chunk.attempt,
                ":offset": offset,
                ":tokens": tokens,
                ":expires": expires_at,
                ":next": next_at,
                ":first": first_sequence,
                ":at": chunk.written_at.timestamp(),
                **run,
            },
        )
        return updated is not None

    def restarted(self, task_id: str) -> None:
        """The head no longer says the task ended: a batch retry runs it again, and its next
        attempt's chunks follow the earlier ones. Best effort, as `ended`: should it fail, the
        new chunks are not read (the task's own item still has the text)."""
        try:
            self._client.update_item(
                TableName=self.table_name,
                Key=_head_key(task_id),
                UpdateExpression="REMOVE #status",
                ConditionExpression="attribute_exists(pk)",  # no head yet: nothing to restart
                ExpressionAttributeNames=_STATUS,
            )
        except ClientError as exc:
            if not is_condition_failure(exc):
                logger.warning("the output's restart not written", error=str(exc), task_id=task_id)
        except BotoCoreError as exc:
            logger.warning("the output's restart not written", error=str(exc), task_id=task_id)

    def ended(self, task: Task, status: TaskStatus, *, offset: int = 0, tokens: int = 0) -> None:
        """The head says `task` ended with `status`, written by the attempt that ended it, whose
        chunks hold `offset` characters and `tokens` tokens (none written: 0), so readers know
        the last chunk. Written after the task's own change, and on a best effort: should it
        fail, a reader learns of the end from the task itself when its wait runs out."""
        try:
            with dynamodb_errors("write"):
                self._client.update_item(
                    TableName=self.table_name,
                    Key=_head_key(task.task_id),
                    UpdateExpression=(
                        "SET owner_tenant = :tenant, #status = :status, attempt = :attempt,"
                        " #offset = :offset, tokens = :tokens, expires_at = :expires,"
                        " last_sequence = if_not_exists(last_sequence, :zero)"
                    ),
                    ExpressionAttributeNames={**_STATUS, "#offset": "offset"},
                    ExpressionAttributeValues=serialize(
                        {
                            ":tenant": task.tenant_id,
                            ":status": status.value,
                            ":attempt": max(1, task.attempts),
                            ":offset": offset,
                            ":tokens": tokens,
                            ":expires": task.expires_at,
                            ":zero": 0,
                        }
                    ),
                )
        except BackendError as exc:
            logger.warning("the output's end not written", error=str(exc), **task_keys(task))
