"""A/B of the runner shapes in one run: services started side by side and measured in
alternating rounds, so a busy machine weighs on each alike.

``python bench/runner_ab.py [OTHER]``: the embedded runner (Unix socket) and a runner over
loopback TCP of this checkout; given OTHER, another checkout with its ``.venv`` (``make
install``; e.g. a worktree of main), its two shapes too, or, given another checkout's
``src`` (e.g. of main before runners), that code's ``serve`` alone. Prints each shape's p50
/ p99 of a trivial Python and JavaScript tool over HTTP and the ctx round trip. Not part of
the test run.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from client import Conn
from service import (
    CTX_CALLS,
    CTX_TOOL,
    EXE,
    JS_TOOL,
    PY_TOOL,
    RUNNER_TOKEN,
    TOKEN,
    create,
    free_port,
    invoke_url,
    pct,
    start_runner,
    start_service,
    timed,
)

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "8"))
PER_ROUND = int(os.environ.get("BENCH_PER_ROUND", "100"))


def main() -> None:
    other = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    with tempfile.TemporaryDirectory(prefix="toolkiln-ab-") as tmp:
        root = Path(tmp)
        procs = []
        shapes: dict[str, int] = {}

        def both(label: str, exe: Path) -> None:
            port = free_port()
            procs.append(start_service(root / label / "embedded", port, exe=exe))
            shapes[f"{label}: embedded runner (Unix socket)"] = port
            rport = free_port()
            procs.append(start_runner(root / label / "runner" / "data", rport, exe=exe))
            port = free_port()
            extra = {
                "TOOLKILN_RUNNERS": f"127.0.0.1:{rport}",
                "TOOLKILN_RUNNER_TOKEN": RUNNER_TOKEN,
            }
            procs.append(start_service(root / label / "tcp", port, extra, exe=exe))
            shapes[f"{label}: runner over loopback TCP"] = port

        try:
            if other is not None and (other / ".venv" / "bin" / "toolkiln").exists():
                both("given checkout", other / ".venv" / "bin" / "toolkiln")
            elif other is not None:
                port = free_port()
                procs.append(start_service(root / "other", port, {"PYTHONPATH": str(other)}))
                shapes["given source, serve alone"] = port
            both("this checkout", EXE)
            alternate(shapes)
            results = {name: ROUNDS_RESULTS[port_] for name, port_ in shapes.items()}
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(60)
    print(
        f"load average {os.getloadavg()[0]:.1f}; {ROUNDS} rounds x {PER_ROUND} calls, alternating"
    )
    print("| shape | Python p50 / p99 | JavaScript p50 / p99 | ctx round trip |")
    print("|---|---|---|---|")
    for name, r in results.items():
        py, js, ctx = r["python"], r["javascript"], r["ctx"]
        print(
            f"| {name} | {pct(py, 0.5):.2f} / {pct(py, 0.99):.2f} ms "
            f"| {pct(js, 0.5):.2f} / {pct(js, 0.99):.2f} ms | {statistics.median(ctx):.3f} ms |"
        )


ROUNDS_RESULTS: dict[int, dict[str, list[float]]] = {}


def alternate(shapes: dict[str, int]) -> None:
    conns, urls = {}, {}
    for port in shapes.values():
        c = Conn(port, TOKEN)
        ws = c.call("GET", "/v1/workspaces")[1]["data"][0]["id"]
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
        urls[port] = (
            invoke_url(create(c, ws, "ab-python", "python", PY_TOOL)),
            invoke_url(create(c, ws, "ab-js", "javascript", JS_TOOL)),
            invoke_url(create(c, ws, "ab-ctx", "python", CTX_TOOL, input_schema=schema)),
        )
        conns[port] = c
        ROUNDS_RESULTS[port] = {"python": [], "javascript": [], "ctx": []}
        for _ in range(50):
            timed(c, "POST", urls[port][0], {"input": {}})
            timed(c, "POST", urls[port][1], {"input": {}})
    for _ in range(ROUNDS):
        for port in conns:
            # A connection of its own per round: the service closes one idle past its
            # keep-alive (5 s), which the other shapes' rounds can take on a busy machine.
            conns[port].close()
            conns[port] = c = Conn(port, TOKEN)
            timed(c, "GET", "/healthz", None)
            py, js, loop = urls[port]
            out = ROUNDS_RESULTS[port]
            out["python"] += [timed(c, "POST", py, {"input": {}}) for _ in range(PER_ROUND)]
            out["javascript"] += [timed(c, "POST", js, {"input": {}}) for _ in range(PER_ROUND)]
            many = timed(c, "POST", loop, {"input": {"n": CTX_CALLS}})
            none = timed(c, "POST", loop, {"input": {"n": 0}})
            out["ctx"].append((many - none) / CTX_CALLS)
    for c in conns.values():
        c.close()


if __name__ == "__main__":
    main()
