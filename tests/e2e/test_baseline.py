"""The bench's baseline, the seed's Flask + Celery + Redis design (bench/baseline.py), works as the
design note says, so that the bench's ratios compare llmtasks with a working thing: tasks submitted
over HTTP are answered 202, run by the Celery worker against the same mock LLM, with a retry
after a 500, and read back from Redis hashes that expire."""

from __future__ import annotations

import socket
import sys

import pytest
import redis

from llmtasks_local.mock_llm import reply_text
from tests.conftest import RunningMock
from tests.helpers import HANG_S, ROOT, eventually

sys.path.insert(0, str(ROOT / "bench"))
from baseline import running_baseline

pytestmark = pytest.mark.e2e


def test_the_baseline_runs_tasks_through_celery_and_redis(mock_llm: RunningMock) -> None:
    with running_baseline(mock_llm.url, threads=8) as baseline, baseline.client() as client:
        ids = {}
        for i in range(5):
            reply = client.post("/tasks", json={"prompt": f"baseline {i}"})
            assert reply.status_code == 202, reply.text
            ids[reply.json()["task_id"]] = f"baseline {i}"
        # Each read until its task has ended: a loaded machine's Celery worker can take longer
        # than one long poll
        done = {
            task_id: eventually(
                lambda task_id=task_id: client.get(f"/tasks/{task_id}", params={"wait": 5}).json(),
                lambda task: task["status"] in ("completed", "failed"),
                timeout_s=HANG_S,
                what=f"task {task_id} ended",
            )
            for task_id in ids
        }
        assert {task["status"] for task in done.values()} == {"completed"}
        assert all(done[task_id]["result"] == reply_text(prompt) for task_id, prompt in ids.items())
        assert mock_llm.stats.calls == 5
        hashes = redis.Redis.from_url(baseline.redis_url)
        assert all(0 < hashes.ttl(f"task:{task_id}") <= 86400 for task_id in ids)  # they expire
        # A 500 is retried
        mock_llm.configure(rate_500=1.0)
        retried = client.post("/tasks", json={"prompt": "retried"}).json()["task_id"]
        eventually(lambda: mock_llm.stats.errors_500, lambda n: n >= 1, timeout_s=HANG_S, what="a 500")
        mock_llm.configure(rate_500=0.0)
        task = eventually(
            lambda: client.get(f"/tasks/{retried}", params={"wait": 5}).json(),
            lambda t: t["status"] == "completed",
            timeout_s=HANG_S,
            what="the retried task completed",
        )
        assert task["result"] == reply_text("retried")
        assert client.get("/tasks/" + "0" * 32).status_code == 404
        assert client.post("/tasks", json={"nope": 1}).status_code == 422


def test_the_baseline_takes_another_port_when_another_process_took_its_own(
    mock_llm: RunningMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the web port the baseline probed taken by another process before gunicorn binds it
    import baseline as module

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([module._free_port(), taken.getsockname()[1]])
        real = module._free_port
        monkeypatch.setattr(module, "_free_port", lambda: next(ports, None) or real())
        # Then it starts on another, and answers there
        with running_baseline(mock_llm.url, threads=2) as baseline, baseline.client() as client:
            assert not baseline.api.endswith(f":{taken.getsockname()[1]}")
            assert client.get("/tasks/none").status_code == 404
