"""One call path: the budget, the recursion guard and the audit cover everything nested under
a call, whichever way it is reached (issue 9). Through the API, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.api.calls import invoke, make_tool
from tests.conftest import Space
from toolkiln.app import Runtime
from toolkiln.services import admission, router


def _audit(client: TestClient, space: Space, **params: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        q = {"workspace_id": space.id, "limit": 500, **params}
        if cursor:
            q["cursor"] = cursor
        r = client.get("/v1/audit", params=q, headers=space.auth("read"))
        assert r.status_code == 200, r.text
        rows += r.json()["data"]
        cursor = r.json()["next_cursor"]
        if not cursor:
            return rows


SNIPPET = (
    "def handle(input, ctx):\n"
    "    out = [ctx.tools.calculate({'expression': '1+1'}) for _ in range(40)]\n"
    "    return sum(1 for r in out if r == {'result': 2})\n"
)


def test_run_code_spends_the_callers_budget(client: TestClient, space: Space) -> None:
    code = (
        "def handle(input, ctx):\n"
        f"    snippet = {SNIPPET!r}\n"
        "    a = ctx.tools.run_code({'language': 'python', 'code': snippet})\n"
        "    b = ctx.tools.run_code({'language': 'python', 'code': snippet})\n"
        "    c = ctx.tools.calculate({'expression': '2+2'})\n"
        "    return {'a': a['raw_data'], 'b': b['raw_data'], 'c': c}\n"
    )
    res = invoke(client, space, make_tool(client, space, "greedy-runner", code))
    assert res["status"] == "ok", res
    ok = res["raw_data"]["a"] + res["raw_data"]["b"]
    # 50 calls for the whole tree: the two run_code calls themselves and 48 calculations.
    assert ok == 48, res["raw_data"]
    assert res["raw_data"]["c"]["error"] == "call_limit"


def test_a_tool_reaching_itself_through_run_code_is_stopped(
    client: TestClient, space: Space
) -> None:
    inner = "def handle(input, ctx):\n    return ctx.tools['loops-through-run-code']({})\n"
    code = (
        "def handle(input, ctx):\n"
        f"    r = ctx.tools.run_code({{'language': 'python', 'code': {inner!r}}})\n"
        "    return {'inner': r['raw_data']}\n"
    )
    tool = make_tool(client, space, "loops-through-run-code", code)
    res = invoke(client, space, tool)
    assert res["status"] == "ok", res
    assert res["raw_data"]["inner"]["error"] == "recursion"
    invoked = _audit(client, space, tool_id=tool["id"], event="tool.invoked")
    assert len(invoked) == 1


def test_the_calls_of_code_run_through_run_code_are_audited(
    client: TestClient, space: Space
) -> None:
    r = client.post(
        "/v1/run-code",
        json={"language": "python", "code": SNIPPET},
        headers=space.auth("invoke"),
    )
    assert r.status_code == 200, r.text
    result = r.json()["data"]
    assert result["raw_data"] == 40 and result["ctx_calls"] == 40
    rows = _audit(client, space, tool_call_id=result["tool_call_id"])
    calc = [x for x in rows if x["event"] == "builtin.called" and x["data"]["name"] == "calculate"]
    assert len(calc) == 40 and {x["source"] for x in calc} == {"code"}
    assert rows[-1]["event"] == "builtin.called" and rows[-1]["data"]["name"] == "run_code"


def test_nested_run_code_rows_name_their_parent(client: TestClient, space: Space) -> None:
    code = (
        "def handle(input, ctx):\n"
        '    snippet = \'def handle(i, ctx):\\n    return ctx.tools.calculate({"expression": "3*3"})\'\n'
        "    return {'inner': ctx.tools.run_code({'language': 'python', 'code': snippet})}\n"
    )
    res = invoke(client, space, make_tool(client, space, "nests-code", code))
    assert res["status"] == "ok" and res["raw_data"]["inner"]["raw_data"] == {"result": 9}, res
    inner_id = res["raw_data"]["inner"]["tool_call_id"]
    inner = _audit(client, space, tool_call_id=inner_id)
    assert [x["data"]["name"] for x in inner] == ["calculate", "run_code"]
    assert inner[-1]["data"]["parent_call_id"] == res["tool_call_id"]


def test_ctx_calls_of_a_test_run_are_audited(client: TestClient, space: Space) -> None:
    body = {
        "workspace_id": space.id,
        "name": "unsaved",
        "language": "python",
        "code": "def handle(input, ctx):\n    return ctx.tools.calculate({'expression': '6*7'})",
        "input": {},
    }
    r = client.post("/v1/custom-tools/test", json=body, headers=space.auth("write"))
    assert r.status_code == 200, r.text
    result = r.json()["data"]
    assert result["raw_data"] == {"result": 42}
    rows = _audit(client, space, tool_call_id=result["tool_call_id"])
    assert [x["event"] for x in rows] == ["builtin.called"]
    assert rows[0]["data"]["name"] == "calculate" and rows[0]["source"] == "code"


def test_ctx_names_the_agent_of_an_invocation(client: TestClient, space: Space) -> None:
    r = client.post(
        "/v1/agents",
        json={"workspace_id": space.id, "name": "Support bot"},
        headers=space.auth("write"),
    )
    agent = r.json()["data"]
    code = "def handle(input, ctx):\n    return {'id': ctx.agentId, 'name': ctx.agent_name}"
    res = invoke(client, space, make_tool(client, space, "who-calls", code), agent_id=agent["id"])
    assert res["raw_data"] == {"id": agent["id"], "name": "Support bot"}


def test_ctx_audit_stores_data_as_given(client: TestClient, space: Space) -> None:
    code = (
        "def handle(input, ctx):\n"
        "    ctx.audit('list', [1, 'two', None])\n"
        "    ctx.audit('text', 'plain')\n"
        "    ctx.audit('nothing')\n"
        "    ctx.audit('object', {'k': {'deep': True}})\n"
        "    return 'done'\n"
    )
    res = invoke(client, space, make_tool(client, space, "audits", code))
    rows = _audit(client, space, tool_call_id=res["tool_call_id"])
    custom = [(x["event"], x["data"]) for x in rows if x["event"].startswith("custom.")]
    assert custom == [
        ("custom.list", [1, "two", None]),
        ("custom.text", "plain"),
        ("custom.nothing", None),
        ("custom.object", {"k": {"deep": True}}),
    ]
    assert all(x["source"] == "code" for x in rows if x["event"].startswith("custom."))


def test_a_tool_disabled_while_a_call_waits_is_not_run(client: TestClient, space: Space) -> None:
    """The status is read when the run starts; this drives the simplest case of it: the
    agent's list said active, the tool was disabled since, the call is refused unrun."""
    tool = make_tool(
        client, space, "soon-disabled", "def main(**p):\n    return {'message': 'ran'}"
    )
    client.post(f"/v1/custom-tools/{tool['id']}/disable", headers=space.auth("write"))
    res = invoke(client, space, tool)
    assert res["error"]["code"] == "tool_disabled"
    after = client.get(f"/v1/custom-tools/{tool['id']}", headers=space.auth("read")).json()["data"]
    assert after["usage_count"] == 0


