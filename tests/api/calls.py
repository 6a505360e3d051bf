"""Small API steps the tests share: make a tool, invoke it, read it back, test-run a draft;
on the in-process ``TestClient`` or over HTTP (an ``httpx.Client``) to a real API process."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi.testclient import TestClient

from tests.conftest import Space

Http = httpx.Client | TestClient


def tool_body(
    ws: str, name: str, code: str, language: str = "python", **over: Any
) -> dict[str, Any]:
    """The create (or test-run) body of a tool in ``ws`` taking any object (``over`` changes
    or adds any field)."""
    body = {"workspace_id": ws, "name": name, "language": language, "code": code}
    return {**body, "input_schema": {"type": "object"}, **over}


def make_tool(
    client: TestClient, space: Space, name: str, code: str, **over: Any
) -> dict[str, Any]:
    """A Python tool taking any object (``over`` changes any field of the create body)."""
    body = tool_body(space.id, name, code, **over)
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


# -- over HTTP, with the client's own token (an admin's)


def first_workspace(http: httpx.Client) -> str:
    """The id of the first workspace the client's token lists (a bootstrap token's own)."""
    return str(http.get("/v1/workspaces").json()["data"][0]["id"])


def created(http: httpx.Client, ws: str, name: str, code: str, language: str = "python") -> str:
    """The id of a new tool taking any object (created: 201)."""
    r = http.post("/v1/custom-tools", json=tool_body(ws, name, code, language))
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


def invoked(http: httpx.Client, tool_id: str, payload: dict[str, Any]) -> httpx.Response:
    """The answer to one invocation of ``tool_id`` with ``payload`` as its input."""
    return http.post(f"/v1/custom-tools/{tool_id}/invoke", json={"input": payload})


def in_both_languages(
    http: httpx.Client, prefix: str, python: str, javascript: str
) -> dict[str, dict[str, Any]]:
    """``{prefix}-python`` and ``{prefix}-javascript`` made in the first workspace and each
    invoked with ``{"x": "on"}``, each run ok: each language's Result."""
    ws = first_workspace(http)
    results = {}
    for language, code in (("python", python), ("javascript", javascript)):
        tool_id = created(http, ws, f"{prefix}-{language}", code, language)
        done = invoked(http, tool_id, {"x": "on"})
        assert done.json()["data"]["status"] == "ok", done.text
        results[language] = done.json()["data"]
    return results


def draft_run(
    http: Http,
    headers: dict[str, str],
    ws: str,
    code: str,
    *,
    name: str = "draft",
    language: str = "python",
    payload: dict[str, Any] | None = None,
    timeout_ms: int = 3000,
) -> dict[str, Any]:
    """The Result of a test run of ``code`` (not stored), as the view's "Test" does, with
    ``payload`` as its input (answered: 200)."""
    body = tool_body(ws, name, code, language, input=payload or {}, timeout_ms=timeout_ms)
    r = http.post("/v1/custom-tools/test", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["data"]
