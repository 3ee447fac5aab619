"""Provider keys' tokens and requests a minute: the GCRA rules, their headers, and the shared
reservation (one TasksTable item per key, as every worker sandbox sees it)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from llmtasks.aws.key_limits import KeyRates
from llmtasks.domain.rate_limits import KeyLimits, KeyUse, RateHeaders, format_duration, parse_duration
from tests.conftest import Aws

pytestmark = pytest.mark.unit

TPM = KeyLimits(tpm=6_000, rpm=60)  # 100 tokens a second, a request a second


@pytest.fixture
def rates(aws: Aws) -> KeyRates:
    return KeyRates(aws.resources.table_names["TasksTable"], aws.dynamodb)


def test_durations_read_and_write_as_openai_writes_them() -> None:
    assert parse_duration("6m0s") == 360.0
    assert parse_duration("20ms") == pytest.approx(0.02)
    assert parse_duration("1s") == 1.0
    assert parse_duration("1m30.5s") == 90.5
    assert parse_duration("1h2m") == 3720.0
    assert parse_duration("soon") is None
    assert parse_duration("") is None
    assert [format_duration(s) for s in (0.02, 1.0, 360.0, 90.5, 3723.0)] == [
        "20ms",
        "1s",
        "6m0s",
        "1m30.5s",
        "1h2m3s",
    ]


def test_headers_give_limits_and_how_much_of_the_minute_is_used() -> None:
    heard = RateHeaders.read(
        {
            "X-RateLimit-Limit-Requests": "60",
            "x-ratelimit-limit-tokens": "6000",
            "x-ratelimit-remaining-requests": "59",
            "x-ratelimit-remaining-tokens": "4500",
            "x-ratelimit-reset-requests": "1s",
            "x-ratelimit-reset-tokens": "15s",
        }
    )
    assert heard.limits == TPM
    tokens_s, requests_s = heard.used_s(TPM)
    assert tokens_s == pytest.approx(15.0)  # 1,500 of 6,000 used: a quarter of the minute
    assert requests_s == pytest.approx(1.0)
    # Tokens the caller is about to give back are not counted as used
    assert heard.used_s(TPM, unsettled_tokens=1_000)[0] == pytest.approx(5.0)
    assert heard.reset_s() == 15.0  # nothing is exhausted: the later reset
    exhausted = heard.model_copy(update={"remaining_requests": 0})
    assert exhausted.reset_s() == 1.0  # the exhausted count's reset


def test_a_call_fits_while_the_minute_has_its_tokens_and_the_wait_is_exact() -> None:
    now = 1000.0
    idle = KeyUse()
    assert idle.wait_s(TPM, 6_000, now) == 0  # a whole minute's tokens fit an idle key
    # 3,000 tokens used (30 s of the minute) and a call of 4,000 (40 s): 10 s until it fits
    half = KeyUse(tokens_at=now + 30)
    assert half.wait_s(TPM, 4_000, now) == pytest.approx(10.0)
    assert half.wait_s(TPM, 3_000, now) == 0
    # A call larger than the limit waits for the whole minute, never for ever
    assert half.wait_s(TPM, 60_000, now) == pytest.approx(30.0)
    # Requests count too, and a 429's hold
    assert KeyUse(requests_at=now + 60).wait_s(TPM, 1, now) == pytest.approx(1.0)
    assert KeyUse(held_until=now + 7).wait_s(TPM, 1, now) == pytest.approx(7.0)
    assert half.free_share(TPM, now) == pytest.approx(0.5)


def test_reservations_fill_the_minute_then_say_when_the_next_fits(rates: KeyRates) -> None:
    now = 1000.0
    assert [rates.reserve("k", TPM, 2_000, now) for _ in range(3)] == [0.0, 0.0, 0.0]
    # The minute is full: a call of 1,000 tokens fits once 10 s of it are back, and none is taken
    assert rates.reserve("k", TPM, 1_000, now) == pytest.approx(10.0)
    assert rates.reserve("k", TPM, 1_000, now + 10) == 0.0
    # A settle gives back what the answer did not use
    rates.settle("k", TPM, reserved=1_000, used=400)
    assert rates.reserve("k", TPM, 600, now + 10) == 0.0
    assert rates.reserve("k", TPM, 100, now + 10) > 0


def test_requests_a_minute_bind_small_calls(rates: KeyRates) -> None:
    limits = KeyLimits(rpm=3)
    assert [rates.reserve("k", limits, 10, 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rates.reserve("k", limits, 10, 0.0) == pytest.approx(20.0)


def test_concurrent_sandboxes_never_reserve_past_the_limit(aws: Aws) -> None:
    table = aws.resources.table_names["TasksTable"]
    sandboxes = [KeyRates(table, aws.dynamodb) for _ in range(8)]  # each with its own view

    def reserve(i: int) -> float:
        return sandboxes[i % 8].reserve("k", TPM, 500, 1000.0)

    with ThreadPoolExecutor(max_workers=8) as pool:
        waits = list(pool.map(reserve, range(30)))
    assert waits.count(0.0) == 12  # 12 x 500 = the minute's 6,000 tokens, not one more
    assert all(w > 0 for w in waits if w)


def test_a_hold_stops_every_sandbox_and_headers_raise_the_use(aws: Aws, rates: KeyRates) -> None:
    other = KeyRates(aws.resources.table_names["TasksTable"], aws.dynamodb)
    rates.hold("k", until=1005.0)  # a 429's reset, told to every worker
    assert other.reserve("k", TPM, 10, 1000.0) == pytest.approx(5.0)
    assert other.reserve("k", TPM, 10, 1005.0) == 0.0
    # Another client of the key used 3,000 tokens: the provider's headers say so
    heard = RateHeaders(limit_tokens=6_000, limit_requests=60, remaining_tokens=3_000, remaining_requests=59)
    assert rates.learn("k", heard, 1005.0) == TPM
    assert other.reserve("k", TPM, 3_100, 1005.0) == pytest.approx(1.0)


def test_limits_the_provider_says_win_and_reach_every_sandbox(aws: Aws, rates: KeyRates) -> None:
    configured = KeyLimits(tpm=10_000)
    heard = RateHeaders(limit_tokens=6_000, limit_requests=60)
    learned = rates.learn("k", heard, 0.0)
    assert learned == TPM
    assert learned.over(configured) == TPM
    other = KeyRates(aws.resources.table_names["TasksTable"], aws.dynamodb)
    other.reserve("k", configured, 100, 0.0)
    assert other.seen["k"].said == TPM


def test_the_soonest_wait_counts_the_running_calls_reservations_as_given_back(rates: KeyRates) -> None:
    now = 1000.0
    assert rates.reserve("k", TPM, 2_000, now) == 0.0  # a call running: 20 s of the minute held
    assert rates.reserve("k", TPM, 2_000, now) == 0.0
    use = rates.seen["k"]
    assert use.tokens_held == pytest.approx(40.0)
    # A call of 3,000 fits in 10 s for sure, at once if the running calls use none of theirs
    assert use.wait_s(TPM, 3_000, now) == pytest.approx(10.0)
    assert use.soonest_s(TPM, 3_000, now) == 0.0
    # One answer used 500 of its 2,000: the minute keeps 500, and 20 s stay held
    rates.settle("k", TPM, reserved=2_000, used=500)
    use = rates.seen["k"]
    assert use.tokens_held == pytest.approx(20.0)
    assert use.wait_s(TPM, 3_000, now) == pytest.approx(0.0)
    assert use.wait_s(TPM, 4_000, now) == pytest.approx(5.0)
    # A leaked reservation (its sandbox died) never makes the soonest later than the sure wait
    leaked = KeyUse(tokens_at=now + 60, tokens_held=-10.0)
    assert leaked.soonest_s(TPM, 1_000, now) == leaked.wait_s(TPM, 1_000, now)
