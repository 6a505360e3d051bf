"""A ``tools/call`` answered by the session's transport (mcp_server/fast.py) and the same
request answered through the SDK's session machinery (sent with a ``progressToken``, which
the fast answer leaves to the SDK) come to the same JSON-RPC answer: results, failed
results, errors, refusals. A real uvicorn, the wire spoken as a client speaks it."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from mcp.types import LATEST_PROTOCOL_VERSION
from mcp_types import INVALID_PARAMS

from tests.conftest import serving
from tests.mcp.offered import greet_and_boom, sdk_session
from toolkiln.app import build
from toolkiln.config import Settings
from toolkiln.mcp_server.fast import SessionManager

TOKEN = "tk_mcp-fast-admin"
ACCEPT = "application/json, text/event-stream"


@dataclass
class Live:
    base: str
    app: FastAPI
    agent: str
    ok: str
    bad: str
    reader: str  # read, no invoke
    other: str  # another workspace's read,invoke

    @property
    def manager(self) -> SessionManager:
        manager = self.app.state.mcp.manager
        assert isinstance(manager, SessionManager)
        return manager


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    rt = build(Settings(data_dir=tmp_path_factory.mktemp("mcp-fast")))
    access = rt.services.access
    offered = greet_and_boom(rt, TOKEN, "fast-agent")
    who, agent, ok, bad = offered.who, offered.agent_id, offered.ok_id, offered.bad_id
    reader = access.create_token(None, who.workspace_id, "read").value
    other = access.create_token(None, access.create_workspace(None, "else").id, "read,invoke")
    apps: list[FastAPI] = []

    def keep(app: FastAPI) -> FastAPI:
        apps.append(app)
        return app

    try:
        with serving(rt, wrap=keep) as base:
            yield Live(base, apps[0], agent, ok, bad, reader, other.value)
    finally:
        rt.close()


def _messages(answer: httpx.Response) -> list[dict[str, Any]]:
    if answer.headers["content-type"].startswith("application/json"):
        return [answer.json()]
    lines = answer.text.splitlines()
    return [json.loads(line[5:]) for line in lines if line.startswith("data:")]


def _data_lines(answer: httpx.Response) -> list[str]:
    return [line[5:] for line in answer.text.splitlines() if line.startswith("data:")]


class Session:
    """One MCP session spoken over plain HTTP: ``initialize``, then
    ``notifications/initialized``."""

    def __init__(self, live: Live, token: str = TOKEN) -> None:
        self.url = f"{live.base}/mcp/agents/{live.agent}"
        self.http = httpx.Client(timeout=30)
        self.headers = {"Accept": ACCEPT, "Authorization": f"Bearer {token}"}
        opening = self.post(
            "initialize",
            {
                "protocolVersion": LATEST_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        )
        self.headers["mcp-session-id"] = opening.headers["mcp-session-id"]
        version = _messages(opening)[-1]["result"]["protocolVersion"]
        self.headers["mcp-protocol-version"] = version
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert self.http.post(self.url, json=note, headers=self.headers).status_code == 202
        self.next_id = 1

    def post(self, method: str, params: Any, **headers: str) -> httpx.Response:
        self.next_id = getattr(self, "next_id", 0) + 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        return self.http.post(self.url, json=body, headers={**self.headers, **headers})

    def call(self, params: dict[str, Any], progress: bool = False, **headers: str) -> Any:
        """The answer to a ``tools/call`` (its id left out), the notifications before it, and
        the HTTP response."""
        if progress:
            params = {**params, "_meta": {"progressToken": "p"}}
        answer = self.post("tools/call", params, **headers)
        assert answer.status_code == 200, answer.text
        *before, last = _messages(answer)
        assert last.pop("id") == self.next_id
        return last, before, answer


CASES = {
    "a result": lambda live: {"name": f"custom_{live.ok}", "arguments": {"who": "mcp"}},
    "a failed run": lambda live: {"name": f"custom_{live.bad}", "arguments": {}},
    "invalid input": lambda live: {"name": f"custom_{live.ok}", "arguments": {"who": 3}},
    "a tool not offered": lambda live: {"name": "custom_nope"},
    "a built-in": lambda live: {"name": "calculate", "arguments": {"expression": "2**5"}},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fast_answer_is_the_sdks(live: Live, case: str) -> None:
    session = Session(live)
    params = CASES[case](live)
    before = live.manager.answered
    fast, told, answer = session.call(params)
    assert live.manager.answered == before + 1  # answered by the transport
    assert told == []  # no progressToken: no progress
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert answer.headers["mcp-session-id"] == session.headers["mcp-session-id"]
    sdk, told, sdk_answer = session.call(params, progress=True)
    assert live.manager.answered == before + 1  # the SDK's
    assert fast == sdk
    # the same text on the wire: the answer's data line, its id aside
    assert _data_lines(answer)[-1].replace(f'"id":{session.next_id - 1}', "") == _data_lines(
        sdk_answer
    )[-1].replace(f'"id":{session.next_id}', "")
    assert "result" in fast, fast
    if case == "a result":
        assert fast["result"]["content"][0]["text"] == "hello mcp"
        # the status line while the run starts, then once done
        progress = [(m["params"]["progress"], m["params"]["message"]) for m in told]
        assert progress == [(0, "Greeting someone"), (1, "Greeting someone")]


def test_an_error_is_the_sdks(live: Live) -> None:
    """A token that may read the agent but not call its tools: the call's refusal, as the
    SDK's dispatcher words an error its handler raised."""
    session = Session(live, live.reader)
    params = {"name": f"custom_{live.ok}", "arguments": {"who": "mcp"}}
    before = live.manager.answered
    fast, _, _ = session.call(params)
    sdk, _, _ = session.call(params, progress=True)
    assert live.manager.answered == before + 1
    assert fast == sdk
    assert "invoke" in fast["error"]["message"], fast


