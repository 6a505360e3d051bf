"""Class: one workspace cannot make another's MCP clients miss what they must be told.

A handshake-era MCP session that listed tools is told when its agent's tool list changes;
the service remembers at most ``MAX_SESSIONS`` such sessions, the oldest forgotten first.
Workspace A opening more sessions than that (each an initialize and a tools/list) made the
service forget workspace B's session, which was then never told of B's own changes. The
sessions a workspace opens push out only its own.

Real MCP over HTTP (the SDK's client) against the service on a real uvicorn.
"""

from __future__ import annotations

import anyio
import pytest

from tests.mcp.offered import sdk_session
from tests.security.test_mcp_scoping import Counter, Live, Side, _add_tool, _in_thread, live
from toolkiln.mcp_server import server

__all__ = ["live"]
FLOOD = 40  # A's sessions, over a cap made this small for the test


def test_a_flood_of_sessions_leaves_another_workspace_told(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "MAX_SESSIONS", FLOOD // 2)
    heard = Counter()

    async def on_message(message: object) -> None:
        if type(getattr(message, "root", message)).__name__ == "ToolListChangedNotification":
            heard.seen()

    async def listed_once(side: Side) -> None:
        async with sdk_session(f"{live.base}/mcp/agents/{side.agent_id}", side.token) as s:
            await s.list_tools()

    async def b_session(ready: anyio.Event, done: anyio.Event) -> None:
        url = f"{live.base}/mcp/agents/{live.y.agent_id}"
        async with sdk_session(url, live.y.token, message_handler=on_message) as s:
            await s.list_tools()
            ready.set()
            await done.wait()

    async def run() -> None:
        ready, done = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(b_session, ready, done)
            await ready.wait()
            for _ in range(FLOOD):
                await listed_once(live.x)
            await _in_thread(lambda: _add_tool(live, live.y, "y-after-flood"))
            await heard.wait_for(1, "B's client was not told of B's change")
            done.set()

    anyio.run(run)
