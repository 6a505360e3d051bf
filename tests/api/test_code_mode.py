"""Code mode (CONTRACT 7a, issue 16): an agent's tools as one ``run_program`` tool, through
the API, in both languages, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Space

TODAY = dt.date.today()
ORDERS = [
    {"id": f"A-{i}", "total": total, "shipped": (TODAY - dt.timedelta(days=age)).isoformat()}
    for i, (total, age) in enumerate([(80, 1), (12, 2), (55, 30), (7, 3), (31, 0), (9, 45)])
]
LIST_ORDERS = f"""
import datetime
ORDERS = {ORDERS!r}

def handle(input, ctx):
    since = datetime.date.fromisoformat(input["since"])
    return {{"message": "orders", "rawData": [o for o in ORDERS if o["shipped"] >= since.isoformat()]}}
"""
ORDER_DETAILS = """
def main(**p):
    return {"message": "details", "rawData": {"id": p["order_id"], "customer": "c-" + p["order_id"]}}
"""
PY_PROGRAM = """
import datetime

async def handle(input, ctx):
    since = (datetime.date.today() - datetime.timedelta(days=7)).isoformat()
    orders = (await ctx.tools.list_orders({"since": since}))["rawData"]
    cheapest = sorted(orders, key=lambda o: o["total"])[:3]
    lines = []
    for o in cheapest:
        d = (await ctx.tools["order-details"]({"order_id": o["id"]}))["rawData"]
        lines.append(f"{o['id']} {o['total']} {d['customer']}")
    sent = await ctx.tools.send_email(
        {"to": "me@example.org", "subject": "Cheapest orders", "body_text": "\\n".join(lines)}
    )
    return {"message": "sent", "rawData": {"ids": [o["id"] for o in cheapest], "sent": sent}}
