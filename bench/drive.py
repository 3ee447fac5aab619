"""Driving a stack over HTTP as the bench's clients do: submits, waits for outcomes, closed and
open loops spread over client threads, a burst, and a tenant's own key.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import httpx

from figures import percentile
from llmtasks_local.emulator.launcher import LaunchedStack

CLIENTS = 16


TERMINAL = {"completed", "failed", "cancelled"}


@dataclass
class Done:
    submitted_at: float  # epoch s, taken by the client just before its POST
    task: dict[str, Any]

    @property
    def completed_at(self) -> float:
        """When the task reached its terminal state, by the stack's clock (this machine's); a
        task read as terminal without that time (none should be) counts as ending when read."""
        stamp = self.task.get("completed_at")
        return datetime.fromisoformat(stamp).timestamp() if stamp else time.time()


class Target(Protocol):
    """What the bench's clients drive: the local stack, or the Celery baseline (bench/baseline.py)."""

    def client(self, api_key: str | None = None, **options: Any) -> httpx.Client: ...


def run_clients(
    count: int,
    work: Callable[[int, httpx.Client], None],
    stack: Target,
    clients: int = CLIENTS,
    api_key: str | None = None,
) -> None:
    """`work(i, client)` for i in range(count), spread over `clients` threads with a client each
    (of `api_key`, else the stack's development key)."""
    next_index = iter(range(count))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            with stack.client(api_key, timeout=60) as client:
                while not errors:
                    with lock:
                        i = next(next_index, None)
                    if i is None:
                        return
                    work(i, client)
        except BaseException as exc:  # the first failure stops every client and is raised
            errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def submit(client: httpx.Client, body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    reply = client.post("/tasks", json=body, headers=headers or {})
    if reply.status_code != 202:
        raise RuntimeError(f"submit answered {reply.status_code}: {reply.text}")
    return str(reply.json()["task_id"])


def wait_done(client: httpx.Client, task_id: str) -> dict[str, Any]:
    while True:
        reply = client.get(f"/tasks/{task_id}", params={"wait": 20})
        reply.raise_for_status()
        task: dict[str, Any] = reply.json()
        if task["status"] in TERMINAL:
            return task


def closed_loop(stack: LaunchedStack, tasks: int, clients: int = CLIENTS) -> list[Done]:
    """Each client submits a task, waits for its outcome, and submits the next."""
    done: list[Done] = []

    def one(i: int, client: httpx.Client) -> None:
        submitted_at = time.time()
        task_id = submit(client, {"prompt": f"bench {i} {uuid.uuid4().hex}"})
        done.append(Done(submitted_at, wait_done(client, task_id)))

    run_clients(tasks, one, stack, clients)
    return done


def open_loop(
    stack: Target,
    tasks: int,
    body: Callable[[int], dict[str, Any]],
    headers: Callable[[int], dict[str, str]],
    clients: int = CLIENTS,
) -> list[tuple[float, str]]:
    """All tasks submitted as fast as `clients` clients can; (submitted_at, task_id) of each."""
    submitted: list[tuple[float, str]] = []

    def one(i: int, client: httpx.Client) -> None:
        submitted_at = time.time()
        submitted.append((submitted_at, submit(client, body(i), headers(i))))

    run_clients(tasks, one, stack, clients)
    return submitted


def outcomes(stack: Target, submitted: list[tuple[float, str]]) -> list[Done]:
    """Each submitted task once it ended, in the order of `submitted` (whichever ended first)."""
    done: list[Done | None] = [None] * len(submitted)

    def one(i: int, client: httpx.Client) -> None:
        submitted_at, task_id = submitted[i]
        done[i] = Done(submitted_at, wait_done(client, task_id))

    run_clients(len(submitted), one, stack)
    return [d for d in done if d is not None]


def burst(target: Target, tasks: int, clients: int = CLIENTS) -> dict[str, float]:
    """`tasks` submits from `clients` clients as fast as they go (open loop, the LLM answering at
    once): submits a second (until the last submit's reply), a submit's p95, and tasks completed
    a second from the first submit."""
    timed: list[tuple[float, float, str]] = []  # (sent at, took, task id), one append a submit
    started = time.time()

    def one(i: int, client: httpx.Client) -> None:
        at = time.time()
        task_id = submit(client, {"prompt": f"burst {i} {uuid.uuid4().hex}"})
        timed.append((at, time.time() - at, task_id))

    run_clients(tasks, one, target, clients)
    submitting_s = max(at + took for at, took, _ in timed) - started
    seconds = [took for _, took, _ in timed]
    submitted = [(at, task_id) for at, _, task_id in timed]
    done = outcomes(target, submitted)
    return {
        "submits_s": tasks / submitting_s,
        "submit_p95": percentile(seconds, 0.95),
        "completed_s": tasks / (max(d.completed_at for d in done) - started),
        "not_completed": sum(d.task["status"] != "completed" for d in done),
    }


@dataclass
class AsTenant:
    """The stack as one tenant's clients reach it: with that tenant's API key."""

    stack: LaunchedStack
    key: str

    def client(self, api_key: str | None = None, **options: Any) -> httpx.Client:
        return self.stack.client(self.key, **options)
