"""The shared pace of LLM calls (one TasksTable item, as every worker sandbox sees it)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from llmtasks.aws.pacing import CallPacer
from tests.conftest import Aws

pytestmark = pytest.mark.unit


@pytest.fixture
def pacer(aws: Aws) -> CallPacer:
    return CallPacer(aws.resources.table_names["TasksTable"], aws.dynamodb, calls_per_second=10)


def test_calls_start_evenly_spaced_and_an_idle_pace_starts_at_once(pacer: CallPacer) -> None:
    starts = [pacer.reserve(now=1000.0) for _ in range(4)]
    # 10 a second, with the 5% slack that absorbs arrival jitter
    assert starts == pytest.approx([1000.0, 1000.105, 1000.21, 1000.315])
    # A call after the reserved slots have all passed starts when it asks
    assert pacer.reserve(now=2000.0) == 2000.0
    assert pacer.reserve(now=2000.05) == pytest.approx(2000.105)


def test_concurrent_sandboxes_never_share_a_slot(pacer: CallPacer) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        starts = sorted(pool.map(lambda _: pacer.reserve(now=500.0), range(30)))
    assert starts == pytest.approx([500.0 + i * 0.105 for i in range(30)])


def test_a_hold_delays_every_later_call_and_never_pulls_the_pace_earlier(pacer: CallPacer) -> None:
    pacer.reserve(now=1000.0)
    pacer.hold(until=1005.0)  # a provider's Retry-After, told to every worker
    assert pacer.reserve(now=1000.5) == pytest.approx(1005.0)
    pacer.hold(until=1002.0)  # an older, shorter one changes nothing
    assert pacer.reserve(now=1000.6) == pytest.approx(1005.105)
