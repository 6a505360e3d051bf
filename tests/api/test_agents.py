"""Agents: enablement, pinning, tool lists in three formats, and the one dispatch call."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator

from tests.conftest import Space, seed_tool
from toolkiln.api.app import create_app
from toolkiln.api.fast import FastRoute
from toolkiln.app import Runtime

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

RICH_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "units": {"type": "string", "enum": ["metric", "imperial"]},
        "days": {"type": "integer"},
        "filters": {
            "type": "object",
            "properties": {
                "rain": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["rain"],
        },
    },
    "required": ["city"],
}


def agent(client: TestClient, space: Space, rw, name: str = "helper") -> dict:
    r = client.post("/v1/agents", json={"workspace_id": space.id, "name": name}, headers=rw)
    assert r.status_code == 201, r.text
    return r.json()["data"]


def tool(client: TestClient, space: Space, rw, **over) -> dict:
    r = client.post("/v1/custom-tools", json=seed_tool(space, **over), headers=rw)
    assert r.status_code == 201, r.text
    return r.json()["data"]


def names(client: TestClient, a: dict, rw, fmt: str = "anthropic") -> list[str]:
    r = client.get(f"/v1/agents/{a['id']}/tools", params={"format": fmt}, headers=rw)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    return [d["function"]["name"] if fmt == "openai" else d["name"] for d in data]


def call(client: TestClient, a: dict, rw, name: str, arguments: dict | str) -> dict:
    r = client.post(
        f"/v1/agents/{a['id']}/tool-calls", json={"name": name, "arguments": arguments}, headers=rw
    )
    assert r.status_code == 200, r.text
    return r.json()["data"]


def test_lists_follow_enablement_and_status(client: TestClient, space: Space, rw) -> None:
    a, b = agent(client, space, rw, "a"), agent(client, space, rw, "b")
    mine = tool(client, space, rw, name="mine")
    shared = tool(client, space, rw, name="shared", enable_globally=True)
    builtins = [
        "calculate",
        "http_request",
        "run_code",
        "send_email",
        "surface_file",
        "web_search",
    ]
    # not enabled for the agent yet: only the built-ins and the global tool
    assert names(client, a, rw) == [*builtins, f"custom_{shared['id']}"]
    assert (
        client.put(f"/v1/agents/{a['id']}/custom-tools/{mine['id']}", headers=rw).status_code == 200
    )
    assert names(client, a, rw) == [*builtins, f"custom_{mine['id']}", f"custom_{shared['id']}"]
    assert names(client, b, rw) == [*builtins, f"custom_{shared['id']}"]
    client.post(f"/v1/custom-tools/{shared['id']}/disable", headers=rw)
    assert f"custom_{shared['id']}" not in names(client, b, rw)
    client.post(f"/v1/custom-tools/{shared['id']}/enable", headers=rw)
    assert f"custom_{shared['id']}" in names(client, b, rw)
    client.patch(
        f"/v1/workspaces/{space.id}/policy",
        json={"builtins": ["calculate"]},
        headers=space.auth("admin"),
    )
    assert names(client, b, rw) == ["calculate", f"custom_{shared['id']}"]
    assert names(client, a, rw, "mcp") == names(client, a, rw, "openai") == names(client, a, rw)
    assert (
        client.delete(f"/v1/agents/{a['id']}/custom-tools/{mine['id']}", headers=rw).status_code
        == 204
    )
    assert f"custom_{mine['id']}" not in names(client, a, rw)


def test_every_format_is_valid_for_its_provider(client: TestClient, space: Space, rw) -> None:
    a = agent(client, space, rw)
    tool(
        client,
        space,
        rw,
        name="weather",
        parameters=None,
        input_schema=RICH_SCHEMA,
        enable_globally=True,
    )
    for fmt in ("openai", "anthropic", "mcp"):
        data = client.get(f"/v1/agents/{a['id']}/tools", params={"format": fmt}, headers=rw).json()[
            "data"
        ]
        for entry in data:
            spec = entry["function"] if fmt == "openai" else entry
            schema = spec[
                "parameters"
                if fmt == "openai"
                else "input_schema"
                if fmt == "anthropic"
                else "inputSchema"
            ]
            assert NAME.match(spec["name"]) and spec["description"]
            assert schema["type"] == "object"
            Draft202012Validator.check_schema(schema)
            if fmt == "openai":
                assert entry["type"] == "function"
    strict = client.get(
        f"/v1/agents/{a['id']}/tools", params={"format": "openai", "strict": "true"}, headers=rw
    ).json()["data"]
    weather = next(
        e["function"]
        for e in strict
        if e["function"]["description"] == "Look up the fulfillment status of an order by id."
    )
    assert weather["strict"] is True
    params = weather["parameters"]

    def check_strict(node: dict) -> None:
        if "anyOf" in node:
            for n in node["anyOf"]:
                check_strict(n)
        if node.get("type") == "object" or "properties" in node:
            assert node["additionalProperties"] is False
            assert sorted(node["required"]) == sorted(node["properties"])
            for sub in node["properties"].values():
                check_strict(sub)
        if "items" in node:
            check_strict(node["items"])

    check_strict(params)
    assert params["properties"]["city"]["type"] == "string"
    assert params["properties"]["days"]["type"] == ["integer", "null"]
    assert params["properties"]["units"] == {
        "anyOf": [{"type": "string", "enum": ["metric", "imperial"]}, {"type": "null"}]
    }
    assert params["properties"]["filters"]["properties"]["tags"]["type"] == ["array", "null"]
    v = Draft202012Validator(params)
    assert v.is_valid({"city": "Oslo", "units": None, "days": None, "filters": None})
    assert not v.is_valid({"city": "Oslo"})
    lax = tool(
        client,
        space,
        rw,
        name="lax",
        parameters=None,
        enable_globally=True,
        input_schema={
            "type": "object",
            "properties": {"q": {"type": "string", "minLength": 2}},
            "patternProperties": {"^x-": {"type": "string"}},
        },
    )
    assert "strict: false" in lax["warnings"][0]["message"]
    listed = client.get(
        f"/v1/agents/{a['id']}/tools", params={"format": "openai", "strict": "true"}, headers=rw
    ).json()["data"]
    entry = next(e["function"] for e in listed if e["function"]["name"] == f"custom_{lax['id']}")
    assert entry["strict"] is False and entry["parameters"]["properties"]["q"]["minLength"] == 2


def test_a_top_level_combinator_is_saved_with_a_warning_and_offered_without_it(
    client: TestClient, space: Space, rw
) -> None:
    a = agent(client, space, rw)
    either = {
        "type": "object",
        "properties": {"id": {"type": "string"}, "email": {"type": "string"}},
        "anyOf": [{"required": ["id"]}, {"required": ["email"]}],
    }
    t = tool(
        client, space, rw, name="either", parameters=None, input_schema=either, enable_globally=True
    )
    assert [w["field"] for w in t["warnings"]] == ["input_schema.anyOf"]
    assert client.get(f"/v1/custom-tools/{t['id']}", headers=rw).json()["data"]["warnings"]
    for fmt, key in (
        ("openai", "parameters"),
        ("anthropic", "input_schema"),
        ("mcp", "inputSchema"),
    ):
        listed = client.get(
            f"/v1/agents/{a['id']}/tools", params={"format": fmt}, headers=rw
        ).json()["data"]
        entry = next(
            e.get("function", e) for e in listed if e.get("function", e)["name"].endswith(t["id"])
        )
        assert (
            "anyOf" not in entry[key] and "Give at least one of: id; email." in entry["description"]
        )
    r = client.post(
        f"/v1/agents/{a['id']}/tool-calls",
        json={"name": f"custom_{t['id']}", "arguments": {}},
        headers=rw,
    )
    assert r.json()["data"]["error"]["code"] == "invalid_input"


def test_dispatch_custom_builtin_unknown_and_pinned(client: TestClient, space: Space, rw) -> None:
    a = agent(client, space, rw)
    t = tool(
        client,
        space,
        rw,
        name="versioned",
        parameters=None,
        input_schema={"type": "object"},
        code="def main(**p):\n    return {'message': 'v1'}",
    )
    client.put(f"/v1/agents/{a['id']}/custom-tools/{t['id']}", json={"version": 1}, headers=rw)
    client.patch(
        f"/v1/custom-tools/{t['id']}",
        json={"code": "def main(**p):\n    return {'message': 'v2'}"},
        headers=rw,
    )
    res = call(client, a, rw, f"custom_{t['id']}", {})
    assert res["status"] == "ok" and res["message"] == "v1" and res["version"] == 1
    invoked = client.post(
        f"/v1/custom-tools/{t['id']}/invoke", json={"input": {}}, headers=rw
    ).json()["data"]
    assert invoked["message"] == "v2"
    client.put(f"/v1/agents/{a['id']}/custom-tools/{t['id']}", headers=rw)
    assert call(client, a, rw, f"custom_{t['id']}", {})["message"] == "v2"
    assert client.get(f"/v1/custom-tools/{t['id']}", headers=rw).json()["data"]["usage_count"] == 3
    calc = call(client, a, rw, "calculate", {"expression": "6*7"})
    assert (
        calc["status"] == "ok"
        and calc["raw_data"] == {"result": 42}
        and calc["llm"] == '{"result": 42}'
    )
    bad = call(client, a, rw, "calculate", {"nope": 1})
    assert bad["status"] == "error" and bad["error"]["code"] == "invalid_input"
    unknown = call(client, a, rw, "delete_everything", {})
    assert unknown["error"]["code"] == "unknown_tool" and "calculate" in unknown["error"]["message"]
    other = tool(client, space, rw, name="not-enabled")
    assert call(client, a, rw, f"custom_{other['id']}", {})["error"]["code"] == "tool_not_enabled"
    assert (
        client.put(
            f"/v1/agents/{a['id']}/custom-tools/{t['id']}", json={"version": 9}, headers=rw
        ).status_code
        == 422
    )
    rows = client.get(
        "/v1/audit", params={"agent_id": a["id"], "event": "tool.invoked"}, headers=rw
    ).json()["data"]
    assert rows and all(r["source"] == "llm" for r in rows)


def test_auto_disable_shows_in_lists_and_dispatch(client: TestClient, space: Space, rw) -> None:
    a = agent(client, space, rw)
    t = tool(
        client,
        space,
        rw,
        name="broken",
        enable_globally=True,
        parameters=None,
        input_schema={"type": "object"},
        code="def main(**p):\n    raise ValueError('x')\n    return {}",
    )
    for _ in range(3):
        assert call(client, a, rw, f"custom_{t['id']}", {})["error"]["code"] == "runtime_error"
    assert f"custom_{t['id']}" not in names(client, a, rw)
    assert call(client, a, rw, f"custom_{t['id']}", {})["error"]["code"] == "tool_not_enabled"


def test_agents_respect_workspaces_and_scopes(
    client: TestClient, space: Space, other_space: Space, rw
) -> None:
    a = agent(client, space, rw)
    other = other_space.auth("read", "write", "invoke")
    assert client.get(f"/v1/agents/{a['id']}", headers=other).status_code == 404
    assert client.get(f"/v1/agents/{a['id']}/tools", headers=other).status_code == 404
    assert (
        client.post(
            f"/v1/agents/{a['id']}/tool-calls",
            json={"name": "calculate"},
            headers=space.auth("read"),
        ).status_code
        == 403
    )
    assert (
        client.get(f"/v1/agents/{a['id']}/tools", params={"format": "xml"}, headers=rw).status_code
        == 422
    )
    foreign = tool(client, other_space, other, name="foreign")
    assert (
        client.put(f"/v1/agents/{a['id']}/custom-tools/{foreign['id']}", headers=rw).status_code
        == 404
    )
    assert client.delete(f"/v1/agents/{a['id']}", headers=rw).status_code == 204
    assert client.get(f"/v1/agents/{a['id']}", headers=rw).status_code == 404


def test_an_agents_default_list_follows_the_providers_published_rules(
    client: TestClient, space: Space, rw
) -> None:
    from tests.domain.test_provider_rules import SCHEMAS, check_entry, check_strict

    a = agent(client, space, rw)
    for label in ("top_one_of", "top_not_and_enum", "strict_able_with_defs"):
        tool(
            client,
            space,
            rw,
            name=label.replace("_", "-"),
            parameters=None,
            input_schema=SCHEMAS[label],
            enable_globally=True,
        )
    url = f"/v1/agents/{a['id']}/tools"
    for fmt in ("openai", "anthropic", "mcp"):
        listed = client.get(url, params={"format": fmt}, headers=rw).json()["data"]
        assert len(listed) >= 8  # five built-ins and the three tools
        for entry in listed:
            check_entry(fmt, entry)
    for mode in ("direct", "code"):
        for fmt in ("openai", "anthropic", "mcp"):
            listed = client.get(url, params={"format": fmt, "mode": mode}, headers=rw).json()
            for entry in listed["data"]:
                check_entry(fmt, entry)
        strict = client.get(url, params={"format": "openai", "strict": "true", "mode": mode})
        for entry in client.get(
            url, params={"format": "openai", "strict": "true", "mode": mode}, headers=rw
        ).json()["data"]:
            check_entry("openai", entry)
            if entry["function"]["strict"]:
                check_strict(entry["function"]["parameters"])
        assert strict.status_code == 401


def test_enabling_one_tool_for_an_agent_at_once_is_never_refused(
    client: TestClient, space: Space, rw
) -> None:
    """PUT is idempotent: requests enabling the same tool for the same agent at the same
    moment all succeed, the last one's version standing (on PostgreSQL two of them found no
    row, both inserted, and the later answered 409 "conflict")."""
    import threading

    a = agent(client, space, rw, name="enabled-at-once")
    t = tool(client, space, rw, name="enabled-at-once")
    url = f"/v1/agents/{a['id']}/custom-tools/{t['id']}"
    answers: list[int] = []
    start = threading.Barrier(8)

    def put(k: int) -> None:
        start.wait()
        for j in range(5):
            r = client.put(url, json={"version": 1} if (k + j) % 2 else None, headers=rw)
            answers.append(r.status_code)

    threads = [threading.Thread(target=put, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert answers == [200] * 40, answers
    listed = client.get(f"/v1/agents/{a['id']}/custom-tools", headers=rw).json()["data"]
    assert [e["tool_id"] for e in listed] == [t["id"]]


def test_arguments_as_openais_json_text_are_the_object_they_spell(
    client: TestClient, space: Space, rw
) -> None:
    """A loop can pass ``tool_calls[].function.arguments`` through as OpenAI gives it: the
    JSON text of an object. Text that is not one is judged by the schema as it is."""
    a = agent(client, space, rw, name="openai-loop")
    calc = call(client, a, rw, "calculate", '{"expression": "6*7"}')
    assert calc["status"] == "ok" and calc["raw_data"] == {"result": 42}, calc
    t = tool(
        client,
        space,
        rw,
        name="echo-args",
        parameters=None,
        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
        code="def main(**p):\n    return {'message': 'got', 'rawData': p}",
    )
    client.put(f"/v1/agents/{a['id']}/custom-tools/{t['id']}", headers=rw)
    res = call(client, a, rw, f"custom_{t['id']}", '{"n": 7}')
    assert res["status"] == "ok" and res["raw_data"] == {"n": 7}, res
    for text in ("[1, 2]", "not json", '"{}"', "[" * 100_000):
        bad = call(client, a, rw, f"custom_{t['id']}", text)
        assert bad["status"] == "error" and bad["error"]["code"] == "invalid_input", (text, bad)


def test_the_tool_call_fast_path_answers_as_fastapis_route(
    runtime: Runtime, client: TestClient, space: Space, rw
) -> None:
    """The agent tool-call route's fast path (api/fast.py) and FastAPI's own route give the
    same answers, good and bad (bodies, content types, tokens, scopes, agents): the same app
    without the fast paths is the reference."""
    reference = create_app(runtime.services)
    reference.router.routes[:] = [
        r for r in reference.router.routes if not isinstance(r, FastRoute)
    ]
    assert any(
        isinstance(r, FastRoute) and r.path.endswith("/tool-calls")
        for r in client.app.router.routes
    )
    a = agent(client, space, rw)
    t = tool(client, space, rw, name="fast-path-tool")
    assert client.put(f"/v1/agents/{a['id']}/custom-tools/{t['id']}", headers=rw).status_code == 200
    url = f"/v1/agents/{a['id']}/tool-calls"
    json_h = {**rw, "content-type": "application/json"}
    good = f'{{"name": "custom_{t["id"]}", "arguments": {{"order_id": "A1"}}}}'.encode()
    cases: list[tuple[str, str, dict[str, str], bytes | None]] = [
        ("POST", url, json_h, good),
        (
            "POST",
            url,
            json_h,
            b'{"name": "calculate", "arguments": "{\\"expression\\": \\"1+1\\"}"}',
        ),
        ("POST", url, json_h, b'{"name": "no_such_tool"}'),
        ("POST", url, json_h, b'{"name": "calculate", "unknown": 1}'),
        ("POST", url, json_h, b'{"name": ""}'),
        ("POST", url, json_h, b'{"name": "calculate", "tool_call_id": ""}'),
        ("POST", url, json_h, b'{"name": '),
        ("POST", url, json_h, b"[]"),
        ("POST", url, rw, None),
        ("POST", url, rw, good),  # no Content-Type
        ("POST", url, {**rw, "content-type": "text/plain"}, good),
        ("POST", url, {"content-type": "application/json"}, good),
        ("POST", url, {**json_h, "authorization": "Bearer tk_wrong"}, good),
        ("POST", url, {**space.auth("read"), "content-type": "application/json"}, good),
        ("POST", url, {**space.auth("read"), "content-type": "application/json"}, b"[]"),
        ("POST", url.replace(a["id"], "no-such-agent"), json_h, good),
        ("GET", url, rw, None),
    ]
    with TestClient(reference, raise_server_exceptions=False) as slow:
        for method, path, headers, body in cases:
            fast_r = client.request(method, path, headers=headers, content=body)
            slow_r = slow.request(method, path, headers=headers, content=body)
            assert fast_r.status_code == slow_r.status_code, (body, fast_r.text, slow_r.text)
            got, want = fast_r.json(), slow_r.json()
            if fast_r.status_code == 200:  # two calls: ids and times differ, nothing else
                for answer in (got, want):
                    answer["data"].update(tool_call_id="", duration_ms=0)
            assert got == want, body
            assert fast_r.headers.get("www-authenticate") == slow_r.headers.get("www-authenticate")
    assert "post" in client.get("/openapi.json").json()["paths"]["/v1/agents/{agent_id}/tool-calls"]
