"""Invoking Python tools through the API: results, errors, counting, auto-disable, stored calls."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import Space, seed_tool
from toolkiln.api.app import create_app
from toolkiln.api.fast import FastRoute
from toolkiln.app import Runtime


def make(client: TestClient, space: Space, rw, code: str, **over: object) -> dict:
    body = seed_tool(
        space,
        code=code,
        **{"name": "t", "parameters": None, "input_schema": {"type": "object"}, **over},
    )
    r = client.post("/v1/custom-tools", json=body, headers=rw)
    assert r.status_code == 201, r.text
    return r.json()["data"]


def invoke(client: TestClient, tool: dict, rw, payload: dict | None = None, **extra) -> dict:
    r = client.post(
        f"/v1/custom-tools/{tool['id']}/invoke", json={"input": payload or {}, **extra}, headers=rw
    )
    assert r.status_code == 200, r.text
    return r.json()["data"]


def get_tool(client: TestClient, tool: dict, rw) -> dict:
    return client.get(f"/v1/custom-tools/{tool['id']}", headers=rw).json()["data"]


def test_seed_tool_runs_and_is_counted(client: TestClient, space: Space, rw) -> None:
    r = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw)
    tool = r.json()["data"]
    res = invoke(client, tool, rw, {"order_id": "A-17"}, tool_call_id="call-seed-" + space.id)
    assert res["status"] == "ok" and res["error"] is None
    assert res["message"] == "Order A-17 is shipped" and res["llm"] == res["message"]
    assert res["raw_data"] == {"status": "shipped"}
    assert res["tool_call_id"] == "call-seed-" + space.id and res["version"] == 1
    assert res["duration_ms"] > 0 and res["ctx_calls"] == 0
    assert get_tool(client, tool, rw)["usage_count"] == 1
    stored = client.get(f"/v1/tool-calls/{res['tool_call_id']}", headers=rw).json()["data"]
    assert stored["message"] == res["message"]
    assert [a["event"] for a in stored["audit"]] == ["tool.invoked"]
    assert stored["audit"][0]["data"]["status"] == "ok"
    again = client.post(
        f"/v1/custom-tools/{tool['id']}/invoke",
        json={"input": {"order_id": "x"}, "tool_call_id": res["tool_call_id"]},
        headers=rw,
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "duplicate_tool_call_id"


def test_entrypoint_shapes(client: TestClient, space: Space, rw) -> None:
    cases = [
        ("async def main(**p):\n    return {'message': str(p['n'] * 2)}", {"n": 21}, "42", None),
        (
            "def handle(input, ctx):\n    return [input['n'], ctx.toolCallId == ctx.tool_call_id]",
            {"n": 1},
            "[1, true]",
            [1, True],
        ),
        (
            "async def handle(input, ctx):\n    return {'message': 'hi', 'rawData': 1, '_llm': 'L'}",
            {},
            "hi",
            1,
        ),
        ("def main(*, ctx, **p):\n    return {'message': ctx.agentId}", {}, "agent-7", None),
    ]
    for i, (code, payload, message, raw) in enumerate(cases):
        tool = make(client, space, rw, code, name=f"shape-{i}")
        res = invoke(client, tool, rw, payload, agent_id="agent-7")
        assert res["status"] == "ok", res
        assert res["message"] == message and res["raw_data"] == raw
    assert res["llm"] == "agent-7"


def test_input_is_validated_before_anything_runs(client: TestClient, space: Space, rw) -> None:
    r = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw)
    tool = r.json()["data"]
    res = invoke(client, tool, rw, {"order_id": 5, "extra": True})
    assert res["status"] == "error" and res["error"]["code"] == "invalid_input"
    assert res["error"]["details"][0]["field"] == "input.order_id"
    res = invoke(client, tool, rw, {})
    assert "order_id" in res["error"]["details"][0]["message"]
    after = get_tool(client, tool, rw)
    assert after["usage_count"] == 0 and after["failure_count"] == 0


def test_every_failure_code_has_a_real_cause(client: TestClient, space: Space, rw) -> None:
    cases = {
        "runtime_error": "def main(**p):\n    x = 1\n    raise ValueError('bad ' + str(x))\n    return {}\n",
        "timeout": "def main(**p):\n    while True:\n        pass\n    return {}\n",
        "memory_limit": "def main(**p):\n    b = bytearray(2 * 1024**3)\n    return {'message': 'x'}\n",
        "output_too_large": "def main(**p):\n    return {'message': 'x' * 2_000_000}\n",
        "invalid_result": "def main(**p):\n    return 42\n",
        "sandbox_violation": "def main(**p):\n    import socket\n    socket.socket()\n    return {}\n",
    }
    for code_name, code in cases.items():
        tool = make(client, space, rw, code, name=code_name.replace("_", "-"), timeout_ms=1000)
        res = invoke(client, tool, rw)
        assert res["status"] == "error", (code_name, res)
        assert res["error"]["code"] == code_name, (code_name, res["error"])
        t = get_tool(client, tool, rw)
        assert t["usage_count"] == 1 and t["failure_count"] == 1, code_name
        assert t["last_error"].startswith(code_name)
    err = invoke(client, get_tool_by_name(client, space, rw, "runtime-error"), rw)["error"]
    assert err["details"] == {"type": "ValueError", "message": "bad 1", "line": 3}
    bad_json = make(client, space, rw, "def main(**p):\n    return {'message': {1, 2}}", name="set")
    assert invoke(client, bad_json, rw)["error"]["code"] == "invalid_result"


def get_tool_by_name(client: TestClient, space: Space, rw, name: str) -> dict:
    tools = client.get("/v1/custom-tools", params={"workspace_id": space.id}, headers=rw).json()
    return next(t for t in tools["data"] if t["name"] == name)


def test_three_failures_disable_and_success_resets(client: TestClient, space: Space, rw) -> None:
    flaky = "def main(**p):\n    if p.get('fail'):\n        raise RuntimeError('no')\n    return {'message': 'ok'}"
    tool = make(client, space, rw, flaky, name="flaky")
    for _ in range(2):
        assert invoke(client, tool, rw, {"fail": True})["error"]["code"] == "runtime_error"
    assert get_tool(client, tool, rw)["failure_count"] == 2
    assert invoke(client, tool, rw)["status"] == "ok"
    assert get_tool(client, tool, rw)["failure_count"] == 0
    for _ in range(3):
        invoke(client, tool, rw, {"fail": True})
    t = get_tool(client, tool, rw)
    assert t["status"] == "disabled" and t["failure_count"] == 3
    assert t["disabled_reason"] == "automatic, after 3 consecutive failures"
    res = invoke(client, tool, rw)
    assert res["error"]["code"] == "tool_disabled"
    assert get_tool(client, tool, rw)["usage_count"] == 6  # the refused call did not count
    rows = client.get(
        "/v1/audit", params={"tool_id": tool["id"], "event": "tool.disabled"}, headers=rw
    ).json()["data"]
    assert len(rows) == 1 and rows[0]["data"]["reason"] == t["disabled_reason"]
    client.post(f"/v1/custom-tools/{tool['id']}/enable", headers=rw)
    assert invoke(client, tool, rw)["status"] == "ok"


def test_output_is_captured_and_capped(client: TestClient, space: Space, rw) -> None:
    code = (
        "import sys\n"
        "def main(**p):\n"
        "    print('hello')\n"
        "    print('e' * 100_000, file=sys.stderr)\n"
        "    return {'message': 'done'}\n"
    )
    res = invoke(client, make(client, space, rw, code, name="logs"), rw)
    assert res["logs"]["stdout"] == "hello\n"
    assert res["logs"]["stderr"].startswith("e" * 1000)
    assert "[truncated:" in res["logs"]["stderr"] and len(res["logs"]["stderr"]) < 66_000


def test_run_code_and_test_store_and_count_nothing(client: TestClient, space: Space, rw) -> None:
    r = client.post(
        "/v1/run-code",
        json={
            "language": "python",
            "code": "def main(**p):\n    return {'message': str(p)}",
            "input": {"a": 1},
        },
        headers=rw,
    )
    assert r.status_code == 200 and r.json()["data"]["message"] == "{'a': 1}"
    syntax = client.post(
        "/v1/run-code", json={"language": "python", "code": "def main(:\n"}, headers=rw
    ).json()["data"]
    assert syntax["error"]["code"] == "runtime_error" and syntax["error"]["details"]["line"] == 1
    body = seed_tool(space, name="draft", input={"order_id": "Z"})
    tested = client.post("/v1/custom-tools/test", json=body, headers=rw)
    assert tested.status_code == 200 and tested.json()["data"]["message"] == "Order Z is shipped"
    listed = client.get("/v1/custom-tools", params={"workspace_id": space.id}, headers=rw).json()
    assert listed["data"] == []
    bad = client.post("/v1/custom-tools/test", json={**body, "code": "def main(:"}, headers=rw)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_tool"
    rows = client.get("/v1/audit", params={"event": "builtin.called"}, headers=rw).json()["data"]
    assert [r["data"]["name"] for r in rows] == ["run_code", "run_code"]


def test_runtimes_tell_the_truth(client: TestClient, rw) -> None:
    data = client.get("/v1/custom-tools/runtimes", headers=rw).json()["data"]
    py = data["python"]
    assert py["available"] is True
    assert {e["name"] for e in py["entrypoints"]} == {"main", "handle"}
    iso = py["isolation"]
    assert set(iso["namespaces"]) == {"mount", "pid", "network", "ipc", "uts"}
    assert iso["seccomp"] == "allowlist" and iso["readonly_root"] is True
    assert iso["cgroup"] in {"v1", "v2"}
    assert {"name": "numpy", "version": "2.3.5"} in py["dependencies"]
    js = data["javascript"]
    assert js["available"] is True and js["isolation"]["cgroup"] in {"v1", "v2"}
    health = client.get("/healthz").json()
    assert health["runtimes"]["python"]["ready"] is True


def test_scopes_for_invoking(client: TestClient, space: Space, other_space: Space, rw) -> None:
    r = client.post("/v1/custom-tools", json=seed_tool(space), headers=rw)
    url = f"/v1/custom-tools/{r.json()['data']['id']}/invoke"
    assert client.post(url, json={"input": {}}).status_code == 401
    assert client.post(url, json={"input": {}}, headers=space.auth("read")).status_code == 403
    other = other_space.auth("read", "write", "invoke")
    assert client.post(url, json={"input": {}}, headers=other).status_code == 404
    missing = url.replace(r.json()["data"]["id"], "no-such-tool")
    assert client.post(missing, json={"input": {}}, headers=rw).status_code == 404
    nope = {"Authorization": "Bearer tk_no-such-token"}
    assert client.post(url, json={"input": {}}, headers=nope).status_code == 401
    # A revoked token is refused at its next call (the token and the tool are one read).
    admin = space.auth("admin")
    made = client.post(
        "/v1/tokens", json={"workspace_id": space.id, "scopes": ["invoke"]}, headers=admin
    ).json()["data"]
    mine = {"Authorization": f"Bearer {made['token']}"}
    assert client.post(url, json={"input": {}}, headers=mine).status_code == 200
    assert client.delete(f"/v1/tokens/{made['id']}", headers=admin).status_code == 204
    assert client.post(url, json={"input": {}}, headers=mine).status_code == 401
    assert (
        client.post(
            "/v1/run-code", json={"language": "python", "code": "x"}, headers=space.auth("read")
        ).status_code
        == 403
    )


def test_the_invoke_fast_path_answers_as_fastapis_route(
    runtime: Runtime, client: TestClient, space: Space, rw
) -> None:
    """The invoke route's fast path (api/fast.py) and FastAPI's own route give the
    same answers, good and bad (bodies, content types, tokens): the same app without the fast
    path is the reference."""
    reference = create_app(runtime.services)
    reference.router.routes[:] = [
        r for r in reference.router.routes if not isinstance(r, FastRoute)
    ]
    assert any(isinstance(r, FastRoute) for r in client.app.router.routes)
    tool = make(client, space, rw, "def main(**params):\n    return {'message': 'ok'}\n")
    url = f"/v1/custom-tools/{tool['id']}/invoke"
    json_h = {**rw, "content-type": "application/json"}
    cases: list[tuple[str, str, dict[str, str], bytes | None]] = [
        ("POST", url, json_h, b'{"input": {}}'),
        ("POST", url, json_h, b'{"input": {}, "unknown": 1}'),
        ("POST", url, json_h, b'{"input": {}, "agent_id": 7}'),
        ("POST", url, json_h, b'{"input": {}, "tool_call_id": ""}'),
        ("POST", url, json_h, b'{"input": '),
        ("POST", url, json_h, b"[]"),
        ("POST", url, json_h, b"null"),
        ("POST", url, json_h, b'{"input": NaN}'),
        ("POST", url, json_h, b"\xff\xfe"),
        ("POST", url, rw, None),
        ("POST", url, rw, b'{"input": {}}'),  # no Content-Type
        ("POST", url, {**rw, "content-type": ""}, b'{"input": {}}'),
        ("POST", url, {**rw, "content-type": ";"}, b'{"input": {}}'),
        ("POST", url, {**rw, "content-type": "text/plain"}, b'{"input": {}}'),
        ("POST", url, {**rw, "content-type": "application/vnd.x+json"}, b'{"input": {}}'),
        ("POST", url, {**rw, "content-type": "Application/JSON; charset=utf-8"}, b'{"input": {}}'),
        ("POST", url, json_h, b'{"input": ' * 5000 + b"1" + b"}" * 5000),
        ("POST", url, {"content-type": "application/json"}, b'{"input": {}}'),
        ("POST", url, {**json_h, "authorization": "Bearer tk_wrong"}, b'{"input": {}}'),
        ("POST", url.replace(tool["id"], "no-such-tool"), json_h, b'{"input": {}}'),
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
    document = client.get("/openapi.json").json()
    assert "post" in document["paths"]["/v1/custom-tools/{tool_id}/invoke"]


def test_one_call_id_sent_at_once_is_a_duplicate_for_all_but_one(
    client: TestClient, space: Space, rw
) -> None:
    """The check before the run is no reservation (both requests run); the later record then
    meets the earlier's unique key, and that answer is duplicate_tool_call_id too."""
    import threading

    tool = make(
        client, space, rw, "import time\ndef handle(i, c):\n    time.sleep(0.5)\n    return 1\n"
    )
    answers = []
    body = {"input": {}, "tool_call_id": "same-" + space.id}

    def send() -> None:
        answers.append(client.post(f"/v1/custom-tools/{tool['id']}/invoke", json=body, headers=rw))

    threads = [threading.Thread(target=send) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in answers) == [200, 409, 409], [r.text for r in answers]
    refused = [r.json()["error"] for r in answers if r.status_code == 409]
    assert [e["code"] for e in refused] == ["duplicate_tool_call_id"] * 2, refused
    assert get_tool(client, tool, rw)["usage_count"] == 1


