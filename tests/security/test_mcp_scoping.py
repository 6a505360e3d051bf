"""Class: what one workspace does must not reach another workspace's MCP clients.

``notifications/tools/list_changed`` (handshake-era sessions) and the 2026-07-28
``subscriptions/listen`` stream tell a client that its agent's tool list may have changed.
Until 2026-12-06 every listening client of every workspace was told of every change, so a
tenant holding an MCP session could watch another tenant's activity: when it created or
edited tools, and when one of its tools was disabled after three failures in a row.

Each test below makes changes in the other workspace and waits until that workspace's own
client has been told (so the service has handled them: the order of the watcher's turns
makes that a sync point, not a sleep), then makes a change in the first workspace and
checks that its client was told of that one change and of nothing before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import serving
from toolkiln.app import Runtime, build
from toolkiln.config import Settings
from toolkiln.domain.auth import Principal
from toolkiln.domain.tools import ToolDraft
from toolkiln.services.calls import CallContext

ADMIN = "tk_mcp-scoping-admin"
OK = "def main(**p):\n    return {'message': 'ok'}\n"
FAILS = "def main(**p):\n    raise ValueError('no')\n    return {}\n"


@dataclass
class Side:
    token: str
    who: Principal
    agent_id: str


@dataclass
class Live:
    runtime: Runtime
    base: str
    x: Side
    y: Side


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    rt = build(Settings(data_dir=Path(tmp_path_factory.mktemp("mcp-scoping"))))
    access = rt.services.access
    access.bootstrap(ADMIN)
    admin = access.authenticate(ADMIN)

    def side(name: str) -> Side:
        ws = access.create_workspace(admin, name)
        token = access.create_token(admin, ws.id, "read,write,invoke").value
        who = access.authenticate(token)
        agent = rt.services.agents.create(who, ws.id, f"{name}-agent")
        tool = rt.services.tools.create(
            who, ws.id, ToolDraft.of(name=f"{name}-first", language="python", code=OK)
        )
        rt.services.agents.enable_tool(who, agent.id, tool.id, None)
        return Side(token, who, agent.id)

    x, y = side("tenant-x"), side("tenant-y")
    try:
        with serving(rt) as base:
            yield Live(rt, base, x, y)
    finally:
        rt.close()


def _add_tool(live: Live, side: Side, name: str) -> None:
    """A change to ``side``'s agent's tool list: a new tool enabled for it."""
    tools, agents = live.runtime.services.tools, live.runtime.services.agents
    ws = side.who.workspace_id
    tool = tools.create(side.who, ws, ToolDraft.of(name=name, language="python", code=OK))
    agents.enable_tool(side.who, side.agent_id, tool.id, None)


def _disable_by_failures(live: Live, side: Side, name: str) -> None:
    """A tool of ``side``'s workspace (not offered to any agent) disabled by three failures."""
    services = live.runtime.services
    ws = side.who.workspace_id
    tool = services.tools.create(
        side.who, ws, ToolDraft.of(name=name, language="python", code=FAILS)
    )
    for _ in range(3):
        services.invoke.invoke(side.who, tool.id, {}, CallContext())
    assert services.tools.get(side.who, tool.id).status == "disabled"


class Counter:
    """Notifications a client got, and a way to wait for the n-th."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = anyio.Event()

    def seen(self) -> None:
        self.count += 1
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, n: int, what: str) -> None:
        with anyio.fail_after(20, shield=False):
            while self.count < n:
                await self._changed.wait()
        assert self.count >= n, what


async def _in_thread(fn: Callable[[], Any]) -> Any:
    return await anyio.to_thread.run_sync(fn)


def test_handshake_era_sessions_hear_only_their_own_workspace(live: Live) -> None:
    heard = {"x": Counter(), "y": Counter()}

    def handler(key: str) -> Callable[[object], Any]:
        async def on_message(message: object) -> None:
            if type(getattr(message, "root", message)).__name__ == "ToolListChangedNotification":
                heard[key].seen()

        return on_message

    async def session(side: Side, key: str, ready: anyio.Event, done: anyio.Event) -> None:
        headers = {"Authorization": f"Bearer {side.token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            url = f"{live.base}/mcp/agents/{side.agent_id}"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write, message_handler=handler(key)) as s:
                    await s.initialize()
                    await s.list_tools()  # a session that listed tools is told of changes
                    ready.set()
                    await done.wait()

    async def run() -> None:
        done = anyio.Event()
        ready = {"x": anyio.Event(), "y": anyio.Event()}
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session, live.x, "x", ready["x"], done)
            tasks.start_soon(session, live.y, "y", ready["y"], done)
            await ready["x"].wait()
            await ready["y"].wait()

            # Y's activity: a tool of Y disabled after three failures, then a new tool.
            await _in_thread(lambda: _disable_by_failures(live, live.y, "y-failing"))
            await heard["y"].wait_for(1, "Y's own client was not told of Y's change")
            await _in_thread(lambda: _add_tool(live, live.y, "y-second"))
            await heard["y"].wait_for(2, "Y's own client was not told of Y's change")

            # X's own change reaches X: the channel works, and it carried nothing of Y's.
            await _in_thread(lambda: _add_tool(live, live.x, "x-second"))
            await heard["x"].wait_for(1, "X's client was not told of X's change")
            assert heard["x"].count == 1, "X's client was told of Y's changes"

            # And the other way round.
            await _in_thread(lambda: _add_tool(live, live.y, "y-third"))
            await heard["y"].wait_for(3, "Y's own client was not told of Y's change")
            assert heard["y"].count == 3, "Y's client was told of X's change"
            done.set()

    anyio.run(run)


def test_listen_streams_hear_only_their_own_workspace(live: Live) -> None:
    heard = {"x": Counter(), "y": Counter()}

    async def listener(side: Side, key: str, ready: anyio.Event, done: anyio.Event) -> None:
        headers = {"Authorization": f"Bearer {side.token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            url = f"{live.base}/mcp/agents/{side.agent_id}"
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="2026-07-28", cache=None) as client:
                async with client.listen(tools_list_changed=True) as sub:
                    ready.set()

                    async def count() -> None:
                        async for _event in sub:
                            heard[key].seen()

                    async with anyio.create_task_group() as inner:
                        inner.start_soon(count)
                        await done.wait()
                        inner.cancel_scope.cancel()

    async def run() -> None:
        done = anyio.Event()
        ready = {"x": anyio.Event(), "y": anyio.Event()}
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(listener, live.x, "x", ready["x"], done)
            tasks.start_soon(listener, live.y, "y", ready["y"], done)
            await ready["x"].wait()
            await ready["y"].wait()

            await _in_thread(lambda: _add_tool(live, live.y, "y-listen-1"))
            await heard["y"].wait_for(1, "Y's listen stream was not told of Y's change")
            await _in_thread(lambda: _disable_by_failures(live, live.y, "y-listen-failing"))
            await heard["y"].wait_for(2, "Y's listen stream was not told of Y's change")

            await _in_thread(lambda: _add_tool(live, live.x, "x-listen-1"))
            await heard["x"].wait_for(1, "X's listen stream was not told of X's change")
            assert heard["x"].count == 1, "X's listen stream was told of Y's changes"

            await _in_thread(lambda: _add_tool(live, live.y, "y-listen-2"))
            await heard["y"].wait_for(3, "Y's listen stream was not told of Y's change")
            assert heard["y"].count == 3, "Y's listen stream was told of X's change"
            done.set()

    anyio.run(run)
