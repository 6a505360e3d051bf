"""The performance table of issue 15, in one run on one machine.

Run with `make bench`. It starts a real `toolkiln serve` (SQLite in a temporary data dir,
every isolation layer on, default settings), creates trivial tools, and measures over HTTP
with one keep-alive connection: a Python tool and a JavaScript tool (p50/p99 of BENCH_SEQ
calls, default 500), one `ctx.tools.calculate` round trip (an invocation making 50 calls
minus one making none, divided by 50), GET /healthz; then BENCH_CONCURRENCY clients
(default 16) invoking the Python tool for BENCH_SECONDS (default 10). Then it reads the
memory of the service and its sandbox processes, stops the service, and runs the baselines:
a fresh `python3 -I -S` per call, a Node worker thread + vm per call, and a bare FastAPI
route (the HTTP floor).

Nothing here is part of the test run; it prints its figures and exits.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import baselines
import density
from client import AsyncConn, Conn

TOKEN = "bench-admin-token"
PY_TOOL = "def main(**params):\n    return {'message': 'ok'}\n"
JS_TOOL = "function main(params) { return { message: 'ok' } }"
CTX_TOOL = (
    "def handle(input, ctx):\n"
    "    for i in range(input['n']):\n"
    "        ctx.tools.calculate({'expression': '1+1'})\n"
    "    return 1\n"
)
N_SEQ = int(os.environ.get("BENCH_SEQ", "500"))
CONC = int(os.environ.get("BENCH_CONCURRENCY", "16"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
N_BASE = int(os.environ.get("BENCH_BASELINE_CALLS", "200"))
CTX_CALLS = 50


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(data: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TOOLKILN_DATA_DIR": str(data), "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN}
    exe = Path(sys.executable).parent / "toolkiln"
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = Conn(port)
            try:
                if conn.call("GET", "/healthz")[0] == 200:
                    return proc
            finally:
                conn.close()
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the service did not become healthy")


def create(c: Conn, ws: str, name: str, language: str, code: str, **extra: object) -> str:
    body = {"workspace_id": ws, "name": name, "language": language, "code": code, **extra}
    status, body = c.call("POST", "/v1/custom-tools", body)
    assert status == 201, body
    return f"/v1/custom-tools/{body['data']['id']}/invoke"


def timed(c: Conn, method: str, path: str, body: object = None) -> float:
    t = time.perf_counter()
    status, answer = c.call(method, path, body)
    took = (time.perf_counter() - t) * 1000
    assert status == 200, answer
    if path.endswith("/invoke"):
        assert answer["data"]["status"] == "ok", answer
    return took


def sequential(c: Conn, url: str, body: object, n: int) -> list[float]:
    for _ in range(min(50, n)):
        timed(c, "POST", url, body)
    return [timed(c, "POST", url, body) for _ in range(n)]


async def throughput(port: int, url: str) -> tuple[float, list[float]]:
    conns = [await AsyncConn.open(port, TOKEN) for _ in range(CONC)]
    lat: list[float] = []
    stop = time.perf_counter() + SECONDS

    async def client(conn: AsyncConn) -> None:
        while time.perf_counter() < stop:
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


def measure_service(port: int, pid: int) -> dict[str, object]:
    c = Conn(port, TOKEN)
    ws = c.call("GET", "/v1/workspaces")[1]["data"][0]["id"]
    py = create(c, ws, "bench-python", "python", PY_TOOL)
    js = create(c, ws, "bench-js", "javascript", JS_TOOL)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    loop = create(c, ws, "bench-ctx", "python", CTX_TOOL, input_schema=schema)
    out: dict[str, object] = {}
    out["isolation"] = c.call("GET", "/v1/custom-tools/runtimes")[1]["data"]["python"]["isolation"]
    for name, url in (("python", py), ("javascript", js)):
        before = density.cpu_ms(pid), density.tree_cpu_ms(pid)
        out[name] = sequential(c, url, {"input": {}}, N_SEQ)
        calls = len(out[name]) + min(50, N_SEQ)  # the warm-up calls count too
        out[f"{name}_cpu"] = (
            (density.cpu_ms(pid) - before[0]) / calls,
            (density.tree_cpu_ms(pid) - before[1]) / calls,
        )
    with_calls, without = [], []
    for _ in range(30):
        with_calls.append(timed(c, "POST", loop, {"input": {"n": CTX_CALLS}}))
        without.append(timed(c, "POST", loop, {"input": {"n": 0}}))
    out["ctx_ms"] = (statistics.median(with_calls) - statistics.median(without)) / CTX_CALLS
    out["healthz"] = [timed(c, "GET", "/healthz") for _ in range(N_SEQ)]
    c.close()
    out["rate"], out["loaded"] = asyncio.run(throughput(port, py))
    out["memory"] = density.settled(pid, int(os.environ.get("TOOLKILN_SANDBOX_WARM", "8")))
    return out


def table(
    m: dict[str, object], fresh: list[float], node: list[float] | None, floor: list[float]
) -> list[str]:
    py, js, hz = m["python"], m["javascript"], m["healthz"]
    assert isinstance(py, list) and isinstance(js, list) and isinstance(hz, list)
    loaded = m["loaded"]
    assert isinstance(loaded, list)
    rows = [
        "| figure | measured |",
        "|---|---|",
        f"| Python tool over HTTP, p50 / p99 | {pct(py, 0.5):.2f} / {pct(py, 0.99):.2f} ms |",
        f"| JavaScript tool over HTTP, p50 / p99 | {pct(js, 0.5):.2f} / {pct(js, 0.99):.2f} ms |",
        f"| throughput, {CONC} clients for {SECONDS:.0f} s, Python tool | {m['rate']:.0f} calls/s"
        f" (p50 {pct(loaded, 0.5):.1f} ms, p99 {pct(loaded, 0.99):.1f} ms under load) |",
        f"| one `ctx.tools.calculate` round trip | {m['ctx_ms']:.3f} ms |",
        "| CPU per sequential call: service / sandbox processes, Python | "
        "{:.2f} / {:.2f} ms |".format(*m["python_cpu"]),  # type: ignore[str-format]
        "| CPU per sequential call: service / sandbox processes, JavaScript | "
        "{:.2f} / {:.2f} ms |".format(*m["javascript_cpu"]),  # type: ignore[str-format]
        f"| `GET /healthz`, p50 / p99 | {pct(hz, 0.5):.2f} / {pct(hz, 0.99):.2f} ms |",
        f"| the HTTP floor: a bare FastAPI GET on the same uvicorn, p50 / p99 "
        f"| {pct(floor, 0.5):.2f} / {pct(floor, 0.99):.2f} ms |",
        f"| vs a fresh `python3 -I -S` per call ({pct(fresh, 0.5):.1f} ms p50) "
        f"| {pct(fresh, 0.5) / pct(py, 0.5):.1f}x faster |",
    ]
    if node is None:
        rows.append("| vs a Node worker thread + vm per call | node not installed |")
    else:
        rows.append(
            f"| vs a Node worker thread + vm per call ({pct(node, 0.5):.1f} ms p50) "
            f"| {pct(node, 0.5) / pct(js, 0.5):.1f}x faster |"
        )
    return rows


def main() -> None:
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f}; python {sys.version.split()[0]}"
    )
    with tempfile.TemporaryDirectory(prefix="toolkiln-bench-") as tmp:
        port = free_port()
        proc = start_service(Path(tmp), port)
        try:
            measured = measure_service(port, proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    fresh = baselines.fresh_python(N_BASE)
    node = baselines.node_worker(N_BASE)
    floor = baselines.fastapi_floor(free_port(), N_SEQ)
    print(f"python isolation layers on: {measured['isolation']}")
    print()
    print("\n".join(table(measured, fresh, node, floor)))
    print()
    print("| memory (after the load run) | USS / PSS |")
    print("|---|---|")
    memory = measured["memory"]
    assert isinstance(memory, dict)
    print("\n".join(density.lines(memory)))


if __name__ == "__main__":
    main()
