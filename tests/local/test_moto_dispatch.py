"""The embedded endpoint's ways past moto's generic serving answer as moto's own do.

Its direct dispatch of JSON RPC requests (moto_patches.serving._dispatch_json_rpc_directly): the same
requests, sent both ways to moto's WSGI app in this process, get the same status, headers and
body, but for what moto draws afresh each time (request ids, message ids, receipt handles,
times). Its reading of request headers (moto_patches.serving.parse_headers_lightly): the same blocks
parse as http.client's parse_headers, through the email parser, parses them."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from botocore.awsrequest import AWSResponse
from werkzeug.test import EnvironBuilder

from tests.helpers import local_client

pytestmark = pytest.mark.unit

# What moto draws afresh for each request, masked before two replies are compared; the CRC and
# the length of a body holding one of them differ with it (a time's digits).
GENERATED = {
    "MessageId",
    "ReceiptHandle",
    "MD5OfMessageAttributes",
    "CreationDateTime",
    "LatestStreamLabel",
    "LatestStreamArn",
    "StreamArn",
    "ShardIterator",
    "NextShardIterator",
    "SequenceNumber",
    "StartingSequenceNumber",
    "eventID",
    "ApproximateCreationDateTime",
    "SentTimestamp",
    "ApproximateFirstReceiveTimestamp",
    "SizeBytes",
    "creationTime",
    "ingestionTime",
    "lastIngestionTime",
    "firstEventTimestamp",
    "lastEventTimestamp",
    "nextForwardToken",
    "nextBackwardToken",
}
GENERATED_HEADERS = {"x-amzn-requestid", "x-amz-crc32", "content-length"}

Reply = tuple[str, list[tuple[str, str]], Any]


class _Body(io.BytesIO):
    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.getvalue()


def _environ(request: Any) -> dict[str, Any]:
    """The WSGI environ of a request botocore prepared, as werkzeug builds one."""
    url = urlsplit(request.url)
    headers = {
        name: sent.decode() if isinstance(sent, bytes) else sent for name, sent in request.headers.items()
    }
    return EnvironBuilder(
        method=request.method,
        base_url=f"{url.scheme}://{url.netloc}",
        path=url.path or "/",
        query_string=url.query,
        headers=headers,
        data=request.body or b"",
    ).get_environ()


@pytest.fixture
def served() -> Iterator[Callable[[bool], tuple[Any, Any, Any, list[Reply]]]]:
    """`served(direct)`: boto3 clients of DynamoDB, SQS and CloudWatch Logs whose requests go to
    moto's WSGI app in this process, directly dispatched or not, and the replies it gave."""
    import moto.server
    from flask import Flask
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    from llmtasks_local.moto_patches import serving

    call = DomainDispatcherApplication.__call__
    wsgi_app = Flask.wsgi_app
    flask_calls: list[str] = []

    def counted(app: Flask, environ: dict[str, Any], start_response: Any) -> Any:
        flask_calls.append(environ.get("HTTP_X_AMZ_TARGET", ""))
        return wsgi_app(app, environ, start_response)

    Flask.wsgi_app = counted  # type: ignore[method-assign]

    def make(direct: bool) -> tuple[Any, Any, Any, list[Reply]]:
        DomainDispatcherApplication.__call__ = call  # type: ignore[method-assign]
        if direct:
            serving._dispatch_json_rpc_directly()
        app = DomainDispatcherApplication(moto.server.create_backend_app)
        replies: list[Reply] = []

        def send(request: Any, **_: Any) -> AWSResponse:
            started: list[Any] = []
            body = b"".join(app(_environ(request), lambda s, h, e=None: started.extend([s, h])))
            status, headers = started
            replies.append((status, headers, json.loads(body) if body.startswith(b"{") else body.decode()))
            return AWSResponse(request.url, int(status.split()[0]), dict(headers), _Body(body))

        clients = [local_client(name, "http://127.0.0.1:5000") for name in ("dynamodb", "sqs", "logs")]
        for client in clients:
            client.meta.events.register("before-send", send)
        return clients[0], clients[1], clients[2], replies

    make.flask_calls = flask_calls  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        DomainDispatcherApplication.__call__ = call  # type: ignore[method-assign]
        Flask.wsgi_app = wsgi_app  # type: ignore[method-assign]


