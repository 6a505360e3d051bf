"""An agent's tool list and code-mode description with 500 tools enabled, uncached and cached,
on SQLite and PostgreSQL.

Run with `make bench-tool-list`. For each database it starts a real `toolkiln serve` (SQLite in
a temporary data dir; PostgreSQL in a fresh database on TOOLKILN_BENCH_POSTGRES_URL, default
the local server: bench/databases.py), creates BENCH_TOOLS tools (default 500) enabled for every agent and one
agent, and measures over HTTP with one keep-alive connection (the client's JSON parse of the
answer included):

  uncached: the first list after a change (the workspace policy written again before each
            request, untimed): the list read and rendered, as after any edit;
  cached:   the same list again: the agent and its list version read, the kept body sent.

p50 and p99 of BENCH_LIST_SEQ requests (default 200 cached, a quarter of that uncached), for
the OpenAI-format list and the Python code-mode description. Not part of the test run.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import databases
from client import Conn
from service import TOKEN, free_port, pct, start_service, stop, timed, workspace

N_TOOLS = int(os.environ.get("BENCH_TOOLS", "500"))
N_SEQ = int(os.environ.get("BENCH_LIST_SEQ", "200"))
CODE = "def main(**params):\n    return {'message': params['record_id']}\n"
LISTS = {
    "tool list (openai)": "format=openai",
    "code-mode description": "mode=code&language=python",
}


def tool(ws: str, i: int) -> dict[str, object]:
    """A tool of typical size: a few typed parameters with descriptions."""
    return {
        "workspace_id": ws,
        "name": f"crm-tool-{i:03d}",
        "description": f"Look up or update record kind {i} in the CRM by id, with filters.",
        "language": "python",
        "code": CODE,
        "enable_globally": True,
        "parameters": {
            "record_id": {"type": "string", "required": True, "description": "The record id."},
            "fields": {"type": "array", "items": {"type": "string"}, "description": "Fields."},
            "limit": {"type": "integer", "description": "At most this many rows."},
        },
    }


def samples(c: Conn, path: str, n: int, before: Callable[[], None] | None = None) -> list[float]:
    out = []
    for _ in range(n):
        if before is not None:
            before()
        out.append(timed(c, "GET", path))
    return out


def measure(port: int) -> dict[str, tuple[list[float], list[float]]]:
    c = Conn(port, TOKEN)
    ws = workspace(c)
    for i in range(N_TOOLS):
        status, body = c.call("POST", "/v1/custom-tools", tool(ws, i))
        assert status == 201, body
    status, body = c.call("POST", "/v1/agents", {"workspace_id": ws, "name": "bench"})
    assert status == 201, body
    agent = body["data"]["id"]
    policy = c.call("GET", f"/v1/workspaces/{ws}/policy")[1]["data"]

    def change() -> None:  # the same policy written again: a change to every list
        status, body = c.call("PATCH", f"/v1/workspaces/{ws}/policy", policy)
        assert status == 200, body

    out = {}
    for label, query in LISTS.items():
        path = f"/v1/agents/{agent}/tools?{query}"
        status, body = c.call("GET", path)
        assert status == 200 and len(body["data"]) in (1, N_TOOLS + len(policy["builtins"]))
        samples(c, path, 10, change)  # warm-up
        uncached = samples(c, path, max(N_SEQ // 4, 10), change)
        samples(c, path, 10)
        cached = samples(c, path, N_SEQ)
        out[label] = (uncached, cached)
    c.close()
    return out


def run(kind: str) -> dict[str, tuple[list[float], list[float]]]:
    with tempfile.TemporaryDirectory(prefix="toolkiln-bench-lists-") as tmp:
        with databases.fresh(kind) as url:
            port = free_port()
            proc = start_service(Path(tmp), port, database_url=url)
            try:
                return measure(port)
            finally:
                stop(proc)


def main() -> None:
    load = os.getloadavg()
    print(
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f}; "
        f"python {sys.version.split()[0]}; {N_TOOLS} tools enabled"
    )
    kinds, missing = databases.kinds()
    if missing:
        print(f"PostgreSQL not measured: {missing}")
    found = {databases.LABELS[kind]: run(kind) for kind in kinds}
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print()
    print("| p50 / p99 ms | " + " | ".join(f"{db} uncached | {db} cached" for db in found) + " |")
    print("|---|" + "---|---|" * len(found))
    for label in LISTS:
        cells = []
        for db in found:
            uncached, cached = found[db][label]
            cells += [
                f"{pct(uncached, 0.5):.2f} / {pct(uncached, 0.99):.2f}",
                f"{pct(cached, 0.5):.2f} / {pct(cached, 0.99):.2f}",
            ]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
