"""What an outside conformance check sends: nulls, huge path numbers, chunked bodies, 405s,
lone surrogates, the last admin token. None of it may reach a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool
from toolkiln.api.app import create_app
from toolkiln.app import build
from toolkiln.config import Settings
from toolkiln.domain import limits


@pytest.fixture
def tool_url(client: TestClient, space: Space, rw) -> str:
    r = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw)
    assert r.status_code == 201, r.text
    return f"/v1/custom-tools/{r.json()['data']['id']}"


@pytest.mark.parametrize(
    "field",
    ["name", "code", "timeout_ms", "enable_globally", "language", "description", "input_schema"],
)
def test_patch_with_null_for_a_non_nullable_field_is_refused_naming_it(
    client: TestClient, tool_url: str, rw, field: str
) -> None:
    r = client.patch(tool_url, json={field: None}, headers=rw)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_tool"
    assert [p["field"] for p in error["details"]] == [field]
    assert client.get(tool_url, headers=rw).json()["data"]["version"] == 1


def test_patch_with_null_for_a_nullable_field_clears_it(
    client: TestClient, tool_url: str, rw
) -> None:
    r = client.patch(tool_url, json={"execution_message_description": None}, headers=rw)
    assert r.status_code == 200 and r.json()["data"]["execution_message_description"] is None
    r = client.patch(tool_url, json={"parameters": None}, headers=rw)
    assert r.status_code == 200, r.text
    assert r.json()["data"]["input_schema"]["properties"] == {}


@pytest.mark.parametrize("number", ["9223372036854775808", "2147483648", "0", "-1", "1.5"])
def test_version_numbers_out_of_range_are_422_not_500(
    client: TestClient, tool_url: str, rw, number: str
) -> None:
    r = client.get(f"{tool_url}/versions/{number}", headers=rw)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"][0]["field"] == "number"


@pytest.mark.parametrize("number", ["296861074480170139648", "2147483648", "0"])
def test_run_tests_of_a_version_out_of_range_is_422_not_500(
    client: TestClient, tool_url: str, rw, number: str
) -> None:
    r = client.post(f"{tool_url}/run-tests", params={"version": number}, headers=rw)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"][0]["field"] == "version"


def test_the_largest_version_number_is_a_plain_404(client: TestClient, tool_url: str, rw) -> None:
    r = client.get(f"{tool_url}/versions/{limits.MAX_VERSION}", headers=rw)
    assert r.status_code == 404


@pytest.mark.parametrize(
    "method,path,allowed",
    [
        ("put", "/healthz", {"GET"}),
        ("trace", "/v1/workspaces", {"GET", "POST"}),
        ("post", "/v1/custom-tools/x/versions", {"GET"}),
    ],
)
def test_405_says_which_methods_are_allowed(
    client: TestClient, rw, method: str, path: str, allowed: set[str]
) -> None:
    r = client.request(method, path, headers=rw)
    assert r.status_code == 405
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert {m.strip() for m in r.headers["allow"].split(",")} == allowed


def test_a_chunked_body_over_the_cap_is_413(client: TestClient, space: Space, rw) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"workspace_id": "' + space.id.encode() + b'", "description": "'
        for _ in range(limits.MAX_BODY_BYTES // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    r = client.post(
        "/v1/custom-tools", content=chunks(), headers={**rw, "Content-Type": "application/json"}
    )
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "payload_too_large"


def test_a_chunked_body_under_the_cap_is_read_whole(client: TestClient, space: Space, rw) -> None:
    body = json.dumps(seed_tool(space, name="chunked")).encode()
    r = client.post(
        "/v1/custom-tools",
        content=iter([body[:10], body[10:]]),
        headers={**rw, "Content-Type": "application/json"},
    )
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "method,path,body,field",
    [
        ("post", "/v1/workspaces", '{{"name": "w\\ud800"}}', "name"),
        ("post", "/v1/agents", '{{"workspace_id": "{ws}", "name": "x\\udc00y"}}', "name"),
        (
            "post",
            "/v1/tokens",
            '{{"workspace_id": "{ws}", "scopes": ["read"], "name": "\\udfff"}}',
            "name",
        ),
        (
            "patch",
            "/v1/workspaces/{ws}/policy",
            '{{"email_allowlist": ["\\uDBFF"]}}',
            "email_allowlist.0",
        ),
        ("post", "/v1/custom-tools/{tool}/disable", '{{"reason": "r\\ud800"}}', "reason"),
    ],
)
def test_a_lone_surrogate_is_a_422_naming_the_field_not_a_500(
    client: TestClient, space: Space, tool_url: str, method: str, path: str, body: str, field: str
) -> None:
    headers = {**space.auth("admin"), "Content-Type": "application/json"}
    tool = tool_url.rsplit("/", 1)[1]
    r = client.request(
        method,
        path.format(ws=space.id, tool=tool),
        content=body.format(ws=space.id).encode(),
        headers=headers,
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"][0]["field"] == field


def test_a_surrogate_pair_is_just_text(client: TestClient, space: Space, rw) -> None:
    body = json.dumps(seed_tool(space, name="pair", description="\U0001f600"))
    assert "\\ud83d\\ude00" in body
    r = client.post(
        "/v1/custom-tools", content=body, headers={**rw, "Content-Type": "application/json"}
    )
    assert r.status_code == 201 and r.json()["data"]["description"] == "\U0001f600"


@pytest.mark.parametrize("name", ["", " ", " lead", "trail ", "a\u202eb", "zero\u200bwidth"])
def test_labels_refuse_what_the_document_refuses(client: TestClient, space: Space, name) -> None:
    r = client.post("/v1/workspaces", json={"name": name}, headers=space.auth("admin"))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"][0]["field"] == "name"


@pytest.mark.parametrize("value", ["", "tab\there", "caf\u00e9", "x" * 129])
def test_client_chosen_ids_are_printable_ascii(
    client: TestClient, tool_url: str, rw, value: str
) -> None:
    r = client.post(f"{tool_url}/invoke", json={"input": {}, "tool_call_id": value}, headers=rw)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"][0]["field"] == "tool_call_id"


@pytest.mark.parametrize("limit", ["0", "501", "-3"])
@pytest.mark.parametrize("path", ["/v1/custom-tools", "/v1/audit", "/v1/outbox"])
def test_page_limits_outside_the_documented_range_are_422(
    client: TestClient, rw, path: str, limit: str
) -> None:
    r = client.get(path, params={"limit": limit}, headers=rw)
    assert r.status_code == 422 and r.json()["error"]["details"][0]["field"] == "limit"


def test_the_document_states_the_limits_the_service_enforces(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    create = schemas["ToolCreate"]["properties"]
    assert create["name"]["pattern"] == "^[a-z0-9]+(-[a-z0-9]+)*$"
    assert create["name"]["maxLength"] == limits.MAX_NAME_CHARS
    assert (create["timeout_ms"]["minimum"], create["timeout_ms"]["maximum"]) == (100, 30000)
    policy = schemas["PolicyPatch"]["properties"]["max_timeout_ms"]
    assert (policy["minimum"], policy["maximum"]) == (100, 30000)
    patch = schemas["ToolPatch"]["properties"]
    assert patch["name"]["type"] == "string" and "default" not in patch["name"]
    assert {"type": "null"} in patch["parameters"]["anyOf"]
    listing = spec["paths"]["/v1/custom-tools"]["get"]["parameters"]
    limit = next(p for p in listing if p["name"] == "limit")["schema"]["anyOf"][0]
    assert (limit["minimum"], limit["maximum"]) == (1, limits.MAX_PAGE_SIZE)
    version = spec["paths"]["/v1/custom-tools/{tool_id}/versions/{number}"]["get"]
    number = next(p for p in version["parameters"] if p["name"] == "number")["schema"]
    assert (number["minimum"], number["maximum"]) == (1, limits.MAX_VERSION)
    invoke = schemas["InvokeIn"]["properties"]["tool_call_id"]["anyOf"][0]
    assert invoke["maxLength"] == 128 and invoke["pattern"] == "^[\\u0020-\\u007e]+$"


def test_the_last_admin_token_cannot_be_revoked(tmp_path: Path) -> None:
    rt = build(Settings(data_dir=tmp_path), sandbox=False)
    try:
        first = rt.services.access.bootstrap("first-admin")
        assert first is not None
        with TestClient(create_app(rt.services), raise_server_exceptions=False) as client:
            admin = {"Authorization": "Bearer first-admin"}
            r = client.delete(f"/v1/tokens/{first.record.id}", headers=admin)
            assert r.status_code == 409 and r.json()["error"]["code"] == "last_admin_token"
            r = client.post(
                "/v1/tokens",
                json={"workspace_id": first.record.workspace_id, "scopes": ["admin"]},
                headers=admin,
            )
            second = r.json()["data"]
            admin = {"Authorization": f"Bearer {second['token']}"}
            r = client.delete(f"/v1/tokens/{first.record.id}", headers=admin)
            assert r.status_code == 204
            r = client.delete(f"/v1/tokens/{second['id']}", headers=admin)
            assert r.status_code == 409 and r.json()["error"]["code"] == "last_admin_token"
            assert client.get("/v1/workspaces", headers=admin).status_code == 200
    finally:
        rt.close()


@pytest.mark.parametrize(
    "path,status",
    [
        ("/v1/custom-tools/a%00b", 404),
        ("/v1/custom-tools/a%00/versions/1", 404),
        ("/v1/workspaces/a%00", 404),
        ("/v1/tool-calls/x%00", 404),
        ("/v1/agents/a%00/tools", 404),
        ("/mcp/agents/a%00", 404),
        ("/v1/custom-tools?workspace_id=a%00", 422),
        ("/v1/audit?event=%00", 422),
        ("/v1/tokens?workspace_id=%00", 422),
        ("/v1/outbox?workspace_id=%00", 422),
        ("/v1/files/a?expires=1&sig=%00", 422),
        ("/v1/files/a?expires=1&sig=%C3%A9", 403),  # not ASCII: compare_digest's TypeError
    ],
)
def test_a_nul_in_a_path_or_query_is_refused_not_a_500(
    client: TestClient, space: Space, path: str, status: int
) -> None:
    """PostgreSQL cannot compare text holding NUL: such a lookup would fail deep down."""
    r = client.get(path, headers=space.auth("admin"))
    assert r.status_code == status, r.text


@pytest.mark.parametrize(
    "path,body",
    [
        (
            "/v1/custom-tools",
            {"workspace_id": "w\x00", "name": "x", "language": "python", "code": "x"},
        ),
        ("/v1/tokens", {"workspace_id": "w\x00", "scopes": ["read"]}),
        ("/v1/agents", {"workspace_id": "w\x00", "name": "a"}),
    ],
)
def test_a_nul_in_a_body_id_is_a_422_not_a_500(
    client: TestClient, space: Space, path: str, body: dict
) -> None:
    r = client.post(path, json=body, headers=space.auth("admin"))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"][0]["field"] == "workspace_id"


def test_a_nul_in_a_tool_calls_name_is_a_422_not_a_500(
    client: TestClient, space: Space, rw
) -> None:
    agent = client.post(
        "/v1/agents", json={"workspace_id": space.id, "name": "nul"}, headers=rw
    ).json()["data"]
    r = client.post(
        f"/v1/agents/{agent['id']}/tool-calls",
        json={"name": "custom_\x00", "arguments": {}},
        headers=rw,
    )
    assert r.status_code == 422 and r.json()["error"]["details"][0]["field"] == "name"


def test_the_longest_ids_the_api_allows_are_stored(
    client: TestClient, space: Space, tool_url: str, rw
) -> None:
    """On PostgreSQL the audit columns once held 64 characters: a longer id was a 500."""
    call_id = "c" * limits.MAX_CALL_ID_CHARS
    r = client.post(
        f"{tool_url}/invoke",
        json={"input": {"order_id": "A-1"}, "tool_call_id": call_id, "agent_id": "a" * 128},
        headers=rw,
    )
    assert r.status_code == 200, r.text
    stored = client.get(f"/v1/tool-calls/{call_id}", headers=rw).json()["data"]
    assert [row["tool_call_id"] for row in stored["audit"]][-1] == call_id
