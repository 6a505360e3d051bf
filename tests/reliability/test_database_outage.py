"""A database stopped and started under traffic: 503 ``unavailable`` while it is away (never
a 500, never a hang), ``/healthz`` says why, and the service recovers with no restart.

The database is a PostgreSQL cluster of this test's own; the service a real ``toolkiln
serve`` process, so the MCP watcher, the app's lifespan and the sandbox pools are the real
ones (a failing watcher used to end the lifespan and close the pools).
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.reliability.harness import (
    Serve,
    admin,
    listed_then_changed,
    pg_cluster,
    wait_for,
)

TOKEN = "tk_outage-admin-token"
QUICK = "def main(**p):\n    return {'message': 'ok ' + str(p.get('n', 0))}"


def test_database_outage_gives_503_then_recovers_without_restart(tmp_path: Path) -> None:
    with pg_cluster() as pg:
        serve = Serve(
            tmp_path / "data",
            {"TOOLKILN_DATABASE_URL": pg.url, "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN},
        ).wait_ready()
        try:
            _outage_under_traffic(pg, serve)
        finally:
            serve.kill()


def _outage_under_traffic(pg, serve: Serve) -> None:  # type: ignore[no-untyped-def]
    http = httpx.Client(base_url=serve.base, headers=admin(TOKEN), timeout=30)
    ws = http.get("/v1/workspaces").json()["data"][0]["id"]
    tool = http.post(
        "/v1/custom-tools",
        json={"workspace_id": ws, "name": "steady", "language": "python", "code": QUICK},
    ).json()["data"]
    agent = http.post("/v1/agents", json={"workspace_id": ws, "name": "watcher"}).json()["data"]
    http.put(f"/v1/agents/{agent['id']}/custom-tools/{tool['id']}", json={})

    seen: list[tuple[int, str]] = []  # (HTTP status, result status or error code)
    stop = threading.Event()
    lock = threading.Lock()

    def traffic() -> None:
        with httpx.Client(base_url=serve.base, headers=admin(TOKEN), timeout=30) as c:
            while not stop.is_set():
                try:
                    r = c.post(f"/v1/custom-tools/{tool['id']}/invoke", json={"input": {}})
                except httpx.TimeoutException:
                    got = (0, "hang")
                except httpx.TransportError as exc:
                    got = (0, type(exc).__name__)
                else:
                    body = r.json()
                    got = (
                        r.status_code,
                        body["data"]["status"] if r.status_code == 200 else body["error"]["code"],
                    )
                    if r.status_code == 503 and r.headers.get("retry-after") != "1":
                        got = (503, "no Retry-After")
                with lock:
                    seen.append(got)

    def count(pred) -> int:  # type: ignore[no-untyped-def]
        with lock:
            return sum(1 for s in seen if pred(s))

    workers = [threading.Thread(target=traffic) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        wait_for("calls before the outage", lambda: count(lambda s: s == (200, "ok")) >= 5)

        pg.stop()
        mark = len(seen)
        wait_for(
            "503 unavailable during the outage",
            lambda: any(s == (503, "unavailable") for s in seen[mark:]),
        )
        health = http.get("/healthz")
        assert health.status_code == 503
        body = health.json()
        assert body["database"] == "unreachable"
        assert [d["part"] for d in body["degraded"]] == ["database"]
        assert body["degraded"][0]["reason"]

        pg.start()
        mark = len(seen)
        wait_for("calls after the database is back", lambda: (200, "ok") in seen[mark:])
        wait_for("healthz ok", lambda: http.get("/healthz").status_code == 200)
        loops = wait_for(
            "the watcher back at work",
            lambda: (
                (b := http.get("/healthz").json()["background"])
                and b["mcp.tool_lists"]["status"] == "ok"
                and b
            ),
        )
        assert loops["mcp.tool_lists"]["restarts"] >= 1  # it did fail, and it came back
    finally:
        stop.set()
        for w in workers:
            w.join(60)

    assert serve.proc.poll() is None
    outcomes = set(seen)
    assert outcomes <= {(200, "ok"), (503, "unavailable")}, outcomes
    oks = count(lambda s: s == (200, "ok"))
    refused = count(lambda s: s[0] == 503)
    usage = http.get(f"/v1/custom-tools/{tool['id']}").json()["data"]["usage_count"]
    # A 503 may come after the result was committed (the answer to COMMIT was lost).
    assert oks <= usage <= oks + refused

    # The MCP watcher still tells sessions about changes, through the recovered database.
    before, after = listed_then_changed(
        serve.base,
        TOKEN,
        agent["id"],
        lambda: http.post(f"/v1/custom-tools/{tool['id']}/disable").raise_for_status(),
    )
    assert f"custom_{tool['id']}" in before and f"custom_{tool['id']}" not in after
