"""What the MCP tests' services hold: a workspace's agent offering a tool that greets and one
that raises."""

from __future__ import annotations

from dataclasses import dataclass

from toolkiln.app import Runtime
from toolkiln.domain.auth import Principal
from toolkiln.domain.tools import ToolDraft


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
    tools = rt.services.tools
    ok = tools.create(
        who,
        who.workspace_id,
        ToolDraft.of(
            name="greet",
            language="python",
            code="def main(**p):\n    return {'message': 'hello ' + p['who'], 'rawData': {'n': 1}}",
            parameters={"who": {"type": "string", "required": True}},
            execution_message_description="Greeting someone",
        ),
    )
    bad = tools.create(
        who,
        who.workspace_id,
        ToolDraft.of(
            name="boom",
            language="python",
            code="def main(**p):\n    raise ValueError('kaboom')\n    return {}",
        ),
    )
    agent = rt.services.agents.create(who, who.workspace_id, agent_name)
    rt.services.agents.enable_tool(who, agent.id, ok.id, None)
    rt.services.agents.enable_tool(who, agent.id, bad.id, None)
    return Offered(who, agent.id, ok.id, bad.id)
