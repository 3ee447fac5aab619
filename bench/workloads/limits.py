"""Per-key limits and budgets (sections limits, budgets): what counting them adds to a submit,
one key's flood beside another key's submits, and a flood against a budget that fits exactly.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import httpx

from drive import run_clients, submit
from figures import Report, ms, percentile, verdict
from harness import PLAIN_MOCK, stack_running
from llmtasks.domain.llm_request import LLMRequest
from llmtasks_local.emulator.launcher import LaunchedStack


def key_limits(report: Report, submits: int) -> None:
    """Per-key limits: what counting them adds to a submit, and whether one key's flood slows
    another key's submits. Key B submits `submits` tasks at 4 a second (under its limit), alone
    and then while key A (same limit) floods GET /tasks from 4 threads and is refused with 429s."""
    section = "limits"

    def paced_submits(stack: LaunchedStack, key: str) -> list[float]:
        seconds = []
        with stack.client(key) as client:
            for i in range(submits):
                started = time.monotonic()
                submit(client, {"prompt": f"limits {i} {uuid.uuid4().hex}"})
                seconds.append(time.monotonic() - started)
                time.sleep(max(0.0, 0.25 - seconds[-1]))
        return seconds

    with stack_running() as stack:
        unlimited = stack.cli("keys", "create", "--tenant", "free").strip()
        flooder = stack.cli(
            "keys", "create", "--tenant", "flood", "--rps", "10", "--max-in-flight", "100"
        ).strip()
        quiet = stack.cli(
            "keys", "create", "--tenant", "quiet", "--rps", "10", "--max-in-flight", "100"
        ).strip()
        free = paced_submits(stack, unlimited)
        alone = paced_submits(stack, quiet)
        statuses: Counter[int] = Counter()
        stop = threading.Event()

        def flood() -> None:
            with stack.client(flooder) as client:
                while not stop.is_set():
                    statuses[client.get("/tasks").status_code] += 1

        threads = [threading.Thread(target=flood) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            flooded = paced_submits(stack, quiet)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    p50 = percentile(free, 0.5)
    report.add(section, f"submit p50, a key without limits ({submits} at 4/s)", ms(p50))
    report.add(
        section,
        "submit p50, a key with rps and max-in-flight",
        ms(percentile(alone, 0.5)),
        f"{percentile(alone, 0.5) / p50:.2f}x",
    )
    report.add(
        section,
        "the same key's submit p50 while another key floods",
        ms(percentile(flooded, 0.5)),
        f"{percentile(flooded, 0.5) / percentile(alone, 0.5):.2f}x alone",
    )
    report.add(
        section, "the same, p95", ms(percentile(flooded, 0.95)), f"alone {ms(percentile(alone, 0.95))}"
    )
    refused = statuses[429] / max(1, sum(statuses.values()))
    report.add(
        section,
        "the flooding key: requests answered / refused (429)",
        f"{statuses[200]} / {statuses[429]}",
        f"{refused:.0%} refused",
    )
    report.note(
        "limits: every key's submits are counted in LimitsTable (one conditional write a request, two"
        " with max-in-flight); a flood is refused by the function, so on this 2-core machine its"
        " requests share the CPU with the other key's: in AWS each runs in its own sandbox"
    )


def budgets(report: Report, submits: int, flood: int) -> None:
    """Issue 41's figures: what reserving under a key's budget adds to a submit (the same run,
    budget on against off, alternating), and `flood` submits from 50 clients at once against a
    month's budget that fits exactly 300 of them: how many are accepted, and the spend reserved."""
    from llmtasks.settings import default_price_table

    section = "budgets"
    prompt = "budget {:06d}"  # every prompt the same length: every task the same most cost
    most = default_price_table().most_cost(LLMRequest(prompt=prompt.format(0)), "gpt-4o-mini")
    fits = 300
    with stack_running() as stack:
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 0})
        free = stack.cli("keys", "create", "--tenant", "free").strip()
        roomy = stack.cli("keys", "create", "--tenant", "budgeted", "--budget-usd-month", "1000000").strip()
        tight = stack.cli(
            "keys", "create", "--tenant", "tight", "--budget-usd-month", str(most * fits)
        ).strip()
        off: list[float] = []
        on: list[float] = []
        with stack.client(free) as without, stack.client(roomy) as within:
            for i in range(submits):
                for client, seconds in ((without, off), (within, on)):
                    started = time.monotonic()
                    submit(client, {"prompt": prompt.format(i)})
                    seconds.append(time.monotonic() - started)
        statuses: Counter[int] = Counter()
        lock = threading.Lock()

        def one(i: int, client: httpx.Client) -> None:
            code = client.post("/tasks", json={"prompt": prompt.format(i)}).status_code
            with lock:
                statuses[code] += 1

        # Calls that outlast the flood: no task ends, so no reservation is settled meanwhile and
        # exactly the tasks whose most cost fits are accepted
        stack.configure_mock(**{**PLAIN_MOCK, "latency_s": 300})
        started = time.monotonic()
        run_clients(flood, one, stack, clients=50, api_key=tight)
        flood_s = time.monotonic() - started
    ratio = percentile(on, 0.5) / percentile(off, 0.5)
    report.add(
        section, f"submit p50, no budget ({submits}, alternating with the next)", ms(percentile(off, 0.5))
    )
    report.add(
        section,
        "submit p50, a key with a month's budget",
        ms(percentile(on, 0.5)),
        f"ratio {ratio:.2f}, target <= 1.2: {verdict(ratio <= 1.2)}",
    )
    report.add(section, "  p95, without / with", f"{ms(percentile(off, 0.95))} / {ms(percentile(on, 0.95))}")
    accepted = statuses[202]
    report.add(
        section,
        f"{flood} submits from 50 clients at once, a budget that fits {fits}: accepted / refused (429)",
        f"{accepted} / {statuses[429]}",
        f"exact: {verdict(accepted == fits and statuses[429] == flood - fits)}",
    )
    report.add(
        section,
        "  spend reserved / budget (USD)",
        f"{most * accepted} / {most * fits}",
        f"never over: {verdict(most * accepted <= most * fits)}",
    )
    report.add(section, "  the flood took", f"{flood_s:.1f} s")
    report.note(
        f"budgets: a task of a {len(prompt.format(0))}-byte prompt and no max_tokens reserves {most} USD"
        " (the prompt a token a byte plus the chat format's, and gpt-4o-mini's 16,384 output tokens);"
        " a refusal past the budget reads the key's in-flight reservations' tasks once to settle"
        " those that ended, so the refused submits cost more than the accepted ones"
    )
