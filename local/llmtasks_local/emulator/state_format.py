"""The state dir's snapshot as AWS-level data: one JSON file, versioned, not moto's objects.

`state.json` holds what the embedded endpoint keeps, in the shapes AWS's APIs use, so that any
moto version (patched or not) can load it through its backends' methods (create_table,
put_item, create_queue, create_bucket, put_object...):

    {"format": "llmtasks-local-state", "version": 3, "seq": N, "clean": true|false,
     "dynamodb": [{"account": A, "region": R, "tables": [TABLE...]}],
     "sqs":      [{"account": A, "region": R, "queues": [QUEUE...]}],
     "s3":       [{"account": A, "region": R, "buckets": [BUCKET...]}]}

- `seq`: the last journal record the snapshot includes (a start replays those after it);
  `clean`: written by a clean stop (else messages in flight are made visible at the next start).
- TABLE: TableName, KeySchema, AttributeDefinitions, BillingMode, ProvisionedThroughput,
  GlobalSecondaryIndexes and LocalSecondaryIndexes (as CreateTable takes them),
  StreamSpecification, LatestStreamLabel, TimeToLive ({AttributeName, Enabled} or null), Tags,
  Items (DynamoDB JSON, as GetItem answers them), and StreamRecords: the stream's records as
  GetRecords answers them, with their sequence numbers, so the stream positions the stack keeps
  beside the snapshot (streams.json) still point at the same records.
- QUEUE: QueueName, Attributes (the settable ones, as SetQueueAttributes takes them), Tags,
  and Messages: MessageId, Body, MessageAttributes, MessageSystemAttributes, MessageGroupId,
  MessageDeduplicationId, SequenceNumber, SenderId, SentTimestamp,
  ApproximateReceiveCount, ApproximateFirstReceiveTimestamp (epoch ms), ReceiptHandles (each
  one a receive gave, the current last), VisibleAt and DelayedUntil (epoch milliseconds, 0: now).
- BUCKET: Name, Region, and Objects: Key, Body (base64), Metadata (the object's headers:
  Content-Type, x-amz-meta-*...), LastModified. A bucket's configuration (lifecycle) is the
  template's, applied again at each start; an unfinished multipart upload is not kept (the
  invocation making it is gone with the stop, and Lambda's retry starts another).

Bytes anywhere else (a binary message attribute) are `{"$bytes": BASE64}` and times
`{"$datetime": ISO-8601}`; the journal's records use the same encoding (`encode`, `decode`).
A state dir written before this format (`moto.pickle`, format 2) is read once and rewritten.
"""

from __future__ import annotations

import base64
import datetime
import json
from typing import Any

from llmtasks_local import moto_backends

VERSION = 3
FORMAT = "llmtasks-local-state"

# What CreateQueue and SetQueueAttributes take (the rest of a queue's attributes are counts).
_QUEUE_ATTRIBUTES = (
    "DelaySeconds",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "Policy",
    "ReceiveMessageWaitTimeSeconds",
    "RedrivePolicy",
    "RedriveAllowPolicy",
    "VisibilityTimeout",
    "SqsManagedSseEnabled",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
)


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, datetime.datetime):
        return {"$datetime": value.isoformat()}
    from moto.s3.models import FakeKey, FakeMultipart

    if isinstance(value, FakeKey):  # an S3 call's source object (copy_object, put_object_tagging)
        return {"$s3object": {"bucket": value.bucket_name, "key": value.name, "version": value.version_id}}
    if isinstance(value, FakeMultipart):  # the object's bytes are whole; its parts are not kept
        return None
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not kept in the state dir")


def _hook(value: dict[str, Any]) -> Any:
    if len(value) == 1:
        if "$bytes" in value:
            return base64.b64decode(value["$bytes"])
        if "$datetime" in value:
            return datetime.datetime.fromisoformat(value["$datetime"])
        if "$s3object" in value:
            return S3ObjectRef(**value["$s3object"])
    return value


class S3ObjectRef:
    """An S3 object named in a journaled call, found again when the call is replayed."""

    def __init__(self, bucket: str, key: str, version: str | None) -> None:
        self.bucket, self.key, self.version = bucket, key, version

    def resolve(self, backend: Any) -> Any:
        return backend.get_object(self.bucket, self.key, version_id=self.version)