def _masked(reply: Reply) -> Reply:
    def mask(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "*" if k in GENERATED else mask(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mask(v) for v in value]
        return value

    status, headers, body = reply
    return status, [(n, "*" if n.lower() in GENERATED_HEADERS else v) for n, v in headers], mask(body)


def _a_task_s_calls(dynamodb: Any, sqs: Any, logs: Any, name: str) -> None:
    """What a task's life asks of DynamoDB, SQS and CloudWatch Logs, refusals included."""
    from botocore.exceptions import ClientError

    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    item = {"pk": {"S": "task#1"}, "status": {"S": "queued"}, "n": {"N": "1"}, "b": {"B": b"\x00"}}
    dynamodb.put_item(TableName=name, Item=item, ConditionExpression="attribute_not_exists(pk)")
    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        dynamodb.put_item(TableName=name, Item=item, ConditionExpression="attribute_not_exists(pk)")
    dynamodb.get_item(TableName=name, Key={"pk": {"S": "task#1"}})
    dynamodb.get_item(TableName=name, Key={"pk": {"S": "task#none"}})
    dynamodb.update_item(
        TableName=name,
        Key={"pk": {"S": "task#1"}},
        UpdateExpression="SET #s = :s, n = n + :one",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":s": {"S": "processing"}, ":one": {"N": "1"}},
        ReturnValues="ALL_NEW",
    )
    with pytest.raises(ClientError, match="ValidationException"):
        dynamodb.update_item(TableName=name, Key={"pk": {"S": "task#1"}}, UpdateExpression="SET n = :missing")
    with pytest.raises(ClientError, match="ResourceNotFoundException"):
        dynamodb.get_item(TableName=f"{name}-none", Key={"pk": {"S": "task#1"}})
    dynamodb.query(
        TableName=name,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": "task#1"}},
    )
    dynamodb.delete_item(TableName=name, Key={"pk": {"S": "task#1"}}, ReturnValues="ALL_OLD")
    queue = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"task_id": "1"}))
    received = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=received[0]["ReceiptHandle"])
    sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)
    with pytest.raises(ClientError, match="NonExistentQueue"):
        sqs.send_message(QueueUrl=f"{queue}-none", MessageBody="x")
    logs.create_log_group(logGroupName=f"/aws/lambda/{name}")
    logs.create_log_stream(logGroupName=f"/aws/lambda/{name}", logStreamName="s")
    logs.put_log_events(
        logGroupName=f"/aws/lambda/{name}",
        logStreamName="s",
        logEvents=[{"timestamp": 1_764_000_000_000, "message": "START RequestId: 1"}],
    )
    logs.get_log_events(logGroupName=f"/aws/lambda/{name}", logStreamName="s")
    with pytest.raises(ClientError, match="ResourceNotFoundException"):
        logs.get_log_events(logGroupName=f"/aws/lambda/{name}-none", logStreamName="s")


def test_json_rpc_requests_answer_directly_as_moto_s_flask_app_answers(served: Any) -> None:
    dynamodb, sqs, logs, direct = served(True)
    _a_task_s_calls(dynamodb, sqs, logs, "directly")
    directly_served = list(served.flask_calls)
    dynamodb, sqs, logs, through_flask = served(False)
    _a_task_s_calls(dynamodb, sqs, logs, "by-flask")  # as long: the same lengths

    # Every request of the first run went past Flask; every one of the second through it.
    assert directly_served == []
    assert len(served.flask_calls) == len(through_flask) == len(direct) == 21
    assert [_masked(r) for r in direct] == [
        _masked(json.loads(json.dumps(r).replace("by-flask", "directly"))) for r in through_flask
    ]
    assert [status for status, _, _ in direct].count("400 BAD REQUEST") == 5


def test_a_request_with_an_origin_takes_flask_s_way_and_its_cors_reply(served: Any) -> None:
    dynamodb, _sqs, _logs, replies = served(True)

    def from_the_console(request: Any, **_: Any) -> None:
        request.headers["Origin"] = "http://127.0.0.1:8000"

    dynamodb.meta.events.register_first("before-send", from_the_console)
    dynamodb.list_tables()
    assert served.flask_calls == ["DynamoDB_20120810.ListTables"]
    assert ("Access-Control-Allow-Origin", "http://127.0.0.1:8000") in replies[0][1]


