"""A model's own http_request is held to the workspace policy's egress list; tool lists say
which tools may reach the network (MCP's openWorldHint). Both databases."""

from __future__ import annotations

from tests.egress.kit import Kit
from tests.egress.servers import Running


def _agent(kit: Kit) -> str:
    r = kit.client.post(
        "/v1/agents", json={"workspace_id": kit.space.id, "name": "a"}, headers=kit.rw
    )
    assert r.status_code == 201, r.text
    return str(r.json()["data"]["id"])


def _call(kit: Kit, agent: str, arguments: dict) -> dict:
    r = kit.client.post(
        f"/v1/agents/{agent}/tool-calls",
        json={"name": "http_request", "arguments": arguments},
        headers=kit.rw,
    )
    assert r.status_code == 200, r.text
    return dict(r.json()["data"])


def test_a_models_call_is_held_to_the_policy(kit: Kit, http: Running) -> None:
    agent = _agent(kit)
    request = {"method": "GET", "url": http.url("/json")}
    refused = _call(kit, agent, request)
    assert refused["error"]["code"] == "egress_denied"  # the policy lists no host
    kit.policy(egress=[f"127.0.0.1:{http.port}"])
    assert _call(kit, agent, request)["error"]["code"] == "egress_denied"  # not private
    kit.policy(egress_private=True)
    answered = _call(kit, agent, request)
    assert answered["status"] == "ok" and answered["raw_data"]["json"] == {"ok": True}
    rows = kit.audit("http.requested")
    assert rows[-1]["source"] == "llm" and rows[-1]["tool_id"] is None
    kit.policy(builtins=["calculate"])
    assert _call(kit, agent, request)["error"]["code"] in ("not_allowed", "unknown_tool")


def test_a_bad_policy_egress_entry_is_422_naming_it(kit: Kit) -> None:
    url = f"/v1/workspaces/{kit.space.id}/policy"
    r = kit.client.patch(url, json={"egress": ["ok.com", "bad host"]}, headers=kit.rw)
    assert r.status_code == 422
    assert [p["field"] for p in r.json()["error"]["details"]] == ["egress.1"]


def test_tool_lists_say_which_tools_may_reach_the_network(kit: Kit) -> None:
    agent = _agent(kit)
    reaching = kit.tool("python", ["api.example.com"])
    closed = kit.tool("python", [])
    for tool in (reaching, closed):
        kit.client.put(f"/v1/agents/{agent}/custom-tools/{tool}", headers=kit.rw)

    def hints() -> dict[str, bool]:
        r = kit.client.get(f"/v1/agents/{agent}/tools", params={"format": "mcp"}, headers=kit.rw)
        return {e["name"]: e["annotations"]["openWorldHint"] for e in r.json()["data"]}

    seen = hints()
    assert seen[f"custom_{reaching}"] is True and seen[f"custom_{closed}"] is False
    assert seen["calculate"] is False and seen["web_search"] is True
    assert seen["http_request"] is False  # the policy lists no host
    kit.policy(egress=["api.example.com"])
    assert hints()["http_request"] is True


PROGRAMS = {
    "python": (
        "def handle(input, ctx):\n"
        "    return {'message': 'ok', 'rawData': ctx.tools.http_request("
        "{'method': 'GET', 'url': '%s'})}\n"
    ),
    "javascript": (
        "export async function handle(input, ctx) {\n"
        "  return { message: 'ok', rawData: await ctx.tools.http_request("
        "{ method: 'GET', url: '%s' }) };\n"
        "}\n"
    ),
}


def test_a_code_mode_program_is_held_to_the_policy(kit: Kit, http: Running, language: str) -> None:
    agent = _agent(kit)
    code = PROGRAMS[language] % http.url("/json")

    def program() -> dict:
        r = kit.client.post(
            f"/v1/agents/{agent}/tool-calls",
            json={"name": "run_program", "arguments": {"language": language, "code": code}},
            headers=kit.rw,
        )
        assert r.status_code == 200, r.text
        return dict(r.json()["data"])

    assert program()["raw_data"]["error"] == "egress_denied"
    kit.policy(egress=[f"127.0.0.1:{http.port}"], egress_private=True)
    assert program()["raw_data"]["json"] == {"ok": True}
    assert len(http.seen.requests) == 1