def test_a_call_that_did_not_queue_keeps_the_status_its_read_saw(
    client: TestClient, space: Space, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window in which the status read with the tool stands counts from the statement
    that read it, not from when the read's transaction began: a slow start of the read (a
    pool checkout, a ping, BEGIN; here made slower than the window on purpose) is not a
    queue, and its call reads the status once. A call that does queue reads it again
    (test_fair_workers, test_disable_race, and the test below)."""
    monkeypatch.setattr(admission, "ADMIT_FRESH_S", 0.5)  # wide: a loaded machine stays within
    tool = make_tool(client, space, "read-once", "def main(**p):\n    return {'message': 'ok'}")
    assert invoke(client, space, tool)["status"] == "ok"  # its validator and code are made
    reads: list[str] = []

    def on_begin(conn: Any) -> None:
        if conn.info.get("toolkiln_readonly") and threading.current_thread().name.startswith(
            "toolkiln-call"
        ):
            reads.append(threading.current_thread().name)
            if len(reads) == 1:
                time.sleep(0.6)  # the invoke's read takes longer than the window

    engine = runtime.database.engine
    sa.event.listen(engine, "begin", on_begin)
    try:
        res = invoke(client, space, tool)
    finally:
        sa.event.remove(engine, "begin", on_begin)
    assert res["status"] == "ok", res
    assert len(reads) == 1, reads  # before 2026-12-03: 2, the status read again


def test_a_tool_disabled_between_its_read_and_its_run_is_not_run(
    client: TestClient, space: Space, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CONTRACT 4, the gap after the read: the tool is disabled after the invocation read it
    as active and before its run asked for a process (here while its input is validated,
    then 50 ms more). The status that read saw is too old when a process is ready, so the
    run reads it again and is refused. (A version that counted the window from when the
    run asked for a process ran it: found by review.)"""
    code = "def main(**p):\n    return {'message': 'ran'}"
    tool = make_tool(client, space, "disabled-in-the-gap", code)
    assert invoke(client, space, tool)["status"] == "ok"
    real = router.input_problems
    fired: list[int] = []

    def validate_then_disable(validator: Any, payload: Any) -> Any:
        if threading.current_thread().name.startswith("toolkiln-call") and not fired:
            fired.append(1)
            r = client.post(f"/v1/custom-tools/{tool['id']}/disable", headers=space.auth("write"))
            assert r.status_code == 200, r.text
            time.sleep(0.05)
        return real(validator, payload)

    monkeypatch.setattr(admission, "ADMIT_FRESH_S", 0.02)  # wider than a process takes to come
    monkeypatch.setattr(router, "input_problems", validate_then_disable)
    res = invoke(client, space, tool)
    assert fired and res["error"] is not None, res
    assert res["error"]["code"] == "tool_disabled", res
    after = client.get(f"/v1/custom-tools/{tool['id']}", headers=space.auth("read")).json()["data"]
    assert after["usage_count"] == 1, after  # the first call only
