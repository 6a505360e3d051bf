"""What the MCP tests' services hold (a workspace's agent offering a tool that greets and one
that raises), and a session of the official MCP client on a served agent."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from toolkiln.app import Runtime
from toolkiln.domain.auth import Principal
from toolkiln.domain.tools import Tool, ToolDraft

GREET = "def main(**p):\n    return {'message': 'hello ' + p['who'], 'rawData': {'n': 1}}"
WHO = {"who": {"type": "string", "required": True}}


@contextlib.asynccontextmanager
async def sdk_session(url: str, token: str, **options: Any) -> AsyncIterator[ClientSession]:
    """The official client's session over streamable HTTP on ``url``, initialized, with
    ``token`` as its bearer (``options``: the session's, e.g. ``message_handler``)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, *_):
            async with ClientSession(read, write, **options) as session:
                await session.initialize()
                yield session


def python_tool(rt: Runtime, who: Principal, ws: str, name: str, code: str, **draft: Any) -> Tool:
    """A Python tool ``name`` made in ``ws`` (``draft``: more of its fields)."""
    return rt.services.tools.create(
        who, ws, ToolDraft.of(name=name, language="python", code=code, **draft)
    )


@dataclass(frozen=True)
class Offered:
    who: Principal
    agent_id: str
    ok_id: str
    bad_id: str


def greet_and_boom(rt: Runtime, token: str, agent_name: str) -> Offered:
    """Bootstraps ``token`` as admin; an agent ``agent_name`` offering ``greet`` (its
    ``who`` greeted, with raw data) and ``boom`` (raises)."""
    access = rt.services.access
    access.bootstrap(token)
    who = access.authenticate(token)
    ws = who.workspace_id
    ok = python_tool(
        rt,
        who,
        ws,
        "greet",
        GREET,
        parameters=WHO,
        execution_message_description="Greeting someone",
    )
    bad = python_tool(
        rt, who, ws, "boom", "def main(**p):\n    raise ValueError('kaboom')\n    return {}"
    )
    agent = rt.services.agents.create(who, who.workspace_id, agent_name)
    rt.services.agents.enable_tool(who, agent.id, ok.id, None)
    rt.services.agents.enable_tool(who, agent.id, bad.id, None)
    return Offered(who, agent.id, ok.id, bad.id)
