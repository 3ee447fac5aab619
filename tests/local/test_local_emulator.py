"""The emulator's own rules: routes, intrinsics, Lambda's reply semantics, timeouts, SQS deletes."""

from __future__ import annotations

import json
import re
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import boto3
import pytest

from llmtasks_local.emulator.gateway import http_event, http_response
from llmtasks_local.emulator.moto_server import CALLS_PATH, CPU_PATH, CallCounter
from llmtasks_local.emulator.runtime import FunctionRuntime, Invocation
from llmtasks_local.emulator.sources import failed_ids
from llmtasks_local.sam.function_spec import HttpRoute
from llmtasks_local.sam.template import Template, TemplateError
from tests.helpers import eventually, toy_function

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


def test_a_handler_past_its_timeout_is_a_timed_out_invocation(tmp_path: Path) -> None:
    spec = toy_function(
        tmp_path,
        """
        import time
        def handler(event, context):
            time.sleep(event["sleep"])  # the handler's work, not a wait of the test
            return context.get_remaining_time_in_millis()
    """,
    )
    runtime = FunctionRuntime(spec, concurrency=2)
    assert runtime.invoke({"sleep": 0}).payload > 900
    late = runtime.invoke({"sleep": 1.5})
    assert late.timed_out
    assert not late.ok


def test_each_invocation_can_report_like_lambda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = toy_function(tmp_path, "def handler(event, context):\n    return context.aws_request_id\n")
    quiet, reporting = FunctionRuntime(spec), FunctionRuntime(spec, report=True)

    with quiet, reporting:
        quiet.invoke({})
        assert capsys.readouterr().out == ""
        cold, warm = reporting.invoke({}).payload, reporting.invoke({}).payload

    report = capsys.readouterr().out
    lines = [
        rf"START RequestId: {request_id} Version: \$LATEST\nEND RequestId: {request_id}\n"
        rf"REPORT RequestId: {request_id}\tFunction: F\tDuration: \d+\.\d\d ms\tBilled Duration: \d+ ms"
        rf"\tMemory Size: 128 MB\tMax Memory Used: [1-9]\d* MB{init}\n"
        # Lambda reports a cold start's init once, on the invocation that waited for it.
        for request_id, init in ((cold, r"\tInit Duration: \d+\.\d\d ms"), (warm, ""))
    ]
    assert re.fullmatch("".join(lines), report), report


def test_each_sandbox_has_its_own_module_state(tmp_path: Path) -> None:
    spec = toy_function(
        tmp_path,
        """
        import threading, time
        calls = []
        def handler(event, context):
            calls.append(1)
            time.sleep(event["sleep"])  # the handler's work, not a wait of the test
            return len(calls)
    """,
    )
    runtime = FunctionRuntime(spec, concurrency=2)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        counts = list(pool.map(runtime.invoke, [{"sleep": 0.3}, {"sleep": 0.3}]))
    assert [c.payload for c in counts] == [1, 1]  # two sandboxes, two copies of `calls`
    assert runtime.invoke({"sleep": 0}).payload == 2  # a warm sandbox keeps its state


def test_a_function_s_first_sandbox_starts_while_other_functions_hold_every_cold_start_slot(
    tmp_path: Path,
) -> None:
    import concurrent.futures
    import os

    from llmtasks_local.emulator import runtime as runtime_module

    spec = toy_function(
        tmp_path,
        """
        import os, time
        def handler(event, context):
            time.sleep(event["sleep"])  # the handler's work, not a wait of the test
            return os.getpid()
    """,
        timeout_s=10,
    )
    slots = runtime_module._cold_starts
    held = 0
    while slots.try_take(synchronous=True):  # other functions' scale-out holds every slot
        held += 1
    runtime = FunctionRuntime(spec, concurrency=2)
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        # The function's first sandbox starts all the same
        first = pool.submit(runtime.invoke, {"sleep": 1.0})
        eventually(lambda: runtime.sandboxes, bool, timeout_s=30, every_s=0.01, what="the first sandbox")
        # A second sandbox is scale-out: it waits for a slot, and takes the first sandbox once
        # that turns idle instead
        second = pool.submit(runtime.invoke, {"sleep": 0})
        pids = [first.result(timeout=60).payload, second.result(timeout=60).payload]
        assert pids[0] == pids[1] != os.getpid()
        assert len(runtime.sandboxes) == 1
    finally:
        for _ in range(held):
            slots.give_back(synchronous=True)
        pool.shutdown()
        runtime.close()


