"""Cost flat in the data, on PostgreSQL: an invoke in an empty workspace against one in a
workspace of 10,000 tools with 1M audit rows and 1M call records.

``python bench/scale.py`` (``TOOLKILN_BENCH_POSTGRES_URL``, the server to make scratch
databases on, default the local one: bench/databases.py; ``SCALE_TOOLS``, default 10,000;
``SCALE_ROWS``, default 1,000,000). It makes two scratch databases and starts a real
``toolkiln serve`` on each (embedded runner, default settings). In the full one the tools
are made through the API (one shared text, so the code check runs once), then the audit
rows and call records go in by SQL, spread over the workspace's tools and the last 30 days,
and the tables are analysed as autovacuum would. Then both services are measured in
alternating rounds (``SCALE_ROUNDS``, default 6, of ``SCALE_CALLS`` sequential invokes of a
Python tool, default 200), so the machine's load falls on both alike: p50 / p99 of each and
the full/empty ratio (the goal: within 1.10). The scratch databases are dropped at the end.

Nothing here is part of the test run; it prints its figures and exits.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import databases
import psycopg
from client import Conn
from service import PY_TOOL, TOKEN, free_port, invoke_url, pct, start_service, stop
from service import create as create_tool

TOOLS = int(os.environ.get("SCALE_TOOLS", "10000"))
ROWS = int(os.environ.get("SCALE_ROWS", "1000000"))
ROUNDS = int(os.environ.get("SCALE_ROUNDS", "6"))
CALLS = int(os.environ.get("SCALE_CALLS", "200"))

CALLS_SQL = """
INSERT INTO tool_calls (workspace_id, id, tool_id, version, kind, status, error_code, result,
                        created_at)
SELECT %(ws)s, 'old-' || i, ids[1 + i %% array_length(ids, 1)], 1, 'invoke',
       CASE WHEN i %% 33 = 0 THEN 'error' ELSE 'ok' END,
       CASE WHEN i %% 33 = 0 THEN 'runtime_error' END,
       jsonb_build_object('status', 'ok', 'result', 1, 'duration_ms', 2.5),
       now() - make_interval(secs => (i::float8 * 2592000 / %(n)s))
FROM generate_series(1, %(n)s) AS i,
     (SELECT array_agg(id) AS ids FROM tools WHERE workspace_id = %(ws)s) AS t
"""


def create(c: Conn, ws: str, name: str, language: str, code: str) -> str:
    return invoke_url(create_tool(c, ws, name, language, code))


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def fill(port: int, dsn: str) -> tuple[str, float]:
    """TOOLS tools through the API, then ROWS audit rows and call records by SQL."""
    c = Conn(port, TOKEN)
    ws = c.call("GET", "/v1/workspaces")[1]["data"][0]["id"]
    c.close()
    started = time.monotonic()

    def make(chunk: range) -> None:
        conn = Conn(port, TOKEN)
        try:
            for i in chunk:
                create(conn, ws, f"tool-{i}", "python", PY_TOOL)
        finally:
            conn.close()

    step = max(1, TOOLS // 4)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(make, [range(i, min(i + step, TOOLS)) for i in range(0, TOOLS, step)]))
    with psycopg.connect(dsn) as db:
        db.execute("SET statement_timeout = 0")
        db.execute(CALLS_SQL, {"ws": ws, "n": ROWS})
        # one audit row per call record, as a call leaves
        db.execute(
            "INSERT INTO audit (workspace_id, tool_call_id, tool_id, source, event, data, "
            "created_at) SELECT workspace_id, id, tool_id, 'api', 'tool.invoked', "
            "jsonb_build_object('status', status), created_at FROM tool_calls "
            "WHERE workspace_id = %(ws)s AND id LIKE 'old-%%'",
            {"ws": ws},
        )
        db.commit()
        db.execute("ANALYZE")
        db.commit()
    return ws, time.monotonic() - started


def counts(dsn: str) -> str:
    with psycopg.connect(dsn) as db:
        got = [
            db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
            for table in ("tools", "audit", "tool_calls")
        ]
    return f"{got[0]:,} tools, {got[1]:,} audit rows, {got[2]:,} call records"


def sequential(port: int, url: str) -> list[float]:
    c = Conn(port, TOKEN)
    out = []
    try:
        for _ in range(CALLS):
            t = time.perf_counter()
            status, body = c.call("POST", url, {"input": {}})
            out.append((time.perf_counter() - t) * 1000)
            assert status == 200 and body["data"]["status"] == "ok", body
    finally:
        c.close()
    return out


def main() -> None:
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f}; python {sys.version.split()[0]}"
    )
    procs = {}
    with (
        databases.fresh("postgresql") as empty_url,
        databases.fresh("postgresql") as full_url,
        tempfile.TemporaryDirectory(prefix="toolkiln-scale-") as tmp,
    ):
        urls_of = {"empty": str(empty_url), "full": str(full_url)}
        try:
            ports = {}
            for kind, url in urls_of.items():
                ports[kind] = free_port()
                procs[kind] = start_service(
                    Path(tmp) / kind, ports[kind], {"TOOLKILN_DATABASE_URL": url}
                )
            _, took = fill(ports["full"], plain(urls_of["full"]))
            print(f"full: {counts(plain(urls_of['full']))} (made in {took:.0f} s)")
            print(f"empty: {counts(plain(urls_of['empty']))}")
            urls = {}
            for kind, port in ports.items():
                c = Conn(port, TOKEN)
                ws = c.call("GET", "/v1/workspaces")[1]["data"][0]["id"]
                urls[kind] = create(c, ws, "measured", "python", PY_TOOL)
                c.close()
                sequential(port, urls[kind])  # warm-up, not counted
            samples: dict[str, list[float]] = {"empty": [], "full": []}
            p50s: dict[str, list[float]] = {"empty": [], "full": []}
            for i in range(ROUNDS):
                for kind in ("empty", "full") if i % 2 == 0 else ("full", "empty"):
                    got = sequential(ports[kind], urls[kind])
                    samples[kind] += got
                    p50s[kind].append(pct(got, 0.5))
            e, f = samples["empty"], samples["full"]
            ratio = statistics.median(p50s["full"]) / statistics.median(p50s["empty"])
            print()
            print(
                f"| figure | empty workspace | {TOOLS:,} tools, {ROWS:,} audit rows and calls "
                "| full / empty |"
            )
            print("|---|---|---|---|")
            print(
                f"| Python tool over HTTP, p50 / p99 | {pct(e, 0.5):.2f} / {pct(e, 0.99):.2f} ms "
                f"| {pct(f, 0.5):.2f} / {pct(f, 0.99):.2f} ms | {ratio:.2f} "
                f"(median of {ROUNDS} rounds' p50; goal <= 1.10) |"
            )
        finally:
            for proc in procs.values():
                stop(proc)


if __name__ == "__main__":
    main()