def encode(value: Any) -> bytes:
    return json.dumps(value, default=_default, separators=(",", ":")).encode()


def decode(data: bytes) -> Any:
    return json.loads(data, object_hook=_hook)


def _regions(service: str) -> list[tuple[str, str, Any]]:
    return [
        (account, region, backend)
        for account, regions in moto_backends.backends(service).items()
        for region, backend in list(regions.items())
    ]


# --- saving ---


def dump(seq: int, *, clean: bool) -> bytes:
    """The snapshot of every table, queue and bucket, in the format above. Call it with every
    writer stopped."""
    state: dict[str, Any] = {"format": FORMAT, "version": VERSION, "seq": seq, "clean": clean}
    state["dynamodb"] = [
        {"account": a, "region": r, "tables": [_table(t) for t in list(b.tables.values())]}
        for a, r, b in _regions("dynamodb")
        if b.tables
    ]
    state["sqs"] = [
        {"account": a, "region": r, "queues": [_queue(q) for q in list(b.queues.values())]}
        for a, r, b in _regions("sqs")
        if b.queues
    ]
    state["s3"] = [
        {"account": a, "region": r, "buckets": [_bucket(k) for k in list(b.buckets.values())]}
        for a, r, b in _regions("s3")
        if b.buckets
    ]
    return encode(state)


def _table(table: Any) -> dict[str, Any]:
    shard = table.stream_shard
    stream = table.stream_specification if (table.stream_specification or {}).get("StreamEnabled") else None
    ttl = table.ttl if table.ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING") else None
    return {
        "TableName": table.name,
        "KeySchema": table.schema,
        "AttributeDefinitions": table.attr,
        "BillingMode": table.billing_mode,
        "ProvisionedThroughput": table.throughput,
        "GlobalSecondaryIndexes": [_index(index, provisioned=True) for index in table.global_indexes],
        "LocalSecondaryIndexes": [_index(index, provisioned=False) for index in table.indexes],
        "StreamSpecification": stream,
        "LatestStreamLabel": table.latest_stream_label if stream else None,
        "TimeToLive": None if ttl is None else {"AttributeName": ttl.get("AttributeName"), "Enabled": True},
        "Tags": table.tags,
        "Items": [item.to_json()["Attributes"] for item in table.all_items()],
        "StreamRecords": [record.to_json() for record in shard.items] if shard is not None else [],
    }


def _index(index: Any, *, provisioned: bool) -> dict[str, Any]:
    described = {"IndexName": index.name, "KeySchema": index.schema, "Projection": index.projection}
    if provisioned:
        described["ProvisionedThroughput"] = index.throughput
    return described


def _queue(queue: Any) -> dict[str, Any]:
    attributes = queue.attributes
    kept = {name: attributes[name] for name in _QUEUE_ATTRIBUTES if attributes.get(name) is not None}
    return {
        "QueueName": queue.name,
        "Attributes": kept,
        "Tags": dict(queue.tags),
        "Messages": [message_of(message) for message in list(queue._messages)],
    }


def message_of(message: Any) -> dict[str, Any]:
    """One SQS message as the snapshot and the journal keep it."""
    return {
        "MessageId": message.id,
        "Body": message.body,
        "MessageAttributes": message.message_attributes,
        "MessageSystemAttributes": message.system_attributes,
        "MessageGroupId": message.group_id,
        "MessageDeduplicationId": message.deduplication_id,
        "SequenceNumber": message.sequence_number,
        "SenderId": message.sender_id,
        "SentTimestamp": message.sent_timestamp,
        "ApproximateReceiveCount": message.approximate_receive_count,
        "ApproximateFirstReceiveTimestamp": message.approximate_first_receive_timestamp,
        "ReceiptHandles": [*message._old_receipt_handles, message.receipt_handle]
        if message.receipt_handle is not None
        else list(message._old_receipt_handles),
        "VisibleAt": message.visible_at,
        "DelayedUntil": message.delayed_until,
    }


def _bucket(bucket: Any) -> dict[str, Any]:
    return {
        "Name": bucket.name,
        "Region": bucket.region_name,
        "Objects": [
            {
                "Key": key.name,
                "Body": base64.b64encode(key.value).decode(),
                "Metadata": dict(key.metadata),
                "LastModified": key.last_modified.isoformat(),
            }
            for key in list(bucket.keys.values())
        ],
    }


