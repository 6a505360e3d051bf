"""The two API paths the view added: validating a draft without storing it, and an agent's
own enablements with their pinned versions."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool


def test_validate_accepts_a_good_draft_and_stores_nothing(
    client: TestClient, space: Space, rw: dict[str, str]
) -> None:
    r = client.post("/v1/custom-tools/validate", json=seed_tool(space), headers=rw)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert data["valid"] is True
    assert data["input_schema"]["required"] == ["order_id"]
    listed = client.get(f"/v1/custom-tools?workspace_id={space.id}", headers=rw).json()["data"]
    assert listed == []


def test_validate_names_every_problem_with_the_line_of_a_syntax_error(
    client: TestClient, space: Space, rw: dict[str, str]
) -> None:
    body = seed_tool(space, name="Bad Name", code="def main(**p):\n    return {'message': (}\n")
    r = client.post("/v1/custom-tools/validate", json=body, headers=rw)
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "invalid_tool"
    by_field = {p["field"]: p for p in error["details"]}
    assert set(by_field) == {"name", "code"}
    assert by_field["code"]["line"] == 2


def test_validate_needs_write_and_the_callers_workspace(
    client: TestClient, space: Space, other_space: Space
) -> None:
    r = client.post("/v1/custom-tools/validate", json=seed_tool(space), headers=space.auth("read"))
    assert r.status_code == 403
    foreign = seed_tool(other_space)
    r = client.post("/v1/custom-tools/validate", json=foreign, headers=space.auth("write"))
    assert r.status_code in (403, 404)
    r = client.post(
        "/v1/custom-tools/validate", json={"workspace_id": space.id}, headers=space.auth("write")
    )
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid_tool"


def test_an_agents_enablements_list_its_pins(
    client: TestClient, space: Space, other_space: Space, rw: dict[str, str]
) -> None:
    agent = client.post(
        "/v1/agents", json={"workspace_id": space.id, "name": "pins"}, headers=rw
    ).json()["data"]
    tools = [
        client.post("/v1/custom-tools", json=seed_tool(space, name=f"pin-{n}"), headers=rw).json()[
            "data"
        ]
        for n in range(2)
    ]
    path = f"/v1/agents/{agent['id']}/custom-tools"
    assert client.get(path, headers=space.auth("read")).json()["data"] == []
    client.put(f"{path}/{tools[0]['id']}", json={"version": 1}, headers=rw)
    client.put(f"{path}/{tools[1]['id']}", headers=rw)
    listed = client.get(path, headers=space.auth("read")).json()["data"]
    assert {(e["tool_id"], e["version"]) for e in listed} == {
        (tools[0]["id"], 1),
        (tools[1]["id"], None),
    }
    assert client.get(path, headers=other_space.auth("read")).status_code == 404
