"""The official MCP client against Toolkiln, over streamable HTTP (a real uvicorn) and stdio."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import serving
from tests.mcp.offered import greet_and_boom
from toolkiln.app import Runtime, build
from toolkiln.config import Settings
from toolkiln.domain.tools import ToolDraft

TOKEN = "tk_mcp-suite-admin"


@dataclass
class Live:
    runtime: Runtime
    base: str
    data_dir: Path
    agent_id: str
    ok_tool: str
    bad_tool: str
    other_token: str


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    data_dir = tmp_path_factory.mktemp("mcp")
    rt = build(Settings(data_dir=data_dir))
    access = rt.services.access
    offered = greet_and_boom(rt, TOKEN, "mcp-agent")
    other_ws = access.create_workspace(None, "elsewhere")
    other = access.create_token(None, other_ws.id, "read,invoke").value
    try:
        with serving(rt) as base:
            yield Live(rt, base, data_dir, offered.agent_id, offered.ok_id, offered.bad_id, other)
    finally:
        rt.close()


async def exercise(session: ClientSession, live: Live) -> dict:
    await session.initialize()
    listed = await session.list_tools()
    names = [t.name for t in listed.tools]
    progress: list[tuple[float, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    ok = await session.call_tool(
        f"custom_{live.ok_tool}", {"who": "mcp"}, progress_callback=on_progress
    )
    bad = await session.call_tool(f"custom_{live.bad_tool}", {})
    calc = await session.call_tool("calculate", {"expression": "2**5"})
    missing = await session.call_tool("custom_nope", {})
    no_who = await session.call_tool(f"custom_{live.ok_tool}", {"who": 3})
    return {
        "no_who": no_who,
        "names": names,
        "tools": listed.tools,
        "ok": ok,
        "bad": bad,
        "calc": calc,
        "missing": missing,
        "progress": progress,
    }


def check(out: dict, live: Live) -> None:
    assert f"custom_{live.ok_tool}" in out["names"] and "calculate" in out["names"]
    greet = next(t for t in out["tools"] if t.name == f"custom_{live.ok_tool}")
    assert greet.input_schema["required"] == ["who"]
    assert greet.annotations is not None and greet.annotations.open_world_hint is False
    ok = out["ok"]
    assert ok.is_error is False and ok.content[0].text == "hello mcp"
    assert ok.structured_content == {"n": 1}
    assert out["bad"].is_error is True and "runtime_error" in out["bad"].content[0].text
    assert out["calc"].structured_content == {"result": 32}
    assert out["missing"].is_error is True and "tool_not_enabled" in out["missing"].content[0].text
    no_who = out["no_who"]
    assert no_who.is_error is True
    assert no_who.content[0].text.startswith("invalid_input: ")
    assert "input.who: 3 is not of type 'string'" in no_who.content[0].text


def test_streamable_http(live: Live) -> None:
    async def run() -> dict:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            url = f"{live.base}/mcp/agents/{live.agent_id}"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    return await exercise(session, live)

    out = anyio.run(run)
    check(out, live)
    assert out["progress"] and out["progress"][0][1] == "Greeting someone"


def test_http_refuses_bad_tokens_and_foreign_agents(live: Live) -> None:
    url = f"{live.base}/mcp/agents/{live.agent_id}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    assert httpx.post(url, json=body, headers=headers).status_code == 401
    bad = {**headers, "Authorization": "Bearer nope"}
    assert httpx.post(url, json=body, headers=bad).status_code == 401
    foreign = {**headers, "Authorization": f"Bearer {live.other_token}"}
    assert httpx.post(url, json=body, headers=foreign).status_code == 404
    assert httpx.post(f"{live.base}/mcp/elsewhere", json=body, headers=headers).status_code == 404


def test_http_refuses_as_the_rest_api_does(live: Live) -> None:
    """One error mapping (api/errors.py): status, code and headers as REST's for the agent."""
    url = f"{live.base}/mcp/agents/{live.agent_id}"
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": "application/json, text/event-stream"}
    for auth in (
        {},
        {"Authorization": "Bearer nope"},
        {"Authorization": f"Bearer {live.other_token}"},
    ):
        mcp = httpx.post(url, json=body, headers={**accept, **auth})
        rest = httpx.get(f"{live.base}/v1/agents/{live.agent_id}", headers=auth)
        assert mcp.status_code in (401, 404)
        assert (mcp.status_code, mcp.json(), mcp.headers.get("www-authenticate")) == (
            rest.status_code,
            rest.json(),
            rest.headers.get("www-authenticate"),
        )