def test_a_waiting_synchronous_invocation_takes_the_next_cold_start_slot_before_an_event_source() -> None:
    """A client waits on an HTTP invocation (API Gateway gives up at 30 s); a poller's batch
    can wait a little longer: with one slot, it is the synchronous invocations' share."""
    from llmtasks_local.emulator.runtime import ColdStartSlots

    slots = ColdStartSlots(1)
    assert slots.try_take(synchronous=False)  # an event source's scale-out holds the only slot
    slots.waits(synchronous=True, waiting=True)  # a status request waits for one
    slots.waits(synchronous=False, waiting=True)  # and so does the next poller's start
    slots.give_back(synchronous=False)
    assert not slots.try_take(synchronous=False)  # which does not jump it
    assert slots.try_take(synchronous=True)
    slots.waits(synchronous=True, waiting=False)
    slots.give_back(synchronous=True)
    assert slots.try_take(synchronous=False)  # with no request waiting, event sources take slots again


def test_each_kind_of_scale_out_keeps_its_share_of_the_cold_start_slots_while_it_waits() -> None:
    """Neither waits out the other: long polls that start a sandbox each leave the worker's
    scale-out its half of the slots, and the worker's scale-out leaves theirs."""
    from llmtasks_local.emulator.runtime import ColdStartSlots

    slots = ColdStartSlots(4)
    slots.waits(synchronous=True, waiting=True)  # status requests wait for sandboxes
    slots.waits(synchronous=False, waiting=True)  # and so does the worker's scale-out
    assert [slots.try_take(synchronous=False) for _ in range(3)] == [True, True, False]
    assert [slots.try_take(synchronous=True) for _ in range(3)] == [True, True, False]
    slots.give_back(synchronous=True)
    assert not slots.try_take(synchronous=False)  # the freed slot is the waiting requests' share
    assert slots.try_take(synchronous=True)
    slots.waits(synchronous=True, waiting=False)  # no request waits any more
    slots.give_back(synchronous=True)
    slots.give_back(synchronous=True)
    assert [slots.try_take(synchronous=False) for _ in range(3)] == [True, True, False]  # all four
    slots.give_back(synchronous=False)
    assert slots.try_take(synchronous=True)  # the scale-out holds more than its share: a request goes first


