"""Invocation latency and throughput over HTTP, next to two simple alternatives.

Run with `make bench`. It starts a real `toolkiln serve` (SQLite in a temporary data dir,
all isolation layers on), creates a trivial Python tool, and measures:
  1. sequential HTTP invocations (one keep-alive client): p50/p99;
  2. 16 concurrent clients for a fixed number of calls: throughput, p50/p99;
and, run by this same script on the same machine, the baselines:
  3. a fresh `python -I -S` process per call (subprocess, result as JSON on stdout);
  4. seed 001's design: a Node worker thread running `vm.runInNewContext` per call.
Nothing here is part of the test run; it prints its figures and exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

TOKEN = "bench-admin-token"
TOOL = "def main(**params):\n    return {'message': 'ok'}\n"
JS_TOOL = "function main(params) { return { message: 'ok' } }"
N_SEQ = int(os.environ.get("BENCH_SEQ", "1000"))
N_CONC = int(os.environ.get("BENCH_CONC_CALLS", "3000"))
CONC = int(os.environ.get("BENCH_CONCURRENCY", "16"))


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p))]


def row(name: str, lat: list[float], rate: float | None) -> str:
    r = f"{rate:8.0f}" if rate else "       -"
    return f"| {name:<52} | {pct(lat, 0.5):7.2f} | {pct(lat, 0.99):7.2f} | {r} |"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(data: Path, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TOOLKILN_DATA_DIR": str(data),
        "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
        "TOOLKILN_SANDBOX_WARM": os.environ.get("TOOLKILN_SANDBOX_WARM", "16"),
    }
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
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the service did not become healthy")


def bench_http(port: int, language: str = "python") -> list[str]:
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    code = TOOL if language == "python" else JS_TOOL
    with httpx.Client(base_url=base, headers=auth) as c:
        ws = c.get("/v1/workspaces").json()["data"][0]["id"]
        tool = c.post(
            "/v1/custom-tools",
            json={
                "workspace_id": ws,
                "name": f"bench-{language}",
                "language": language,
                "code": code,
            },
        ).json()["data"]
        url = f"/v1/custom-tools/{tool['id']}/invoke"
        iso = c.get("/v1/custom-tools/runtimes").json()["data"][language]["isolation"]
        for _ in range(50):
            c.post(url, json={"input": {}})
        lat = []
        for _ in range(N_SEQ):
            t = time.perf_counter()
            r = c.post(url, json={"input": {}})
            lat.append((time.perf_counter() - t) * 1000)
            assert r.json()["data"]["status"] == "ok", r.text
    name = "Toolkiln" if language == "python" else "Toolkiln, JavaScript"
    rows = [row(f"{name}, HTTP, sequential (1 client)", lat, 1000 / statistics.mean(lat))]
    conc_lat, rate = asyncio.run(_concurrent(base, auth, url))
    rows.append(row(f"{name}, HTTP, {CONC} concurrent clients", conc_lat, rate))
    print(f"{language} isolation layers on: {json.dumps(iso)}")
    return rows


async def _concurrent(base: str, auth: dict[str, str], url: str) -> tuple[list[float], float]:
    lat: list[float] = []
    left = N_CONC
    limits = httpx.Limits(max_connections=CONC, max_keepalive_connections=CONC)
    async with httpx.AsyncClient(base_url=base, headers=auth, limits=limits, timeout=60) as c:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t = time.perf_counter()
                r = await c.post(url, json={"input": {}})
                lat.append((time.perf_counter() - t) * 1000)
                assert r.json()["data"]["status"] == "ok", r.text

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONC)))
        elapsed = time.perf_counter() - start
    return lat, len(lat) / elapsed


def concurrently(once: Callable[[], float], calls: int) -> tuple[list[float], float]:
    """Run ``once`` from CONC threads until ``calls`` are done: latencies and calls/s."""
    lat: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(calls // CONC):
            d = once()
            with lock:
                lat.append(d)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(CONC)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return lat, len(lat) / (time.perf_counter() - start)


def bench_sandbox_only() -> list[str]:
    """The sandbox alone (no HTTP, no database), to split the cost."""
    from toolkiln.domain.execution import RunRequest
    from toolkiln.sandbox.packages import PackageStore
    from toolkiln.sandbox.runner import PythonSandbox

    with tempfile.TemporaryDirectory(prefix="toolkiln-bench-pkgs-") as tmp:
        sandbox = PythonSandbox(PackageStore(Path(tmp)), warm=16)
        try:
            req = RunRequest("python", TOOL, "main", {}, 5000)

            class Link:
                def admit(self) -> bool:
                    return True

                def call(self, name: str, payload: object) -> object:
                    return None

                def audit(self, event: str, data: object) -> None:
                    return None

            def once() -> float:
                t = time.perf_counter()
                out = sandbox.run(req, Link())
                assert out.kind == "return", out
                return (time.perf_counter() - t) * 1000

            for _ in range(50):
                once()
            seq = [once() for _ in range(N_SEQ)]
            conc, rate = concurrently(once, N_CONC)
        finally:
            sandbox.close()
    return [
        row("sandbox only (no HTTP, no DB), sequential", seq, 1000 / statistics.mean(seq)),
        row(f"sandbox only, {CONC} concurrent threads", conc, rate),
    ]


def bench_fresh_python() -> list[str]:
    code = TOOL + "import json\nprint(json.dumps(main()))\n"
    cmd = [sys.executable, "-I", "-S", "-c", code]
    lat = []
    for _ in range(200):
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, check=True, env={})
        json.loads(out.stdout)
        lat.append((time.perf_counter() - t) * 1000)

    def fresh() -> float:
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True, env={})
        return (time.perf_counter() - t) * 1000

    conc, rate = concurrently(fresh, 400)
    return [
        row(
            "fresh `python -I -S` per call (no HTTP), sequential", lat, 1000 / statistics.mean(lat)
        ),
        row(f"fresh `python -I -S` per call, {CONC} concurrent", conc, rate),
    ]


NODE = r"""
const { Worker } = require('node:worker_threads');
const src = `
  const { parentPort, workerData } = require('node:worker_threads');
  const vm = require('node:vm');
  const ctx = Object.create(null);
  ctx.input = JSON.parse(workerData);
  const out = vm.runInNewContext('(function main(p){ return {message: "ok"} })(input)', ctx, {timeout: 5000});
  parentPort.postMessage(JSON.stringify(out));
`;
function once() {
  return new Promise((resolve, reject) => {
    const t = process.hrtime.bigint();
    const w = new Worker(src, { eval: true, workerData: '{}' });
    w.once('message', (m) => { JSON.parse(m); resolve(Number(process.hrtime.bigint() - t) / 1e6); w.terminate(); });
    w.once('error', reject);
  });
}
(async () => {
  const seq = [];
  for (let i = 0; i < 200; i++) seq.push(await once());
  const conc = [];
  const t0 = process.hrtime.bigint();
  const C = Number(process.argv[process.argv.length - 1]);
  for (let b = 0; b < 400 / C; b++) conc.push(...await Promise.all(Array.from({length: C}, once)));
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ seq, conc, rate: conc.length / secs }));
})();
"""


def bench_node() -> list[str]:
    node = shutil.which("node")
    if node is None:
        return ["| Node worker thread + vm per call | node not installed | | |"]
    env = {k: v for k, v in os.environ.items() if k != "NODE_EXTRA_CA_CERTS"}
    out = subprocess.run(
        [node, "-e", NODE, str(CONC)], capture_output=True, text=True, check=True, env=env
    )
    data = json.loads(out.stdout)
    seq = data["seq"]
    return [
        row(
            "Node worker thread + vm.runInNewContext per call, seq.",
            seq,
            1000 / statistics.mean(seq),
        ),
        row(f"Node worker thread + vm per call, {CONC} concurrent", data["conc"], data["rate"]),
    ]


def main() -> None:
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    head = f"| {'what (trivial tool)':<52} | p50 ms  | p99 ms  | calls/s  |"
    rows = []
    with tempfile.TemporaryDirectory(prefix="toolkiln-bench-") as tmp:
        port = free_port()
        proc = start_service(Path(tmp), port)
        try:
            rows += bench_http(port)
            rows += bench_http(port, "javascript")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    rows += bench_sandbox_only()
    rows += bench_fresh_python()
    rows += bench_node()
    print(head)
    print("|" + "-" * 54 + "|---------|---------|----------|")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
