"""domain/stats.py: duration buckets, quantiles, and a window's buckets."""

from __future__ import annotations

from datetime import UTC, datetime

from toolkiln.domain.stats import (
    BUCKETS,
    DURATION_BOUNDS_MS,
    StatsRow,
    duration_bucket,
    quantile,
    span_of,
    summary,
)


def test_a_duration_is_counted_in_the_first_bucket_it_fits() -> None:
    assert duration_bucket(0.1) == 0
    assert duration_bucket(0.5) == 0
    assert duration_bucket(0.6) == 1
    assert duration_bucket(2.5) == DURATION_BOUNDS_MS.index(3)
    assert duration_bucket(10**9) == BUCKETS - 1


def test_quantiles_interpolate_within_the_bucket() -> None:
    counts = [0] * BUCKETS
    counts[DURATION_BOUNDS_MS.index(3)] = 100  # 100 calls between 2 and 3 ms
    assert quantile(counts, 0.5) == 2.5
    assert quantile(counts, 0.99) == 2.99
    counts[BUCKETS - 1] = 1000  # most beyond the last bound: that bound
    assert quantile(counts, 0.99) == DURATION_BOUNDS_MS[-1]
    assert quantile([0] * BUCKETS, 0.5) is None


def test_rows_land_in_their_bucket_of_the_window() -> None:
    now = datetime(2026, 12, 6, 9, 30, 20, tzinfo=UTC)
    first, count, minutes = span_of("24h", now)
    assert (count, minutes) == (96, 15)
    one = [0] * BUCKETS
    one[4] = 1
    rows = [
        StatsRow(first + count - 1, "", 3, tuple(x * 3 for x in one)),
        StatsRow(first + count - 1, "timeout", 1, tuple(one)),
        StatsRow(first, "", 2, tuple(x * 2 for x in one)),
        StatsRow(first - 1, "", 50, tuple(x * 50 for x in one)),  # before the window
    ]
    found = summary("24h", now, rows)
    assert found["to"] == "2026-12-06T09:45:00Z"
    assert found["buckets"][-1]["start"] == "2026-12-06T09:30:00Z"
    assert found["buckets"][-1]["calls"] == 4
    assert found["buckets"][-1]["failures_by_code"] == {"timeout": 1}
    assert found["buckets"][0]["calls"] == 2
    assert found["total"]["calls"] == 6 and found["total"]["failures"] == 1
