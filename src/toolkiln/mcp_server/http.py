"""``/mcp/agents/{agent_id}[?mode=code&language=...&names=name]``: streamable HTTP, bearer
auth, run in the service's lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from toolkiln.api.errors import envelope, retry_after, status_of
from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import ToolkilnError, Unauthenticated
from toolkiln.mcp_server.server import Endpoint, Listeners, make_server, tool_list_watcher
from toolkiln.services.container import Services

PREFIX = "/agents/"
PRINCIPAL = "toolkiln_principal"  # where __call__ leaves the request's principal (its scope)


def _bearer(headers: Any) -> str | None:
    scheme, _, value = (headers.get("authorization") or "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _agent_of(path: str) -> str:
    return path.removeprefix(PREFIX).strip("/").split("/")[0]


@dataclass(frozen=True)
class _Template:
    """What a route leaves in the ASGI scope for /metrics: its path template."""

    path: str


ROUTE = _Template("/mcp/agents/{agent_id}")


class McpHttp:
    """ASGI app mounted at /mcp: checks the token and the agent, then hands the request to
    the SDK's session manager."""

    def __init__(self, services: Services) -> None:
        self._services = services

        async def resolve(ctx: ServerRequestContext[Any, Any]) -> Endpoint:
            request = ctx.request
            if not isinstance(request, Request):
                raise Unauthenticated("MCP over HTTP needs the HTTP request.")
            # Checked once per HTTP request, by __call__ below.
            principal = getattr(request.state, PRINCIPAL, None)
            if not isinstance(principal, Principal):
                raise Unauthenticated("The request was not authenticated.")
            agent_id = _agent_of(request.url.path.split("/mcp", 1)[-1])
            q = request.query_params
            return Endpoint(
                principal,
                agent_id,
                q.get("mode", "direct"),
                q.get("language", "python"),
                q.get("names", "id"),
            )

        self.listeners = Listeners()
        self.manager = StreamableHTTPSessionManager(make_server(services, resolve, self.listeners))

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        async with self.manager.run(), anyio.create_task_group() as tasks:
            watcher = tool_list_watcher(self._services, self.listeners)
            tasks.start_soon(self._services.background.run, "mcp.tool_lists", watcher)
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        sub = path.split("/mcp", 1)[-1] if path.startswith("/mcp") else path
        if scope["type"] != "http" or not sub.startswith(PREFIX) or not _agent_of(sub):
            await envelope(404, "not_found", "MCP lives at /mcp/agents/{agent_id}.")(
                scope, receive, send
            )
            return
        scope["route"] = ROUTE  # /metrics counts requests by the route's template
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            # The token and the agent in one read; listing needs read and calling needs
            # invoke: the services check each request.
            principal = await anyio.to_thread.run_sync(
                lambda: self._services.agents.enter(_bearer(headers), _agent_of(sub))
            )
            scope.setdefault("state", {})[PRINCIPAL] = principal
        except ToolkilnError as exc:  # the REST API's answer to the same error
            answer = envelope(status_of(exc), exc.code, exc.message, exc.details, retry_after(exc))
            await answer(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)
