"""API keys on the local stack, refused at the edge as API Gateway refuses them: no key is a 401
from the gateway (nothing runs), a key the authorizer denies is a 403 (the route's function does
not run), decisions are cached for AuthCacheSeconds; per-key limits are 429 problems."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import AUTH_CACHE_S, RunningStack, start_stack
from tests.e2e.test_local_stack import wait_terminal
from tests.helpers import HANG_S, eventually

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def auth_stack() -> Iterator[RunningStack]:
    """A stack of its own, printing Lambda's REPORT line for each invocation (its records)."""
    running = start_stack("--report")
    yield running
    running.stop()


def invocations(stack: RunningStack) -> Counter[str]:
    """How many times each function has run, from the REPORT lines of the stack's log."""
    counted: Counter[str] = Counter()
    for line in stack.log.read_text().splitlines():
        if line.startswith("REPORT RequestId:"):
            counted[line.split("Function: ", 1)[1].split("\t", 1)[0]] += 1
    return counted


def settled(stack: RunningStack) -> Counter[str]:
    """The invocation counts once the log has caught up (REPORT follows the reply)."""
    last: list[Counter[str]] = []

    def same_twice() -> bool:
        now = invocations(stack)
        steady = bool(last) and now == last[-1]
        last.append(now)
        return steady

    eventually(same_twice, bool, timeout_s=HANG_S, every_s=0.3, what="the stack's REPORT lines")
    return last[-1]


def refused_by_the_gateway(reply: httpx.Response, status: int, message: str) -> None:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"message": message}


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-api-key": "lt_nope_nope"}, {"Authorization": ""}],
    ids=["no header", "x-api-key only", "empty Authorization"],
)
def test_no_key_is_api_gateway_s_401_and_the_authorizer_never_runs(
    auth_stack: RunningStack, headers: dict[str, str]
) -> None:
    before = settled(auth_stack)
    with httpx.Client(base_url=auth_stack.api, headers=headers, timeout=30.0) as client:
        for reply in (
            client.post("/tasks", json={"prompt": "p"}),
            client.get("/tasks"),
            client.get("/tasks/" + "a" * 32),
            client.post("/v1/responses", json={"model": "m", "input": "p", "background": True}),
        ):
            refused_by_the_gateway(reply, 401, "Unauthorized")
    after = settled(auth_stack)
    for function in ("AuthorizerFunction", "SubmitFunction", "StatusFunction"):
        assert after[function] == before[function], function


@pytest.mark.parametrize(
    "authorization",
    ["Bearer lt_0123456789ab_notthesecret", "Bearer hello", "Basic dXNlcjpwYXNz", "lt_no_scheme"],
)
def test_a_bad_key_is_the_authorizer_s_403_and_the_route_s_function_never_runs(
    auth_stack: RunningStack, authorization: str
) -> None:
    before = settled(auth_stack)
    # API Gateway's own 30 s, not httpx's default 5 s: the first of these runs the authorizer's cold
    # start, which a loaded clean-clone run took past 5 s.
    client_timeout = httpx.Timeout(30.0)
    with httpx.Client(
        base_url=auth_stack.api, headers={"Authorization": authorization}, timeout=client_timeout
    ) as client:
        refused_by_the_gateway(client.post("/tasks", json={"prompt": "p"}), 403, "Forbidden")
        # A bad body tells a refused caller nothing either
        refused_by_the_gateway(client.post("/tasks", content=b"{not json"), 403, "Forbidden")
        refused_by_the_gateway(client.get("/tasks"), 403, "Forbidden")
    after = settled(auth_stack)
    assert after["SubmitFunction"] == before["SubmitFunction"]
    assert after["StatusFunction"] == before["StatusFunction"]
    # The denial is cached per Authorization value: one authorizer run for the three requests
    assert after["AuthorizerFunction"] - before["AuthorizerFunction"] == 1


