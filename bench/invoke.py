"""The performance table of docs/benchmarks.md, in one run on one machine, for SQLite and
PostgreSQL side by side.

Run with `make bench`. For each database (SQLite in a temporary data dir; PostgreSQL in a
fresh database of its own, bench/databases.py; PostgreSQL is left out, and said so, when no
server answers) it starts a real `toolkiln serve` (every isolation layer on, default
settings), creates trivial tools, and measures over HTTP with one keep-alive connection: a
Python tool and a JavaScript tool (p50/p99 of BENCH_SEQ calls, default 500, with the CPU the
service, its runner and the sandbox processes spent per call), one `ctx.tools.calculate`
round trip (an invocation making 50 calls minus one making none, divided by 50), GET
/healthz; the Python tool over REST invoke, MCP `tools/call` and an agent's tool-call route
in alternating rounds (bench/protocols.py); then BENCH_CONCURRENCY clients (default 16)
invoking the Python tool for BENCH_SECONDS (default 10), and the memory of the service and
its sandbox processes. Then the baselines, once: a fresh `python3 -I -S` per call, a Node
worker thread + vm per call, and a bare FastAPI route (the HTTP floor). Last, the runner
shapes on each database (bench/shapes.py).

Nothing here is part of the test run; it prints its figures and exits.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import baselines
import databases
import density
import protocols
from client import AsyncConn, Conn
from service import (
    CTX_SCHEMA,
    CTX_TOOL,
    JS_TOOL,
    N_SEQ,
    PY_TOOL,
    TOKEN,
    WARM_UP,
    create,
    ctx_round_trip,
    free_port,
    invoke_url,
    pct,
    sequential,
    start_service,
    stop,
    timed,
    workspace,
)
from shapes import shapes_table

CONC = int(os.environ.get("BENCH_CONCURRENCY", "16"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
N_BASE = int(os.environ.get("BENCH_BASELINE_CALLS", "200"))

Measured = dict[str, object]


async def throughput(port: int, url: str) -> tuple[float, list[float]]:
    conns = [await AsyncConn.open(port, TOKEN) for _ in range(CONC)]
    lat: list[float] = []
    stop_at = time.perf_counter() + SECONDS

    async def client(conn: AsyncConn) -> None:
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            status, answer = await conn.call("POST", url, {"input": {}})
            lat.append((time.perf_counter() - t) * 1000)
            assert status == 200 and answer["data"]["status"] == "ok", answer

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    elapsed = time.perf_counter() - start
    for conn in conns:
        conn.close()
    return len(lat) / elapsed, lat


def cpu(pid: int, runner: int | None) -> tuple[float, float, float]:
    """CPU so far (ms): the service process, its runner process, everything under the runner."""
    if runner is None:
        return density.cpu_ms(pid), 0.0, density.tree_cpu_ms(pid)
    return density.cpu_ms(pid), density.cpu_ms(runner), density.tree_cpu_ms(runner)


def measure_service(port: int, pid: int) -> Measured:
    c = Conn(port, TOKEN)
    ws = workspace(c)
    py = create(c, ws, "bench-python", "python", PY_TOOL)
    js = create(c, ws, "bench-js", "javascript", JS_TOOL)
    loop = create(c, ws, "bench-ctx", "python", CTX_TOOL, input_schema=CTX_SCHEMA)
    out: Measured = {}
    out["isolation"] = c.call("GET", "/v1/custom-tools/runtimes")[1]["data"]["python"]["isolation"]
    runner = density.runner_of(pid)
    for name, tool in (("python", py), ("javascript", js)):
        before = cpu(pid, runner)
        out[name] = sequential(c, invoke_url(tool), {"input": {}}, N_SEQ)
        calls = N_SEQ + min(WARM_UP, N_SEQ)  # the warm-up calls count too
        out[f"{name}_cpu"] = tuple(
            (a - b) / calls for a, b in zip(cpu(pid, runner), before, strict=True)
        )
    out["ctx_ms"] = ctx_round_trip(c, invoke_url(loop))
    out["healthz"] = [timed(c, "GET", "/healthz") for _ in range(N_SEQ)]
    out |= protocols.three_ways(port, ws, py, N_SEQ)
    c.close()
    out["rate"], out["loaded"] = asyncio.run(throughput(port, invoke_url(py)))
    out["memory"] = density.settled(pid, int(os.environ.get("TOOLKILN_SANDBOX_WARM", "8")))
    return out


def measured_on(kind: str) -> Measured:
    with databases.fresh(kind) as url, tempfile.TemporaryDirectory(prefix="toolkiln-bench-") as tmp:
        port = free_port()
        proc = start_service(Path(tmp), port, database_url=url)
        try:
            return measure_service(port, proc.pid)
        finally:
            stop(proc)


def _q(m: Measured, name: str, p: float = 0.5) -> float:
    samples = m[name]
    assert isinstance(samples, list)
    return pct(samples, p)


def _p(samples: object) -> str:
    assert isinstance(samples, list)
    return f"{pct(samples, 0.5):.2f} / {pct(samples, 0.99):.2f} ms"


def _vs_rest(way: str) -> Callable[[Measured], str]:
    return lambda m: f"{_p(m[way])} ({_q(m, way) / _q(m, 'rest'):.2f}x)"


def _cpu(name: str) -> Callable[[Measured], str]:
    def cell(m: Measured) -> str:
        parts = m[f"{name}_cpu"]  # service, runner, sandbox
        assert isinstance(parts, tuple)
        return " / ".join(f"{v:.2f}" for v in parts) + " ms"

    return cell


def _rate(m: Measured) -> str:
    return (
        f"{m['rate']:.0f} calls/s (p50 {_q(m, 'loaded'):.1f}, p99 {_q(m, 'loaded', 0.99):.1f} ms)"
    )


def _times(base: list[float] | None, name: str) -> Callable[[Measured], float]:
    """How many times faster than ``base`` the tool's p50 is (0 when not measured)."""
    return lambda m: 0.0 if base is None else pct(base, 0.5) / _q(m, name)


