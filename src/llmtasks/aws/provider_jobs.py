"""A provider batch's jobs in TasksTable: one item a job, `pjob#<batch>#<chunk>#<part>`, expiring
with the batch, and the jobs' request counts on the batch's item (`provider_counts`).

The item is written `creating` before the provider is asked for the job and gets the job's id
right after, each write conditional: whichever copy of a chunk's message writes first owns the
job, and a copy that finds an id creates nothing (services/provider_batches.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from llmtasks.aws.batch_store import batch_key
from llmtasks.aws.dynamo import deserialize, dynamodb_errors, is_condition_failure, serialize, updated_if
from llmtasks.domain.errors import BackendError
from llmtasks.domain.provider_batches import ProviderJob

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef


def job_key(batch_id: str, chunk: int, part: int) -> dict[str, AttributeValueTypeDef]:
    return {"pk": {"S": f"pjob#{batch_id}#{chunk}#{part}"}}


def _job_of(item: Any) -> ProviderJob:
    fields = deserialize(item)
    fields.pop("pk", None)
    return ProviderJob.model_validate(fields)


class ProviderJobs:
    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table_name = table_name
        self._client = client

    def begin(self, job: ProviderJob) -> tuple[ProviderJob, bool]:
        """The job's item written `creating`, and True; the stored one and False when it exists
        already (a copy of the chunk's message, or a crash, got there first)."""
        item = serialize({**deserialize(job_key(job.batch_id, job.chunk, job.part)), **job.model_dump()})
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item=item,
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            old = exc.response.get("Item")
            if is_condition_failure(exc) and old:
                return _job_of(old), False
            raise BackendError(f"DynamoDB put failed: {exc}") from exc
        except BotoCoreError as exc:
            raise BackendError(f"DynamoDB put failed: {exc}") from exc
        return job, True

    def get(self, batch_id: str, chunk: int, part: int) -> ProviderJob | None:
        with dynamodb_errors("read"):
            reply = self._client.get_item(
                TableName=self.table_name, Key=job_key(batch_id, chunk, part), ConsistentRead=True
            )
        item = reply.get("Item")
        return _job_of(item) if item else None

    def started(self, job: ProviderJob, job_id: str) -> ProviderJob:
        """The provider's id on the job (running); the stored job when another copy stored its
        own first (then this one's is the same job, found by its tag, or the copy's)."""
        item = updated_if(
            self._client,
            self.table_name,
            job_key(job.batch_id, job.chunk, job.part),
            "SET job_id = :id, #phase = :running",
            condition="attribute_exists(pk) AND attribute_not_exists(job_id)",
            values={":id": job_id, ":running": "running"},
            names={"#phase": "phase"},
        )
        if item is not None:
            return _job_of(item)
        stored = self.get(job.batch_id, job.chunk, job.part)
        if stored is None:
            raise BackendError(f"provider job {job.tag}: its item is gone")
        return stored

    def note_provider_id(self, job: ProviderJob, job_id: str) -> None:
        """Which job a provider's job id is (its webhook names the id alone): `pjobid#<id>`,
        expiring with the batch."""
        with dynamodb_errors("write"):
            self._client.put_item(
                TableName=self.table_name,
                Item=serialize(
                    {
                        "pk": f"pjobid#{job_id}",
                        "batch_id": job.batch_id,
                        "chunk": job.chunk,
                        "part": job.part,
                        "expires_at": job.expires_at,
                    }
                ),
            )

    def of_provider_id(self, job_id: str) -> ProviderJob | None:
        """The job the provider's id is, as stored; None for an id no batch sent."""
        with dynamodb_errors("read"):
            reply = self._client.get_item(TableName=self.table_name, Key={"pk": {"S": f"pjobid#{job_id}"}})
        item = reply.get("Item")
        if not item:
            return None
        noted = deserialize(item)
        return self.get(str(noted["batch_id"]), int(noted["chunk"]), int(noted["part"]))

    def looked(self, job: ProviderJob, look: int, *, completed: int, failed: int) -> bool:
        """Look number `look` at the running job done, with the provider's counts (never
        lowered), on the job and on its batch's `provider_counts`; False when that look, or a
        later one, was counted first (a copy)."""
        completed, failed = max(completed, job.completed), max(failed, job.failed)
        counted = updated_if(
            self._client,
            self.table_name,
            job_key(job.batch_id, job.chunk, job.part),
            "SET #looks = :looks, #completed = :completed, #failed = :failed",
            condition="#looks <= :seen",
            values={":looks": look + 1, ":seen": look, ":completed": completed, ":failed": failed},
            names={"#looks": "looks", "#completed": "completed", "#failed": "failed"},
        )
        if counted is None:
            return False
        # The batch's map exists from its submit; a batch gone (expired) has none to count on.
        updated_if(
            self._client,
            self.table_name,
            batch_key(job.batch_id),
            "SET provider_counts.#job = :counts",
            condition="attribute_exists(provider_counts)",
            values={":counts": [completed, failed]},
            names={"#job": job.name},
        )
        return True

    def ended(self, job: ProviderJob) -> None:
        """Every item of the job has its outcome: later looks at it do nothing."""
        with dynamodb_errors("write"):
            self._client.update_item(
                TableName=self.table_name,
                Key=job_key(job.batch_id, job.chunk, job.part),
                UpdateExpression="SET #phase = :ended",
                ExpressionAttributeNames={"#phase": "phase"},
                ExpressionAttributeValues=serialize({":ended": "ended"}),
            )
