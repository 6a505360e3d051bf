"""A tool version's egress list (CONTRACT 14): saved with the version, checked on save,
shown in Tool and ToolVersion; SQLite and PostgreSQL."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool


def test_egress_is_part_of_the_version(client: TestClient, space: Space, rw) -> None:
    body = seed_tool(space, name="reaches", egress=["api.example.com", "*.example.org:8443"])
    tool = client.post("/v1/custom-tools", json=body, headers=rw).json()["data"]
    assert tool["egress"] == ["api.example.com", "*.example.org:8443"]
    r = client.patch(
        f"/v1/custom-tools/{tool['id']}", json={"egress": ["api.example.com"]}, headers=rw
    )
    assert r.status_code == 200 and r.json()["data"]["version"] == 2
    same = client.patch(
        f"/v1/custom-tools/{tool['id']}", json={"egress": ["api.example.com"]}, headers=rw
    )
    assert same.json()["data"]["version"] == 2  # no change, no version
    versions = client.get(f"/v1/custom-tools/{tool['id']}/versions", headers=rw).json()["data"]
    assert [v["egress"] for v in versions] == [
        ["api.example.com", "*.example.org:8443"],
        ["api.example.com"],
    ]


def test_absent_egress_is_none(client: TestClient, space: Space, rw) -> None:
    tool = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw).json()["data"]
    assert tool["egress"] == []


def test_a_bad_pattern_is_422_naming_it(client: TestClient, space: Space, rw) -> None:
    bad = ["ok.example.com", "a b.com", "user@host.com", "2130706433", "0x7f.1", "*", "x:99999"]
    r = client.post("/v1/custom-tools", json=seed_tool(space, egress=bad), headers=rw)
    assert r.status_code == 422
    found = {p["field"]: p["message"] for p in r.json()["error"]["details"]}
    assert set(found) == {f"egress.{i}" for i in range(1, len(bad))}
    for i, entry in enumerate(bad[1:], 1):
        assert repr(entry) in found[f"egress.{i}"]
