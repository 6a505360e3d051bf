"""Cost flat over time: a service aged by mixed traffic against a fresh one, same machine.

``python bench/soak.py`` (``SOAK_SECONDS``, default 600; ``SOAK_WORKSPACES``, default 300).
It starts real ``toolkiln serve`` processes on their embedded defaults. The first is aged:
every workspace gets a token, a Python and a JavaScript tool, a tool that raises, a tool that
makes ``ctx`` calls and one that runs out of time; ``SOAK_CLIENTS`` (default 8) clients then
send a mix of calls for ``SOAK_SECONDS`` (ok calls in both languages, failures, timeouts,
memory hogs, nested ctx calls, test runs, new versions, refused saves). The second is fresh.
The third (``SOAK_RESTARTED``, default 1; 0: none) is "restarted": a new process on a copy of
the aged data, which tells what the data's age costs from what the process's age costs.
Then all are measured in rounds that change their order (``SOAK_ROUNDS``, default 6, of
``SOAK_CALLS`` sequential calls of each tool, default 200), so the machine's load falls on
each alike, and it prints each one's p50 / p99, its CPU per call (the service's, and its
runner's with everything under it, from /proc), and their ratios to fresh (the goal: within
1.10), with what the aged process holds: its memory, threads, open files, sandbox processes,
the data dir and the frames in its SQLite WAL when the traffic stopped. ``SOAK_HOLD=path``
keeps the services up for a profiler while that file exists.

Nothing here is part of the test run; it prints its figures and exits.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import density
from client import AsyncConn, Conn
from service import JS_TOOL, PY_TOOL, TOKEN, free_port, invoke_url, pct, start_service, stop
from service import create as create_tool

SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
WORKSPACES = int(os.environ.get("SOAK_WORKSPACES", "300"))
CLIENTS = int(os.environ.get("SOAK_CLIENTS", "8"))
ROUNDS = int(os.environ.get("SOAK_ROUNDS", "6"))
CALLS = int(os.environ.get("SOAK_CALLS", "200"))
RESTARTED = os.environ.get("SOAK_RESTARTED", "1") != "0"

RAISES = "def main(**params):\n    if params is not None:\n        raise ValueError('soak')\n    return 1\n"
CTX = "def handle(input, ctx):\n    return ctx.tools.calculate({'expression': '6*7'})\n"
SLOW = "def main(**params):\n    while True:\n        pass\n    return 1\n"
HOG = "def main(**params):\n    x = bytearray(1 << 30)\n    return len(x)\n"


def create(c: Conn, ws: str, name: str, language: str, code: str, **extra: object) -> str:
    return invoke_url(create_tool(c, ws, name, language, code, **extra))


def workspace(admin: Conn, port: int, i: int) -> dict[str, str]:
    """A workspace with its own token and tools; returns the paths the mix calls."""
    status, body = admin.call("POST", "/v1/workspaces", {"name": f"soak-{i}"})
    assert status == 201, body
    ws = body["data"]["id"]
    status, body = admin.call(
        "POST", "/v1/tokens", {"workspace_id": ws, "scopes": ["read", "write", "invoke"]}
    )
    assert status == 201, body
    token = body["data"]["token"]
    c = Conn(port, token)
    try:
        paths = {
            "token": token,
            "ws": ws,
            "python": create(c, ws, "py", "python", PY_TOOL),
            "javascript": create(c, ws, "js", "javascript", JS_TOOL),
            "raises": create(c, ws, "raises", "python", RAISES),
            "ctx": create(c, ws, "ctx", "python", CTX),
            "slow": create(c, ws, "slow", "python", SLOW, timeout_ms=100),
            "hog": create(c, ws, "hog", "python", HOG),
        }
    finally:
        c.close()
    return paths


def request(rng: random.Random, space: dict[str, str], kind: str) -> tuple[str, str, object]:
    """The method, path and body of one request of the mix."""
    if kind == "version":
        code = PY_TOOL.replace("'ok'", repr(f"ok {rng.random()}"))
        return "PATCH", space["python"].rsplit("/", 1)[0], {"code": code}
    if kind == "refused":
        body = {"workspace_id": space["ws"], "name": "x", "language": "python", "code": "def ("}
        return "POST", "/v1/custom-tools", body
    if kind == "test":
        draft = {"workspace_id": space["ws"], "name": "draft", "language": "javascript"}
        return "POST", "/v1/custom-tools/test", {**draft, "code": JS_TOOL, "input": {}}
    return "POST", space[kind], {"input": {}}


async def mix(port: int, spaces: list[dict[str, str]], stop: float, seen: dict[str, int]) -> None:
    """One client: a random workspace and a random kind of request, until ``stop``."""
    rng = random.Random()
    conns: dict[str, AsyncConn] = {}
    kinds = ["python"] * 6 + ["javascript"] * 4 + ["raises", "ctx", "ctx", "slow", "hog"]
    kinds += ["version", "refused", "test"]
    try:
        while time.monotonic() < stop:
            space = rng.choice(spaces)
            kind = rng.choice(kinds)
            method, path, body = request(rng, space, kind)
            conn = conns.pop(space["ws"], None)
            if len(conns) >= 16:
                conns.pop(next(iter(conns))).close()
            try:
                if conn is None:
                    raise ConnectionError
                status, _ = await conn.call(method, path, body)
            except (ConnectionError, asyncio.IncompleteReadError):
                # the service closes a connection left idle past its keep-alive
                if conn is not None:
                    conn.close()
                conn = await AsyncConn.open(port, space["token"])
                status, _ = await conn.call(method, path, body)
            conns[space["ws"]] = conn
            seen[f"{kind} {status}"] = seen.get(f"{kind} {status}", 0) + 1
            if kind in ("raises", "slow", "hog"):
                # three failures in a row disable a tool: an ok call of it in between
                # is not possible, so it is enabled again as a user would
                tool = space[kind].rsplit("/", 1)[0]
                await conn.call("POST", f"{tool}/enable", None)  # fresh from the call above
    finally:
        for conn in conns.values():
            conn.close()


def age(port: int) -> dict[str, object]:
    admin = Conn(port, TOKEN)
    started = time.monotonic()
    spaces = [workspace(admin, port, i) for i in range(WORKSPACES)]
    admin.close()
    made = time.monotonic() - started
    seen: dict[str, int] = {}

    async def run() -> None:
        stop = time.monotonic() + SECONDS
        await asyncio.gather(*(mix(port, spaces, stop, seen) for _ in range(CLIENTS)))

    asyncio.run(run())
    return {"made_s": made, "requests": seen}


def rounds(port: int, pid: int, py: str, js: str) -> dict[str, list[float]]:
    """``CALLS`` sequential calls of each tool: their times (ms), and the CPU each one cost
    the service (``api``) and its runner with everything under it (``runner``), per call."""
    c = Conn(port, TOKEN)
    runner = density.runner_of(pid)
    out: dict[str, list[float]] = {}
    try:
        for name, url in (("python", py), ("javascript", js)):
            api0 = density.cpu_ms(pid)
            run0 = density.cpu_ms(runner) + density.tree_cpu_ms(runner) if runner else 0.0
            out[name] = []
            for _ in range(CALLS):
                t = time.perf_counter()
                status, body = c.call("POST", url, {"input": {}})
                out[name].append((time.perf_counter() - t) * 1000)
                assert status == 200 and body["data"]["status"] == "ok", body
            run1 = density.cpu_ms(runner) + density.tree_cpu_ms(runner) if runner else 0.0
            out[f"{name} api"] = [(density.cpu_ms(pid) - api0) / CALLS]
            out[f"{name} runner"] = [(run1 - run0) / CALLS]
    finally:
        c.close()
    return out


def restarted_copy(aged: Path, into: Path) -> None:
    """The aged service's data, copied while it runs (SQLite's backup: one consistent
    state) with its key, for a new process: the data's age without the process's."""
    into.mkdir(parents=True)
    shutil.copy(aged / "secrets.key", into / "secrets.key")
    src = sqlite3.connect(aged / "toolkiln.db")
    dst = sqlite3.connect(into / "toolkiln.db")
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def wal_frames(data: Path) -> int:
    """Frames the SQLite WAL holds now (the header of its index, ``-shm``): 0 without one."""
    try:
        with (data / "toolkiln.db-shm").open("rb") as f:
            return int.from_bytes(f.read(20)[16:20], "little")
    except OSError:
        return 0


def under(root: int) -> int:
    """How many processes run under ``root``."""
    parents: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    count = 0
    for pid in parents:
        up = parents.get(pid)
        while up is not None and up != root:
            up = parents.get(up)
        count += up == root
    return count


def holdings(pid: int, data: Path) -> list[str]:
    status = Path(f"/proc/{pid}/status").read_text()
    threads = next(line.split()[1] for line in status.splitlines() if line.startswith("Threads"))
    m = density.mem(pid)
    size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
    tree = density.tree_cpu_ms(pid)
    return [
        f"  memory: {m.uss_kb / 1024:.1f} MB USS / {m.pss_kb / 1024:.1f} MB PSS"
        if m
        else "  memory: ?",
        f"  threads: {threads}; open files: {len(os.listdir(f'/proc/{pid}/fd'))}",
        f"  data dir: {size / 1e6:.1f} MB; CPU of the tree so far: {tree / 1000:.0f} s",
        f"  processes under it: {under(pid)}",
    ]


def hold(services: dict[str, tuple[int, int, tuple[str, str]]]) -> None:
    """With ``SOAK_HOLD=path``, keep the services up for a profiler while that file exists."""
    flag = os.environ.get("SOAK_HOLD")
    if not flag:
        return
    Path(flag).write_text(repr(services))
    print(f"holding while {flag} exists: {services}", flush=True)
    while Path(flag).exists():
        time.sleep(1)


FIGURES = ("python", "javascript")


def report(name: str, results: dict[str, dict[str, list[float]]], p50s: dict) -> list[str]:
    """Rows of the table: each service's p50 / p99 and CPU per call, and its ratio to fresh."""
    rows = []
    fresh = results["fresh"]
    for figure in FIGURES:
        ratio = statistics.median(p50s[name][figure]) / statistics.median(p50s["fresh"][figure])
        cpu = [statistics.median(results[name][f"{figure} {p}"]) for p in ("api", "runner")]
        cpu_f = [statistics.median(fresh[f"{figure} {p}"]) for p in ("api", "runner")]
        values = results[name][figure]
        rows.append(
            f"| {name}, {figure} | {pct(values, 0.5):.2f} / {pct(values, 0.99):.2f} ms "
            f"| {cpu[0]:.2f} / {cpu[1]:.2f} ms | {ratio:.2f} "
            f"| {cpu[0] / cpu_f[0]:.2f} / {cpu[1] / cpu_f[1]:.2f} |"
        )
    return rows


