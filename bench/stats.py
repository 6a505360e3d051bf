"""What a tool's stats cost to read, with 10k, 100k and 1M stored calls, on PostgreSQL.

``python bench/stats.py`` (``TOOLKILN_TEST_POSTGRES_URL``, default the test server's): in a
scratch database migrated to the service's schema, one tool gets N calls spread over seven
days (``tool_calls`` rows, ~3% failures, durations of a few ms with a slow tail), and its
per-minute counts (``tool_call_stats``) as the calls' upserts leave them, built here in one
statement. For each N it times the stats read of each window (``SqlStats.window``, what
``GET /v1/custom-tools/{id}/stats`` reads; median of BENCH_REPEAT), and, for comparison, the
same figures computed from the stored calls themselves (``percentile_cont`` over the
window's rows). Last, the upsert each stored call runs, timed alone. Prints a table; not
part of the test run.
"""

from __future__ import annotations

import os
import re
import secrets
import statistics
import time
from datetime import UTC, datetime

import psycopg
import sqlalchemy as sa

from toolkiln.domain.stats import BUCKETS, DURATION_BOUNDS_MS, WINDOWS, minute_of, span_of
from toolkiln.storage.database import Database
from toolkiln.storage.stats_repo import SqlStats

URL = os.environ.get("TOOLKILN_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
REPEAT = int(os.environ.get("BENCH_REPEAT", "15"))
SIZES = (10_000, 100_000, 1_000_000)
TOOL = "benchtool" + secrets.token_hex(4)

# N calls over the last seven days, one per (7 days / N); every 33rd fails.
CALLS = """
INSERT INTO tool_calls (workspace_id, id, tool_id, version, kind, status, error_code, result,
                        created_at)
SELECT 'ws', :tool || '-' || i, :tool, 1, 'invoke',
       CASE WHEN i % 33 = 0 THEN 'error' ELSE 'ok' END,
       CASE WHEN i % 33 = 0 THEN 'runtime_error' END,
       jsonb_build_object('duration_ms', 1.5 + (i % 7) + CASE WHEN i % 97 = 0 THEN 400 ELSE 0 END),
       now() - make_interval(secs => (i::float8 * 604800 / :n))
FROM generate_series(1, :n) AS i
"""


def rollup_sql() -> str:
    """The per-minute rows the calls' upserts leave, made from the stored calls at once."""
    bounds = list(DURATION_BOUNDS_MS)
    d = "(result->>'duration_ms')::float8"
    index = f"width_bucket({d}, ARRAY{bounds}::float8[])"  # bounds are upper, inclusive: close
    cols = ", ".join(f"d{i}" for i in range(BUCKETS))
    sums = ", ".join(
        f"count(*) FILTER (WHERE least({index} - CASE WHEN {d} = ANY(ARRAY{bounds}::float8[]) "
        f"THEN 1 ELSE 0 END, {BUCKETS - 1}) = {i})"
        for i in range(BUCKETS)
    )
    return (
        f"INSERT INTO tool_call_stats (tool_id, minute, code, calls, {cols}) "
        f"SELECT tool_id, floor(extract(epoch FROM created_at) / 60)::int, "
        f"coalesce(error_code, ''), count(*), {sums} "
        f"FROM tool_calls WHERE tool_id = :tool GROUP BY 1, 2, 3"
    )


NAIVE = """
SELECT count(*), count(*) FILTER (WHERE status = 'error'),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY (result->>'duration_ms')::float8),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY (result->>'duration_ms')::float8)
FROM tool_calls
WHERE tool_id = :tool AND created_at >= now() - make_interval(mins => :minutes)
GROUP BY floor(extract(epoch FROM created_at) / 60 / :size), error_code
"""


def _pg(sql: str) -> str:
    """A statement written with ``:name`` parameters, for psycopg (``%(name)s``)."""
    return re.sub(r"(?<!:):(\w+)", r"%(\1)s", sql.replace("%", "%%"))


def timed(fn: object) -> float:
    samples = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    base = URL.replace("postgresql+psycopg://", "postgresql://")
    name = f"toolkiln_bench_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    head, _, _ = URL.rpartition("/")
    db = Database(f"{head}/{name}")
    try:
        db.migrate()
        print(
            f"| calls | {' | '.join(f'stats {w}' for w in WINDOWS)} | "
            f"{' | '.join(f'from the calls {w}' for w in WINDOWS)} | rows read 7d |"
        )
        print("|---" * (2 * len(WINDOWS) + 2) + "|")
        done = 0
        for n in SIZES:
            # Loaded on a connection of its own: the service's connections give up on a
            # statement after 5 s (storage/database.py).
            with psycopg.connect(f"{base.rpartition('/')[0]}/{name}") as load:
                load.execute("DELETE FROM tool_calls WHERE tool_id = %(tool)s", {"tool": TOOL})
                load.execute("DELETE FROM tool_call_stats WHERE tool_id = %(tool)s", {"tool": TOOL})
                load.execute(_pg(CALLS), {"tool": TOOL, "n": n})
                load.execute(_pg(rollup_sql()), {"tool": TOOL})
                load.commit()
                load.execute("ANALYZE tool_calls")
                load.execute("ANALYZE tool_call_stats")
                load.commit()
            done = n
            now = datetime.now(UTC)
            fast, slow = [], []
            with db.engine.connect() as c:
                stats = SqlStats(c)
                for window in WINDOWS:
                    first, count, minutes = span_of(window, now)
                    fast.append(
                        timed(lambda s=stats, f=first, n=count, m=minutes: s.window(TOOL, f, n, m))
                    )
                    params = {"tool": TOOL, "minutes": count * minutes, "size": minutes}
                    slow.append(timed(lambda c=c, p=params: c.execute(sa.text(NAIVE), p).all()))
                rows = c.execute(
                    sa.text("SELECT count(*) FROM tool_call_stats WHERE tool_id = :tool"),
                    {"tool": TOOL},
                ).scalar()
            print(
                f"| {n:,} | {' | '.join(f'{v:.2f} ms' for v in fast)} | "
                f"{' | '.join(f'{v:.1f} ms' if v < 1e9 else '> 5 s' for v in slow)} | {rows:,} |"
            )
        # The upsert a stored call adds to its transaction, alone.
        with db.engine.connect() as c:
            stats = SqlStats(c)
            minute = minute_of(datetime.now(UTC))
            samples = []
            for i in range(2000):
                start = time.perf_counter()
                stats.add(TOOL, minute - (i % 5), "", 2.0 + i % 4)
                samples.append((time.perf_counter() - start) * 1000)
            c.commit()
        print(
            f"\nthe upsert of one call ({done:,} calls stored): "
            f"p50 {statistics.median(samples):.3f} ms, "
            f"p99 {sorted(samples)[int(len(samples) * 0.99)]:.3f} ms"
        )
    finally:
        db.dispose()
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
