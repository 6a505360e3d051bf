"""``/mcp/agents/{agent_id}[?mode=code&language=...&names=name]``: streamable HTTP, bearer
auth, run in the service's lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from toolkiln.api.errors import envelope
from toolkiln.domain.errors import Unauthenticated
from toolkiln.mcp_server.entrance import ENTRANCE, Entrance, endpoint_of
from toolkiln.mcp_server.fast import SessionManager, Sessions
from toolkiln.mcp_server.server import (
    Endpoint,
    Listeners,
    ToolCalls,
    make_server,
    tool_list_watcher,
)
from toolkiln.services.access import hash_of
from toolkiln.services.container import Services

PREFIX = "/agents/"


def _bearer(headers: Any) -> str | None:
    scheme, _, value = (headers.get("authorization") or "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _holder(bearer: str | None) -> AuthenticatedUser:
    """Who holds a session, for the SDK's owner check: the token's hash (never the token)."""
    held = hash_of(bearer) if bearer else ""
    return AuthenticatedUser(AccessToken(token=held, client_id=held, scopes=[]))


def _agent_of(path: str) -> str:
    return path.removeprefix(PREFIX).strip("/").split("/")[0]


@dataclass(frozen=True)
class _Template:
    """What a route leaves in the ASGI scope for /metrics: its path template."""

    path: str


ROUTE = _Template("/mcp/agents/{agent_id}")


class McpHttp:
    """ASGI app mounted at /mcp: checks the token and the agent, then hands the request to
    the SDK's session manager, whose transports answer a plain ``tools/call`` themselves
    (mcp_server/fast.py)."""

    def __init__(self, services: Services) -> None:
        self._services = services

        async def resolve(ctx: ServerRequestContext[Any, Any]) -> Endpoint:
            request = ctx.request
            if not isinstance(request, Request):
                raise Unauthenticated("MCP over HTTP needs the HTTP request.")
            return endpoint_of(request)

        self.listeners = Listeners()
        self._calls = ToolCalls(services)
        server = make_server(services, resolve, self.listeners, self._calls)
        server.middleware = [Sessions(), *server.middleware]
        self.manager = SessionManager(services, self._calls, app=server)

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        async with self.manager.run(), anyio.create_task_group() as tasks:
            watcher = tool_list_watcher(self._services, self.listeners)
            tasks.start_soon(self._services.background.run, "mcp.tool_lists", watcher)
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()
                self._calls.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        sub = path.split("/mcp", 1)[-1] if path.startswith("/mcp") else path
        if scope["type"] != "http" or not sub.startswith(PREFIX) or not _agent_of(sub):
            await envelope(404, "not_found", "MCP lives at /mcp/agents/{agent_id}.")(
                scope, receive, send
            )
            return
        scope["route"] = ROUTE  # /metrics counts requests by the route's template
        # A header sent twice counts by its first value, as Starlette's and the SDK's reads do
        # (tests/mcp/test_fast_review.py).
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.decode("latin-1"), v.decode("latin-1"))
        q = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        entrance = Entrance(
            _bearer(headers),
            _agent_of(sub),
            q.get("mode", "direct"),
            q.get("language", "python"),
            q.get("names", "id"),
        )
        scope.setdefault("state", {})[ENTRANCE] = entrance
        # The SDK's manager serves a session only to the credential that opened it (any other
        # gets 404, as for a session that does not exist): the credential is its token's hash.
        scope["user"] = _holder(entrance.bearer)
        # The token and the agent in one read, before anything else of the request (listing
        # needs read and calling needs invoke: the services check each request); a request
        # its session's transport may answer itself has it checked there (mcp_server/fast.py).
        if not self.manager.may_answer(scope, headers):
            refused = await entrance.entered(self._services)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.manager.handle_request(scope, receive, send)