def main() -> None:
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f}; python {sys.version.split()[0]}"
    )
    with tempfile.TemporaryDirectory(prefix="toolkiln-soak-") as tmp:
        dirs = {n: Path(tmp) / n for n in ("aged", "fresh", "restarted")}
        ports = {n: free_port() for n in dirs}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            procs["aged"] = start_service(dirs["aged"], ports["aged"])
            aging = age(ports["aged"])
            print(
                f"aged: {WORKSPACES} workspaces made in {aging['made_s']:.0f} s, then {CLIENTS}"
                f" clients for {SECONDS:.0f} s"
            )
            requests = aging["requests"]
            assert isinstance(requests, dict)
            print("  requests:", ", ".join(f"{k}: {v}" for k, v in sorted(requests.items())))
            print("\n".join(holdings(procs["aged"].pid, dirs["aged"])))
            print(f"  WAL frames when the traffic stopped: {wal_frames(dirs['aged'])}")
            if RESTARTED:
                restarted_copy(dirs["aged"], dirs["restarted"])
            else:
                del dirs["restarted"]
            for name in dirs:
                if name != "aged":
                    procs[name] = start_service(dirs[name], ports[name])
            urls = {}
            for name, port in ports.items():
                if name not in procs:
                    continue
                c = Conn(port, TOKEN)
                ws = c.call("GET", "/v1/workspaces")[1]["data"][0]["id"]
                urls[name] = (
                    create(c, ws, "measured-py", "python", PY_TOOL),
                    create(c, ws, "measured-js", "javascript", JS_TOOL),
                )
                c.close()
                rounds(port, procs[name].pid, *urls[name])  # warm-up, not counted
            names = list(procs)
            results: dict[str, dict[str, list[float]]] = {n: {} for n in names}
            p50s: dict[str, dict[str, list[float]]] = {n: {f: [] for f in FIGURES} for n in names}
            for i in range(ROUNDS):
                # each service takes each place in the order as often
                order = names[i % len(names) :] + names[: i % len(names)]
                if i // len(names) % 2:
                    order.reverse()
                for name in order:
                    got = rounds(ports[name], procs[name].pid, *urls[name])
                    for figure, values in got.items():
                        results[name].setdefault(figure, []).extend(values)
                        if figure in FIGURES:
                            p50s[name][figure].append(pct(values, 0.5))
            print()
            print(
                "| service, tool | p50 / p99 | CPU per call, service / runner's tree "
                "| p50 / fresh (goal <= 1.10) | CPU / fresh |"
            )
            print("|---|---|---|---|---|")
            for name in names:
                print("\n".join(report(name, results, p50s)))
            print(
                f"(ratios: median of {ROUNDS} rounds of {CALLS} calls each; load average"
                f" {os.getloadavg()[0]:.2f} at the end)"
            )
            for name in names[1:]:
                print(f"\n{name}, for comparison:")
                print("\n".join(holdings(procs[name].pid, dirs[name])))
            hold({n: (procs[n].pid, ports[n], urls[n]) for n in names})
        finally:
            for proc in procs.values():
                stop(proc)


if __name__ == "__main__":
    main()
