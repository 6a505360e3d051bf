"""A tool name holding NUL, from tool code (``ctx.tools``) or an MCP client, finds no tool on
both backends: PostgreSQL cannot compare text holding NUL, and such a lookup ended the run
as ``infra_error`` (ctx) or answered the SQL text to an MCP client (until 2026-12-06)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import Space
from toolkiln.app import Runtime
from toolkiln.services.calls import CallContext

CALLS_NUL_NAMES = (
    "def main(*, ctx, **p):\n"
    "    seen = []\n"
    "    for name in ('x\\x00', 'custom_\\x00', 'a\\x00b'):\n"
    "        out = ctx.tools[name]({})\n"
    "        seen.append(out.get('error'))\n"
    "    return {'message': 'done', 'rawData': seen}\n"
)


def test_a_nul_in_a_ctx_tool_name_is_an_unknown_tool(
    client: TestClient, space: Space, rw: dict[str, str]
) -> None:
    body = {"workspace_id": space.id, "name": "nul-names", "language": "python"}
    made = client.post("/v1/custom-tools", json={**body, "code": CALLS_NUL_NAMES}, headers=rw)
    assert made.status_code == 201, made.text
    res = client.post(
        f"/v1/custom-tools/{made.json()['data']['id']}/invoke", json={"input": {}}, headers=rw
    ).json()["data"]
    assert res["status"] == "ok", res["error"]
    assert res["raw_data"] == ["unknown_tool"] * 3, res["raw_data"]


def test_a_nul_in_an_agents_tool_name_is_refused_as_not_offered(
    runtime: Runtime, space: Space
) -> None:
    """The path an MCP ``tools/call`` takes (REST's agent route refuses NUL on input)."""
    who = runtime.services.access.authenticate(space.tokens["admin"])
    agent = runtime.services.agents.create(who, space.id, "nul-agent")
    for name in ("a\x00", "custom_\x00"):
        told: list[str] = []
        result = runtime.services.agents.dispatch(
            who, agent.id, name, {}, CallContext(), on_status=told.append
        )
        assert told == []
        assert result.error is not None, result
        assert result.error["code"] in ("unknown_tool", "tool_not_enabled"), result.error