# Its entrypoint is given no ctx, and it names nothing the analysis reads as a way to it
# (domain/code_check.py _py_takes_ctx): it is sent one way (runners/wire.py RunOneWay),
# and reaches the ctx of the jail's frame anyway.
REACHES_CTX = """
def main(**p):
    get = object.__getattribute__
    try:
        raise ValueError()
    except ValueError as e:
        frame = get(get(e, "__trace" + "back__"), "tb_" + "frame")
    while frame is not None:
        found = get(frame, "f_" + "locals").get("c" + "tx")
        if found is not None:
            return {"message": str(found.tools.calculate({"expression": "6*7"}))}
        frame = get(frame, "f_" + "back")
    return {"message": "none"}
"""


def test_a_tool_given_no_ctx_that_reaches_it_anyway_is_answered_once(
    client: TestClient, space: Space, rw
) -> None:
    """The runner gives the one-way run up at its ctx call (nothing of it left its process)
    and the API runs it again on the stream: one answer, one count, one row of the call.
    (A first call of a text waits for its compile, so it goes on the stream: the second
    is sent one way. The runner's side alone: tests/runners/test_one_way.py.)"""
    tool = make(client, space, rw, REACHES_CTX)
    for n in (1, 2):
        res = invoke(client, tool, rw)
        assert res["status"] == "ok" and "42" in res["message"], res
        assert res["ctx_calls"] == 1
        assert get_tool(client, tool, rw)["usage_count"] == n
        stored = client.get(f"/v1/tool-calls/{res['tool_call_id']}", headers=rw).json()["data"]
        events = [a["event"] for a in stored["audit"]]
        assert events.count("tool.invoked") == 1 and len(events) == 2, events
