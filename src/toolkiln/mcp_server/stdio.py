"""``toolkiln mcp --agent ID``: the agent's tools over stdio for local MCP clients.

Like the rest of the CLI it runs with the local user's access to the data directory and
configuration, so it needs no token: it acts for the agent's workspace with read and invoke.
"""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from toolkiln.domain.auth import Principal
from toolkiln.mcp_server.server import Endpoint, Listeners, make_server, tool_list_watcher
from toolkiln.services.background import Loop
from toolkiln.services.container import Services


def serve_stdio(
    services: Services,
    agent_id: str,
    mode: str = "direct",
    loops: dict[str, Loop] | None = None,
    names: str = "id",
) -> None:
    """``loops``: the runtime's other background loops (``Runtime.loops``), run alongside."""
    admin = Principal("local-cli", "", frozenset({"admin"}))
    agent = services.agents.get(admin, agent_id)
    principal = Principal("local-cli", agent.workspace_id, frozenset({"read", "invoke"}))

    async def resolve(ctx: ServerRequestContext[Any, Any]) -> Endpoint:
        return Endpoint(principal, agent.id, mode, names=names)

    listeners = Listeners()
    server = make_server(services, resolve, listeners)

    async def main() -> None:
        async with stdio_server() as (read, write), anyio.create_task_group() as tasks:
            watcher = tool_list_watcher(services, listeners)
            tasks.start_soon(services.background.run, "mcp.tool_lists", watcher)
            for name, loop in (loops or {}).items():
                tasks.start_soon(services.background.run, name, loop)
            await server.run(read, write, server.create_initialization_options())
            tasks.cancel_scope.cancel()

    anyio.run(main)
