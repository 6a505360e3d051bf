"""An MCP server whose tools are an agent's tools, on the SDK's low-level ``Server``.

Tools live in the database, so the low-level server (``on_list_tools``/``on_call_tool``) fits
better than the decorator layer: both handlers ask the services, which apply the same
scopes, enablement and audit as the REST API.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server

import toolkiln
from toolkiln.domain.auth import Principal
from toolkiln.services.container import Services
from toolkiln.services.invoke import CallContext

Resolve = Callable[[ServerRequestContext[Any, Any]], Awaitable[tuple[Principal, str]]]


def make_server(services: Services, resolve: Resolve) -> Server[Any]:
    """``resolve`` tells, for each request, who calls and for which agent."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        principal, agent_id = await resolve(ctx)
        entries = await anyio.to_thread.run_sync(
            lambda: services.agents.tool_list(principal, agent_id, "mcp")
        )
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=e["name"], description=e["description"], input_schema=e["inputSchema"]
                )
                for e in entries
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        principal, agent_id = await resolve(ctx)
        status = await anyio.to_thread.run_sync(
            lambda: services.agents.status_line(principal, agent_id, params.name)
        )
        if status:
            await ctx.session.report_progress(0, 1, status)
        result = await anyio.to_thread.run_sync(
            lambda: services.agents.dispatch(
                principal, agent_id, params.name, params.arguments or {}, CallContext()
            )
        )
        if status:
            await ctx.session.report_progress(1, 1, status)
        if result.error is not None:
            text = f"{result.error['code']}: {result.error['message']}"
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)],
                structured_content={"error": result.error},
                is_error=True,
            )
        raw = result.raw_data
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=str(result.llm or result.message or ""))],
            structured_content=raw if isinstance(raw, dict) else {"result": raw},
            is_error=False,
        )

    return Server(
        "toolkiln",
        version=toolkiln.__version__,
        instructions="Custom and built-in tools of one Toolkiln agent.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