def test_params_not_valid_are_the_sdks_to_answer(live: Live) -> None:
    session = Session(live)
    before = live.manager.answered
    for params in ({"arguments": {}}, {"name": "calculate", "arguments": 3}, {"name": 7}):
        answer, _, _ = session.call(params)
        assert answer["error"]["code"] == INVALID_PARAMS, answer
    answer, _, _ = session.call({"name": "calculate", "arguments": {"expression": "1"}})
    assert "result" in answer
    assert live.manager.answered == before + 1  # the valid one alone


def test_refusals_before_the_call_are_as_before(live: Live) -> None:
    """The token and the agent are checked before the session is looked at (the REST API's
    envelope); a session ended by DELETE is the SDK's 404; nothing reaches the call."""
    session = Session(live)
    before = live.manager.answered
    params = {"name": "calculate", "arguments": {"expression": "1"}}
    refusals = (("nope", 401, "unauthorized"), (live.other, 404, "not_found"))
    for (token, status, code), method, given in itertools.product(
        refusals, ("tools/call", "tools/list"), (params, {})
    ):
        answer = session.post(method, given, Authorization=f"Bearer {token}")
        assert (answer.status_code, answer.json()["error"]["code"]) == (status, code)
    bare = {k: v for k, v in session.headers.items() if k != "Authorization"}
    body = {"jsonrpc": "2.0", "id": 98, "method": "tools/call", "params": params}
    assert session.http.post(session.url, json=body, headers=bare).status_code == 401
    no_json = {**session.headers, "Accept": "text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": params}
    assert session.http.post(session.url, json=body, headers=no_json).status_code == 406
    assert session.http.delete(session.url, headers=session.headers).status_code == 200
    assert session.post("tools/call", params).status_code == 404
    assert live.manager.answered == before


def test_the_sdks_own_client(live: Live) -> None:
    """The official client over streamable HTTP, whose plain calls the transport answers."""

    async def run() -> list[Any]:
        async with sdk_session(f"{live.base}/mcp/agents/{live.agent}", TOKEN) as session:
            return [
                await session.call_tool(f"custom_{live.ok}", {"who": "sdk"}),
                await session.call_tool(f"custom_{live.bad}", {}),
            ]

    before = live.manager.answered
    ok, bad = anyio.run(run)
    assert live.manager.answered == before + 2
    assert ok.is_error is False and ok.content[0].text == "hello sdk"
    assert ok.structured_content == {"n": 1}
    assert bad.is_error is True and "runtime_error" in bad.content[0].text
