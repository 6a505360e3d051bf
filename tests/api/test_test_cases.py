"""Test cases (CONTRACT section 3): stored per version, run before a write is stored, runnable
on any version, counting nothing; and allowed_callers stored and versioned."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool

DOUBLE_PY = (
    "def main(**p):\n    n = p['n']\n    return {'message': str(n * 2), 'rawData': {'n': n * 2}}\n"
)
DOUBLE_JS = "function main(p) {\n  const n = p.n;\n  return { message: String(n * 2), rawData: { n: n * 2 } };\n}\n"
CODE = {"python": DOUBLE_PY, "javascript": DOUBLE_JS}
BROKEN = {
    "python": "def main(**p):\n    n = p['n']\n    return {'message': str(n * 3), 'rawData': {'n': n * 3}}\n",
    "javascript": "function main(p) {\n  return { message: 'x', rawData: { n: p.n.nope.deeper } };\n}\n",
}
SCHEMA = {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}
CASES = [
    {"name": "two", "input": {"n": 2}, "expect": {"status": "ok", "raw_data": {"n": 4}}},
    {"name": "half", "input": {"n": 0.5}, "expect": {"message": "1.0", "raw_data": {"n": 1}}},
    {"name": "no input", "input": {}, "expect": {"error_code": "invalid_input"}},
]


def body(space: Space, language: str = "python", **over: object) -> dict:
    cases = [dict(c) for c in CASES]
    if language == "javascript":
        cases[1]["expect"] = {"message": "1", "raw_data": {"n": 1.0}}
    fields: dict[str, object] = {
        "name": f"double-{language}",
        "language": language,
        "code": CODE[language],
        "parameters": None,
        "input_schema": SCHEMA,
        "test_cases": cases,
    }
    return seed_tool(space, **{**fields, **over})


def counts(client: TestClient, tool_id: str, rw: dict) -> tuple[int, int, int]:
    t = client.get(f"/v1/custom-tools/{tool_id}", headers=rw).json()["data"]
    return t["usage_count"], t["failure_count"], t["version"]


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_passing_cases_are_stored_with_the_version(
    client: TestClient, space: Space, rw, language: str
) -> None:
    r = client.post("/v1/custom-tools", json=body(space, language), headers=rw)
    assert r.status_code == 201, r.text
    tool = r.json()["data"]
    assert [c["name"] for c in tool["test_cases"]] == ["two", "half", "no input"]
    assert tool["allowed_callers"] == ["direct", "code"]
    v1 = client.get(f"/v1/custom-tools/{tool['id']}/versions/1", headers=rw).json()["data"]
    assert v1["test_cases"] == tool["test_cases"]
    assert counts(client, tool["id"], rw) == (0, 0, 1)  # test runs count nothing


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_bad_edit_is_refused_by_the_test_cases(
    client: TestClient, space: Space, rw, language: str
) -> None:
    tool = client.post("/v1/custom-tools", json=body(space, language), headers=rw).json()["data"]
    r = client.patch(f"/v1/custom-tools/{tool['id']}", json={"code": BROKEN[language]}, headers=rw)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "tests_failed"
    by_name = {c["name"]: c for c in err["details"]}
    assert set(by_name) == {"two", "half", "no input"}
    assert by_name["no input"]["passed"] is True and by_name["no input"]["mismatch"] is None
    two = by_name["two"]
    assert two["passed"] is False
    if language == "python":
        assert two["mismatch"] == [{"field": "raw_data", "expected": {"n": 4}, "actual": {"n": 6}}]
    else:
        assert {m["field"] for m in two["mismatch"]} == {"status", "raw_data"}
        assert two["result"]["error"]["code"] == "runtime_error"
    # Nothing was stored: same version, same code, no failure counted.
    got = client.get(f"/v1/custom-tools/{tool['id']}", headers=rw).json()["data"]
    assert got["code"] == CODE[language] and got["version"] == 1
    assert (got["usage_count"], got["failure_count"]) == (0, 0)
    assert (
        len(client.get(f"/v1/custom-tools/{tool['id']}/versions", headers=rw).json()["data"]) == 1
    )


def test_a_failing_create_stores_nothing_unless_allowed(
    client: TestClient, space: Space, rw
) -> None:
    bad = body(space, code=BROKEN["python"])
    r = client.post("/v1/custom-tools", json=bad, headers=rw)
    assert r.status_code == 422 and r.json()["error"]["code"] == "tests_failed"
    listed = client.get(f"/v1/custom-tools?workspace_id={space.id}", headers=rw).json()["data"]
    assert listed == []
    audit = client.get(f"/v1/audit?workspace_id={space.id}&event=tool.created", headers=rw)
    assert audit.json()["data"] == []
    r = client.post("/v1/custom-tools", json={**bad, "allow_failing_tests": True}, headers=rw)
    assert r.status_code == 201, r.text
    tool = r.json()["data"]
    run = client.post(f"/v1/custom-tools/{tool['id']}/run-tests", headers=rw)
    assert run.status_code == 200, run.text
    data = run.json()["data"]
    assert (data["version"], data["passed"], data["failed"]) == (1, 1, 2)
    assert counts(client, tool["id"], rw) == (0, 0, 1)  # failing runs count nothing either
    # A change that makes no new version runs no tests, so it goes through.
    r = client.patch(f"/v1/custom-tools/{tool['id']}", json={"enable_globally": True}, headers=rw)
    assert r.status_code == 200 and r.json()["data"]["version"] == 1


def test_run_tests_on_any_version(client: TestClient, space: Space, rw) -> None:
    tool = client.post("/v1/custom-tools", json=body(space), headers=rw).json()["data"]
    tripled = [
        {"name": "two", "input": {"n": 2}, "expect": {"raw_data": {"n": 6}}},
    ]
    r = client.patch(
        f"/v1/custom-tools/{tool['id']}",
        json={"code": BROKEN["python"], "test_cases": tripled},
        headers=rw,
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"]["version"] == 2
    now = client.post(f"/v1/custom-tools/{tool['id']}/run-tests", headers=rw).json()["data"]
    assert (now["version"], now["passed"], now["failed"]) == (2, 1, 0)
    old = client.post(f"/v1/custom-tools/{tool['id']}/run-tests?version=1", headers=rw)
    assert old.json()["data"]["passed"] == 3
    missing = client.post(f"/v1/custom-tools/{tool['id']}/run-tests?version=9", headers=rw)
    assert missing.status_code == 404
    read_only = client.post(f"/v1/custom-tools/{tool['id']}/run-tests", headers=space.auth("read"))
    assert read_only.status_code == 403
    # Removing every case makes a version with none; nothing needs to pass.
    r = client.patch(f"/v1/custom-tools/{tool['id']}", json={"test_cases": []}, headers=rw)
    assert r.json()["data"]["version"] == 3 and r.json()["data"]["test_cases"] == []


def test_raw_data_is_compared_as_json(client: TestClient, space: Space, rw) -> None:
    code = "def main(**p):\n    return {'message': 'm', 'rawData': {'one': 1, 'yes': True}}\n"
    cases = [
        {"name": "float", "expect": {"raw_data": {"one": 1.0, "yes": True}}},
        {"name": "bool is no number", "expect": {"raw_data": {"one": True, "yes": 1}}},
        {"name": "null message", "expect": {"message": None}},
    ]
    over = {"name": "json-eq", "code": code, "parameters": None, "test_cases": cases}
    r = client.post("/v1/custom-tools", json=seed_tool(space, **over), headers=rw)
    assert r.status_code == 422
    passed = {c["name"]: c["passed"] for c in r.json()["error"]["details"]}
    assert passed == {"float": True, "bool is no number": False, "null message": False}


def test_bad_test_cases_and_callers_are_refused_by_field(
    client: TestClient, space: Space, rw
) -> None:
    def problems(**over: object) -> set[str]:
        r = client.post("/v1/custom-tools", json=body(space, **over), headers=rw)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "invalid_tool"
        return {p["field"] for p in r.json()["error"]["details"]}

    same = [{"name": "a"}, {"name": "a"}]
    assert "test_cases.1.name" in problems(test_cases=same)
    assert "test_cases.0.expect.colour" in problems(
        test_cases=[{"name": "a", "expect": {"colour": 1}}]
    )
    assert "test_cases.0.expect.status" in problems(
        test_cases=[{"name": "a", "expect": {"status": "fine"}}]
    )
    assert "test_cases" in problems(test_cases=[{"name": f"c{i}"} for i in range(51)])
    assert "allowed_callers.0" in problems(allowed_callers=["agents"])
    assert "allowed_callers" in problems(allowed_callers=[])
    assert "allowed_callers" in problems(allowed_callers=["code", "code"])
    tool = client.post("/v1/custom-tools", json=body(space), headers=rw).json()["data"]
    for field in ("test_cases", "allowed_callers"):
        r = client.patch(f"/v1/custom-tools/{tool['id']}", json={field: None}, headers=rw)
        assert r.status_code == 422, (field, r.text)


def test_allowed_callers_are_stored_and_versioned(client: TestClient, space: Space, rw) -> None:
    r = client.post("/v1/custom-tools", json=body(space, allowed_callers=["code"]), headers=rw)
    tool = r.json()["data"]
    assert tool["allowed_callers"] == ["code"]
    r = client.patch(
        f"/v1/custom-tools/{tool['id']}", json={"allowed_callers": ["direct"]}, headers=rw
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"]["allowed_callers"] == ["direct"] and r.json()["data"]["version"] == 2
    versions = client.get(f"/v1/custom-tools/{tool['id']}/versions", headers=rw).json()["data"]
    assert [v["allowed_callers"] for v in versions] == [["code"], ["direct"]]
