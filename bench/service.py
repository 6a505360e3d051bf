"""What every bench script starts and calls: a real `toolkiln serve` (on the database it is
given), a `toolkiln runner` of its own, the bench's tools, and timed calls over one
keep-alive connection."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from client import Conn

TOKEN = "bench-admin-token"
PY_TOOL = "def main(**params):\n    return {'message': 'ok'}\n"
JS_TOOL = "function main(params) { return { message: 'ok' } }"
CTX_TOOL = (
    "def handle(input, ctx):\n"
    "    for i in range(input['n']):\n"
    "        ctx.tools.calculate({'expression': '1+1'})\n"
    "    return 1\n"
)
CTX_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}
N_SEQ = int(os.environ.get("BENCH_SEQ", "500"))
CTX_CALLS = 50
WARM_UP = 50
EXE = Path(sys.executable).parent / "toolkiln"
RUNNER_TOKEN = "bench-runner-token"


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * p))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    data: Path,
    port: int,
    extra: dict[str, str] | None = None,
    exe: Path = EXE,
    database_url: str | None = None,
) -> subprocess.Popen[bytes]:
    """``toolkiln serve`` on ``database_url`` (None: SQLite in ``data``); returns once
    healthy. ``TOOLKILN_*`` variables of the bench's environment reach it, but for the
    database, which is the one given."""
    env = {k: v for k, v in os.environ.items() if k != "TOOLKILN_DATABASE_URL"}
    env |= {"TOOLKILN_DATA_DIR": str(data), "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN, **(extra or {})}
    if database_url is not None:
        env["TOOLKILN_DATABASE_URL"] = database_url
    data.mkdir(parents=True, exist_ok=True)
    log = data / "serve.log"
    proc = subprocess.Popen(
        [str(exe), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
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
    raise SystemExit(f"the service did not become healthy: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def workspace(c: Conn) -> str:
    return str(c.call("GET", "/v1/workspaces")[1]["data"][0]["id"])


def create(c: Conn, ws: str, name: str, language: str, code: str, **extra: object) -> str:
    """A tool; its id."""
    body = {"workspace_id": ws, "name": name, "language": language, "code": code, **extra}
    status, answer = c.call("POST", "/v1/custom-tools", body)
    assert status == 201, answer
    return str(answer["data"]["id"])


def invoke_url(tool_id: str) -> str:
    return f"/v1/custom-tools/{tool_id}/invoke"


def timed(c: Conn, method: str, path: str, body: object = None) -> float:
    t = time.perf_counter()
    status, answer = c.call(method, path, body)
    took = (time.perf_counter() - t) * 1000
    assert status == 200, answer
    if path.endswith("/invoke") or path.endswith("/tool-calls"):
        assert answer["data"]["status"] == "ok", answer
    return took


def sequential(c: Conn, url: str, body: object, n: int) -> list[float]:
    for _ in range(min(WARM_UP, n)):
        timed(c, "POST", url, body)
    return [timed(c, "POST", url, body) for _ in range(n)]


def ctx_round_trip(c: Conn, loop_url: str) -> float:
    """One ctx call: (median of runs making CTX_CALLS - median of runs making none) / CTX_CALLS."""
    with_calls, without = [], []
    for _ in range(30):
        with_calls.append(timed(c, "POST", loop_url, {"input": {"n": CTX_CALLS}}))
        without.append(timed(c, "POST", loop_url, {"input": {"n": 0}}))
    return (statistics.median(with_calls) - statistics.median(without)) / CTX_CALLS
