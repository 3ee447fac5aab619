"""The emulator's own rules: routes, intrinsics, Lambda's reply semantics, timeouts, SQS deletes."""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from llmtasks.local.gateway import http_event, http_response
from llmtasks.local.moto_server import CALLS_PATH, CallCounter
from llmtasks.local.runtime import FunctionRuntime, Invocation
from llmtasks.local.sources import SqsPoller, StreamPoller, failed_ids
from llmtasks.local.template import FunctionSpec, HttpRoute, SqsSource, StreamSource, Template, TemplateError
from tests.conftest import Aws

pytestmark = pytest.mark.unit


def test_routes_match_like_api_gateway() -> None:
    route = HttpRoute("F", "GET", "/tasks/{task_id}")
    assert route.match("GET", "/tasks/abc") == {"task_id": "abc"}
    assert route.match("GET", "/tasks/abc/cancel") is None
    assert route.match("POST", "/tasks/abc") is None
    assert HttpRoute("F", "ANY", "/files/{proxy+}").match("PUT", "/files/a/b") == {"proxy": "a/b"}
    # A decoded path variable may hold a newline (%0A); it is the function's to refuse.
    assert route.match("GET", "/tasks/\nx") == {"task_id": "\nx"}
    assert route.match("GET", "/tasks/abc\n") == {"task_id": "abc\n"}


def test_http_events_are_payload_2_0() -> None:
    event = http_event(
        route=HttpRoute("F", "GET", "/tasks/{task_id}"),
        method="GET",
        path="/tasks/abc",
        raw_query="wait=5&x=1&x=2",
        headers=[("X-Thing", "a"), ("x-thing", "b"), ("Cookie", "s=1; t=2")],
        body=b"",
        path_parameters={"task_id": "abc"},
    )
    assert event["version"] == "2.0"
    assert event["routeKey"] == "GET /tasks/{task_id}"
    assert event["queryStringParameters"] == {"wait": "5", "x": "1,2"}
    assert event["headers"]["x-thing"] == "a,b"
    assert event["cookies"] == ["s=1", "t=2"]
    assert event["pathParameters"] == {"task_id": "abc"}
    assert "body" not in event


def test_binary_bodies_are_base64_and_replies_decode() -> None:
    event = http_event(
        route=HttpRoute("F", "POST", "/x"),
        method="POST",
        path="/x",
        raw_query="",
        headers=[("content-type", "application/octet-stream")],
        body=b"\xff\x00",
        path_parameters={},
    )
    assert event["isBase64Encoded"] is True
    reply = http_response({"statusCode": 201, "body": "aGk=", "isBase64Encoded": True, "headers": {"A": "b"}})
    assert (reply.status_code, reply.body, reply.headers["a"]) == (201, b"hi", "b")
    assert http_response({"plain": "dict"}).status_code == 200


def test_intrinsics_resolve(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        textwrap.dedent("""
        Parameters:
          Stage: {Type: String, Default: dev}
        Conditions:
          IsProd: !Equals [!Ref Stage, prod]
        Resources: {}
    """)
    )
    template = Template.load(path, {"Stage": "prod"})
    value = {
        "a": {"Fn::Sub": "${Stage}-${AWS::Region}-${Q.Arn}"},
        "b": {"Fn::If": ["IsProd", "big", "small"]},
        "c": {"Fn::Join": ["/", ["x", {"Ref": "Stage"}]]},
        "d": [{"Ref": "AWS::NoValue"}, 1],
    }
    resolved = template.resolve(value, {}, {("Q", "Arn"): "arn:q"})
    assert resolved == {"a": "prod-us-east-1-arn:q", "b": "big", "c": "x/prod", "d": [1]}
    with pytest.raises(TemplateError):
        template.resolve({"Ref": "Nope"}, {}, {})
    with pytest.raises(TemplateError):
        Template.load(path, {"Unknown": "1"})


