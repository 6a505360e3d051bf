"""Class: a call's cgroup slot is nobody else's while anything of that call is in it.

A nested run (``ctx.tools.run_code``, a custom tool reached through ``ctx``) joins its root
call's slot, so one memory cap and one CPU quota hold for the whole tree. The root's own
process can die while a nested run goes on (it exits, or the slot's OOM killer picks it).
Until 2026-12-06 its slot went back to the free list as soon as that process was reaped,
and the fresh child made to replace it took it: the next caller, of any workspace, then ran
under the same 256 MB as the other workspace's nested run (a victim's calls ended
``memory_limit``, and three of them disabled its tool).

Here the warm pool holds two children, so the replacement of the dead root is the one child
ready when the other workspace calls: on the previous code it sat in the dead root's slot,
next to the 120 MB the nested run holds, and the victim's 180 MB hit the cap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import own_service
from toolkiln.app import Runtime

TOKEN = "tk_slot-guests-admin"
HOG_MB = 120
VICTIM_MB = 180  # under the 256 MB cap alone, over it beside the hog

HOG = (
    "import time\n"
    "def main(**p):\n"
    f"    b = bytearray({HOG_MB} * 1024 * 1024)\n"
    "    for i in range(0, len(b), 4096):\n"
    "        b[i] = 1\n"
    "    time.sleep(8)\n"  # until run_code's own limit (5 s) stops it
    "    return {'message': 'hog'}\n"
)
ROOT = (
    "import os, threading, time\n"
    f"HOG = {HOG!r}\n"
    "def main(*, ctx, **p):\n"
    "    run = lambda: ctx.tools.run_code({'language': 'python', 'code': HOG})\n"
    "    threading.Thread(target=run, daemon=True).start()\n"
    "    time.sleep(1.5)\n"
    "    os._exit(5)\n"
    "    return {'message': 'never'}\n"
)
VICTIM = (
    "def main(**p):\n"
    f"    b = bytearray({VICTIM_MB} * 1024 * 1024)\n"
    "    for i in range(0, len(b), 4096):\n"
    "        b[i] = 1\n"
    "    return {'message': 'fine'}\n"
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Runtime, TestClient]]:
    data_dir = Path(tmp_path_factory.mktemp("slot-guests"))
    with own_service(data_dir, TOKEN, sandbox_warm=2) as (rt, client, _who):
        sandbox = rt.sandboxes["python"]
        if sandbox.cgroups is None:
            pytest.fail("the security suite runs with cgroups (the sandbox at full strength)")
        yield rt, client


def _slot_usages(rt: Runtime) -> list[int]:
    """Bytes charged to each memory slot of the Python sandbox."""
    cgroups = rt.sandboxes["python"].cgroups
    assert cgroups is not None
    name = "memory.current" if cgroups.version == "v2" else "memory.usage_in_bytes"
    found = []
    for root in cgroups.roots[:1]:
        for slot in root.glob("slot*"):
            try:
                found.append(int((slot / name).read_text()))
            except (OSError, ValueError):
                pass
    return found


def _run(client: TestClient, ws: str, code: str, timeout_ms: int) -> dict[str, Any]:
    body = {
        "workspace_id": ws,
        "name": "slot-guest-case",
        "language": "python",
        "code": code,
        "input_schema": {"type": "object"},
        "timeout_ms": timeout_ms,
        "input": {},
    }
    r = client.post(
        "/v1/custom-tools/test", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_a_dead_roots_slot_is_not_handed_on_while_its_nested_run_is_in_it(
    service: tuple[Runtime, TestClient],
) -> None:
    rt, client = service
    headers = {"Authorization": f"Bearer {TOKEN}"}
    a = client.get("/v1/workspaces", headers=headers).json()["data"][0]["id"]
    made = client.post("/v1/workspaces", json={"name": "victim"}, headers=headers)
    assert made.status_code == 201, made.text
    b = made.json()["data"]["id"]
    pool = rt.sandboxes["python"].template

    assert _run(client, b, VICTIM, 10_000)["status"] == "ok"  # alone, it fits

    root: dict[str, Any] = {}
    attack = threading.Thread(target=lambda: root.update(_run(client, a, ROOT, 15_000)))
    attack.start()
    try:
        # Until the nested run holds its memory and the dead root's replacement is ready.
        deadline = time.monotonic() + 12
        while not (
            max(_slot_usages(rt), default=0) >= HOG_MB * 1024 * 1024
            and pool.health()["warm"] >= 1
            and attack.is_alive()
        ):
            assert time.monotonic() < deadline and attack.is_alive(), (
                "the nested run never held its memory while the root's call was on",
                root,
            )
            time.sleep(0.02)
        victim = _run(client, b, VICTIM, 10_000)
        assert attack.is_alive(), "the nested run ended before the victim ran: no test"
        assert victim["status"] == "ok", victim["error"]
    finally:
        attack.join(30)
    assert root and root["status"] == "error", root
    # The slot is free again once the nested run has left it: calls go on.
    assert _run(client, b, VICTIM, 10_000)["status"] == "ok"
    assert _run(client, a, "def main(**p):\n    return {'message': 'ok'}\n", 5000)["status"] == "ok"
