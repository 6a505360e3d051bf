"""Edges of the one call path found by review: ids as long as the API accepts, values that no
database stores, test runs that reach stored tools, deadlines that are the caller's, scopes.
Through the API, on SQLite and PostgreSQL."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.calls import invoke, make_tool, state
from tests.conftest import Space


def test_ids_of_128_characters_are_recorded(client: TestClient, space: Space) -> None:
    tool = make_tool(
        client, space, "long-ids", "def main(**p):\n    raise ValueError('x')\n    return {}"
    )
    for i in range(3):
        res = invoke(client, space, tool, tool_call_id=f"{i}" * 128, agent_id="a" * 128)
        assert res["error"]["code"] == "runtime_error"
    after = state(client, space, tool)
    assert after["usage_count"] == 3 and after["status"] == "disabled"
    call = client.get(f"/v1/tool-calls/{'0' * 128}", headers=space.auth("read")).json()["data"]
    assert call["audit"][0]["agent_id"] == "a" * 128


def test_values_no_database_stores_are_the_tools_counted_failure(
    client: TestClient, space: Space
) -> None:
    deep_nul = (
        "def handle(input, ctx):\n"
        "    v = 'x\\x00'\n"
        "    for _ in range(70):\n"
        "        v = [v]\n"
        "    return {'message': 'deep', 'rawData': v}\n"
    )
    tool = make_tool(client, space, "deep-nul", deep_nul)
    res = invoke(client, space, tool)
    assert res["error"]["code"] == "invalid_result", res
    assert state(client, space, tool)["failure_count"] == 1


def test_a_test_run_counts_nothing_it_reaches(client: TestClient, space: Space) -> None:
    failing = make_tool(
        client,
        space,
        "stored-and-failing",
        "def main(**p):\n    raise ValueError('x')\n    return {}",
    )
    body = {
        "workspace_id": space.id,
        "name": "tries-it",
        "language": "python",
        "code": "def handle(input, ctx):\n    return [ctx.tools['stored-and-failing']({})['error'] for _ in range(3)]",
        "input": {},
    }
    r = client.post("/v1/custom-tools/test", json=body, headers=space.auth("write"))
    assert r.status_code == 200 and r.json()["data"]["raw_data"] == ["runtime_error"] * 3, r.text
    after = state(client, space, failing)
    assert after["status"] == "active" and after["usage_count"] == 0 and after["failure_count"] == 0


def test_a_nested_tool_cut_short_by_its_callers_deadline_is_not_failed(
    client: TestClient, space: Space
) -> None:
    slow = make_tool(
        client, space, "slow-inner", "def main(**p):\n    while True:\n        pass\n    return {}"
    )
    outer = make_tool(
        client,
        space,
        "hasty-outer",
        "def handle(input, ctx):\n    return ctx.tools['slow-inner']({})",
        timeout_ms=1000,
    )
    res = invoke(client, space, outer)
    assert res["status"] == "error"
    inner = state(client, space, slow)
    assert inner["usage_count"] == 1 and inner["failure_count"] == 0, inner
    rows = client.get(
        "/v1/audit",
        params={"tool_id": slow["id"], "event": "tool.invoked"},
        headers=space.auth("read"),
    ).json()["data"]
    assert rows[0]["data"]["error"] == "timeout"


def test_an_invoke_token_can_make_an_agents_tool_call(client: TestClient, space: Space) -> None:
    agent = client.post(
        "/v1/agents", json={"workspace_id": space.id, "name": "b"}, headers=space.auth("write")
    ).json()["data"]
    r = client.post(
        f"/v1/agents/{agent['id']}/tool-calls",
        json={"name": "calculate", "arguments": {"expression": "2+2"}},
        headers=space.auth("invoke"),
    )
    assert r.status_code == 200 and r.json()["data"]["raw_data"] == {"result": 4}, r.text


def test_run_code_refuses_a_used_call_id(client: TestClient, space: Space) -> None:
    tool = make_tool(client, space, "first-user", "def main(**p):\n    return {'message': 'ok'}")
    invoke(client, space, tool, tool_call_id="taken-by-invoke")
    r = client.post(
        "/v1/run-code",
        json={
            "language": "python",
            "code": "def handle(i, c):\n    return 1",
            "tool_call_id": "taken-by-invoke",
        },
        headers=space.auth("invoke"),
    )
    assert r.status_code == 409 and r.json()["error"]["code"] == "duplicate_tool_call_id"


def test_an_agents_tool_call_and_a_builtin_call_refuse_a_used_call_id(
    client: TestClient, space: Space
) -> None:
    """Every entrance that takes a client's ``tool_call_id`` checks it the one way
    (``CallContext.call_id_in``): an id an invoke used is a 409 for the others too."""
    tool = make_tool(client, space, "id-keeper", "def main(**p):\n    return {'message': 'ok'}")
    invoke(client, space, tool, tool_call_id="taken-once")
    agent = client.post(
        "/v1/agents", json={"workspace_id": space.id, "name": "ids"}, headers=space.auth("write")
    ).json()["data"]
    calls = [
        (
            f"/v1/agents/{agent['id']}/tool-calls",
            {"name": "calculate", "arguments": {"expression": "1+1"}},
        ),
        ("/v1/builtin-tools/calculate/call", {"input": {"expression": "1+1"}}),
    ]
    for path, body in calls:
        r = client.post(
            path, json={**body, "tool_call_id": "taken-once"}, headers=space.auth("invoke")
        )
        assert r.status_code == 409, (path, r.text)
        assert r.json()["error"]["code"] == "duplicate_tool_call_id"
