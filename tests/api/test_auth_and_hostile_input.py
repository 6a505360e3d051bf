"""The auth matrix, and hostile or malformed input that must never become a 500."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool


def test_auth_matrix(client: TestClient, space: Space, other_space: Space, rw) -> None:
    r = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw)
    tool_id = r.json()["data"]["id"]
    url = f"/v1/custom-tools/{tool_id}"
    assert client.get(url).status_code == 401
    assert client.get(url).json()["error"]["code"] == "unauthorized"
    assert client.get(url, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get(url, headers={"Authorization": "Basic abc"}).status_code == 401
    # missing scope
    for scopes, method, path, body in [
        (("read",), "post", "/v1/custom-tools", seed_tool(space, name="x")),
        (("read",), "patch", url, {"description": "x"}),
        (("read",), "delete", url, None),
        (("read",), "post", f"{url}/disable", None),
        (("invoke",), "get", url, None),
        (("write",), "get", "/v1/audit", None),
        (("read", "write", "invoke"), "post", "/v1/workspaces", {"name": "w"}),
        (("read", "write", "invoke"), "get", "/v1/tokens", None),
    ]:
        r = client.request(method, path, json=body, headers=space.auth(*scopes))
        assert r.status_code == 403, (scopes, method, path)
        assert r.json()["error"]["code"] == "forbidden"
    # another workspace's object does not exist for you
    other = other_space.auth("read", "write", "invoke")
    for method, path in [("get", url), ("patch", url), ("delete", url), ("get", f"{url}/versions")]:
        body = {"description": "x"} if method == "patch" else None
        assert client.request(method, path, json=body, headers=other).status_code == 404
    assert client.get(f"/v1/workspaces/{space.id}", headers=other).status_code == 404
    r = client.post("/v1/custom-tools", json=seed_tool(space, name="y"), headers=other)
    assert r.status_code == 404
    listed = client.get("/v1/custom-tools", headers=other).json()["data"]
    assert tool_id not in {t["id"] for t in listed}
    # an admin token reaches every workspace
    assert client.get(url, headers=other_space.auth("admin")).status_code == 200


def test_tokens_are_shown_once_and_revocable(client: TestClient, space: Space) -> None:
    admin = space.auth("admin")
    r = client.post(
        "/v1/tokens",
        json={"workspace_id": space.id, "scopes": ["read"], "name": "ci"},
        headers=admin,
    )
    assert r.status_code == 201
    issued = r.json()["data"]
    assert issued["token"].startswith("tk_") and issued["scopes"] == ["read"]
    listed = client.get("/v1/tokens", params={"workspace_id": space.id}, headers=admin).json()[
        "data"
    ]
    assert issued["id"] in {t["id"] for t in listed}
    assert all("token" not in t for t in listed)
    mine = {"Authorization": f"Bearer {issued['token']}"}
    assert client.get(f"/v1/workspaces/{space.id}", headers=mine).status_code == 200
    assert client.delete(f"/v1/tokens/{issued['id']}", headers=admin).status_code == 204
    assert client.get(f"/v1/workspaces/{space.id}", headers=mine).status_code == 401
    bad = client.post(
        "/v1/tokens", json={"workspace_id": space.id, "scopes": ["root"]}, headers=admin
    )
    assert bad.status_code == 422


def test_workspaces_and_policy(client: TestClient, space: Space) -> None:
    admin = space.auth("admin")
    r = client.post("/v1/workspaces", json={"name": f"{space.name}-b"}, headers=admin)
    assert r.status_code == 201
    again = client.post("/v1/workspaces", json={"name": f"{space.name}-b"}, headers=admin)
    assert again.status_code == 409
    mine = client.get("/v1/workspaces", headers=space.auth("read")).json()["data"]
    assert [w["id"] for w in mine] == [space.id]
    url = f"/v1/workspaces/{space.id}/policy"
    policy = client.get(url, headers=space.auth("read")).json()["data"]
    assert policy["max_timeout_ms"] == 30000 and "calculate" in policy["builtins"]
    change = {"email_allowlist": ["a@b.com", "example.org"], "max_timeout_ms": 2000}
    new = client.patch(url, json=change, headers=space.auth("write")).json()["data"]
    assert new["email_allowlist"] == ["a@b.com", "example.org"] and new["max_timeout_ms"] == 2000
    rw = space.auth("read", "write", "invoke")
    r = client.post("/v1/custom-tools", json=seed_tool(space, timeout_ms=3000), headers=rw)
    assert r.status_code == 422 and r.json()["error"]["details"][0]["field"] == "timeout_ms"
    bad = client.patch(url, json={"builtins": ["rm_rf"]}, headers=space.auth("write"))
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["field"] == "builtins.0"


def test_workspaces_created_with_one_name_at_once_get_name_taken(
    client: TestClient, space: Space
) -> None:
    """One is created, every other is 409 ``name_taken``, as one after another (on PostgreSQL
    those that passed the name check together met the unique key: 409 ``conflict``)."""
    import threading

    admin = space.auth("admin")

    def create(name: str, start: threading.Barrier, answers: list) -> None:
        start.wait()
        r = client.post("/v1/workspaces", json={"name": name}, headers=admin)
        answers.append((r.status_code, (r.json().get("error") or {}).get("code")))

    for round_ in range(6):
        answers: list[tuple[int, str | None]] = []
        start = threading.Barrier(12)
        name = f"{space.name}-race-{round_}"
        threads = [threading.Thread(target=create, args=(name, start, answers)) for _ in range(12)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert sorted(answers, key=str) == [(201, None)] + [(409, "name_taken")] * 11, answers


def _count(client: TestClient, space: Space, rw) -> int:
    return len(
        client.get("/v1/custom-tools", params={"workspace_id": space.id}, headers=rw).json()["data"]
    )


def test_malformed_and_hostile_bodies_get_clear_4xx(client: TestClient, space: Space, rw) -> None:
    post = "/v1/custom-tools"
    json_headers = {**rw, "Content-Type": "application/json"}
    cases = [
        (b"{bad", 400, "malformed_json"),
        (b"", 422, "invalid_tool"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "malformed_json"),
        (b'"just a string"', 422, "invalid_tool"),
        (json.dumps(seed_tool(space, timeout_ms="5000")).encode(), 422, "invalid_tool"),
        (json.dumps(seed_tool(space, extra_field=1)).encode(), 422, "invalid_tool"),
        (json.dumps(seed_tool(space, name="a" * 65)).encode(), 422, "invalid_tool"),
        (json.dumps(seed_tool(space, name="lookup\u2010order")).encode(), 422, "invalid_tool"),
        (json.dumps(seed_tool(space, name="l\u043eokup")).encode(), 422, "invalid_tool"),
        (json.dumps(seed_tool(space, name="name\n")).encode(), 422, "invalid_tool"),
        (json.dumps(seed_tool(space, name="a\x00b")).encode(), 422, "invalid_tool"),
        (json.dumps(seed_tool(space, description="x\x00")).encode(), 422, "invalid_tool"),
        (
            json.dumps(seed_tool(space, code="def main(**p):\n    return '\x00'")).encode(),
            422,
            "invalid_tool",
        ),
        (json.dumps(seed_tool(space, code="x" * 300_000)).encode(), 422, "invalid_tool"),
        (
            json.dumps(seed_tool(space, parameters={"a\x00": {"type": "string"}})).encode(),
            422,
            "invalid_tool",
        ),
        (json.dumps(seed_tool(space, language="ruby")).encode(), 422, "invalid_tool"),
        (json.dumps(seed_tool(space, workspace_id="nope")).encode(), 404, "not_found"),
        (b'{"a": ' + b"1" * 2_000_000 + b"}", 413, "payload_too_large"),
    ]
    before = _count(client, space, rw)
    for body, status, code in cases:
        r = client.post(post, content=body, headers=json_headers)
        assert r.status_code == status, (body[:60], r.text[:300])
        assert r.json()["error"]["code"] == code, body[:60]
        assert "Traceback" not in r.text
    assert _count(client, space, rw) == before
    form = client.post(post, content=b"a=1", headers={**rw, "Content-Type": "text/plain"})
    assert form.status_code == 415 and form.json()["error"]["code"] == "unsupported_media_type"
    # A JSON body sent without any Content-Type (a 422 about its shape until 2026-12-06).
    bare = client.post(post, content=json.dumps(seed_tool(space)).encode(), headers=rw)
    assert bare.status_code == 415 and bare.json()["error"]["code"] == "unsupported_media_type"
    deep_schema = {"type": "object"}
    node = deep_schema
    for _ in range(100):
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    r = client.post(
        post, json=seed_tool(space, parameters=None, input_schema=deep_schema), headers=rw
    )
    assert r.status_code == 422 and "deeper" in r.json()["error"]["details"][0]["message"]
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    "method,path,status,code",
    [
        ("get", "/v1/nothing-here", 404, "not_found"),
        ("put", "/healthz", 405, "method_not_allowed"),
        ("get", "/v1/custom-tools/x/versions/notanumber", 422, "validation_error"),
    ],
)
def test_framework_errors_use_the_envelope(
    client: TestClient, rw, method, path, status, code
) -> None:
    r = client.request(method, path, headers=rw)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code


def test_system_endpoints(client: TestClient, rw) -> None:
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    spec = client.get("/openapi.json").json()
    for path in [
        "/v1/custom-tools",
        "/v1/custom-tools/{tool_id}",
        "/v1/custom-tools/{tool_id}/versions/{number}",
        "/v1/custom-tools/{tool_id}/enable",
        "/v1/workspaces/{workspace_id}/policy",
        "/v1/tokens",
        "/v1/audit",
    ]:
        assert path in spec["paths"], path
    client.get("/v1/custom-tools", headers=rw)
    text = client.get("/metrics").text
    assert (
        'toolkiln_http_requests_total{method="GET",route="/v1/custom-tools",status="200"}' in text
    )
    assert "toolkiln_http_request_duration_seconds_bucket" in text


def test_the_document_lists_415_and_500_where_they_can_come(client: TestClient, rw) -> None:
    """docs/api.md: every route that takes a body answers 415 `unsupported_media_type` to a
    body not sent as JSON, and any route 500 `internal_error` (in the envelope) when the
    service fails. The document listed neither, so a client generated from it had no type
    for those answers."""
    spec = client.get("/openapi.json").json()
    missing = []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            wanted = {"500"} | ({"415"} if "requestBody" in op else set())
            missing += [f"{method} {path} {c}" for c in sorted(wanted - set(op["responses"]))]
    assert not missing, missing
    plain = {**rw, "Content-Type": "text/plain"}
    r = client.post("/v1/custom-tools", content=b'{"name": "x"}', headers=plain)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


def test_metrics_name_every_route_by_its_template(client: TestClient, space: Space, rw) -> None:
    """docs/api.md: requests are counted by route template. The invoke route's fast path
    (a plain Starlette route ahead of FastAPI's) and the MCP mount were counted as
    "unmatched", so the busiest route of the service had no series of its own."""
    tool_id = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw).json()["data"][
        "id"
    ]
    ok = client.post(
        f"/v1/custom-tools/{tool_id}/invoke", json={"input": {"order_id": "A-1"}}, headers=rw
    )
    assert ok.status_code == 200
    bad = client.post(f"/v1/custom-tools/{tool_id}/invoke", json={"inpt": {}}, headers=rw)
    assert bad.status_code == 422  # FastAPI's own route (the fallback)
    text = client.get("/metrics").text
    route = "/v1/custom-tools/{tool_id}/invoke"
    assert f'toolkiln_http_requests_total{{method="POST",route="{route}",status="200"}}' in text
    assert f'toolkiln_http_requests_total{{method="POST",route="{route}",status="422"}}' in text


def test_metrics_name_the_mcp_endpoint_by_its_template(runtime) -> None:
    from toolkiln.app import build_app

    app = TestClient(build_app(runtime, close_on_exit=False))  # no lifespan: refused first
    assert app.post("/mcp/agents/someagent", json={}).status_code == 401
    assert app.post("/mcp/elsewhere", json={}).status_code == 404
    text = app.get("/metrics").text
    mcp = 'method="POST",route="/mcp/agents/{agent_id}",status="401"'
    assert f"toolkiln_http_requests_total{{{mcp}}}" in text
    assert 'route="unmatched",status="404"' in text  # no MCP endpoint there: no template


def test_no_token_is_401_before_the_body_is_judged(client: TestClient, space: Space, rw) -> None:
    """CONTRACT 1: no or bad token is 401, whatever the body: a body that breaks the rules
    is judged (422) only for a caller the token lets in, on every route that takes one."""
    tool_id = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw).json()["data"][
        "id"
    ]
    spec = client.get("/openapi.json").json()
    checked, wrong = [], []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if "requestBody" not in op or op.get("security") == []:
                continue  # no body, or a route without a token (none takes a body today)
            url = "/".join(
                "x" if part.startswith("{") else part
                for part in path.replace("{tool_id}", tool_id).split("/")
            )
            for headers in ({}, {"Authorization": "Bearer nope"}):
                bad = {"input": 5, "name": 7, "code": 1, "unknown": True}
                r = client.request(method, url, json=bad, headers=headers)
                if r.status_code != 401:
                    wrong.append((method, path, bool(headers), r.status_code))
            checked.append((method, path))
    assert ("post", "/v1/custom-tools/{tool_id}/invoke") in checked, checked
    assert not wrong, wrong
    # Malformed JSON is 400 whoever sends it (it is not a body to judge).
    for url in (f"/v1/custom-tools/{tool_id}/invoke", "/v1/custom-tools"):
        r = client.post(url, content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_json", r.text


# The scope each operation of the OpenAPI document needs (docs/api.md, "Auth").
SCOPES = {
    ("post", "/v1/workspaces"): "admin",
    ("get", "/v1/workspaces"): "read",
    ("get", "/v1/workspaces/{workspace_id}"): "read",
    ("get", "/v1/workspaces/{workspace_id}/policy"): "read",
    ("patch", "/v1/workspaces/{workspace_id}/policy"): "write",
    ("post", "/v1/workspaces/{workspace_id}/secrets"): "write",
    ("get", "/v1/workspaces/{workspace_id}/secrets"): "read",
    ("patch", "/v1/workspaces/{workspace_id}/secrets/{name}"): "write",
    ("delete", "/v1/workspaces/{workspace_id}/secrets/{name}"): "write",
    ("post", "/v1/tokens"): "admin",
    ("get", "/v1/tokens"): "admin",
    ("delete", "/v1/tokens/{token_id}"): "admin",
    ("get", "/v1/custom-tools/runtimes"): "read",
    ("post", "/v1/custom-tools/test"): "write",
    ("post", "/v1/custom-tools/{tool_id}/invoke"): "invoke",
    ("post", "/v1/run-code"): "invoke",
    ("get", "/v1/tool-calls/{tool_call_id}"): "read",
    ("post", "/v1/custom-tools/generate"): "write",
    ("post", "/v1/custom-tools"): "write",
    ("get", "/v1/custom-tools"): "read",
    ("post", "/v1/custom-tools/validate"): "write",
    ("get", "/v1/custom-tools/{tool_id}"): "read",
    ("patch", "/v1/custom-tools/{tool_id}"): "write",
    ("delete", "/v1/custom-tools/{tool_id}"): "write",
    ("post", "/v1/custom-tools/{tool_id}/run-tests"): "write",
    ("post", "/v1/custom-tools/{tool_id}/enable"): "write",
    ("post", "/v1/custom-tools/{tool_id}/disable"): "write",
    ("get", "/v1/custom-tools/{tool_id}/versions"): "read",
    ("get", "/v1/custom-tools/{tool_id}/stats"): "read",
    ("get", "/v1/custom-tools/{tool_id}/versions/{number}"): "read",
    ("get", "/v1/audit"): "read",
    ("get", "/v1/builtin-tools"): "read",
    ("post", "/v1/builtin-tools/{name}/call"): "invoke",
    ("get", "/v1/outbox"): "read",
    ("post", "/v1/agents"): "write",
    ("get", "/v1/agents"): "read",
    ("get", "/v1/agents/{agent_id}"): "read",
    ("delete", "/v1/agents/{agent_id}"): "write",
    ("get", "/v1/agents/{agent_id}/custom-tools"): "read",
    ("put", "/v1/agents/{agent_id}/custom-tools/{tool_id}"): "write",
    ("delete", "/v1/agents/{agent_id}/custom-tools/{tool_id}"): "write",
    ("get", "/v1/agents/{agent_id}/tools"): "read",
    ("post", "/v1/agents/{agent_id}/tool-calls"): "invoke",
}
NO_TOKEN = {("get", "/healthz"), ("get", "/v1/files/{file_id}")}


def test_missing_scope_is_403_before_the_body_or_query_is_judged(
    client: TestClient, space: Space, rw
) -> None:
    """docs/api.md "Auth": after 401 comes 403, before 404 and 422. A token that lacks the
    scope of a route is told so, whatever its body or query parameters hold (a read-only
    token posting a broken tool definition learnt of the definition's problems, not that it
    may not write)."""
    tool_id = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw).json()["data"][
        "id"
    ]
    spec = client.get("/openapi.json").json()
    ops = {(m, path): op for path, item in spec["paths"].items() for m, op in item.items()}
    assert set(ops) == set(SCOPES) | NO_TOKEN, set(ops) ^ (set(SCOPES) | NO_TOKEN)
    bad_query = {"limit": 0, "cursor": "zz", "format": "x", "mode": "x", "version": 0}
    wrong = []
    for (method, path), scope in SCOPES.items():
        url = path.replace("{tool_id}", tool_id).replace("{number}", "0")
        url = "/".join("x" if part.startswith("{") else part for part in url.split("/"))
        for held in ("read", "write", "invoke"):
            if held == scope:
                continue
            body = {"input": 5, "name": 7, "code": 1, "unknown": True}
            r = client.request(
                method,
                url,
                params=bad_query,
                json=body if "requestBody" in ops[(method, path)] else None,
                headers=space.auth(held),
            )
            if r.status_code != 403 or r.json()["error"]["details"] != {"required_scope": scope}:
                wrong.append((method, path, held, r.status_code))
    assert not wrong, wrong


def test_enable_and_disable_judge_a_body_that_is_sent(client: TestClient, space: Space, rw) -> None:
    """Both take an optional body: none, or an empty object, is fine; malformed JSON is 400
    and an unknown field 422, for enable as for disable (enable ignored its body)."""
    tool_id = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw).json()["data"][
        "id"
    ]
    json_headers = {**rw, "Content-Type": "application/json"}
    for action in ("disable", "enable"):
        url = f"/v1/custom-tools/{tool_id}/{action}"
        broken = client.post(url, content=b"{not json", headers=json_headers)
        assert broken.status_code == 400, (action, broken.text)
        assert broken.json()["error"]["code"] == "malformed_json"
        unknown = client.post(url, json={"surprise": 1}, headers=rw)
        assert unknown.status_code == 422, (action, unknown.text)
        assert "surprise" in unknown.text
        assert client.post(url, json={}, headers=rw).status_code == 200, action
        assert client.post(url, headers=rw).status_code == 200, action
