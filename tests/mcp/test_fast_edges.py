"""The edges of the transport's own answer to a plain ``tools/call`` (mcp_server/fast.py):
a call refused a turn, headers sent twice, and a session used with another token are
answered as on the SDK's path and as the endpoint's checks answer them."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.mcp.test_fast_calls import ACCEPT, Live, Session, live

__all__ = ["live"]


def test_a_call_over_the_waiting_cap_is_a_failed_result_as_on_the_sdk_path(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call refused a turn (``Turns.acquire``: too many calls wait) is a failed result in
    a 200 event, as the SDK's path (``ToolCalls.__call__``) answers it, never the REST
    API's 429 envelope in the middle of a session."""
    session = Session(live)
    turns = live.app.state.mcp._calls._pool.turns
    monkeypatch.setattr(turns, "waiting_cap", 0)  # every call "over the cap"
    params = {"name": "calculate", "arguments": {"expression": "1"}}
    sdk, _, _ = session.call(params, progress=True)
    assert sdk["result"]["isError"] is True, sdk
    answer = session.post("tools/call", params)
    assert answer.status_code == 200, (answer.status_code, answer.text)


def test_no_token_is_refused_whatever_the_version_headers(live: Live) -> None:
    """A header sent twice counts by its first value, as the SDK reads it: a request whose
    first ``mcp-protocol-version`` is of another era is never taken for one the session's
    transport checks itself, so a request without a token is refused (401) before the SDK
    sees it, whatever its version headers say."""
    session = Session(live)
    sid = session.headers["mcp-session-id"]
    version = session.headers["mcp-protocol-version"]
    for method in ("ping", "tools/list", "tools/call"):
        raw = [
            (b"accept", ACCEPT.encode()),
            (b"content-type", b"application/json"),
            (b"mcp-session-id", sid.encode()),
            (b"mcp-protocol-version", b"2026-07-28"),
            (b"mcp-protocol-version", version.encode()),
        ]
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}
        with httpx.Client(timeout=30) as http:
            answer = http.send(
                httpx.Request("POST", session.url, headers=raw, content=json.dumps(body))
            )
        assert answer.status_code == 401, (method, answer.status_code, answer.text)


def test_a_session_serves_only_the_token_that_opened_it(live: Live) -> None:
    """A session serves only the token that opened it (the SDK's owner check, given the
    token's hash as ``scope["user"]`` by McpHttp): another workspace's token, on its own
    agent, neither has its calls answered on that session nor opens the session's GET
    stream (which would carry the first workspace's notifications): 404 for both, as for a
    session that does not exist."""
    services = live.app.state.mcp._services
    access = services.access
    ws = access.create_workspace(None, "hijacker")
    token_b = access.create_token(None, ws.id, "read,write,invoke").value
    agent_b = services.agents.create(access.authenticate(token_b), ws.id, "b-agent")
    a = Session(live)  # workspace A's session
    headers_b = {**a.headers, "Authorization": f"Bearer {token_b}"}
    url_b = f"{live.base}/mcp/agents/{agent_b.id}"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "calculate", "arguments": {"expression": "1"}},
    }
    before = live.manager.answered
    answer = a.http.post(url_b, json=body, headers=headers_b)
    on_a_session = live.manager.answered - before
    with a.http.stream("GET", url_b, headers=headers_b) as stream:
        get_status = stream.status_code
    assert (answer.status_code, on_a_session, get_status) == (404, 0, 404)
