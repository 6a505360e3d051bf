"""The performance table of docs/benchmarks.md, in one run on one machine.

Run with `make bench`. It starts a real `toolkiln serve` (SQLite in a temporary data dir,
every isolation layer on, default settings), creates trivial tools, and measures over HTTP
with one keep-alive connection: a Python tool and a JavaScript tool (p50/p99 of BENCH_SEQ
calls, default 500), one `ctx.tools.calculate` round trip (an invocation making 50 calls
minus one making none, divided by 50), GET /healthz; then BENCH_CONCURRENCY clients
(default 16) invoking the Python tool for BENCH_SECONDS (default 10). Then it reads the
memory of the service and its sandbox processes, stops the service, and runs the baselines:
a fresh `python3 -I -S` per call, a Node worker thread + vm per call, and a bare FastAPI
route (the HTTP floor). Last, the runner shapes side by side: the embedded
default (the runner `serve` starts, on a Unix socket) against a `toolkiln runner` of its own
reached over loopback TCP, each measured in turn on a service of its own (BENCH_SEQ
sequential calls of the Python and JavaScript tools, the ctx round trip).

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


EXE = Path(sys.executable).parent / "toolkiln"
RUNNER_TOKEN = "bench-runner-token"


def start_runner(data: Path, port: int, exe: Path = EXE) -> subprocess.Popen[bytes]:
    """A ``toolkiln runner`` on loopback TCP; returns once it listens."""
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/"),
        "TOOLKILN_DATA_DIR": str(data),
        "TOOLKILN_RUNNER_TOKEN": RUNNER_TOKEN,
    }
    log = data.parent / "runner.log"
    data.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [str(exe), "runner", "--listen", f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "runner listening on" in log.read_text(errors="replace"):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the runner did not start: {log.read_text(errors='replace')[-2000:]}")


def start_service(
    data: Path, port: int, extra: dict[str, str] | None = None, exe: Path = EXE
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TOOLKILN_DATA_DIR": str(data),
        "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
        **(extra or {}),
    }
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


def shape(tmp: Path, remote: bool) -> dict[str, object]:
    """Sequential Python and JavaScript calls and the ctx round trip on a service whose
    runner is its own (embedded) or a ``toolkiln runner`` over loopback TCP."""
    runner = None
    extra: dict[str, str] = {}
    if remote:
        rport = free_port()
        runner = start_runner(tmp / "runner" / "data", rport)
        extra = {"TOOLKILN_RUNNERS": f"127.0.0.1:{rport}", "TOOLKILN_RUNNER_TOKEN": RUNNER_TOKEN}
    port = free_port()
    proc = start_service(tmp / "api", port, extra)
    try:
        c = Conn(port, TOKEN)
        ws = c.call("GET", "/v1/workspaces")[1]["data"][0]["id"]
        out: dict[str, object] = {}
        py = create(c, ws, "bench-python", "python", PY_TOOL)
        js = create(c, ws, "bench-js", "javascript", JS_TOOL)
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
        loop = create(c, ws, "bench-ctx", "python", CTX_TOOL, input_schema=schema)
        out["python"] = sequential(c, py, {"input": {}}, N_SEQ)
        out["javascript"] = sequential(c, js, {"input": {}}, N_SEQ)
        with_calls, without = [], []
        for _ in range(30):
            with_calls.append(timed(c, "POST", loop, {"input": {"n": CTX_CALLS}}))
            without.append(timed(c, "POST", loop, {"input": {"n": 0}}))
        out["ctx_ms"] = (statistics.median(with_calls) - statistics.median(without)) / CTX_CALLS
        c.close()
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if runner is not None:
            runner.terminate()
            runner.wait(timeout=60)


def shapes_table() -> list[str]:
    """The embedded default and a runner over loopback TCP, side by side."""
    with tempfile.TemporaryDirectory(prefix="toolkiln-bench-shapes-") as tmp:
        embedded = shape(Path(tmp) / "embedded", remote=False)
        tcp = shape(Path(tmp) / "tcp", remote=True)
    rows = [
        "| figure | embedded runner (Unix socket) | runner over loopback TCP | TCP - embedded |",
        "|---|---|---|---|",
    ]
    for name in ("python", "javascript"):
        a, b = embedded[name], tcp[name]
        assert isinstance(a, list) and isinstance(b, list)
        rows.append(
            f"| {name} tool over HTTP, p50 / p99 | {pct(a, 0.5):.2f} / {pct(a, 0.99):.2f} ms "
            f"| {pct(b, 0.5):.2f} / {pct(b, 0.99):.2f} ms | {pct(b, 0.5) - pct(a, 0.5):+.2f} ms p50 |"
        )
    e, t = embedded["ctx_ms"], tcp["ctx_ms"]
    assert isinstance(e, float) and isinstance(t, float)
    rows.append(
        f"| one `ctx.tools.calculate` round trip | {e:.3f} ms | {t:.3f} ms | {t - e:+.3f} ms |"
    )
    return rows


def main() -> None:
    if os.environ.get("BENCH_ONLY") == "shapes":  # the runner shapes alone
        print("\n".join(shapes_table()))
        return
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
    print()
    print("\n".join(shapes_table()))


if __name__ == "__main__":
    main()
