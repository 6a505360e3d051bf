"""Workspaces of a test's own on one service, each with its own token, driven via the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.testclient import TestClient

from toolkiln.app import Runtime


@dataclass
class Tenant:
    client: TestClient
    workspace_id: str
    headers: dict[str, str]

    def tool(self, name: str, code: str, language: str = "javascript", **over: Any) -> str:
        body = {
            "workspace_id": self.workspace_id,
            "name": name,
            "description": "security suite tool",
            "language": language,
            "code": code,
            "input_schema": {"type": "object"},
            "enable_globally": False,
            **over,
        }
        r = self.client.post("/v1/custom-tools", json=body, headers=self.headers)
        assert r.status_code == 201, r.text
        return str(r.json()["data"]["id"])

    def invoke(self, tool_id: str, payload: dict | None = None) -> dict:
        r = self.client.post(
            f"/v1/custom-tools/{tool_id}/invoke",
            json={"input": payload or {}},
            headers=self.headers,
        )
        assert r.status_code == 200, r.text
        return dict(r.json()["data"])

    def stored(self, call_id: str) -> dict:
        r = self.client.get(f"/v1/tool-calls/{call_id}", headers=self.headers)
        assert r.status_code == 200, r.text
        return dict(r.json()["data"])

    def get_tool(self, tool_id: str) -> dict:
        r = self.client.get(f"/v1/custom-tools/{tool_id}", headers=self.headers)
        assert r.status_code == 200, r.text
        return dict(r.json()["data"])


def tenant(rt: Runtime, client: TestClient, name: str) -> Tenant:
    access = rt.services.access
    ws = access.create_workspace(None, name)
    token = access.create_token(None, ws.id, "invoke,read,write").value
    return Tenant(client, ws.id, {"Authorization": f"Bearer {token}"})