def test_stdio(live: Live) -> None:
    exe = str(Path(sys.executable).parent / "toolkiln")
    env = {"TOOLKILN_DATA_DIR": str(live.data_dir), "PATH": os.environ.get("PATH", "")}
    params = StdioServerParameters(command=exe, args=["mcp", "--agent", live.agent_id], env=env)

    async def run() -> dict:
        with open(os.devnull, "w") as sink:
            async with stdio_client(params, errlog=sink) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    return await exercise(session, live)

    check(anyio.run(run), live)


def test_list_changed_reaches_clients(live: Live) -> None:
    who = live.runtime.services.access.authenticate(TOKEN)
    extra = live.runtime.services.tools.create(
        who,
        who.workspace_id,
        ToolDraft.of(
            name="late-comer",
            language="python",
            code="def main(**p):\n    return {'message': 'hi'}",
        ),
    )
    got = anyio.Event()
    seen: list[str] = []

    async def on_message(message: object) -> None:
        name = type(getattr(message, "root", message)).__name__
        seen.append(name)
        if name == "ToolListChangedNotification":
            got.set()

    async def run() -> tuple[list[str], list[str], bool]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            url = f"{live.base}/mcp/agents/{live.agent_id}"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write, message_handler=on_message) as session:
                    init = await session.initialize()
                    before = [t.name for t in (await session.list_tools()).tools]
                    await anyio.to_thread.run_sync(
                        lambda: live.runtime.services.agents.enable_tool(
                            who, live.agent_id, extra.id, None
                        )
                    )
                    with anyio.fail_after(15):
                        await got.wait()
                    after = [t.name for t in (await session.list_tools()).tools]
                    return (
                        before,
                        after,
                        bool(init.capabilities.tools and init.capabilities.tools.list_changed),
                    )

    before, after, advertised = anyio.run(run)
    assert advertised
    assert f"custom_{extra.id}" not in before and f"custom_{extra.id}" in after


def test_code_mode_over_streamable_http(live: Live) -> None:
    program = (
        "async def handle(input, ctx):\n"
        "    r = await ctx.tools.greet({'who': 'program'})\n"
        "    c = await ctx.tools.calculate({'expression': '6*7'})\n"
        "    return {'message': r['message'], 'rawData': c}\n"
    )

    async def run() -> tuple[list[str], str, object]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            url = f"{live.base}/mcp/agents/{live.agent_id}?mode=code"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    listed = await session.list_tools()
                    out = await session.call_tool(
                        "run_program", {"language": "python", "code": program}
                    )
                    return [t.name for t in listed.tools], listed.tools[0].description or "", out

    names, description, out = anyio.run(run)
    assert names == ["run_program"] and "def greet(*, who: str)" in description
    assert out.is_error is False and out.content[0].text == "hello program"  # type: ignore[attr-defined]
    assert out.structured_content == {"result": 42}  # type: ignore[attr-defined]


def test_a_code_mode_session_offers_run_program_alone(live: Live) -> None:
    async def run() -> object:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            url = f"{live.base}/mcp/agents/{live.agent_id}?mode=code"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await session.call_tool("calculate", {"expression": "1+1"})

    out = anyio.run(run)
    assert out.is_error is True and "unknown_tool" in out.content[0].text  # type: ignore[attr-defined]


def test_http_offers_own_names_when_asked(live: Live) -> None:
    """``?names=name``: the custom tools under their own names, called by them."""

    async def run() -> tuple[list[str], str]:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            url = f"{live.base}/mcp/agents/{live.agent_id}?names=name"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    listed = [t.name for t in (await session.list_tools()).tools]
                    out = await session.call_tool("greet", {"who": "by name"})
                    return listed, out.content[0].text

    listed, text = anyio.run(run)
    assert "greet" in listed and f"custom_{live.ok_tool}" not in listed
    assert text == "hello by name"
