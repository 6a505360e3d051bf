"""Small API steps the call-path tests share: make a tool, invoke it, read it back."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import Space


def make_tool(
    client: TestClient, space: Space, name: str, code: str, **over: Any
) -> dict[str, Any]:
    """A Python tool taking any object (``over`` changes any field of the create body)."""
    body = {
        "workspace_id": space.id,
        "name": name,
        "language": "python",
        "code": code,
        "input_schema": {"type": "object"},
        **over,
    }
    r = client.post("/v1/custom-tools", json=body, headers=space.auth("write"))
    assert r.status_code == 201, r.text
    return r.json()["data"]


def invoke(client: TestClient, space: Space, tool: dict[str, Any], **body: Any) -> dict[str, Any]:
    """The Result of one invocation with an empty input (``body`` adds fields)."""
    r = client.post(
        f"/v1/custom-tools/{tool['id']}/invoke",
        json={"input": {}, **body},
        headers=space.auth("invoke"),
    )
    assert r.status_code == 200, r.text
    return r.json()["data"]


def state(client: TestClient, space: Space, tool: dict[str, Any]) -> dict[str, Any]:
    r = client.get(f"/v1/custom-tools/{tool['id']}", headers=space.auth("read"))
    return r.json()["data"]
