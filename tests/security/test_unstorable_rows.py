"""Rows the service makes from what a caller sent (a built-in's ``builtin.called`` summary of
its input) are always storable: NUL (PostgreSQL's JSONB refuses it), lone surrogates and
numbers that are not finite never reach a write. A tool that put them into a built-in's input
made its call's one write fail on PostgreSQL: a 500, no stored call, no audit row, and its
failures were never counted (so never auto-disabled). On SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.conftest import Space

# NUL in a key and a value of a built-in's input, and (as raw JSON text, which no encoder of
# the jail's would write) a number past a float's range, which reads as infinity.
CODE = {
    "python": (
        "import struct\n"
        "def handle(input, ctx):\n"
        "    ctx.tools.calculate({'expression': '1', 'k' + chr(0): 'a' + chr(0) + 'b'})\n"
        "    link = ctx._link\n"
        '    body = (\'{"op":"call","run":"%s","id":99,"tool":"calculate",\'\n'
        '            \'"input":{"expression":"1","n":1e400}}\' % link.run).encode()\n'
        "    link.sock.sendall(struct.pack('>I', len(body)) + body)\n"
        "    link.reader.recv(1 << 20)\n"
        "    raise RuntimeError('fails every time')\n"
        "    return 1\n"
    ),
    "javascript": (
        "async function handle(input, ctx) {\n"
        "  await ctx.tools.calculate({ expression: '1', ['k' + String.fromCharCode(0)]: 'a\\u0000b' });\n"
        "  throw new Error('fails every time');\n"
        "  return 1;\n"
        "}\n"
    ),
}


@pytest.mark.parametrize("language", ["python", "javascript"])
def test_a_builtins_input_summary_is_storable(
    client: TestClient, space: Space, language: str
) -> None:
    body = {
        "workspace_id": space.id,
        "name": f"unstorable-summary-{language}",
        "language": language,
        "code": CODE[language],
        "input_schema": {"type": "object"},
    }
    rw = space.auth("read", "write", "invoke")
    r = client.post("/v1/custom-tools", json=body, headers=rw)
    assert r.status_code == 201, r.text
    tool_id = r.json()["data"]["id"]
    for _ in range(3):
        r = client.post(f"/v1/custom-tools/{tool_id}/invoke", json={"input": {}}, headers=rw)
        assert r.status_code == 200, r.text
        res = r.json()["data"]
        assert res["error"]["code"] == "runtime_error", res
    tool = client.get(f"/v1/custom-tools/{tool_id}", headers=rw).json()["data"]
    assert (tool["usage_count"], tool["status"]) == (3, "disabled"), tool
    stored = client.get(f"/v1/tool-calls/{res['tool_call_id']}", headers=rw)
    assert stored.status_code == 200, stored.text
    rows = [a for a in stored.json()["data"]["audit"] if a["event"] == "builtin.called"]
    assert rows and all(a["data"]["name"] == "calculate" for a in rows), rows
    text = json.dumps([a["data"] for a in rows])
    assert "\\u0000" not in text and "Infinity" not in text, text


def test_the_builtin_endpoint_summarises_bad_input_storably(
    client: TestClient, space: Space
) -> None:
    rw = space.auth("read", "write", "invoke")
    r = client.post(
        "/v1/builtin-tools/calculate/call",
        content=b'{"input": {"expression": "1", "k\\u0000": "v\\u0000", "n": 1e400}}',
        headers={**rw, "Content-Type": "application/json"},
    )
    assert r.status_code in (200, 422), r.text
    rows = client.get(
        "/v1/audit", params={"workspace_id": space.id, "event": "builtin.called"}, headers=rw
    )
    assert rows.status_code == 200, rows.text
