"""The workspaces' list versions: what an agent's cached tool list is keyed by.

A workspace's ``list_version`` moves in the transaction of every change to what its agents'
tool lists show (each leaves an audit row of ``LIST_CHANGING_EVENTS``: ``SqlAudit`` notes
its workspace and the unit of work moves the version just before it commits). A list read
takes the version in the statement that reads the agent, so a replica sees another's change
on its next request, with no message between them (tests/api/test_list_cache.py,
docs/decisions/170-tool-lists-cached-by-version.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from toolkiln.domain.ids import utcnow
from toolkiln.domain.records import Agent
from toolkiln.storage.moments import utc
from toolkiln.storage.prepared import Prepared
from toolkiln.storage.tables import agents, workspaces

_w = workspaces.c
# The agent and its workspace's list version, in one statement (one round trip).
_AGENT_LISTED = Prepared(
    sa.select(
        agents.c.id, agents.c.workspace_id, agents.c.name, agents.c.created_at, _w.list_version
    )
    .select_from(agents.join(workspaces, _w.id == agents.c.workspace_id))
    .where(agents.c.id == sa.bindparam("id"))
)
_BUMP = Prepared(
    workspaces.update()
    .where(_w.id == sa.bindparam("b_id"))
    .values(list_version=_w.list_version + 1)
)


class SqlLists:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    def agent(self, agent_id: str) -> tuple[Agent, int] | None:
        """The agent and its workspace's list version (None: no such agent)."""
        r = _AGENT_LISTED.first(self._c, {"id": agent_id})
        if r is None:
            return None
        agent = Agent(r["id"], r["workspace_id"], r["name"], utc(r["created_at"]) or utcnow())
        return agent, int(r["list_version"])

    def bump(self, workspace_ids: Iterable[str]) -> None:
        """Move these workspaces' versions on, in id order: the workspace rows are the
        last locks a transaction takes, always in one order, so two transactions (of two
        replicas on one PostgreSQL) that change lists cannot deadlock over them."""
        for workspace_id in sorted(set(workspace_ids)):
            _BUMP.run(self._c, {"b_id": workspace_id})