@pytest.mark.parametrize(
    ("invocation", "report", "expected"),
    [
        (Invocation(payload={"batchItemFailures": [{"itemIdentifier": "b"}]}), True, {"b"}),
        (Invocation(payload={"batchItemFailures": [{"itemIdentifier": "b"}]}), False, set()),
        (Invocation(payload={"batchItemFailures": [{"itemIdentifier": "zz"}]}), True, {"a", "b"}),
        (Invocation(payload={"batchItemFailures": [{"itemIdentifier": ""}]}), True, {"a", "b"}),
        (Invocation(error="boom"), True, {"a", "b"}),
        (Invocation(timed_out=True, error="Task timed out"), True, {"a", "b"}),
        (Invocation(payload=None), True, set()),
    ],
)
def test_batch_replies_follow_lambdas_rules(invocation: Invocation, report: bool, expected: set[str]) -> None:
    assert failed_ids(invocation, report_failures=report, all_ids=["a", "b"]) == expected


def _function(tmp_path: Path, body: str, timeout_s: int = 1) -> FunctionSpec:
    (tmp_path / "app.py").write_text(textwrap.dedent(body))
    return FunctionSpec("F", tmp_path, "app.handler", timeout_s, 128, {})


def test_a_handler_past_its_timeout_is_a_timed_out_invocation(tmp_path: Path) -> None:
    spec = _function(
        tmp_path,
        """
        import time
        def handler(event, context):
            time.sleep(event["sleep"])
            return context.get_remaining_time_in_millis()
    """,
    )
    runtime = FunctionRuntime(spec, concurrency=2)
    assert runtime.invoke({"sleep": 0}).payload > 900
    late = runtime.invoke({"sleep": 1.5})
    assert late.timed_out
    assert not late.ok


def test_each_invocation_can_report_like_lambda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _function(tmp_path, "def handler(event, context):\n    return context.aws_request_id\n")
    quiet, reporting = FunctionRuntime(spec), FunctionRuntime(spec, report=True)

    quiet.invoke({})
    assert capsys.readouterr().out == ""
    request_id = reporting.invoke({}).payload

    report = capsys.readouterr().out
    assert re.fullmatch(
        rf"START RequestId: {request_id} Version: \$LATEST\nEND RequestId: {request_id}\n"
        rf"REPORT RequestId: {request_id}\tFunction: F\tDuration: \d+\.\d\d ms\tBilled Duration: \d+ ms"
        r"\tMemory Size: 128 MB\n",
        report,
    ), report


def test_each_sandbox_has_its_own_module_state(tmp_path: Path) -> None:
    spec = _function(
        tmp_path,
        """
        import threading, time
        calls = []
        def handler(event, context):
            calls.append(1)
            time.sleep(event["sleep"])
            return len(calls)
    """,
    )
    runtime = FunctionRuntime(spec, concurrency=2)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        counts = list(pool.map(runtime.invoke, [{"sleep": 0.3}, {"sleep": 0.3}]))
    assert [c.payload for c in counts] == [1, 1]  # two sandboxes, two copies of `calls`
    assert runtime.invoke({"sleep": 0}).payload == 2  # a warm sandbox keeps its state


def test_the_sqs_poller_deletes_all_but_the_reported_failures(aws: Aws, tmp_path: Path) -> None:
    spec = _function(
        tmp_path,
        """
        def handler(event, context):
            return {"batchItemFailures": [
                {"itemIdentifier": r["messageId"]} for r in event["Records"] if r["body"] == "bad"]}
    """,
        timeout_s=5,
    )
    url = aws.queue_url("WebhookQueue")
    arn = aws.resources.attributes[("WebhookQueue", "Arn")]
    for body in ("good", "bad", "good"):
        aws.sqs.send_message(QueueUrl=url, MessageBody=body)

    source = SqsSource("F", "S", arn, batch_size=10, report_batch_item_failures=True)
    poller = SqsPoller(source, FunctionRuntime(spec), aws.sqs, url, threading.Event())
    batch = poller.next_batch()
    assert len(batch) == 3
    poller.deliver(batch)
    aws.sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for i, m in enumerate(batch)
        ],
    )
    left = aws.messages("WebhookQueue")
    assert [m["Body"] for m in left] == ["bad"]


class CountingSqs:
    """The SQS client, with a count of its receives."""

    def __init__(self, sqs: Any) -> None:
        self._sqs = sqs
        self.receives = 0

    def receive_message(self, **kwargs: Any) -> Any:
        self.receives += 1
        return self._sqs.receive_message(**kwargs)


