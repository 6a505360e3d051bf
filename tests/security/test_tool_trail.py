"""Class: every run of a stored tool is in that tool's own audit trail (CONTRACT 8).

A row about a custom tool carries its ``tool_id``, whichever way the tool was reached: a
code-mode program, ``run_code``, another tool's ``ctx``, a test run of an unsaved draft, a
tool's own test cases (``run-tests``, a PATCH or a create with cases). Until this was fixed,
``tool.called`` rows carried no ``tool_id`` (or the caller's) and a test run's execution of
a stored tool left no row at all, so ``GET /v1/audit?tool_id=X`` (and the view's Audit
section) did not show them. A test run's execution is marked ``"test_run": true`` and
counted nowhere: the tool's usage and failure counts stay as they were.

Every case runs with the stored tool in each language, called from code in each language.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.security.conftest import Target
from tests.security.tenants import Tenant, tenant

LANGUAGES = ("python", "javascript")
TARGET = {
    "python": "def main(**params):\n    return {'message': 'reached'}\n",
    "javascript": "function main(params) {\n  return {message: 'reached'};\n}\n",
}
# Code that calls the tool named {name} through ctx and returns what it got.
CALLER = {
    "python": (
        "async def handle(input, ctx):\n"
        "    got = await ctx.tools['{name}']({{}})\n"
        "    return {{'message': str(got.get('message'))}}\n"
    ),
    "javascript": (
        "async function handle(input, ctx) {{\n"
        "  const got = await ctx.tools['{name}']({{}});\n"
        "  return {{message: String(got.message)}};\n"
        "}}\n"
    ),
}
PAIRS = list(itertools.product(LANGUAGES, LANGUAGES))  # (the stored tool's, the caller's)
_names = itertools.count()


@pytest.fixture(scope="module")
def owner(target: Target) -> Iterator[Tenant]:
    yield tenant(target.runtime, target.client, "trail-owner")


def _stored(owner: Tenant, language: str, **over: object) -> tuple[str, str]:
    name = f"trail-{language[:2]}-{next(_names)}"
    return owner.tool(name, TARGET[language], language=language, **over), name


def _trail(owner: Tenant, tool_id: str) -> list[dict]:
    r = owner.client.get(
        "/v1/audit", params={"tool_id": tool_id, "limit": 200}, headers=owner.headers
    )
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def _uncounted(owner: Tenant, tool_id: str) -> None:
    tool = owner.get_tool(tool_id)
    assert (tool["usage_count"], tool["failure_count"]) == (0, 0), tool


def _called_rows(rows: list[dict], tool_id: str) -> list[dict]:
    return [r for r in rows if r["event"] == "tool.called" and r["data"]["tool_id"] == tool_id]


@pytest.mark.parametrize(("stored", "caller"), PAIRS)
def test_a_program_calling_a_stored_tool_is_in_its_trail(
    owner: Tenant, stored: str, caller: str
) -> None:
    tool_id, name = _stored(owner, stored)
    r = owner.client.post(
        "/v1/agents", json={"workspace_id": owner.workspace_id, "name": f"trail-{name}"},
        headers=owner.headers,
    )  # fmt: skip
    agent = r.json()["data"]["id"]
    owner.client.put(f"/v1/agents/{agent}/custom-tools/{tool_id}", headers=owner.headers)
    program = {"language": caller, "code": CALLER[caller].format(name=name)}
    r = owner.client.post(
        f"/v1/agents/{agent}/tool-calls",
        json={"name": "run_program", "arguments": program},
        headers=owner.headers,
    )
    result = r.json()["data"]
    assert result["status"] == "ok" and result["message"] == "reached", result
    trail = _trail(owner, tool_id)
    called = _called_rows(trail, tool_id)
    assert [r["tool_call_id"] for r in called] == [result["tool_call_id"]], trail
    invoked = [r for r in trail if r["event"] == "tool.invoked"]
    assert len(invoked) == 1 and not invoked[0]["data"].get("test_run"), invoked


@pytest.mark.parametrize(("stored", "caller"), PAIRS)
def test_run_code_and_another_tool_calling_a_stored_tool_are_in_its_trail(
    owner: Tenant, stored: str, caller: str
) -> None:
    tool_id, name = _stored(owner, stored)
    r = owner.client.post(
        "/v1/run-code",
        json={"language": caller, "code": CALLER[caller].format(name=name)},
        headers=owner.headers,
    )
    assert r.json()["data"]["message"] == "reached", r.text
    via_tool = owner.tool(f"{name}-caller", CALLER[caller].format(name=name), language=caller)
    call = owner.invoke(via_tool)
    assert call["message"] == "reached", call
    called = _called_rows(_trail(owner, tool_id), tool_id)
    assert len(called) == 2, called
    assert called[1]["tool_call_id"] == call["tool_call_id"]
    assert called[1]["data"]["caller_tool_id"] == via_tool
    assert owner.get_tool(tool_id)["usage_count"] == 2


@pytest.mark.parametrize(("stored", "caller"), PAIRS)
def test_a_test_run_reaching_a_stored_tool_is_in_its_trail_and_counts_nothing(
    owner: Tenant, stored: str, caller: str
) -> None:
    tool_id, name = _stored(owner, stored)
    body = {
        "workspace_id": owner.workspace_id,
        "name": "unsaved-draft",
        "language": caller,
        "code": CALLER[caller].format(name=name),
        "input": {},
    }
    r = owner.client.post("/v1/custom-tools/test", json=body, headers=owner.headers)
    assert r.json()["data"]["message"] == "reached", r.text
    trail = _trail(owner, tool_id)
    events = sorted(r["event"] for r in trail if r["event"] != "tool.created")
    assert events == ["tool.called", "tool.invoked"], trail
    assert all(r["data"]["test_run"] is True for r in trail if r["event"] != "tool.created")
    _uncounted(owner, tool_id)


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_tools_own_test_cases_are_in_its_trail_and_count_nothing(
    owner: Tenant, language: str
) -> None:
    case = {"name": "reaches", "input": {}, "expect": {"message": "reached"}}
    tool_id, _ = _stored(owner, language, test_cases=[case])
    created = _trail(owner, tool_id)  # the create ran the case before storing the tool
    assert [r["event"] for r in created] == ["tool.invoked", "tool.created"], created

    r = owner.client.post(f"/v1/custom-tools/{tool_id}/run-tests", headers=owner.headers)
    assert r.json()["data"]["passed"] == 1, r.text
    change = {"code": TARGET[language] + ("# v2\n" if language == "python" else "// v2\n")}
    r = owner.client.patch(f"/v1/custom-tools/{tool_id}", json=change, headers=owner.headers)
    assert r.status_code == 200, r.text

    trail = _trail(owner, tool_id)
    runs = [r for r in trail if r["event"] == "tool.invoked"]
    assert len(runs) == 3, trail  # the create's, run-tests', the PATCH's
    for row in runs:
        assert row["data"]["test_run"] is True and row["data"]["status"] == "ok", row
        assert row["tool_id"] == tool_id
    _uncounted(owner, tool_id)