Row = tuple[str, Callable[[Measured], str], str, Callable[[Measured], bool] | None]


def rows(fresh: list[float], node: list[float] | None, floor: list[float]) -> list[Row]:
    """Each figure: its cell, its goal, and whether a service met it."""
    vs_fresh, vs_node = _times(fresh, "python"), _times(node, "javascript")
    node_p50 = "node not installed" if node is None else f"{pct(node, 0.5):.1f} ms p50"
    return [
        ("Python tool over HTTP (REST invoke), p50 / p99", lambda m: _p(m["python"]), "<= 1.5 / <= 5 ms",
         lambda m: _q(m, "python") <= 1.5 and _q(m, "python", 0.99) <= 5),
        ("JavaScript tool over HTTP, p50 / p99", lambda m: _p(m["javascript"]), "<= 2 / <= 6 ms",
         lambda m: _q(m, "javascript") <= 2 and _q(m, "javascript", 0.99) <= 6),
        ("the Python tool, REST invoke in the rounds below, p50 / p99", lambda m: _p(m["rest"]), "", None),
        ("MCP `tools/call`, one session, p50 / p99 (x REST p50)", _vs_rest("mcp"), "<= 1.25x",
         lambda m: _q(m, "mcp") <= 1.25 * _q(m, "rest")),
        ("agent tool-call (`POST .../tool-calls`), p50 / p99 (x REST p50)", _vs_rest("agent"), "<= 1.25x",
         lambda m: _q(m, "agent") <= 1.25 * _q(m, "rest")),
        (f"throughput, {CONC} clients for {SECONDS:.0f} s, Python tool", _rate, ">= 500 calls/s",
         lambda m: float(str(m["rate"])) >= 500),
        ("one `ctx.tools.calculate` round trip", lambda m: f"{m['ctx_ms']:.3f} ms", "<= 0.15 ms",
         lambda m: float(str(m["ctx_ms"])) <= 0.15),
        ("CPU per call, service / runner / sandbox, Python", _cpu("python"), "", None),
        ("CPU per call, service / runner / sandbox, JavaScript", _cpu("javascript"), "", None),
        ("`GET /healthz`, p50 / p99", lambda m: _p(m["healthz"]), "", None),
        ("the HTTP floor: a bare FastAPI GET on the same uvicorn (no database)", lambda m: _p(floor), "", None),
        (f"vs a fresh `python3 -I -S` per call ({pct(fresh, 0.5):.1f} ms p50)",
         lambda m: f"{vs_fresh(m):.1f}x", ">= 10x", lambda m: vs_fresh(m) >= 10),
        (f"vs a Node worker thread + vm per call ({node_p50})",
         lambda m: f"{vs_node(m):.1f}x" if node else "-", ">= 10x", None if node is None else lambda m: vs_node(m) >= 10),
    ]  # fmt: skip


def table(
    found: dict[str, Measured], fresh: list[float], node: list[float] | None, floor: list[float]
) -> list[str]:
    labels = [databases.LABELS[k] for k in found]
    out = [f"| figure | {' | '.join(labels)} | goal |", "|---" * (len(found) + 2) + "|"]
    for what, cell, goal, ok in rows(fresh, node, floor):
        if ok is not None:
            met = [databases.LABELS[k] for k, m in found.items() if ok(m)]
            goal += f": met on {', '.join(met)}" if met else ": not met"
        out.append(f"| {what} | {' | '.join(cell(m) for m in found.values())} | {goal} |")
    return out


def main() -> None:
    kinds, missing = databases.kinds()
    if missing:
        print(f"PostgreSQL not measured: {missing}; SQLite only.")
    if os.environ.get("BENCH_ONLY") == "shapes":  # the runner shapes alone
        print("\n".join(shapes_table(kinds)))
        return
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f} at the start; python {sys.version.split()[0]}"
    )
    found = {kind: measured_on(kind) for kind in kinds}
    fresh = baselines.fresh_python(N_BASE)
    node = baselines.node_worker(N_BASE)
    floor = baselines.fastapi_floor(free_port(), N_SEQ)
    print(f"python isolation layers on: {found['sqlite']['isolation']}")
    print()
    print("\n".join(table(found, fresh, node, floor)))
    print()
    memory = {databases.LABELS[k]: m["memory"] for k, m in found.items()}
    print("\n".join(density.lines(memory)))  # type: ignore[arg-type]
    print()
    print("\n".join(shapes_table(kinds)))
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")


if __name__ == "__main__":
    main()