def test_a_bug_in_a_directly_served_handler_still_reaches_werkzeug(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.dynamodb.responses import DynamoHandler

    def a_bug(self: Any) -> str:
        raise RuntimeError("a bug in moto")

    monkeypatch.setattr(DynamoHandler, "list_tables", a_bug)
    dynamodb, _sqs, _logs, _replies = served(True)
    with pytest.raises(RuntimeError, match="a bug in moto"):  # werkzeug answers 500 and logs it
        dynamodb.list_tables()
    assert served.flask_calls == []


# Header blocks as a request sends them: boto3's plain lines, and what only the email parser
# takes (folded lines, a line with no colon, a "From " line, a lone CR, a block with no end).
HEADER_BLOCKS = [
    b"Host: 127.0.0.1:5000\r\nX-Amz-Target: DynamoDB_20120810.GetItem\r\n"
    b"Content-Type: application/x-amz-json-1.0\r\nAuthorization: AWS4-HMAC-SHA256 "
    b"Credential=testing/20261204/us-east-1/dynamodb/aws4_request, Signature=ab\r\n"
    b"Content-Length: 60\r\n\r\n",
    b"Accept: a\r\nAccept: b\r\nX-Empty:\r\nX-Spaced:  \t padded  \r\nX-Latin: caf\xe9\r\n\r\n",
    b"Host: h\nX-Bare-LF: yes\n\n",
    b"X-Folded: first\r\n second\r\nHost: h\r\n\r\n",
    b"Host: h\r\nno colon here\r\nX-After: lost\r\n\r\n",
    b"From someone\r\nHost: h\r\n\r\n",
    b": no name\r\nHost: h\r\n\r\n",
    b"X-Cr: a\rb\r\nHost: h\r\n\r\n",
    b"Host: h\r\nX-No-End: yes\r\n",
    b"\r\n",
]


@pytest.mark.parametrize("block", HEADER_BLOCKS)
def test_headers_parse_as_the_email_parser_parses_them(block: bytes) -> None:
    import http.client

    from llmtasks_local.moto_patches.serving import parse_headers_lightly

    light, parsed = parse_headers_lightly(io.BytesIO(block)), http.client.parse_headers(io.BytesIO(block))
    assert type(light) is type(parsed)
    assert light.items() == parsed.items()
    assert [type(d) for d in light.defects] == [type(d) for d in parsed.defects]
    assert [light.get_all(n) for n in parsed] == [parsed.get_all(n) for n in parsed]
    if block.endswith((b"\n\r\n", b"\n\n")):  # what follows the block's end is left unread
        rest = io.BytesIO(block + b"body")
        parse_headers_lightly(rest)
        assert rest.read() == b"body"


def test_plain_header_lines_skip_the_email_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    import email.parser

    from llmtasks_local.moto_patches.serving import parse_headers_lightly

    def parse(*_: Any, **__: Any) -> Any:
        raise AssertionError("the email parser was used")

    monkeypatch.setattr(email.parser.Parser, "parsestr", parse)
    assert parse_headers_lightly(io.BytesIO(HEADER_BLOCKS[0]))["X-Amz-Target"].endswith("GetItem")
    with pytest.raises(AssertionError, match="the email parser was used"):
        parse_headers_lightly(io.BytesIO(b"X-Folded: first\r\n second\r\n\r\n"))


def test_an_http_error_raised_by_moto_s_handler_answers_as_flask_answers_it(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.dynamodb.responses import DynamoHandler
    from werkzeug.exceptions import RequestEntityTooLarge

    def too_large(self: Any, *_: Any, **__: Any) -> None:
        raise RequestEntityTooLarge()

    monkeypatch.setattr(DynamoHandler, "setup_class", too_large)
    replies = []
    for direct in (True, False):
        dynamodb, _sqs, _logs, reply = served(direct)
        with pytest.raises(Exception, match="413"):
            dynamodb.list_tables()
        replies.append(reply[0])
    assert replies[0] == replies[1]
    assert replies[0][0] == "413 REQUEST ENTITY TOO LARGE"
