"""``names=name``: an agent's custom tools offered under their own names where every format
allows it and no built-in has the name; ``custom_{id}`` otherwise and by default. Both names
reach the tool in a tool call."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.test_agents import NAME, agent, call, tool
from tests.conftest import Space


def listed(client: TestClient, a: dict, rw, fmt: str, names: str | None) -> list[str]:
    params = {"format": fmt} | ({"names": names} if names else {})
    r = client.get(f"/v1/agents/{a['id']}/tools", params=params, headers=rw)
    assert r.status_code == 200, r.text
    return [d["function"]["name"] if fmt == "openai" else d["name"] for d in r.json()["data"]]


def test_own_names_where_they_can_be(client: TestClient, space: Space, rw) -> None:
    a = agent(client, space, rw, name="named")
    own = tool(client, space, rw, name="lookup-order", enable_globally=True)
    clash = tool(client, space, rw, name="calculate", enable_globally=True)  # a built-in's
    for fmt in ("openai", "anthropic", "mcp"):
        default = listed(client, a, rw, fmt, None)
        assert f"custom_{own['id']}" in default and f"custom_{clash['id']}" in default
        named = listed(client, a, rw, fmt, "name")
        assert "lookup-order" in named and f"custom_{own['id']}" not in named
        assert f"custom_{clash['id']}" in named and named.count("calculate") <= 1
        assert all(NAME.fullmatch(n) for n in named)
    by_name = call(client, a, rw, "lookup-order", {"order_id": "7"})
    by_id = call(client, a, rw, f"custom_{own['id']}", {"order_id": "7"})
    assert by_name["tool_id"] == by_id["tool_id"] == own["id"]
    assert by_name["message"] == "Order 7 is shipped"
    # "calculate" stays the built-in.
    assert call(client, a, rw, "calculate", {"expression": "2+3"})["tool_id"] is None


def test_an_unknown_naming_is_a_422_naming_the_field(client: TestClient, space: Space, rw) -> None:
    a = agent(client, space, rw, name="naming")
    r = client.get(f"/v1/agents/{a['id']}/tools", params={"names": "nick"}, headers=rw)
    assert r.status_code == 422, r.text
    assert "names" in r.text
