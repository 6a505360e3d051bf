"""Class: one workspace cannot fill the database the others share with files. A workspace
holds at most its quota of files whose links have not expired (``TOOLKILN_FILES_PER_WORKSPACE``
and ``_MB``): past it ``surface_file`` answers ``quota_exceeded`` and nothing is stored, while
another workspace stores as before; files whose link expired are deleted by a background
loop every replica runs (``files.prune``), and their space is the workspace's again."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient

from tests.conftest import own_service
from toolkiln.app import Runtime
from toolkiln.domain.ids import utcnow

ADMIN = "tk_file-quota-admin-token"
STORE = (
    "async def handle(input, ctx):\n"
    "    out = []\n"
    "    for i in range(input['n']):\n"
    "        got = await ctx.tools.surface_file(\n"
    "            {'filename': f'f{i}.txt', 'content': 'x' * input['size']}\n"
    "        )\n"
    "        out.append(got.get('error') or 'ok')\n"
    "    return {'message': ','.join(out)}\n"
)


def _workspace(rt: Runtime, name: str) -> dict[str, str]:
    ws = rt.services.access.create_workspace(None, name)
    token = rt.services.access.create_token(None, ws.id, "write,invoke").value
    return {"Authorization": f"Bearer {token}"}


def _store(client: TestClient, headers: dict[str, str], n: int, size: int = 10) -> list[str]:
    body = {"language": "python", "code": STORE, "input": {"n": n, "size": size}}
    r = client.post("/v1/run-code", json=body, headers=headers)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert data["status"] == "ok", data
    return str(data["message"]).split(",")


def test_a_workspace_past_its_quota_stores_nothing_and_others_store(tmp_path: Path) -> None:
    with own_service(tmp_path, ADMIN, files_per_workspace=3, files_per_workspace_mb=1) as (
        rt,
        client,
        _,
    ):
        a = _workspace(rt, "quota-a")
        b = _workspace(rt, "quota-b")
        assert _store(client, a, 5) == ["ok", "ok", "ok", "quota_exceeded", "quota_exceeded"]
        assert _store(client, b, 2) == ["ok", "ok"]
        # Bytes count too: 1 MB in all (a file is capped at 10 MB on its own).
        c = _workspace(rt, "quota-c")
        assert _store(client, c, 2, size=600_000) == ["ok", "quota_exceeded"]
        # Once their links expired, A's files are deleted and A stores again.
        assert "files.prune" in rt.loops()
        assert rt.services.files.prune(utcnow() + timedelta(hours=2)) >= 6
        assert _store(client, a, 1) == ["ok"]