def test_a_good_key_s_decision_is_cached_for_the_ttl(auth_stack: RunningStack) -> None:
    key = auth_stack.cli("keys", "create", "--tenant", "cached").strip()
    time.sleep(AUTH_CACHE_S)  # real time is the point: the cache's TTL
    before = settled(auth_stack)
    with auth_stack.client(key) as client:
        started = time.monotonic()
        for _ in range(5):
            assert client.get("/tasks").status_code == 200
        span_s = time.monotonic() - started
    after = settled(auth_stack)
    assert after["StatusFunction"] - before["StatusFunction"] == 5
    # One decision, and another only once a whole TTL has passed since the last: a loaded
    # machine's five requests can take several TTLs, quiet ones well under one.
    decisions = after["AuthorizerFunction"] - before["AuthorizerFunction"]
    assert 1 <= decisions <= 1 + int(span_s // AUTH_CACHE_S), (decisions, span_s)


def test_health_and_the_docs_need_no_key(auth_stack: RunningStack) -> None:
    with httpx.Client(base_url=auth_stack.api, timeout=30.0) as client:  # a cold start, loaded
        assert client.get("/health").json()["status"] == "ok"
        assert client.get("/docs").status_code == 200
        assert "/tasks" in client.get("/openapi.json").json()["paths"]


def test_a_tenant_never_sees_another_tenant_s_tasks(auth_stack: RunningStack) -> None:
    acme_key = auth_stack.cli("keys", "create", "--tenant", "acme", "--name", "e2e").strip()
    with auth_stack.client() as dev, auth_stack.client(acme_key) as acme:
        task_id = dev.post("/tasks", json={"prompt": "dev's own"}).json()["task_id"]
        assert acme.get(f"/tasks/{task_id}").status_code == 404
        assert acme.post(f"/tasks/{task_id}/cancel").status_code == 404
        assert task_id not in [t["task_id"] for t in acme.get("/tasks").json()["data"]]
        mine = acme.post("/tasks", json={"prompt": "acme's own"}).json()["task_id"]
        assert [t["task_id"] for t in acme.get("/tasks").json()["data"]] == [mine]
        assert task_id in [t["task_id"] for t in dev.get("/tasks", params={"limit": 100}).json()["data"]]
        assert dev.get(f"/tasks/{mine}").status_code == 404


def test_a_revoked_key_is_refused_within_the_cache_ttl(auth_stack: RunningStack) -> None:
    key = auth_stack.cli("keys", "create", "--tenant", "revokee").strip()
    key_id = key.split("_")[1]
    listing = auth_stack.cli("keys", "list")
    assert key_id in listing
    assert key not in listing
    assert key.split("_", 2)[2] not in listing
    with auth_stack.client(key) as client:
        assert client.get("/tasks").status_code == 200  # now cached as allowed
        assert "revoked" in auth_stack.cli("keys", "revoke", key_id)
        # Once the cache's TTL has passed since the revoke (its allow was kept before it), the
        # next request is refused, however long that request then takes
        time.sleep(AUTH_CACHE_S)
        refused_by_the_gateway(client.get("/tasks"), 403, "Forbidden")


def test_a_key_s_requests_a_second_are_capped_and_a_flood_leaves_another_key_alone(
    auth_stack: RunningStack, capsys: pytest.CaptureFixture[str]
) -> None:
    # The flooding key allows one request a second: its threads' requests meet in a second
    # however slowly a loaded machine serves them (at 5, three threads whose requests took a
    # second each never passed it).
    flooder = auth_stack.cli("keys", "create", "--tenant", "flood", "--rps", "1").strip()
    quiet = auth_stack.cli("keys", "create", "--tenant", "quiet", "--rps", "5").strip()
    flood_statuses: Counter[int] = Counter()
    retry_after: set[str] = set()
    refused = threading.Event()
    stop = threading.Event()

    def flood() -> None:
        with auth_stack.client(flooder) as client:
            while not stop.is_set():
                reply = client.get("/tasks")
                flood_statuses[reply.status_code] += 1
                if reply.status_code == 429:
                    retry_after.add(reply.headers["retry-after"])
                    assert reply.headers["content-type"] == "application/problem+json"
                    refused.set()

    def quiet_submits() -> list[float]:
        seconds = []
        with auth_stack.client(quiet) as client:
            for i in range(8):
                started = time.monotonic()
                reply = client.post("/tasks", json={"prompt": f"quiet {i}"})
                seconds.append(time.monotonic() - started)
                assert reply.status_code == 202, reply.text
                time.sleep(0.25)  # 4 a second: under its own limit
        return seconds

    alone = quiet_submits()
    flooders = [threading.Thread(target=flood) for _ in range(3)]
    for thread in flooders:
        thread.start()
    try:
        # Once the flood is being refused, every one of the other key's submits is accepted
        assert refused.wait(HANG_S), flood_statuses
        during = quiet_submits()
    finally:
        stop.set()
        for thread in flooders:
            thread.join()
    assert flood_statuses[429] > 0, flood_statuses
    assert flood_statuses[200] > 0, flood_statuses
    assert set(flood_statuses) <= {200, 429}, flood_statuses
    assert retry_after == {"1"}
    with capsys.disabled():  # a measurement, not an assertion: this machine is shared
        print(
            f"\nper-key rps: the flooding key got {flood_statuses[200]} x 200,"
            f" {flood_statuses[429]} x 429;"
            f" the other key's submit, median {statistics.median(alone) * 1000:.0f} ms alone,"
            f" {statistics.median(during) * 1000:.0f} ms during the flood"
        )


def test_a_key_s_tasks_in_flight_are_capped_until_they_end(auth_stack: RunningStack) -> None:
    capped = auth_stack.cli("keys", "create", "--tenant", "capped", "--max-in-flight", "2").strip()
    auth_stack.configure_mock(latency_s=3)
    try:
        with auth_stack.client(capped) as client:
            first = [client.post("/tasks", json={"prompt": f"held {i}"}).json()["task_id"] for i in range(2)]
            refused = client.post("/tasks", json={"prompt": "one too many"})
            assert refused.status_code == 429, refused.text
            assert int(refused.headers["retry-after"]) > 0
            assert "in flight" in refused.json()["detail"]
            # A batch counts its items
            batch = client.post("/batches", json={"items": [{"prompt": "a"}]})
            assert batch.status_code == 429, batch.text
            for task_id in first:
                wait_terminal(client, task_id)
            assert client.post("/tasks", json={"prompt": "room again"}).status_code == 202
    finally:
        auth_stack.configure_mock(latency_s=0)


def test_no_auth_lets_the_simplest_polling_client_work() -> None:
    import requests

    stack = start_stack("--no-auth", "--report")
    try:
        assert stack.api_key is None
        base = stack.api
        # Each request's first call cold-starts its function: a CI run's StatusFunction took
        # over 10 s to answer on the loaded machine.
        task_id = requests.post(f"{base}/tasks", json={"prompt": "no key needed"}, timeout=HANG_S).json()[
            "task_id"
        ]
        give_up = time.monotonic() + HANG_S
        while requests.get(f"{base}/tasks/{task_id}", timeout=HANG_S).json()["status"] != "completed":
            assert time.monotonic() < give_up
            time.sleep(0.2)
        assert requests.get(f"{base}/tasks/{task_id}", timeout=HANG_S).json()["result"]
        ran = settled(stack)
        assert ran["SubmitFunction"] >= 1
        assert ran["AuthorizerFunction"] == 0  # the gateway alone stands in for it
    finally:
        stack.stop()


def test_up_prints_a_working_dev_key(auth_stack: RunningStack) -> None:
    assert auth_stack.api_key is not None
    assert auth_stack.api_key in auth_stack.log.read_text()
    with auth_stack.client() as client:
        task = wait_terminal(client, client.post("/tasks", json={"prompt": "dev key"}).json()["task_id"])
    assert task["status"] == "completed"
