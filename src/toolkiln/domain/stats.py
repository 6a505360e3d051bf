"""A tool's calls over a window: per time bucket, calls, failures by code, p50 and p99.

Every stored call of a tool adds one to a row of its minute and outcome code (the empty code
for an ``ok`` call) and to one of that row's duration buckets (``DURATION_BOUNDS_MS``), so a
window is read from at most one row per minute and code, however many calls it holds. The
percentiles are estimated from those buckets, linearly within the bucket the rank falls in
(as Prometheus's ``histogram_quantile`` does).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

# Upper bounds of the duration buckets, in milliseconds; one more bucket holds the rest.
DURATION_BOUNDS_MS = (
    0.5, 1, 2, 3, 5, 8, 13, 20, 30, 50, 80, 130, 200, 300, 500, 800, 1300, 2000, 3000, 5000,
    8000, 13000, 20000, 30000,
)  # fmt: skip
BUCKETS = len(DURATION_BOUNDS_MS) + 1
# A window: how many buckets, of how many minutes each.
WINDOWS: dict[str, tuple[int, int]] = {"1h": (60, 1), "24h": (96, 15), "7d": (168, 60)}
# Rows older than the longest window (and its first bucket's start) are never read again.
KEPT_MINUTES = max(count * minutes for count, minutes in WINDOWS.values()) + 60


def duration_bucket(ms: float) -> int:
    """The index of the bucket a duration is counted in."""
    return bisect.bisect_left(DURATION_BOUNDS_MS, ms)


def minute_of(moment: datetime) -> int:
    """Minutes since the epoch (UTC)."""
    return int(moment.timestamp() // 60)


@dataclass(frozen=True, slots=True)
class StatsRow:
    """Calls of one bucket of a window with one outcome code ("" for ok)."""

    bucket: int  # the bucket's first minute // its minutes
    code: str
    calls: int
    durations: tuple[int, ...]  # counts per duration bucket


def quantile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile of the durations counted in ``counts`` (ms), or None without any."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            lower = DURATION_BOUNDS_MS[i - 1] if i > 0 else 0.0
            if i >= len(DURATION_BOUNDS_MS):
                return float(DURATION_BOUNDS_MS[-1])  # beyond the last bound: that bound
            upper = DURATION_BOUNDS_MS[i]
            return round(lower + (upper - lower) * (rank - seen) / count, 3)
        seen += count
    return float(DURATION_BOUNDS_MS[-1])


@dataclass(slots=True)
class _Bucket:
    calls: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    durations: list[int] = field(default_factory=lambda: [0] * BUCKETS)

    def add(self, row: StatsRow) -> None:
        self.calls += row.calls
        if row.code:
            self.failures[row.code] = self.failures.get(row.code, 0) + row.calls
        for i, count in enumerate(row.durations):
            self.durations[i] += count

    def shown(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "failures": sum(self.failures.values()),
            "failures_by_code": dict(sorted(self.failures.items())),
            "p50_ms": quantile(self.durations, 0.5),
            "p99_ms": quantile(self.durations, 0.99),
        }


def span_of(window: str, now: datetime) -> tuple[int, int, int]:
    """A window's first bucket, its bucket count and each bucket's minutes, ending with the
    bucket ``now`` is in."""
    count, minutes = WINDOWS[window]
    last = minute_of(now) // minutes
    return last - count + 1, count, minutes


def summary(window: str, now: datetime, rows: Iterable[StatsRow]) -> dict[str, Any]:
    """Every bucket of the window (empty ones too, so a chart's axis is regular), and the
    whole window's totals."""
    first, count, minutes = span_of(window, now)
    buckets = [_Bucket() for _ in range(count)]
    whole = _Bucket()
    for row in rows:
        if first <= row.bucket < first + count:
            buckets[row.bucket - first].add(row)
            whole.add(row)

    def start(i: int) -> str:
        at = datetime.fromtimestamp(0, UTC) + timedelta(minutes=(first + i) * minutes)
        return at.isoformat().replace("+00:00", "Z")

    return {
        "window": window,
        "bucket_seconds": minutes * 60,
        "from": start(0),
        "to": start(count),
        "buckets": [{"start": start(i), **b.shown()} for i, b in enumerate(buckets)],
        "total": whole.shown(),
    }
