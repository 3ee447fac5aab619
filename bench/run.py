"""The llmtasks benchmark: overhead against the boto3 floor, scale, goodput under a provider rate
limit, AWS calls and cost per task, durable state, key limits, the seed's Celery design side by
side, tokens a minute over a pool of keys, call slots kept busy on long calls, scheduling between
tenants, cold-start import time, and a big batch watched in the console.

Run from the project root: `make bench` (or `.venv/bin/python bench/run.py`). It starts its own
local stacks (`llmtasks up` on free ports, 127.0.0.1 only), prints each figure with its ratio and
target, and writes the table to bench/RESULTS.md. Figures, not assertions: these machines are
shared and noisy, so targets are ratios measured side by side in one run.

This module is the command line and the order of the sections; each workload is a module of
bench/workloads/, on the shared parts: harness.py (the stacks, their CPU, memory and AWS calls,
list prices), drive.py (the clients) and figures.py (the report and RESULTS.md's table).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

from figures import Report, ms, percentile, verdict
from harness import ROOT, stack_running
from workloads.batches import batch_files, batch_output
from workloads.call_slots import call_slots
from workloads.console import console_load
from workloads.costs import costs
from workloads.cpu_account import cpu_account
from workloads.goodput import goodput
from workloads.limits import budgets, key_limits
from workloads.overhead import boto3_floor, overhead
from workloads.requests import request_costs
from workloads.runs import runs
from workloads.sandboxes import sandboxes
from workloads.scheduling import scheduling
from workloads.startup import cli_start, cold_start, daily_loop
from workloads.state import durable_state
from workloads.storage import listing_pages, progress_writes, queue_receives
from workloads.streaming import streaming
from workloads.token_limits import token_limits
from workloads.versus_celery import versus_celery
from workloads.webhooks import webhooks

SECTIONS = (
    "cli",
    "loop",
    "cold",
    "sandboxes",
    "overhead",
    "scale",
    "paced",
    "cost",
    "state",
    "limits",
    "budgets",
    "celery",
    "tokens",
    "cpu",
    "slots",
    "scheduling",
    "webhooks",
    "streaming",
    "batch_files",
    "batch_output",
    "queues",
    "listing",
    "progress",
    "console",
    "request",
    "runs",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Small sizes: a smoke run of every section.")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"Comma-separated sections (default all: {','.join(SECTIONS)}).",
    )
    args = parser.parse_args()
    chosen = set(args.only.split(","))
    sizes = (
        {
            "single": 20,
            "small": 100,
            "large": 300,
            "floor": 100,
            "cost": 50,
            "paced": 100,
            "burst": 100,
            "stored": 1000,
            "limits": 20,
            "budgets": 400,
            "sandboxes": 100,
            "tokens": 45,
        }
        if args.quick
        else {
            "single": 200,
            "small": 1000,
            "large": 10000,
            "floor": 1000,
            "cost": 200,
            "paced": 600,
            "burst": 1000,
            "stored": 10000,
            "limits": 60,
            "budgets": 1000,
            "sandboxes": 300,
            "tokens": 150,
        }
    )
    report = Report()
    began = time.monotonic()
    print(
        f"llmtasks benchmark on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()})"
    )
    if "cli" in chosen:
        cli_start(report)
    if "loop" in chosen:
        daily_loop(report)
    if "cold" in chosen:
        cold_start(report)
    if "sandboxes" in chosen:
        sandboxes(report, sizes["sandboxes"])
    if "overhead" in chosen:
        with stack_running() as stack:  # the floor runs against the same moto server as the stack's
            floor = boto3_floor(stack.endpoint, sizes["floor"])
        floor_p50 = percentile(floor, 0.5)
        report.add("floor", f"6 boto3 calls per task, sequential, {sizes['floor']} tasks: p50", ms(floor_p50))
        report.add("floor", "p95", ms(percentile(floor, 0.95)))
        # The latency configuration (no batching window) at both sizes, then the template's
        # default window, whose wait is the price of fuller batches (fewer billed seconds).
        # Like for like with the floor: one client, so nothing waits for the machine's two cores.
        overhead(report, sizes["single"], floor_p50, window_s=0, clients=1)
        small = overhead(report, sizes["small"], floor_p50, window_s=0)
        if "scale" in chosen:
            large = overhead(
                report, sizes["small"], floor_p50, window_s=0, stored_first=sizes["large"] - sizes["small"]
            )
            ratio = large / small
            report.add(
                "scale",
                f"overhead p50 at {sizes['large']} / at {sizes['small']}",
                f"{ratio:.2f}",
                f"target <= 1.2: {verdict(ratio <= 1.2)}",
            )
        overhead(report, sizes["small"], floor_p50)
    if "paced" in chosen:
        goodput(report, sizes["paced"], limit_rps=20)
        # Half the limit, side by side: whether the pace or this machine bounds the first figure.
        goodput(report, sizes["paced"] // 2, limit_rps=10)
    if "cost" in chosen:
        costs(report, sizes["cost"])
    if "request" in chosen:
        request_costs(report, sizes["cost"])
    if "runs" in chosen:
        runs(report, args.quick)
    if "state" in chosen:
        durable_state(report, sizes["burst"], sizes["stored"])
    if "limits" in chosen:
        key_limits(report, sizes["limits"])
    if "budgets" in chosen:
        budgets(report, sizes["limits"], sizes["budgets"])
    if "celery" in chosen:
        versus_celery(report, sizes["burst"])
    if "tokens" in chosen:
        token_limits(report, sizes["tokens"])
    if "cpu" in chosen:
        cpu_account(report, sizes["burst"])
    if "slots" in chosen:
        call_slots(report, args.quick)
    if "scheduling" in chosen:
        scheduling(report, args.quick)
    if "webhooks" in chosen:
        webhooks(report, args.quick)
    if "streaming" in chosen:
        streaming(report, args.quick)
    if "batch_files" in chosen:
        batch_files(report, args.quick)
    if "batch_output" in chosen:
        batch_output(report, args.quick)
    if "queues" in chosen:
        queue_receives(report, args.quick)
    if "listing" in chosen:
        listing_pages(report, args.quick)
    if "progress" in chosen:
        progress_writes(report, args.quick)
    if "console" in chosen:
        console_load(report, args.quick)
    elapsed = time.monotonic() - began
    report.note(f"whole run: {elapsed:.0f} s on {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}")
    args.out.write_text(
        report.markdown("llmtasks benchmark results" + (" (quick run)" if args.quick else ""))
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