"""
JS_PROGRAM = """
async function handle(input, ctx) {
  const since = new Date(Date.now() - 7 * 864e5).toISOString().slice(0, 10);
  const orders = (await ctx.tools.list_orders({ since })).rawData;
  const cheapest = orders.sort((a, b) => a.total - b.total).slice(0, 3);
  const lines = [];
  for (const o of cheapest) {
    const d = (await ctx.tools['order-details']({ order_id: o.id })).rawData;
    lines.push(`${o.id} ${o.total} ${d.customer}`);
  }
  const sent = await ctx.tools.send_email(
    { to: 'me@example.org', subject: 'Cheapest orders', body_text: lines.join('\\n') });
  return { message: 'sent', rawData: { ids: cheapest.map((o) => o.id), sent } };
}
"""


def _post(client: TestClient, space: Space, path: str, body: Any) -> Any:
    r = client.post(path, json=body, headers=space.auth("read", "write", "invoke"))
    assert r.status_code in (200, 201), r.text
    return r.json()["data"]


def _tool(client: TestClient, space: Space, name: str, code: str, **over: Any) -> dict[str, Any]:
    body = {"workspace_id": space.id, "name": name, "language": "python", "code": code, **over}
    return _post(client, space, "/v1/custom-tools", body)


@pytest.fixture
def shop(client: TestClient, space: Space) -> dict[str, Any]:
    """An agent with two order tools, a direct-only tool and a code-only tool."""
    r = client.patch(
        f"/v1/workspaces/{space.id}/policy",
        json={"email_allowlist": ["example.org"]},
        headers=space.auth("admin"),
    )
    assert r.status_code == 200, r.text
    since = {"since": {"type": "string", "required": True, "description": "ISO date"}}
    by_id = {"order_id": {"type": "string", "required": True}}
    tools = {
        "list": _tool(
            client,
            space,
            "list-orders",
            LIST_ORDERS,
            parameters=since,
            description="Orders shipped on or after a date.",
        ),
        "details": _tool(
            client,
            space,
            "order-details",
            ORDER_DETAILS,
            parameters=by_id,
            description="One order's customer.",
        ),
        "direct_only": _tool(
            client,
            space,
            "refund-order",
            ORDER_DETAILS,
            parameters=by_id,
            allowed_callers=["direct"],
        ),
        "code_only": _tool(
            client, space, "raw-export", ORDER_DETAILS, parameters=by_id, allowed_callers=["code"]
        ),
        "unoffered": _tool(client, space, "not-for-this-agent", ORDER_DETAILS, parameters=by_id),
    }
    agent = _post(client, space, "/v1/agents", {"workspace_id": space.id, "name": "shopper"})
    for key in ("list", "details", "direct_only", "code_only"):
        r = client.put(
            f"/v1/agents/{agent['id']}/custom-tools/{tools[key]['id']}",
            json={},
            headers=space.auth("write"),
        )
        assert r.status_code == 200, r.text
    return {"agent": agent, **tools}


def _list(client: TestClient, space: Space, agent: dict[str, Any], **params: Any) -> list[Any]:
    r = client.get(f"/v1/agents/{agent['id']}/tools", params=params, headers=space.auth("read"))
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_code_mode_offers_one_program_tool_in_every_format(
    client: TestClient, space: Space, shop: dict[str, Any]
) -> None:
    agent = shop["agent"]
    openai = _list(client, space, agent, format="openai", mode="code")
    anthropic = _list(client, space, agent, format="anthropic", mode="code", language="javascript")
    mcp = _list(client, space, agent, format="mcp", mode="code")
    assert [t["function"]["name"] for t in openai] == ["run_program"]
    assert [t["name"] for t in anthropic] == [t["name"] for t in mcp] == ["run_program"]
    py = openai[0]["function"]["description"]
    js = anthropic[0]["description"]
    assert "def list_orders(*, since: str) -> ToolResult" in py and "ISO date" in py
    assert "declare function list_orders(args: { /** ISO date */ since: string })" in js
    for text in (py, js):
        assert "raw_export" in text and "order_details" in text and "calculate" in text
        assert "refund_order" not in text and "not_for_this_agent" not in text
    schema = openai[0]["function"]["parameters"]
    assert schema["required"] == ["language", "code"] and "anyOf" not in schema
    direct = [t["name"] for t in _list(client, space, agent, format="mcp")]
    assert f"custom_{shop['direct_only']['id']}" in direct
    assert f"custom_{shop['code_only']['id']}" not in direct
    bad = client.get(
        f"/v1/agents/{agent['id']}/tools", params={"mode": "both"}, headers=space.auth("read")
    )
    assert bad.status_code == 422


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_program_calls_custom_tools_and_a_builtin_under_one_budget(
    client: TestClient, space: Space, shop: dict[str, Any], language: str
) -> None:
    agent = shop["agent"]
    code = PY_PROGRAM if language == "python" else JS_PROGRAM
    res = _post(
        client,
        space,
        f"/v1/agents/{agent['id']}/tool-calls",
        {"name": "run_program", "arguments": {"language": language, "code": code}},
    )
    assert res["status"] == "ok", res
    assert res["raw_data"]["ids"] == ["A-3", "A-1", "A-4"]
    assert "message_id" in res["raw_data"]["sent"]
    assert res["ctx_calls"] == 5  # list, three details, one email
    call = client.get(f"/v1/tool-calls/{res['tool_call_id']}", headers=space.auth("read"))
    rows = call.json()["data"]["audit"]
    assert [r["event"] for r in rows] == ["tool.called"] * 4 + ["builtin.called", "tool.invoked"]
    assert [r["data"]["name"] for r in rows[:4]] == ["list-orders"] + ["order-details"] * 3
    assert all(r["source"] == "code" and r["agent_id"] == agent["id"] for r in rows[:5])
    assert rows[-1]["data"]["name"] == "run_program"
    for key, n in (("list", 1), ("details", 3)):
        tool = client.get(f"/v1/custom-tools/{shop[key]['id']}", headers=space.auth("read"))
        assert tool.json()["data"]["usage_count"] == n
    nested = client.get(
        "/v1/audit",
        params={"tool_id": shop["details"]["id"], "event": "tool.invoked"},
        headers=space.auth("read"),
    ).json()["data"]
    assert {r["data"]["parent_call_id"] for r in nested} == {res["tool_call_id"]}
    assert {r["source"] for r in nested} == {"code"}


def test_a_program_reaches_exactly_the_agents_code_mode_tools(
    client: TestClient, space: Space, shop: dict[str, Any]
) -> None:
    code = (
        "def handle(input, ctx):\n"
        "    return {n: ctx.tools[n]({'order_id': 'x'}).get('error') for n in\n"
        "            ['raw-export', 'refund-order', 'not-for-this-agent', 'custom_nope']}\n"
    )
    res = _post(
        client,
        space,
        f"/v1/agents/{shop['agent']['id']}/tool-calls",
        {"name": "run_program", "arguments": {"language": "python", "code": code}},
    )
    assert res["raw_data"] == {
        "raw-export": None,
        "refund-order": "unknown_tool",
        "not-for-this-agent": "unknown_tool",
        "custom_nope": "tool_not_enabled",
    }, res


def test_a_program_is_held_to_fifty_calls_and_refuses_bad_input(
    client: TestClient, space: Space, shop: dict[str, Any]
) -> None:
    code = (
        "def handle(input, ctx):\n"
        "    out = [ctx.tools.calculate({'expression': '1+1'}) for _ in range(55)]\n"
        "    return [r.get('error') for r in out if isinstance(r, dict) and 'error' in r]\n"
    )
    url = f"/v1/agents/{shop['agent']['id']}/tool-calls"
    res = _post(
        client,
        space,
        url,
        {"name": "run_program", "arguments": {"language": "python", "code": code}},
    )
    assert res["raw_data"] == ["call_limit"] * 5 and res["ctx_calls"] == 55
    bad = _post(client, space, url, {"name": "run_program", "arguments": {"language": "cobol"}})
    assert bad["error"]["code"] == "invalid_input"
    nohandle = _post(
        client,
        space,
        url,
        {
            "name": "run_program",
            "arguments": {"language": "python", "code": "def main(**p):\n    return {}"},
        },
    )
    assert nohandle["error"]["code"] == "runtime_error"


def test_a_custom_tool_whose_name_means_something_else_is_listed_by_its_id(
    client: TestClient, space: Space
) -> None:
    """``send-email`` would be ``send_email`` in a program, which is the built-in; a name
    ``custom-...`` would be read as an id. Such tools are listed as ``custom_{id}``, and a
    program calling what the list says reaches them."""
    agent = _post(client, space, "/v1/agents", {"workspace_id": space.id, "name": "homonyms"})
    code = "def main(**p):\n    return {'message': 'the custom one'}\n"
    tools = [_tool(client, space, name, code) for name in ("send-email", "custom-report")]
    for t in tools:
        r = client.put(
            f"/v1/agents/{agent['id']}/custom-tools/{t['id']}", json={}, headers=space.auth("write")
        )
        assert r.status_code == 200, r.text
    text = _list(client, space, agent, format="openai", mode="code")[0]["function"]["description"]
    for t in tools:
        assert f"def custom_{t['id']}(" in text, text
    assert "def custom_report(" not in text
    calls = ", ".join(f"ctx.tools.custom_{t['id']}({{}})['message']" for t in tools)
    program = f"def handle(input, ctx):\n    return [{calls}]\n"
    res = _post(
        client,
        space,
        f"/v1/agents/{agent['id']}/tool-calls",
        {"name": "run_program", "arguments": {"language": "python", "code": program}},
    )
    assert res["status"] == "ok" and res["raw_data"] == ["the custom one"] * 2, res