# --- loading ---


def load(state: dict[str, Any]) -> tuple[int, bool]:
    """Builds the snapshot's tables, queues and buckets through moto's backends (into a moto
    that holds none of them yet); returns its seq and whether a clean stop wrote it."""
    for place in state.get("dynamodb", []):
        backend = moto_backends.backends("dynamodb")[place["account"]][place["region"]]
        for table in place["tables"]:
            _load_table(backend, table)
    for place in state.get("sqs", []):
        backend = moto_backends.backends("sqs")[place["account"]][place["region"]]
        for queue in place["queues"]:  # dead-letter queues first: a redrive policy names one
            attributes = {k: v for k, v in queue["Attributes"].items() if k != "RedrivePolicy"}
            backend.create_queue(queue["QueueName"], tags=queue["Tags"] or None, **attributes)
        for queue in place["queues"]:
            if "RedrivePolicy" in queue["Attributes"]:
                # moto's SetQueueAttributes resets a Policy it is not given: it goes along
                again = {
                    name: queue["Attributes"][name]
                    for name in ("RedrivePolicy", "Policy")
                    if name in queue["Attributes"]
                }
                backend.set_queue_attributes(queue["QueueName"], again)
            live = backend.queues[queue["QueueName"]]
            for message in queue["Messages"]:
                restored = message_from(message)
                live.add_message(restored)
                if restored.approximate_receive_count and not restored.visible:
                    live.pending_messages.add(restored)  # in flight: its FIFO group stays held
    for place in state.get("s3", []):
        backend = moto_backends.backends("s3")[place["account"]][place["region"]]
        for bucket in place["buckets"]:
            backend.create_bucket(bucket["Name"], bucket["Region"])
            for stored in bucket["Objects"]:
                key = backend.put_object(bucket["Name"], stored["Key"], base64.b64decode(stored["Body"]))
                key.set_metadata(dict(stored["Metadata"]))
                key.last_modified = datetime.datetime.fromisoformat(stored["LastModified"])
    return int(state["seq"]), bool(state["clean"])


def _load_table(backend: Any, table: dict[str, Any]) -> None:
    from moto.dynamodb.models.table import StreamRecord

    name = table["TableName"]
    backend.create_table(
        name,
        schema=table["KeySchema"],
        throughput=table["ProvisionedThroughput"],
        attr=table["AttributeDefinitions"],
        global_indexes=table["GlobalSecondaryIndexes"],
        indexes=table["LocalSecondaryIndexes"],
        streams=table["StreamSpecification"],
        billing_mode=table["BillingMode"],
        sse_specification=None,
        tags=table["Tags"],
        deletion_protection_enabled=False,
        warm_throughput=None,
    )
    if table["TimeToLive"] is not None:
        backend.update_time_to_live(name, table["TimeToLive"])
    for item in table["Items"]:
        backend.put_item(name, item)
    live = backend.get_table(name)
    if live.stream_shard is not None:
        # The stream holds the records it held, with their numbers, not the puts above.
        live.latest_stream_label = table["LatestStreamLabel"] or live.latest_stream_label
        records = []
        for saved in table["StreamRecords"]:
            record: Any = StreamRecord.__new__(StreamRecord)  # its record, not one made anew
            record.record = saved
            records.append(record)
        live.stream_shard.items = records


def message_from(saved: dict[str, Any]) -> Any:
    """A moto message made from message_of()'s dict, to add to its queue."""
    from moto.sqs.models import Message

    message = Message(saved["MessageId"], saved["Body"], saved["MessageSystemAttributes"] or None)
    message.message_attributes = saved["MessageAttributes"] or {}
    message.group_id = saved["MessageGroupId"]
    message.deduplication_id = saved["MessageDeduplicationId"]
    message.sequence_number = saved["SequenceNumber"]
    message.sender_id = saved["SenderId"]
    message.sent_timestamp = saved["SentTimestamp"]
    message.approximate_receive_count = saved["ApproximateReceiveCount"]
    message.approximate_first_receive_timestamp = saved["ApproximateFirstReceiveTimestamp"]
    handles = saved["ReceiptHandles"]
    message.receipt_handle = handles[-1] if handles else None
    message._old_receipt_handles = list(handles[:-1])
    message.visible_at = saved["VisibleAt"]
    message.delayed_until = saved["DelayedUntil"]
    return message
