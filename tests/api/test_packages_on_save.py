"""Saving a tool starts installing the listed packages its code imports, wherever the import
stands, so its first call finds them (CONTRACT 5; issue 10). Real pip into a store of this
test's own."""

from __future__ import annotations

import time
from pathlib import Path

from tests.conftest import own_service

TOKEN = "tk_packages-on-save"
CODE = "def main(**p):\n    import pytz\n    return {'message': pytz.utc.zone}\n"


def test_a_saved_tools_packages_are_installed_before_its_first_call(tmp_path: Path) -> None:
    with own_service(tmp_path, TOKEN) as (rt, client, who):
        h = {"Authorization": f"Bearer {TOKEN}"}
        body = {
            "workspace_id": who.workspace_id,
            "name": "zone",
            "language": "python",
            "code": CODE,
            # Too short to wait for an install on the call path: the save must have started it.
            "timeout_ms": 1000,
        }
        r = client.post("/v1/custom-tools", json=body, headers=h)
        assert r.status_code == 201, r.text
        store = rt.sandboxes["python"].packages
        specs = store.specs(["pytz"])
        assert specs, "pytz is a listed package"
        deadline = time.monotonic() + 180
        while not all(store.installed(s) for s in specs):
            assert time.monotonic() < deadline, "the save did not start pytz's install"
            time.sleep(0.2)
        res = client.post(
            f"/v1/custom-tools/{r.json()['data']['id']}/invoke", json={"input": {}}, headers=h
        )
        assert res.json()["data"]["status"] == "ok" and res.json()["data"]["message"] == "UTC"
        state = client.get(f"/v1/custom-tools/{r.json()['data']['id']}", headers=h).json()["data"]
        assert state["failure_count"] == 0
