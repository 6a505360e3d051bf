"""What checking tool code costs a save, and what code made to be slow to parse costs.

Starts a real `toolkiln serve` (SQLite in a temporary data dir, default settings) and, over
HTTP with one keep-alive connection: BENCH_SAVES (default 200) validates and creates of an
ordinary tool, each with code the service has not seen (every one parsed), then the same
validate repeated (the workspace's analysis kept); p50 and p99 of each. Then a 256 KiB
f-string of 65,000 `{1=}` fields and 256 KB of bracket junk sent to validate: how long until
each is refused, and the slowest `/healthz` answered from another connection meanwhile.
Last, without the service: an ordinary tool's analysis in this process, in a checker, and
through a runner process's ``Analyse`` (2 x BENCH_SAVES new texts each), p50 and p99.

Run as `python bench/checks.py`; with `PYTHONPATH=<another checkout>/src` it measures that
checkout's service instead (the figures of docs/decisions are its before and after). Nothing
here is part of the test run.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from client import Conn
from service import TOKEN, free_port, pct, start_service

N = int(os.environ.get("BENCH_SAVES", "200"))
TOOL = (
    "import json\n"
    "def main(**params):\n"
    "    order = params.get('order_id', {n})\n"
    "    return {{'message': f'Order {{order}} is shipped', 'rawData': {{'n': {n}}}}}\n"
)
FSTRING = "def main(**p):\n    return {'message': f'" + "{1=}" * 65_000 + "'}\n"
BRACKETS = "function main(p) { return " + "([{" * 87_000 + "}\n"


ROUNDS = ["warm", "v", "s", "c"]  # the tag of each round of saves


def body(ws: str, name: str, code: str, language: str = "python") -> dict[str, object]:
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}}}
    return {
        "workspace_id": ws,
        "name": name,
        "language": language,
        "code": code,
        "input_schema": schema,
    }


def saves(c: Conn, ws: str, path: str, status: int, tag: str, fresh: bool = True) -> list[float]:
    """Each text new to the service when ``fresh`` (each round its own numbers), else one."""
    base = 10**6 * (1 + ROUNDS.index(tag))
    lat = []
    for i in range(N):
        code = TOOL.format(n=base + i if fresh else 0)
        t = time.perf_counter()
        got, answer = c.call("POST", path, body(ws, f"{tag}-{i}", code))
        lat.append((time.perf_counter() - t) * 1000)
        assert got == status, answer
    return lat


def refusal(port: int, ws: str, language: str, code: str) -> tuple[int, float, float, int]:
    """The answer's status, ms until it came, the slowest /healthz meanwhile, and how many
    answered."""
    healthz: list[float] = []
    done = threading.Event()

    def probe() -> None:
        c = Conn(port)
        while not done.is_set():
            t = time.perf_counter()
            assert c.call("GET", "/healthz")[0] == 200
            healthz.append((time.perf_counter() - t) * 1000)
        c.close()

    prober = threading.Thread(target=probe)
    c = Conn(port, TOKEN)
    prober.start()
    t = time.perf_counter()
    status, _ = c.call("POST", "/v1/custom-tools/validate", body(ws, "slow", code, language))
    took = (time.perf_counter() - t) * 1000
    done.set()
    prober.join()
    c.close()
    return status, took, max(healthz, default=0.0), len(healthz)


JS_TOOL = (
    "import _ from 'lodash';\n"
    "export function main(p) {{ const n = {n}; return {{ message: `Order ${{p.order_id}} ${{n}}` }} }}\n"
)


def analysis_alone() -> None:
    try:
        from toolkiln.domain.code_check import analyse
        from toolkiln.sandbox.checks import CheckerPool
    except ImportError:
        return  # a checkout without code checkers
    remote = _remote_analyser()
    pool = CheckerPool()
    try:
        pool.analyse("python", TOOL.format(n=-1), "bench")
        if remote is not None:
            remote[0].analyse("python", TOOL.format(n=-1), "bench")
        for language, src in (("python", TOOL), ("javascript", JS_TOOL)):
            here, there, runner = [], [], []
            for i in range(2 * N):
                t = time.perf_counter()
                assert not analyse(language, src.format(n=i)).problems
                here.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                assert not pool.analyse(language, src.format(n=i + 10**6), "bench").problems
                there.append((time.perf_counter() - t) * 1000)
                if remote is not None:
                    t = time.perf_counter()
                    code = src.format(n=i + 2 * 10**6)
                    assert not remote[0].analyse(language, code, "bench").problems
                    runner.append((time.perf_counter() - t) * 1000)
            print(
                f"analysis, {language:10}  here p50 {pct(here, 0.5):.3f} ms p99 "
                f"{pct(here, 0.99):.3f} ms; in a checker p50 {pct(there, 0.5):.3f} ms p99 "
                f"{pct(there, 0.99):.3f} ms"
            )
            if runner:
                print(
                    f"analysis, {language:10}  through a runner (Analyse, Unix socket) p50 "
                    f"{pct(runner, 0.5):.3f} ms p99 {pct(runner, 0.99):.3f} ms"
                )
    finally:
        pool.close()
        if remote is not None:
            remote[1]()


def _remote_analyser() -> tuple[Any, Any] | None:
    """The API's analyser on a runner process of its own (the embedded runner's shape), and
    what stops it; None in a checkout without ``Analyse``."""
    try:
        from toolkiln.config import RunnerSettings
        from toolkiln.runners.analyser import RemoteAnalyser
        from toolkiln.runners.fleet import Fleet
        from toolkiln.runners.local import LocalRunner
    except ImportError:
        return None
    data = Path(tempfile.mkdtemp(prefix="bench-checks-"))
    local = LocalRunner(RunnerSettings(data_dir=data, sandbox_warm=1, sandbox_js_workers=1))
    fleet = Fleet([local.address], local.token)

    def stop() -> None:
        fleet.close()
        local.stop()

    return RemoteAnalyser(fleet), stop


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start_service(Path(tmp), port)
        try:
            c = Conn(port, TOKEN)
            ws = c.call("GET", "/v1/workspaces")[1]["data"][0]["id"]
            saves(c, ws, "/v1/custom-tools/validate", 200, "warm")
            rows = {
                "validate, new code": saves(c, ws, "/v1/custom-tools/validate", 200, "v"),
                "validate, same code": saves(c, ws, "/v1/custom-tools/validate", 200, "s", False),
                "create, new code": saves(c, ws, "/v1/custom-tools", 201, "c"),
            }
            for name, lat in rows.items():
                print(f"{name:22} p50 {pct(lat, 0.5):7.2f} ms   p99 {pct(lat, 0.99):7.2f} ms")
            for language, code in (("python", FSTRING), ("javascript", BRACKETS)):
                status, took, worst, answered = refusal(port, ws, language, code)
                print(
                    f"256 KiB {language:10} answered {status} in {took:6.0f} ms; /healthz "
                    f"meanwhile: {answered} answers, slowest {worst:.0f} ms"
                )
            c.close()
        finally:
            proc.terminate()
            proc.wait(30)
    analysis_alone()


if __name__ == "__main__":
    main()
