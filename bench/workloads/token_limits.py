"""Tokens a minute over a pool of keys (section tokens): three keys of different limits at the
mock, which counts them as OpenAI does, under a burst of calls of mixed sizes; llmtasks (which
reserves each call's tokens before it) beside the seed's Celery design (which calls and retries
the 429s) in the same run, on the same mock.
"""

from __future__ import annotations

import json
import time
from typing import Any

from baseline import running_baseline  # bench/ is on sys.path: run.py runs as a script
from drive import Target, open_loop, outcomes
from figures import Report, verdict
from harness import stack_running, worker_slots

# Tokens a minute of each key (the mock's count: a word a token)
LIMITS = {"sk-bench-large": 30_000, "sk-bench-medium": 20_000, "sk-bench-small": 10_000}
# (prompt words, max_completion_tokens): a short question, a page, a long document
SIZES = ((50, 100), (500, 500), (2_000, 1_500))
# Each reply is as long as max_completion_tokens lets it be, after half a second
MOCK = {
    "key_limits": {key: {"tpm": tpm} for key, tpm in LIMITS.items()},
    "reply_chars": 20_000,
    "pad_word_chars": 4,
    "latency_s": 0.5,
}


def body(i: int) -> dict[str, Any]:
    words, cap = SIZES[i % len(SIZES)]
    return {"prompt": f"tokens {i} " + "word " * words, "max_completion_tokens": cap}


def _run(target: Target, stack: Any, tasks: int) -> dict[str, float]:
    stack.configure_mock(**MOCK)  # counters zeroed, every key's minute whole
    started = time.time()
    done = outcomes(target, open_loop(target, tasks, body, lambda _i: {}))
    stats = stack.mock_stats()
    completed = sum(d.task["status"] == "completed" for d in done)
    minutes = (max(d.completed_at for d in done) - started) / 60
    served = sum(stats["tokens_by_key"].values())
    return {
        "minutes": minutes,
        "served": served,
        # What the keys gave past the minute they started with (full): the rate they refill at
        "steady": max(0, served - sum(LIMITS.values())) / minutes,
        "calls": stats["calls"],
        "limited": stats["key_limited"],
        "failed": len(done) - completed,
    }


def token_limits(report: Report, tasks: int) -> None:
    section = "tokens"
    limit = sum(LIMITS.values())
    keys = [{"api_key": key, "tpm": tpm} for key, tpm in LIMITS.items()]
    # A model the price table lacks: a call that sets no max_completion_tokens (the warm-up's)
    # reserves UNPRICED_OUTPUT_TOKENS for its reply, not gpt-4o-mini's 16,384 a call.
    with stack_running(
        "--parameter-overrides", "LlmModel=mock-bench", env={"LLM_KEYS": json.dumps(keys)}
    ) as stack:
        ours = _run(stack, stack, tasks)
        concurrency, batch = worker_slots()
        assert stack.mock is not None
        with running_baseline(stack.mock + "/v1", threads=concurrency * batch, keys=tuple(LIMITS)) as celery:
            theirs = _run(celery, stack, tasks)
    report.add(
        section,
        f"{tasks} calls of mixed sizes on 3 keys of {', '.join(f'{t:,}' for t in LIMITS.values())}"
        " tokens a minute: tokens served a minute past the first minute's",
        f"{ours['steady']:,.0f}",
        f"{ours['steady'] / limit:.2f} of the keys' {limit:,} (target >= 0.9):"
        f" {verdict(ours['steady'] >= 0.9 * limit)}; Celery {theirs['steady']:,.0f}"
        f" ({theirs['steady'] / limit:.2f})",
    )
    for name, figures in (("llmtasks", ours), ("Celery", theirs)):
        share = figures["limited"] / max(1, figures["calls"])
        report.add(
            section,
            f"{name}: calls answered 429 / calls made",
            f"{figures['limited']:.0f} / {figures['calls']:.0f} ({share:.1%})",
            f"target < 1%: {verdict(share < 0.01)}" if name == "llmtasks" else "",
        )
        report.add(
            section,
            f"{name}: tasks failed; tokens served in all; minutes from the first submit to the last end",
            f"{figures['failed']:.0f}; {figures['served']:,.0f}; {figures['minutes']:.2f}",
        )
