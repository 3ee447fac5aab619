"""The console at scale (section console): one batch with a user's `GET /tasks?limit=5` beside
it, then the same batch with the console's page polling its overview as well, on one stack:
whether watching a big batch slows it, how fast the overview answers meanwhile, and `GET /tasks`
during each batch against the idle stack with the same table.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from figures import Report, ms, verdict
from harness import PLAIN_MOCK, stack_running
from llmtasks_local.emulator.launcher import LaunchedStack
from workloads.batches import batch_file_lines, submit_batch_file

ENDED = ("completed", "completed_with_errors", "failed", "cancelled")
POLL_S = 2.0  # the console page's poll, and the user's listing beside it


def batch_run_s(client: httpx.Client, items: int) -> float:
    """One batch of `items` lines (an uploaded file) from its submit to its end."""
    upload = client.post("/batches/uploads").json()
    httpx.put(upload["upload_url"], content=batch_file_lines(items, 200), timeout=300).raise_for_status()
    started = time.monotonic()
    batch_id = submit_batch_file(client, upload["file_id"])
    while client.get(f"/batches/{batch_id}").json()["status"] not in ENDED:
        time.sleep(0.5)
    return time.monotonic() - started


def timed_get(client: httpx.Client, path: str, params: dict[str, Any], took: list[float]) -> None:
    started = time.perf_counter()
    client.get(path, params=params).raise_for_status()
    took.append(time.perf_counter() - started)


LISTINGS: dict[str, dict[str, Any]] = {"": {"limit": 5}, "?status=": {"status": "pending", "limit": 5}}


def listing_times() -> dict[str, list[float]]:
    return {name: [] for name in LISTINGS}


def watching(
    stack: LaunchedStack, stop: threading.Event, overview: list[float] | None, listing: dict[str, list[float]]
) -> None:
    """A user's `GET /tasks?limit=5` and `GET /tasks?status=pending&limit=5` every POLL_S, and
    with `overview` the console's page (its overview as often) beside them, until `stop`."""
    token = parse_qs(urlsplit(stack.console).query)["token"][0]
    console = httpx.Client(base_url=stack.api, headers={"Authorization": f"Bearer {token}"}, timeout=120)
    with console, stack.client() as client:
        while not stop.is_set():
            if overview is not None:
                timed_get(console, "/console/api/overview", {}, overview)
            for name, params in LISTINGS.items():
                timed_get(client, "/tasks", params, listing[name])
            stop.wait(POLL_S)


def watched_batch_s(
    stack: LaunchedStack,
    client: httpx.Client,
    items: int,
    overview: list[float] | None,
    listing: dict[str, list[float]],
) -> float:
    """A batch's time with `watching` beside it."""
    stop = threading.Event()
    watcher = threading.Thread(target=watching, args=(stack, stop, overview, listing), daemon=True)
    watcher.start()
    try:
        return batch_run_s(client, items)
    finally:
        stop.set()
        watcher.join()


def console_load(report: Report, quick: bool) -> None:
    """Issue 78's figures, on one stack: a batch with a user's GET /tasks?limit=5 every two
    seconds beside it, then the same batch again with the console's page polling its overview
    too; each batch's items a second, the overview's latency while the second ran, and GET
    /tasks on the idle stack (the first batch's tasks in the table) and during each batch."""
    items = 300 if quick else 20_000
    section = "console"
    with stack_running() as stack, stack.client() as client:
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 0})
        plain = listing_times()
        alone_s = watched_batch_s(stack, client, items, None, plain)
        idle = listing_times()
        for _ in range(20):
            for name, params in LISTINGS.items():
                timed_get(client, "/tasks", params, idle[name])
        overview: list[float] = []
        polled = listing_times()
        watched_s = watched_batch_s(stack, client, items, overview, polled)
    slowdown = watched_s / alone_s
    report.add(section, f"a {items:,}-line batch, console closed: items/s", f"{items / alone_s:.1f}")
    report.add(
        section,
        "  the same batch, the console polling: items/s",
        f"{items / watched_s:.1f}",
        f"{slowdown:.2f}x the closed run's time (target <= 1.1x): {verdict(slowdown <= 1.1)}",
    )
    report.add(
        section,
        f"  the console's overview meanwhile: p50 / max ({len(overview)} polls)",
        f"{ms(statistics.median(overview))} / {ms(max(overview))}",
        f"target < 1 s: {verdict(max(overview) < 1)}",
    )
    for name, params in LISTINGS.items():
        shown = "&".join(f"{key}={value}" for key, value in params.items())
        idle_p50 = statistics.median(idle[name])
        report.add(section, f"  GET /tasks?{shown}, idle, the first batch's tasks stored: p50", ms(idle_p50))
        for label, took in (("console closed", plain[name]), ("console polling", polled[name])):
            p50 = statistics.median(took)
            report.add(
                section,
                f"    during the batch, {label}: p50",
                ms(p50),
                f"{p50 / idle_p50:.2f}x (target <= 2x): {verdict(p50 <= 2 * idle_p50)}",
            )
