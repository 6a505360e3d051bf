"""GET /v1/custom-tools/{id}/stats: a tool's calls per bucket (calls, failures by code, p50,
p99), on SQLite and PostgreSQL, with the tool routes' scopes and tenancy."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Space

CODE = (
    "def main(**p):\n"
    "    if p.get('fail'):\n"
    "        raise ValueError('asked to')\n"
    "    return {'message': 'ok'}\n"
)
PARAMS = {"fail": {"type": "boolean"}}


def _tool(client: TestClient, space: Space, rw: dict[str, str]) -> str:
    body = {
        "workspace_id": space.id,
        "name": "counted",
        "language": "python",
        "code": CODE,
        "parameters": PARAMS,
    }
    r = client.post("/v1/custom-tools", json=body, headers=rw)
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


def _stats(client: TestClient, tool: str, headers: dict[str, str], window: str) -> Any:
    return client.get(f"/v1/custom-tools/{tool}/stats", params={"window": window}, headers=headers)


def test_stats_count_calls_failures_by_code_and_percentiles(
    client: TestClient, space: Space, rw: dict[str, str]
) -> None:
    tool = _tool(client, space, rw)
    inputs: list[Any] = [{}, {"fail": True}, {}, {"fail": True}, {}, {"fail": "no"}, {}, {}]
    for given in inputs:
        r = client.post(f"/v1/custom-tools/{tool}/invoke", json={"input": given}, headers=rw)
        assert r.status_code == 200, r.text
    for window, count, seconds in (("1h", 60, 60), ("24h", 96, 900), ("7d", 168, 3600)):
        r = _stats(client, tool, rw, window)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert data["tool_id"] == tool and data["window"] == window
        assert data["bucket_seconds"] == seconds and len(data["buckets"]) == count
        total = data["total"]
        assert total["calls"] == 8
        assert total["failures"] == 3
        assert total["failures_by_code"] == {"invalid_input": 1, "runtime_error": 2}
        assert 0 < total["p50_ms"] <= total["p99_ms"] <= 30000
        assert sum(b["calls"] for b in data["buckets"]) == 8
        busy = [b for b in data["buckets"] if b["calls"]]
        assert busy and all(b["p50_ms"] is not None for b in busy)
        assert all(b["p50_ms"] is None for b in data["buckets"] if not b["calls"])
        starts = [b["start"] for b in data["buckets"]]
        assert starts == sorted(starts) and data["from"] == starts[0]


def test_a_tool_without_calls_has_empty_buckets(
    client: TestClient, space: Space, rw: dict[str, str]
) -> None:
    tool = _tool(client, space, rw)
    data = _stats(client, tool, rw, "1h").json()["data"]
    assert data["total"] == {
        "calls": 0,
        "failures": 0,
        "failures_by_code": {},
        "p50_ms": None,
        "p99_ms": None,
    }


def test_stats_take_read_scope_and_stay_in_the_workspace(
    client: TestClient, space: Space, other_space: Space, rw: dict[str, str]
) -> None:
    tool = _tool(client, space, rw)
    assert _stats(client, tool, space.auth("read"), "1h").status_code == 200
    assert _stats(client, tool, space.auth("invoke"), "1h").status_code == 403
    foreign = _stats(client, tool, other_space.auth("read"), "1h")
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "not_found"
    assert _stats(client, "nosuchtool", rw, "1h").status_code == 404
    assert client.get(f"/v1/custom-tools/{tool}/stats").status_code == 401
    bad = _stats(client, tool, rw, "2h")
    assert bad.status_code == 422


@pytest.mark.parametrize("window", ["1h", "24h", "7d"])
def test_the_stats_route_is_in_the_openapi_document(client: TestClient, window: str) -> None:
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/v1/custom-tools/{tool_id}/stats"]["get"]
    (param,) = [p for p in op["parameters"] if p["name"] == "window"]
    assert window in param["schema"]["enum"]
