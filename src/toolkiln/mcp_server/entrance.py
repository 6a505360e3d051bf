"""Who a request to ``/mcp/agents/{agent_id}`` calls as: its bearer token and the agent its
path names, checked in one read (``AgentService.enter``) before anything the request asks is
served. ``McpHttp`` makes the check on anyio's thread hand-off; a ``tools/call`` that a
session's transport answers itself has it made first in the call's own read
(mcp_server/fast.py, ``AgentService.dispatch`` given ``entered``). Refused, the request
gets the REST API's answer to the same error
(tests/mcp/test_mcp.py::test_http_refuses_as_the_rest_api_does)."""

from __future__ import annotations

from dataclasses import dataclass

import anyio
from starlette.requests import Request
from starlette.types import ASGIApp, Scope

from toolkiln.api.errors import envelope, retry_after, status_of
from toolkiln.domain.errors import ToolkilnError, Unauthenticated
from toolkiln.mcp_server.server import Endpoint
from toolkiln.services.container import Services

ENTRANCE = "toolkiln_entrance"  # where McpHttp leaves the request's Entrance (scope state)


@dataclass(slots=True)
class Entrance:
    """What the request says; ``endpoint`` once its token and agent were checked."""

    bearer: str | None
    agent_id: str
    mode: str
    language: str
    names: str
    endpoint: Endpoint | None = None

    def enter(self, services: Services) -> Endpoint:
        """On a thread: the check (a ToolkilnError refuses), made once per request."""
        if self.endpoint is None:
            principal = services.agents.enter(self.bearer, self.agent_id)
            self.endpoint = Endpoint(principal, self.agent_id, self.mode, self.language, self.names)
        return self.endpoint

    async def entered(self, services: Services) -> ASGIApp | None:
        """The check on anyio's thread hand-off: None once passed, else the refusal."""
        try:
            await anyio.to_thread.run_sync(self.enter, services)
        except ToolkilnError as exc:
            return refusal(exc)
        return None


def refusal(exc: ToolkilnError) -> ASGIApp:
    """The REST API's answer to the same error (api/errors.py)."""
    return envelope(status_of(exc), exc.code, exc.message, exc.details, retry_after(exc))


def entrance_of(scope: Scope) -> Entrance:
    entrance = scope.get("state", {}).get(ENTRANCE)
    if not isinstance(entrance, Entrance):
        raise Unauthenticated("The request was not authenticated.")
    return entrance


def endpoint_of(request: Request) -> Endpoint:
    """Who calls, for which agent and how, of a request whose check passed."""
    endpoint = entrance_of(request.scope).endpoint
    if endpoint is None:
        raise Unauthenticated("The request was not authenticated.")
    return endpoint