def test_the_gateway_answers_like_api_gateway_for_errors_timeouts_and_unknown_routes(tmp_path: Path) -> None:
    import httpx

    from llmtasks_local.emulator.gateway import HttpGateway
    from tests.helpers import serve

    spec = toy_function(
        tmp_path,
        """
        import time
        def handler(event, context):
            if event["rawPath"] == "/boom":
                raise RuntimeError("boom")
            if event["rawPath"] == "/slow":
                time.sleep(1.5)  # the handler's work, past its 1 s Timeout (a 503)
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


def test_the_gateway_applies_lambda_s_six_mb_limits_as_api_gateway_does(tmp_path: Path) -> None:
    import httpx

    from llmtasks_local.emulator.gateway import HttpGateway
    from tests.helpers import serve

    spec = toy_function(
        tmp_path,
        """
        import os
        def handler(event, context):
            with open(os.path.join(os.path.dirname(__file__), "ran"), "a") as ran:
                ran.write(event["rawPath"] + "\\n")
            if event["rawPath"] == "/echo":
                return {"statusCode": 200, "body": str(len(event["body"]))}
            return {"statusCode": 200, "body": "x" * int(event["pathParameters"]["n"])}
    """,
        timeout_s=10,
    )
    runtime = FunctionRuntime(spec)
    routes = [HttpRoute("F", "POST", "/echo"), HttpRoute("F", "GET", "/big/{n}")]
    gateway = HttpGateway(routes, {"F": runtime})
    ran = tmp_path / "ran"
    with serve(gateway.app()) as url, httpx.Client(base_url=url, timeout=30) as client:
        # A body whose event is within 6 MB runs; one whose event is over never reaches the function
        assert client.post("/echo", content=b"a" * 5_000_000).text == "5000000"
        refused = client.post("/echo", content=b"a" * 6_291_456)
        assert (refused.status_code, refused.json()) == (413, {"message": "Request Too Long"})
        assert ran.read_text().splitlines() == ["/echo"]
        # A reply over Lambda's response limit is API Gateway's answer for a failed function
        assert len(client.get("/big/6000000").text) == 6_000_000
        failed = client.get("/big/6300000")
        assert (failed.status_code, failed.json()) == (500, {"message": "Internal Server Error"})
        assert client.get("/big/3").text == "xxx"
    runtime.close()


def test_a_handler_that_exits_is_a_function_error_not_a_dead_poller(tmp_path: Path) -> None:
    spec = toy_function(
        tmp_path,
        """
        import sys
        def handler(event, context):
            sys.exit(3)
    """,
    )
    with FunctionRuntime(spec) as runtime:
        invocation = runtime.invoke({})
        assert not invocation.ok
        # Lambda's words for a runtime whose process ended; the next invocation gets a new one.
        assert invocation.error == "Runtime.ExitError: Runtime exited with error: exit status 3"
        assert runtime.invoke({}).error == invocation.error


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
    # The CPU each operation's answers took, by the same names (each answer here is a no-op app).
    cpu = json.loads(serve({"PATH_INFO": CPU_PATH, "REQUEST_METHOD": "GET"}))
    assert cpu.keys() == json.loads(read).keys()
    assert all(isinstance(us, int) and us >= 0 for us in cpu.values())
    assert serve({"PATH_INFO": CALLS_PATH, "REQUEST_METHOD": "DELETE"}) == read
    assert serve({"PATH_INFO": CALLS_PATH, "REQUEST_METHOD": "GET"}) == b"{}"
    assert serve({"PATH_INFO": CPU_PATH, "REQUEST_METHOD": "GET"}) == b"{}"


def test_the_call_counter_adds_up_the_cpu_each_operation_took() -> None:
    counter = CallCounter()
    scope = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/dynamodb/aws4_request"

    def busy_app(_environ: dict[str, Any], start_response: Any) -> list[bytes]:
        spent = time.thread_time()
        while time.thread_time() - spent < 0.02:  # 20 ms of this thread's CPU, not of a clock
            pass
        start_response("200 OK", [])
        return [b"{}"]

    environ = {"HTTP_AUTHORIZATION": scope, "HTTP_X_AMZ_TARGET": "DynamoDB_20120810.UpdateItem"}
    for _ in range(3):
        counter(busy_app, dict(environ), lambda *_: None)
    assert json.loads(counter.read(CALLS_PATH)) == {"dynamodb.UpdateItem": 3}
    assert json.loads(counter.read(CPU_PATH))["dynamodb.UpdateItem"] >= 60_000


def test_a_send_does_not_scan_the_queue_yet_its_counts_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws
    from moto.sqs.models import Message

    looks = []
    visible = Message.visible
    monkeypatch.setattr(Message, "visible", property(lambda m: looks.append(m.id) or visible.fget(m)))  # type: ignore[attr-defined]
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="backlog")["QueueUrl"]
        for _ in range(5):
            sqs.send_message_batch(
                QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "m"} for i in range(10)]
            )
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=3, VisibilityTimeout=600)
        looks.clear()

        sqs.send_message(QueueUrl=url, MessageBody="one more")

        assert looks == []  # moto's send counted every message of the queue before
        counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (counts["ApproximateNumberOfMessages"], counts["ApproximateNumberOfMessagesNotVisible"]) == (
            "48",
            "3",
        )


def test_an_invocation_during_a_warm_up_waits_for_that_sandbox_instead_of_starting_another(
    tmp_path: Path,
) -> None:
    import concurrent.futures

    spec = toy_function(
        tmp_path,
        """
        import os, time
        time.sleep(1.0)  # a slow init: the invocation below comes while it runs
        def handler(event, context):
            return os.getpid()
    """,
        timeout_s=10,
    )
    runtime = FunctionRuntime(spec, concurrency=4)
    pool = concurrent.futures.ThreadPoolExecutor(2)
    try:
        # Given a warm-up under way (--warm-containers eager)
        warming = pool.submit(runtime.prewarm)
        eventually(lambda: runtime.sandboxes or runtime._warming, bool, timeout_s=30, every_s=0.01)
        # When an invocation arrives before that sandbox is ready
        invocation = pool.submit(runtime.invoke, {}).result(timeout=60)
        # Then it ran in the warmed sandbox: one sandbox, whose init the warm-up reported
        init_s = warming.result(timeout=60)
        assert init_s is not None
        assert init_s >= 1.0
        assert invocation.init_s is None  # not a cold start of its own
        assert len(runtime.sandboxes) == 1
        # And a function with a sandbox already is not warmed again
        assert runtime.prewarm() is None
        assert len(runtime.sandboxes) == 1
    finally:
        pool.shutdown()
        runtime.close()


def test_moto_s_apps_run_without_flask_s_debug_mode_and_errors_still_propagate() -> None:
    import moto.server

    from llmtasks_local.moto_patches import serving

    create = moto.server.create_backend_app
    serving._debug_mode_off()
    try:
        app = moto.server.create_backend_app("sqs")
    finally:
        moto.server.create_backend_app = create
    assert not app.debug

    @app.route("/_a_bug")
    def a_bug() -> str:
        raise RuntimeError("a bug in moto")

    with pytest.raises(RuntimeError, match="a bug in moto"):  # to werkzeug: 500 and its traceback
        app.test_client().get("/_a_bug")


def test_a_closed_runtime_leaves_none_of_its_sandboxes_files_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the sandbox makes its files
    runtime = FunctionRuntime(toy_function(tmp_path, "def handler(event, context):\n    return 1\n"))
    assert runtime.invoke({}).payload == 1
    assert sorted(f.name.rsplit("-", 1)[0] for f in temp.iterdir()) == [
        "llmtasks-cut",
        "llmtasks-sandbox-cpu",
    ]
    runtime.close()  # then a stopping stack exits, and the sandboxes' output readers with it
    assert list(temp.iterdir()) == []
