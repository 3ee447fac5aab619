"""Retry-After as providers and receivers send it: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llmtasks.domain.retry_after import parse_retry_after

NOW = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("30", 30.0),
        ("0.5", 0.5),  # some providers send fractions; none is rounded up to a second
        ("0", 0.0),
        ("-4", 0.0),  # a negative delay means now, not a wait in the past
        ("Tue, 01 Dec 2026 10:00:42 GMT", 42.0),
        ("Tue, 01 Dec 2026 09:59:00 GMT", 0.0),  # a date already past: now
        ("", None),
        (None, None),
        ("soon", None),  # neither form: no Retry-After, the caller's own backoff applies
    ],
)
def test_a_retry_after_reads_as_the_seconds_it_names(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header, now=NOW) == seconds


def test_an_http_date_is_read_against_the_clock_when_no_now_is_given() -> None:
    # An hour ahead of the real clock: the wait is an hour, less the moments the test takes.
    in_an_hour = datetime.now(tz=UTC).timestamp() + 3600
    header = datetime.fromtimestamp(in_an_hour, tz=UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")
    seconds = parse_retry_after(header)
    assert seconds is not None
    assert 3500 < seconds <= 3600
