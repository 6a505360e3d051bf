"""Two replicas on one PostgreSQL database behind nginx, configured as docs/deployment.md
says: invocations spread over both stay exact, a file link made on one is served by the
other, and a tool disabled through one vanishes from the other's agent lists and MCP
sessions (told through LISTEN/NOTIFY)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import PG_URL
from tests.reliability.harness import (
    ROOT,
    Nginx,
    Serve,
    admin,
    free_port,
    fresh_postgres_database,
    listed_then_changed,
    wait_for,
)
from toolkiln.cli.main import DRAIN_MARGIN_S
from toolkiln.domain.limits import MAX_TIMEOUT_MS

TOKEN = "tk_replicas-admin-token"
CALLS = 40
COUNT = "def main(**p):\n    return {'message': 'counted'}"
SURFACE = (
    "def handle(input, ctx):\n"
    "    f = ctx.tools.surface_file({'filename': 'report.txt', 'content': input['text']})\n"
    "    return {'message': f['url'], 'rawData': f}\n"
)


def documented_site(ports: tuple[int, int], listen: int) -> str:
    text = (ROOT / "docs" / "deployment.md").read_text()
    site = re.search(r"```nginx\n(.*?)```", text, re.S)
    assert site, "docs/deployment.md shows no nginx configuration"
    out = site.group(1)
    for documented, port in (("8081", ports[0]), ("8082", ports[1]), ("8080", listen)):
        assert f"127.0.0.1:{documented}" in out
        out = out.replace(f"127.0.0.1:{documented}", f"127.0.0.1:{port}")
    return out


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, Serve, Serve]]:
    lb_port = free_port()
    lb = f"http://127.0.0.1:{lb_port}"
    with fresh_postgres_database(PG_URL) as url:
        env = {
            "TOOLKILN_DATABASE_URL": url,
            "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN,
            "TOOLKILN_FILE_SIGNING_KEY": secrets.token_hex(32),
            "TOOLKILN_PUBLIC_URL": lb,
        }
        # Started at one moment on a new database: both migrate, under the lock.
        replicas = [Serve(tmp_path / f"r{i}" / "data", env) for i in (1, 2)]
        nginx = None
        try:
            for r in replicas:
                r.wait_ready()
            nginx = Nginx(
                documented_site((replicas[0].port, replicas[1].port), lb_port), tmp_path / "lb"
            )
            wait_for("nginx", lambda: _answers(f"{lb}/healthz"))
            yield lb, replicas[0], replicas[1]
        finally:
            if nginx is not None:
                nginx.stop()
            for r in replicas:
                # SIGTERM, as an operator stops a replica: its sandboxes close and remove
                # their cgroup trees (a SIGKILL left them for the next service to reuse).
                # Longer than serve's drain of calls in flight (MAX_TIMEOUT_MS + margin);
                # past it terminate() kills the group itself.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.terminate(MAX_TIMEOUT_MS / 1000 + DRAIN_MARGIN_S + 10)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(r.proc.pid, signal.SIGKILL)  # a straggler of its group, if any


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_two_replicas_behind_nginx(cluster: tuple[str, Serve, Serve]) -> None:
    lb, one, two = cluster
    via_lb = httpx.Client(base_url=lb, headers=admin(TOKEN), timeout=60)
    ws = via_lb.get("/v1/workspaces").json()["data"][0]["id"]

    def create(name: str, code: str, **extra: object) -> dict:
        r = via_lb.post(
            "/v1/custom-tools",
            json={"workspace_id": ws, "name": name, "language": "python", "code": code, **extra},
        )
        assert r.status_code == 201, r.text
        return r.json()["data"]

    counted = create("counted", COUNT)

    # Invocations through the balancer land on both replicas, and the count stays exact.
    upstreams: Counter[str] = Counter()
    outcomes: Counter[tuple[int, str]] = Counter()
    lock = threading.Lock()

    def caller(n: int) -> None:
        with httpx.Client(base_url=lb, headers=admin(TOKEN), timeout=60) as c:
            for _ in range(n):
                r = c.post(f"/v1/custom-tools/{counted['id']}/invoke", json={"input": {}})
                with lock:
                    upstreams[r.headers.get("x-upstream", "?")] += 1
                    outcomes[(r.status_code, r.json().get("data", {}).get("status", "?"))] += 1

    threads = [threading.Thread(target=caller, args=(CALLS // 4,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert outcomes == {(200, "ok"): CALLS}
    assert set(upstreams) == {f"127.0.0.1:{one.port}", f"127.0.0.1:{two.port}"}, upstreams
    for replica in (one, two):
        got = httpx.get(
            f"{replica.base}/v1/custom-tools/{counted['id']}", headers=admin(TOKEN)
        ).json()
        assert got["data"]["usage_count"] == CALLS

    # A file link made on one replica is served by the other (and through the balancer).
    surfacing = create(
        "surfacing", SURFACE, parameters={"text": {"type": "string", "required": True}}
    )
    made = httpx.post(
        f"{one.base}/v1/custom-tools/{surfacing['id']}/invoke",
        json={"input": {"text": "made on one"}},
        headers=admin(TOKEN),
        timeout=60,
    ).json()["data"]
    assert made["status"] == "ok", made
    link = urlsplit(made["raw_data"]["url"])
    assert f"{link.scheme}://{link.netloc}" == lb
    for base in (two.base, lb):
        served = httpx.get(f"{base}{link.path}?{link.query}", timeout=30)
        assert served.status_code == 200 and served.content == b"made on one"
    tampered = httpx.get(f"{two.base}{link.path}?{link.query}0", timeout=30)
    assert tampered.status_code == 403

    # Disabled through one: gone from the other's agent lists, and MCP sessions are told.
    agent = via_lb.post("/v1/agents", json={"workspace_id": ws, "name": "everywhere"}).json()
    agent_id = agent["data"]["id"]
    assert via_lb.put(f"/v1/agents/{agent_id}/custom-tools/{counted['id']}", json={}).is_success
    name = f"custom_{counted['id']}"

    def names_on(replica: Serve) -> list[str]:
        r = httpx.get(
            f"{replica.base}/v1/agents/{agent_id}/tools?format=openai", headers=admin(TOKEN)
        )
        return [t["function"]["name"] for t in r.json()["data"]]

    assert name in names_on(two)

    def through(replica: Serve, action: str):  # type: ignore[no-untyped-def]
        return lambda: httpx.post(
            f"{replica.base}/v1/custom-tools/{counted['id']}/{action}", headers=admin(TOKEN)
        ).raise_for_status()

    # An MCP session through the balancer (its /mcp/ affinity), the change on replica one.
    # Within 15 s: only NOTIFY can do it (the fallback look comes every 30 s).
    before, after = listed_then_changed(lb, TOKEN, agent_id, through(one, "disable"), 15)
    assert name in before and name not in after
    assert name not in names_on(two)
    # A session on replica two itself, the change on replica one: across replicas for sure.
    before, after = listed_then_changed(two.base, TOKEN, agent_id, through(one, "enable"), 15)
    assert name not in before and name in after
    assert name in names_on(two)
