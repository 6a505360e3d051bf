"""A database server that stops answering but keeps its connections open (every process of
it SIGSTOPped, as a hung host or a partition looks to the client): requests that need it
answer 503 ``unavailable`` within a bound, ``/healthz`` too, never a hang; once the server
answers again (SIGCONT) the service does too, with no restart.

A clean stop (connections refused) is test_database_outage.py; there the client learns at
once. Here nothing tells it: the kernel still accepts connections and acknowledges what is
sent, so only the client's own time bound on each answer ends the wait.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.reliability.harness import Serve, admin, pg_cluster, wait_for

TOKEN = "tk_freeze-admin-token"
QUICK = "def main(**p):\n    return {'message': 'ok'}"
CONCURRENT = 12
# Far above the service's own bound (docs/api.md: a round trip 5 s, a connection 5 s): a
# request still unanswered by then hangs.
CLIENT_TIMEOUT_S = 30


def test_frozen_database_gives_503_within_a_bound_then_recovers(tmp_path: Path) -> None:
    with pg_cluster() as pg:
        serve = Serve(
            tmp_path / "data",
            {"TOOLKILN_DATABASE_URL": pg.url, "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN},
        ).wait_ready()
        try:
            _freeze_under_traffic(pg, serve)
        finally:
            serve.kill()


def _freeze_under_traffic(pg, serve: Serve) -> None:  # type: ignore[no-untyped-def]
    http = httpx.Client(base_url=serve.base, headers=admin(TOKEN), timeout=CLIENT_TIMEOUT_S)
    ws = http.get("/v1/workspaces").json()["data"][0]["id"]
    tool = http.post(
        "/v1/custom-tools",
        json={"workspace_id": ws, "name": "steady", "language": "python", "code": QUICK},
    ).json()["data"]
    invoke = f"/v1/custom-tools/{tool['id']}/invoke"

    def call(path: str) -> tuple[int | str, str, float]:
        """(HTTP status or the transport error, result status or error code, seconds)."""
        started = time.monotonic()
        with httpx.Client(base_url=serve.base, headers=admin(TOKEN), timeout=CLIENT_TIMEOUT_S) as c:
            try:
                r = c.get(path) if path == "/healthz" else c.post(path, json={"input": {}})
            except httpx.TransportError as exc:
                return type(exc).__name__, "", time.monotonic() - started
        body = r.json()
        if path == "/healthz":
            what = body["database"]
        elif r.status_code == 200:
            what = body["data"]["status"]
        else:
            what = body["error"]["code"]
        return r.status_code, what, time.monotonic() - started

    with ThreadPoolExecutor(CONCURRENT + 1) as pool:
        # Calls at once first, so the service's pool holds open connections to the server.
        warm = list(pool.map(call, [invoke] * CONCURRENT))
        assert {(s, w) for s, w, _ in warm} == {(200, "ok")}, warm

        pg.freeze()
        try:
            during = list(pool.map(call, [invoke] * CONCURRENT + ["/healthz"]))
            # And after the first wave: connections made or dropped meanwhile are bounded too.
            again = list(pool.map(call, [invoke] * 4 + ["/healthz"]))
        finally:
            pg.thaw()

    print("during the freeze (status, what, seconds):", during, again)
    calls, health = during[:-1] + again[:-1], [during[-1], again[-1]]
    assert {(s, w) for s, w, _ in calls} == {(503, "unavailable")}, calls
    assert {(s, w) for s, w, _ in health} == {(503, "unreachable")}, health

    # Back without a restart: the connections that timed out were dropped, not reused.
    wait_for("a call after the thaw", lambda: call(invoke)[:2] == (200, "ok"), 60)
    wait_for("healthz ok", lambda: call("/healthz")[:2] == (200, "ok"), 60)
    after = [call(invoke) for _ in range(CONCURRENT)]
    assert {(s, w) for s, w, _ in after} == {(200, "ok")}, after
    assert serve.proc.poll() is None