def test_a_batching_window_gathers_a_trickle_into_one_batch_with_few_receives(
    aws: Aws, tmp_path: Path
) -> None:
    # Given a queue that gets a message now and four more over the next 0.6 s
    url = aws.queue_url("WebhookQueue")
    arn = aws.resources.attributes[("WebhookQueue", "Arn")]
    aws.sqs.send_message(QueueUrl=url, MessageBody="first")

    def trickle() -> None:
        for i in range(4):
            time.sleep(0.15)
            aws.sqs.send_message(QueueUrl=url, MessageBody=f"then {i}")

    sender = threading.Thread(target=trickle)
    sender.start()
    sqs = CountingSqs(aws.sqs)
    source = SqsSource("F", "S", arn, batch_size=10, batching_window_s=1)
    spec = _function(tmp_path, "def handler(event, context):\n    return None\n")
    poller = SqsPoller(source, FunctionRuntime(spec), sqs, url, threading.Event())  # type: ignore[arg-type]
    # When the poller takes its next batch, with a one-second window
    started = time.monotonic()
    batch = poller.next_batch()
    sender.join()
    # Then all five are in it, the window was kept, and it took a receive every quarter second
    # at most, not one per message as each landed
    assert sorted(m["Body"] for m in batch) == ["first", "then 0", "then 1", "then 2", "then 3"]
    assert 1.0 <= time.monotonic() - started < 2.0
    assert sqs.receives <= 1 + 4


def test_the_gateway_answers_like_api_gateway_for_errors_timeouts_and_unknown_routes(tmp_path: Path) -> None:
    import httpx

    from llmtasks.local.gateway import HttpGateway
    from tests.helpers import serve

    spec = _function(
        tmp_path,
        """
        import time
        def handler(event, context):
            if event["rawPath"] == "/boom":
                raise RuntimeError("boom")
            if event["rawPath"] == "/slow":
                time.sleep(1.5)
            return {"statusCode": 200, "body": event["pathParameters"]["name"]}
    """,
    )
    runtime = FunctionRuntime(spec)
    gateway = HttpGateway([HttpRoute("F", "GET", "/{name}")], {"F": runtime})
    with serve(gateway.app()) as url, httpx.Client(base_url=url) as client:
        assert client.get("/hello").text == "hello"
        assert client.get("/a%0Ab").text == "a\nb"  # routed, as API Gateway does
        assert (client.get("/boom").status_code, client.get("/boom").json()) == (
            500,
            {"message": "Internal Server Error"},
        )
        assert client.get("/slow").status_code == 503
        assert client.post("/hello").json() == {"message": "Not Found"}


def test_a_handler_that_exits_is_a_function_error_not_a_dead_poller(tmp_path: Path) -> None:
    spec = _function(
        tmp_path,
        """
        import sys
        def handler(event, context):
            sys.exit(3)
    """,
    )
    invocation = FunctionRuntime(spec).invoke({})
    assert not invocation.ok
    assert "SystemExit" in (invocation.error or "")


def test_the_endpoint_counts_calls_by_service_and_operation() -> None:
    counter = CallCounter()
    scope = "AWS4-HMAC-SHA256 Credential=testing/20261129/us-east-1/{}/aws4_request, SignedHeaders=host"

    def serve(environ: dict[str, Any], reply: bytes = b"{}") -> bytes:
        return b"".join(counter(lambda _e, _s: [reply], environ, lambda *_: None))

    serve({"HTTP_AUTHORIZATION": scope.format("sqs"), "HTTP_X_AMZ_TARGET": "AmazonSQS.SendMessage"})
    receive = {"HTTP_AUTHORIZATION": scope.format("sqs"), "HTTP_X_AMZ_TARGET": "AmazonSQS.ReceiveMessage"}
    assert serve(receive, b'{"Messages": [{"MessageId": "m"}]}') == b'{"Messages": [{"MessageId": "m"}]}'
    serve(receive, b"{}")
    serve({"HTTP_AUTHORIZATION": scope.format("sqs"), "QUERY_STRING": "Action=DeleteMessage"})
    serve({"HTTP_AUTHORIZATION": scope.format("s3"), "REQUEST_METHOD": "PUT", "PATH_INFO": "/b/k"})
    dynamodb = {
        "HTTP_AUTHORIZATION": scope.format("dynamodb"),
        "HTTP_X_AMZ_TARGET": "DynamoDB_20120810.PutItem",
    }
    serve(dynamodb)
    serve(dynamodb)
    serve(
        {
            "HTTP_AUTHORIZATION": scope.format("dynamodb"),
            "HTTP_X_AMZ_TARGET": "DynamoDBStreams_20120810.GetRecords",
        }
    )

    read = serve({"PATH_INFO": CALLS_PATH, "REQUEST_METHOD": "GET"})
    assert json.loads(read) == {
        "sqs.SendMessage": 1,
        "sqs.ReceiveMessage": 1,
        "sqs.ReceiveMessage.empty": 1,
        "sqs.DeleteMessage": 1,
        "s3.PUT": 1,
        "dynamodb.PutItem": 2,
        "dynamodbstreams.GetRecords": 1,
    }
    assert serve({"PATH_INFO": CALLS_PATH, "REQUEST_METHOD": "DELETE"}) == read
    assert serve({"PATH_INFO": CALLS_PATH, "REQUEST_METHOD": "GET"}) == b"{}"


