"""The registry endpoints of CONTRACT section 3, on SQLite and PostgreSQL."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool


def create(client: TestClient, space: Space, rw: dict[str, str], **over: object) -> dict:
    r = client.post("/v1/custom-tools", json=seed_tool(space, **over), headers=rw)
    assert r.status_code == 201, r.text
    return r.json()["data"]


def test_create_with_seed_body_returns_the_tool(client: TestClient, space: Space, rw) -> None:
    tool = create(client, space, rw)
    assert tool["name"] == "lookup-order-status"
    assert tool["version"] == 1 and tool["validated"] is True
    assert tool["status"] == "active" and tool["usage_count"] == 0 and tool["failure_count"] == 0
    assert tool["timeout_ms"] == 5000 and tool["enable_globally"] is False
    assert tool["input_schema"] == {
        "type": "object",
        "properties": {"order_id": {"type": "string", "description": "The order id to look up."}},
        "required": ["order_id"],
    }
    assert tool["parameters"]["order_id"]["required"] is True
    assert tool["created_at"].endswith("Z")
    got = client.get(f"/v1/custom-tools/{tool['id']}", headers=rw).json()["data"]
    assert got == tool


def test_create_with_full_input_schema(client: TestClient, space: Space, rw) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0}, "tags": {"type": "array"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    tool = create(client, space, rw, parameters=None, input_schema=schema, name="count")
    assert tool["input_schema"] == schema
    assert tool["parameters"] == {
        "n": {"type": "integer", "minimum": 0, "required": True},
        "tags": {"type": "array", "required": False},
    }


def test_tool_without_parameters_takes_none(client: TestClient, space: Space, rw) -> None:
    body = seed_tool(space, name="no-params")
    del body["parameters"]
    r = client.post("/v1/custom-tools", json=body, headers=rw)
    assert r.status_code == 201
    assert r.json()["data"]["input_schema"]["properties"] == {}


def test_every_problem_is_reported_at_once(client: TestClient, space: Space, rw) -> None:
    body = seed_tool(
        space,
        name="Bad_Name",
        code="def main(**p):\n    x = (\n",
        parameters={"a": {"type": "strng"}},
        timeout_ms=60000,
    )
    r = client.post("/v1/custom-tools", json=body, headers=rw)
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["code"] == "invalid_tool"
    fields = {p["field"] for p in err["details"]}
    assert {"name", "code", "parameters.a.type", "timeout_ms"} <= fields
    code_problem = next(p for p in err["details"] if p["field"] == "code")
    assert code_problem["line"] == 2 and "column" in code_problem


def test_code_must_define_an_entrypoint_with_a_return(client: TestClient, space, rw) -> None:
    cases = {
        "def helper():\n    return 1\n": "main or handle",
        "def main(**p):\n    def inner():\n        return 1\n    inner()\n": "return",
        "def main(**p):\n    return 1\ndef handle(i, c):\n    return 2\n": "only one",
        "def handle(input):\n    return 1\n": "two parameters",
    }
    for code, needle in cases.items():
        r = client.post("/v1/custom-tools", json=seed_tool(space, code=code), headers=rw)
        assert r.status_code == 422, code
        assert needle in r.json()["error"]["details"][0]["message"], code


def test_javascript_modern_syntax_is_accepted(client: TestClient, space: Space, rw) -> None:
    code = (
        "class Fmt { #c = 'USD'; get c() { return this.#c; } }\n"
        "export async function handle(input, ctx) {\n"
        "  const n = input?.amount ?? 0;\n"
        "  const r = await Promise.resolve(`${new Fmt().c} ${n}`);\n"
        "  return { message: r };\n"
        "}\n"
    )
    tool = create(client, space, rw, language="javascript", code=code, name="fmt")
    assert tool["language"] == "javascript"
    arrow = "const main = async (params) => ({ message: 'hi' });\n"
    assert create(client, space, rw, language="javascript", code=arrow, name="arrow")["id"]


def test_javascript_errors_name_line_and_column(client: TestClient, space: Space, rw) -> None:
    cases = [
        (
            "async function main(p) {\n  const x = ;\n  return {message: 'a'};\n}\n",
            "SyntaxError",
            2,
        ),
        ("function helper() { return 1 }\n", "main or handle", None),
        ("function main(p) {\n  const f = () => { return 1 };\n}\n", "return", 1),
    ]
    for code, needle, line in cases:
        body = seed_tool(space, language="javascript", code=code)
        r = client.post("/v1/custom-tools", json=body, headers=rw)
        assert r.status_code == 422, code
        p = r.json()["error"]["details"][0]
        assert needle in p["message"]
        if line is not None:
            assert p["line"] == line


def test_invalid_schemas_are_refused(client: TestClient, space: Space, rw) -> None:
    for schema, field in [
        ({"type": "array"}, "input_schema.type"),
        ({"type": "object", "properties": {"a": {"type": 5}}}, "input_schema"),
        ({"type": "object", "minProperties": -1}, "input_schema"),
    ]:
        body = seed_tool(space, parameters=None, input_schema=schema)
        r = client.post("/v1/custom-tools", json=body, headers=rw)
        assert r.status_code == 422
        assert r.json()["error"]["details"][0]["field"].startswith(field)
    both = seed_tool(space, input_schema={"type": "object"})
    r = client.post("/v1/custom-tools", json=both, headers=rw)
    assert r.json()["error"]["code"] == "invalid_tool"


def test_names_are_unique_per_workspace(client: TestClient, space, other_space, rw) -> None:
    create(client, space, rw)
    r = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw)
    assert r.status_code == 409 and r.json()["error"]["code"] == "name_taken"
    other = other_space.auth("read", "write", "invoke")
    assert (
        client.post("/v1/custom-tools", json=seed_tool(other_space), headers=other).status_code
        == 201
    )


def test_versions_follow_changes(client: TestClient, space: Space, rw) -> None:
    tool = create(client, space, rw)
    url = f"/v1/custom-tools/{tool['id']}"
    same = client.patch(url, json={"execution_message_description": "Checking"}, headers=rw)
    assert same.status_code == 200 and same.json()["data"]["version"] == 1
    new_code = "def main(**params):\n    return {'message': 'v2'}\n"
    v2 = client.patch(url, json={"code": new_code}, headers=rw).json()["data"]
    assert v2["version"] == 2 and v2["code"] == new_code
    v3 = client.patch(url, json={"parameters": {"q": {"type": "integer"}}}, headers=rw).json()[
        "data"
    ]
    assert v3["version"] == 3 and v3["input_schema"]["properties"] == {"q": {"type": "integer"}}
    v4 = client.patch(url, json={"timeout_ms": 1000, "description": "d"}, headers=rw).json()["data"]
    assert v4["version"] == 4
    versions = client.get(f"{url}/versions", headers=rw).json()["data"]
    assert [v["version"] for v in versions] == [1, 2, 3, 4]
    first = client.get(f"{url}/versions/1", headers=rw).json()["data"]
    assert first["code"] == tool["code"] and first["parameters"] == tool["parameters"]
    assert client.get(f"{url}/versions/9", headers=rw).status_code == 404
    renamed = client.patch(url, json={"name": "renamed"}, headers=rw).json()["data"]
    assert renamed["name"] == "renamed" and renamed["version"] == 4


def test_a_bad_patch_changes_nothing(client: TestClient, space: Space, rw) -> None:
    tool = create(client, space, rw)
    url = f"/v1/custom-tools/{tool['id']}"
    r = client.patch(url, json={"code": "def main(:\n", "name": "ok-name"}, headers=rw)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_tool"
    assert client.get(url, headers=rw).json()["data"] == tool
    create(client, space, rw, name="taken")
    r = client.patch(url, json={"name": "taken"}, headers=rw)
    assert r.status_code == 409
    assert client.get(url, headers=rw).json()["data"]["name"] == tool["name"]


def test_enable_disable_delete_and_their_audit(client: TestClient, space: Space, rw) -> None:
    tool = create(client, space, rw)
    url = f"/v1/custom-tools/{tool['id']}"
    off = client.post(f"{url}/disable", json={"reason": "maintenance"}, headers=rw).json()["data"]
    assert off["status"] == "disabled" and off["disabled_reason"] == "maintenance"
    on = client.post(f"{url}/enable", headers=rw).json()["data"]
    assert on["status"] == "active" and on["failure_count"] == 0 and on["disabled_reason"] is None
    client.patch(url, json={"description": "changed"}, headers=rw)
    assert client.delete(url, headers=rw).status_code == 204
    assert client.get(url, headers=rw).status_code == 404
    assert client.get(f"{url}/versions", headers=rw).status_code == 404
    rows = client.get("/v1/audit", params={"tool_id": tool["id"]}, headers=rw).json()["data"]
    events = [r["event"] for r in rows]
    assert events == [
        "tool.created",
        "tool.disabled",
        "tool.enabled",
        "tool.updated",
        "tool.deleted",
    ]
    assert rows[1]["data"]["reason"] == "maintenance"
    assert all(r["source"] == "api" and r["workspace_id"] == space.id for r in rows)


def test_lists_page_with_cursors(client: TestClient, space: Space, rw) -> None:
    ids = [create(client, space, rw, name=f"t{i}")["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        params = {"workspace_id": space.id, "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/custom-tools", params=params, headers=rw).json()
        seen += [t["id"] for t in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    rows, cursor = [], None
    while True:
        params = {"event": "tool.created", "limit": 3, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/audit", params=params, headers=rw).json()
        rows += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [r["tool_id"] for r in rows] == ids
    bad = client.get("/v1/audit", params={"cursor": "garbage!"}, headers=rw)
    assert bad.status_code == 422


def test_a_cursor_not_issued_for_that_list_is_refused_naming_the_field(
    client: TestClient, space: Space, rw
) -> None:
    """Cursors are sealed positions (domain/opaque.py): one of the pattern's shape that the
    service did not issue, an old hexadecimal one, another list's, or an audit row's id is a
    422 naming ``cursor``, never a page from a made-up position and never a 500."""
    create(client, space, rw, name="cursor-lists")
    create(client, space, rw, name="cursor-lists-2")
    audit = client.get("/v1/audit", params={"workspace_id": space.id, "limit": 1}, headers=rw)
    tools = client.get(
        "/v1/custom-tools", params={"workspace_id": space.id, "limit": 1}, headers=rw
    )
    row_id, audit_cursor = audit.json()["data"][0]["id"], audit.json()["next_cursor"]
    tools_cursor = tools.json()["next_cursor"]
    changed = audit_cursor[:-1] + ("0" if audit_cursor[-1] != "0" else "1")
    made_up = ["0" * 32, "f" * 32, "7fffffff", "f" * 15, "a" * 26, row_id, changed]
    for path, foreign in (
        ("/v1/custom-tools", audit_cursor),
        ("/v1/outbox", tools_cursor),
        ("/v1/audit", tools_cursor),
    ):
        for cursor in [*made_up, foreign]:
            params = {"workspace_id": space.id, "cursor": cursor}
            r = client.get(path, params=params, headers=rw)
            assert r.status_code == 422, (path, cursor, r.text)
            assert r.json()["error"]["details"][0]["field"] == "cursor", r.text


def test_a_cursor_past_what_a_column_holds_is_an_empty_page(
    runtime, client: TestClient, space: Space, rw
) -> None:
    """Positions a sequence column cannot hold (PostgreSQL refused 80000000 against a 32-bit
    column with a 500): an empty last page."""
    positions = runtime.services.audit.positions
    create(client, space, rw, name="past-the-end")
    for path, kind in (
        ("/v1/custom-tools", "tools-cursor"),
        ("/v1/outbox", "outbox-cursor"),
        ("/v1/audit", "audit-cursor"),
    ):
        for position in (2**31 - 1, 2**31, 2**63, 2**64 - 1):
            params = {"workspace_id": space.id, "cursor": positions.seal(kind, position)}
            r = client.get(path, params=params, headers=rw)
            assert r.status_code == 200, (path, position, r.text)
            assert r.json()["data"] == [] and r.json()["next_cursor"] is None, (path, position)


def test_concurrent_edits_of_one_tool_go_one_after_another(
    client: TestClient, space: Space, rw
) -> None:
    """Each edit its own version, none refused (on PostgreSQL two PATCHes read the same
    version, and the second's new version met the first's: a 409 "conflict")."""
    import threading

    tool = create(client, space, rw, name="edited-at-once")
    answers: list[int] = []

    def edit(k: int) -> None:
        for j in range(6):
            body = {"description": f"edit {k}-{j}"}
            r = client.patch(f"/v1/custom-tools/{tool['id']}", json=body, headers=rw)
            answers.append(r.status_code)

    threads = [threading.Thread(target=edit, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [200] * 24
    now = client.get(f"/v1/custom-tools/{tool['id']}", headers=rw).json()["data"]
    listed = client.get(f"/v1/custom-tools/{tool['id']}/versions", headers=rw).json()["data"]
    numbers = sorted(v["version"] for v in listed)
    assert numbers == list(range(1, now["version"] + 1)) and now["version"] == 25
    assert (
        next(v for v in listed if v["version"] == now["version"])["description"]
        == (now["description"])
    )
