"""Ids and lookups are scoped to their workspace: nothing of workspace A is reachable, or even
in the way, from workspace B (issue 10). Through the API, on SQLite and PostgreSQL."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool
from toolkiln.app import Runtime
from toolkiln.services.calls import CallContext


def _tool(client: TestClient, space: Space, **over: Any) -> dict[str, Any]:
    r = client.post("/v1/custom-tools", json=seed_tool(space, **over), headers=space.auth("write"))
    assert r.status_code == 201, r.text
    return r.json()["data"]


def _invoke(
    client: TestClient, space: Space, tool: dict[str, Any], input: Any = None, **body: Any
) -> Any:
    return client.post(
        f"/v1/custom-tools/{tool['id']}/invoke",
        json={"input": {"order_id": "A-1"} if input is None else input, **body},
        headers=space.auth("invoke"),
    )


def test_a_tool_call_id_is_a_workspace_own(
    client: TestClient, space: Space, other_space: Space
) -> None:
    call_id = f"call-{secrets.token_hex(4)}"
    mine = _tool(client, space)
    theirs = _tool(client, other_space, code="def main(**p):\n    return {'message': 'B'}")
    assert _invoke(client, space, mine, tool_call_id=call_id).status_code == 200
    # The same id in another workspace is that workspace's own: no 409, no shared record.
    r = _invoke(client, other_space, theirs, tool_call_id=call_id)
    assert r.status_code == 200 and r.json()["data"]["message"] == "B"
    # Used twice in one workspace, it is a conflict there.
    assert _invoke(client, space, mine, tool_call_id=call_id).status_code == 409
    a = client.get(f"/v1/tool-calls/{call_id}", headers=space.auth("read")).json()["data"]
    b = client.get(f"/v1/tool-calls/{call_id}", headers=other_space.auth("read")).json()["data"]
    assert a["tool_id"] == mine["id"] and b["tool_id"] == theirs["id"]
    assert {r["workspace_id"] for r in a["audit"]} == {space.id}
    assert {r["workspace_id"] for r in b["audit"]} == {other_space.id}
    assert all(r["tool_id"] == theirs["id"] for r in b["audit"])


def test_another_workspaces_call_is_not_found(
    client: TestClient, space: Space, other_space: Space
) -> None:
    call_id = f"secret-{secrets.token_hex(4)}"
    assert _invoke(client, space, _tool(client, space), tool_call_id=call_id).status_code == 200
    r = client.get(f"/v1/tool-calls/{call_id}", headers=other_space.auth("read"))
    assert r.status_code == 404
    rows = client.get(
        "/v1/audit",
        params={"tool_call_id": call_id, "workspace_id": other_space.id},
        headers=other_space.auth("read"),
    ).json()["data"]
    assert rows == []


def test_an_agent_is_never_offered_another_workspaces_status_line(
    runtime: Runtime, client: TestClient, space: Space, other_space: Space
) -> None:
    secret = f"Reading the ledger of {secrets.token_hex(4)}"
    foreign = _tool(client, space, execution_message_description=secret, enable_globally=True)
    r = client.post(
        "/v1/agents",
        json={"workspace_id": other_space.id, "name": "b"},
        headers=other_space.auth("write"),
    )
    agent = r.json()["data"]
    who = runtime.services.access.authenticate(other_space.tokens["invoke,read,write"])
    told: list[str] = []
    name = f"custom_{foreign['id']}"
    result = runtime.services.agents.dispatch(
        who, agent["id"], name, {"order_id": "x"}, CallContext(), on_status=told.append
    )
    assert told == [] and result.error is not None
    assert result.error["code"] == "tool_not_enabled"
    r = client.post(
        f"/v1/agents/{agent['id']}/tool-calls",
        json={"name": f"custom_{foreign['id']}", "arguments": {"order_id": "x"}},
        headers=other_space.auth("read", "write", "invoke"),
    )
    assert r.status_code == 200 and r.json()["data"]["error"]["code"] == "tool_not_enabled"
    assert secret not in r.text


def test_ctx_cannot_reach_another_workspaces_tool_by_id(
    client: TestClient, space: Space, other_space: Space
) -> None:
    foreign = _tool(client, space, code="def main(**p):\n    return {'message': 'A secret'}")
    code = f"def handle(input, ctx):\n    return ctx.tools['custom_{foreign['id']}']({{'order_id': 'x'}})"
    probe = _tool(client, other_space, name="probe", code=code, parameters=None)
    res = _invoke(client, other_space, probe, {}).json()["data"]
    assert res["raw_data"]["error"] == "unknown_tool" and "A secret" not in str(res)


def test_lone_surrogates_in_an_input_are_refused_naming_the_field(
    client: TestClient, space: Space
) -> None:
    tool = _tool(client, space)
    body = '{"input": {"order_id": "\\ud800"}}'
    r = client.post(
        f"/v1/custom-tools/{tool['id']}/invoke",
        content=body,
        headers={**space.auth("invoke"), "Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text
    err = r.json()["data"]["error"]
    assert err["code"] == "invalid_input" and err["details"][0]["field"] == "input.order_id"
    after = client.get(f"/v1/custom-tools/{tool['id']}", headers=space.auth("read")).json()["data"]
    assert after["usage_count"] == 0 and after["failure_count"] == 0


def test_a_result_with_a_lone_surrogate_is_the_tools_counted_failure(
    client: TestClient, space: Space
) -> None:
    for language, code in (
        ("python", "def handle(input, ctx):\n    return {'message': 'x\\ud800'}"),
        ("javascript", "function handle(input, ctx) { return {message: 'x\\ud800'}; }"),
    ):
        tool = _tool(
            client,
            space,
            name=f"surrogate-{language}",
            language=language,
            code=code,
            parameters=None,
        )
        res = _invoke(client, space, tool, {}).json()["data"]
        assert res["error"]["code"] in {"invalid_result", "runtime_error"}, res
        after = client.get(f"/v1/custom-tools/{tool['id']}", headers=space.auth("read"))
        assert after.json()["data"]["failure_count"] == 1, language