def test_a_function_error_splits_a_stream_batch_so_one_bad_record_holds_up_only_itself(
    tmp_path: Path,
) -> None:
    spec = _function(
        tmp_path,
        """
        import json
        def handler(event, context):
            numbers = [r["dynamodb"]["SequenceNumber"] for r in event["Records"]]
            with open(__file__ + ".calls", "a") as calls:
                calls.write(json.dumps(numbers) + "\\n")
            if "3" in numbers:
                raise RuntimeError("a poison record")
    """,
    )
    skipped: list[dict[str, Any]] = []

    def poller(bisect: bool) -> StreamPoller:
        source = StreamSource("F", "S", "arn:stream", maximum_retry_attempts=1, bisect_on_error=bisect)
        return StreamPoller(source, FunctionRuntime(spec), None, threading.Event(), skipped.append)  # type: ignore[arg-type]

    records = [{"dynamodb": {"SequenceNumber": str(n)}} for n in range(1, 7)]
    calls = tmp_path / "app.py.calls"
    assert poller(bisect=True).deliver(records) is True
    invoked = [json.loads(line) for line in calls.read_text().splitlines()]
    # Halves until the bad record stands alone; it alone is retried (once) and given up on.
    assert invoked == [
        ["1", "2", "3", "4", "5", "6"],
        ["1", "2", "3"],
        ["1"],
        ["2", "3"],
        ["2"],
        ["3"],
        ["3"],
        ["4", "5", "6"],
    ]
    assert [note["DDBStreamBatchInfo"]["startSequenceNumber"] for note in skipped] == ["3"]
    calls.unlink()
    skipped.clear()
    poller(bisect=False).deliver(records)
    assert [note["DDBStreamBatchInfo"]["batchSize"] for note in skipped] == [6]  # all six skipped together


def test_concurrent_receives_hand_each_message_to_one_poller_and_deletes_lose_no_send(aws: Aws) -> None:
    """As SQS does within a visibility timeout; moto alone gave one message to two pollers at
    times (a task then ran twice), and a delete could drop a message sent meanwhile."""
    url = aws.queue_url("TaskQueue")
    sent = 400
    received: list[str] = []
    errors: list[BaseException] = []

    def send(first: int) -> None:
        for start in range(first, sent, 40):
            entries = [{"Id": str(i), "MessageBody": f"m{start + i}"} for i in range(10)]
            aws.sqs.send_message_batch(QueueUrl=url, Entries=entries)

    def receive_and_delete() -> None:
        try:
            idle = 0
            while idle < 3:
                reply = aws.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=120)
                batch = reply.get("Messages", [])
                idle = 0 if batch else idle + 1
                received.extend(m["Body"] for m in batch)
                for m in batch:
                    aws.sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        except BaseException as exc:
            errors.append(exc)

    senders = [threading.Thread(target=send, args=(first,)) for first in range(0, 40, 10)]
    pollers = [threading.Thread(target=receive_and_delete) for _ in range(6)]
    for thread in senders + pollers:
        thread.start()
    for thread in senders + pollers:
        thread.join(timeout=60)
    received.extend(m["Body"] for m in aws.messages("TaskQueue"))
    assert errors == []
    duplicates = {body for body, n in Counter(received).items() if n > 1}
    assert duplicates == set()
    assert set(received) == {f"m{i}" for i in range(sent)}
