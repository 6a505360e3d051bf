"""Agents: which tools each one sees, in OpenAI/Anthropic/MCP form, and the one dispatch call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkiln.domain.auth import Bearer, Principal
from toolkiln.domain.codemode import (
    PROGRAM_LANGUAGES,
    RUN_PROGRAM,
    program_allowed,
    program_def,
)
from toolkiln.domain.egress import builtin_open_world
from toolkiln.domain.errors import InvalidRequest, NotFound, Unauthenticated
from toolkiln.domain.formats import CUSTOM_PREFIX, FORMATS, NAMES, ToolDef, by_own_name, render
from toolkiln.domain.ids import new_id, utcnow
from toolkiln.domain.limits import MAX_TIMEOUT_MS
from toolkiln.domain.origin import Budget, Offer, Origin
from toolkiln.domain.records import LIST_CHANGING_EVENTS, Agent, AuditRow, Policy, check_label
from toolkiln.domain.results import Result, error, refused
from toolkiln.services.access import hash_of, principal_from
from toolkiln.services.calls import (
    ByName,
    CallContext,
    Found,
    check_ids,
    raced_call_id,
)
from toolkiln.services.paging import listing_scope
from toolkiln.services.ports import UnitOfWork, UnitOfWorkFactory
from toolkiln.services.router import Router
from toolkiln.services.tool_lists import ListCache, Listing
from toolkiln.services.turns import WorkspaceHints

MODES = ("direct", "code")


class AgentService:
    def __init__(
        self, uow: UnitOfWorkFactory, router: Router, hints: WorkspaceHints | None = None
    ) -> None:
        self._uow = uow
        self._router = router
        self.lists = ListCache()
        # The workspace of each token a tool call checked: whose turn its next call waits
        # for (services/turns.py); shared with invoke's.
        self.hints = hints or WorkspaceHints()

    # -- agents

    def create(self, principal: Principal, workspace_id: str, name: str) -> Agent:
        principal.require("write")
        principal.require_workspace(workspace_id)
        problems = check_label("name", name)
        if problems:
            raise InvalidRequest("The agent name is not valid.", problems)
        agent = Agent(new_id(), workspace_id, name, utcnow())
        with self._uow() as tx:
            if tx.workspaces.get(workspace_id) is None:
                raise NotFound("No workspace with that id.")
            tx.agents.add(agent)
            tx.audit.add(
                AuditRow(workspace_id, "agent.created", agent_id=agent.id, data={"name": name})
            )
        return agent

    def all(self, principal: Principal, workspace_id: str | None) -> list[Agent]:
        scope = listing_scope(principal, workspace_id)
        with self._uow(readonly=True) as tx:
            return tx.agents.all(scope)

    def get(self, principal: Principal, agent_id: str) -> Agent:
        principal.require("read")
        with self._uow(readonly=True) as tx:
            return self._visible(tx, principal, agent_id)

    def delete(self, principal: Principal, agent_id: str) -> None:
        principal.require("write")
        with self._uow() as tx:
            agent = self._visible(tx, principal, agent_id)
            tx.agents.delete(agent.id)
            tx.audit.add(AuditRow(agent.workspace_id, "agent.deleted", agent_id=agent.id))

    def enable_tool(
        self, principal: Principal, agent_id: str, tool_id: str, version: int | None
    ) -> dict[str, Any]:
        principal.require("write")
        with self._uow() as tx:
            agent = self._visible(tx, principal, agent_id)
            tool = tx.tools.get(tool_id)
            if tool is None or tool.workspace_id != agent.workspace_id:
                raise NotFound("No custom tool with that id in the agent's workspace.")
            if version is not None and tx.tools.version(tool_id, version) is None:
                raise InvalidRequest(
                    "That version of the tool does not exist.",
                    [{"field": "version", "message": f"versions are 1 to {tool.version}"}],
                )
            tx.agents.enable(agent.id, tool.id, version)
            tx.audit.add(
                AuditRow(
                    agent.workspace_id,
                    "agent.tool_enabled",
                    tool_id=tool.id,
                    agent_id=agent.id,
                    data={"version": version},
                )
            )
        return {"agent_id": agent.id, "tool_id": tool.id, "version": version}

    def disable_tool(self, principal: Principal, agent_id: str, tool_id: str) -> None:
        principal.require("write")
        with self._uow() as tx:
            agent = self._visible(tx, principal, agent_id)
            if not tx.agents.disable(agent.id, tool_id):
                raise NotFound("That tool is not enabled for this agent.")
            tx.audit.add(
                AuditRow(
                    agent.workspace_id, "agent.tool_disabled", tool_id=tool_id, agent_id=agent.id
                )
            )

    def enabled_tools(self, principal: Principal, agent_id: str) -> list[dict[str, Any]]:
        """The custom tools enabled for this agent, each with its pinned version or None."""
        principal.require("read")
        with self._uow(readonly=True) as tx:
            agent = self._visible(tx, principal, agent_id)
            enabled = tx.agents.enabled(agent.id)
        return [
            {"agent_id": agent.id, "tool_id": tool_id, "version": version}
            for tool_id, version in sorted(enabled.items())
        ]

    # -- what an agent sees

    def tool_defs(
        self, principal: Principal, agent_id: str, mode: str = "direct", scope: str = "read"
    ) -> tuple[Agent, list[ToolDef]]:
        """Built-ins the workspace allows (by name), then active custom tools that are global
        or enabled for this agent (as custom_{id}, at their pinned version if any). Listing
        needs ``read``; a tool call works them out with ``invoke`` alone."""
        principal.require(scope)
        with self._uow(readonly=True) as tx:
            agent, _, defs = self._defs_in(tx, principal, agent_id, mode)
        return agent, defs

    def _defs_in(
        self, tx: UnitOfWork, principal: Principal, agent_id: str, mode: str
    ) -> tuple[Agent, Policy, list[ToolDef]]:
        """``tool_defs``, read in ``tx``; with the workspace policy it read."""
        agent = self._visible(tx, principal, agent_id)
        policy = tx.workspaces.policy(agent.workspace_id)
        allowed = set(policy.builtins)
        offered = tx.tools.offered(agent.workspace_id, agent.id)
        tools = [t for t, _ in offered]
        pinned = {t.id: tx.tools.version(t.id, v) for t, v in offered if v is not None}
        defs = [
            ToolDef(
                s.name,
                s.description,
                s.input_schema,
                "builtin",
                open_world=builtin_open_world(s.name, policy.egress),
            )
            for s in self._router.specs()
            if s.name in allowed
        ]
        for tool in tools:
            version = pinned.get(tool.id)
            d = version.definition if version else tool.definition
            if mode not in d.allowed_callers:  # "direct", "code" or both
                continue
            schema = d.input_schema
            description = d.description or tool.name
            defs.append(
                ToolDef(
                    f"{CUSTOM_PREFIX}{tool.id}",
                    description,
                    schema,
                    "custom",
                    tool.id,
                    version.version if version else tool.version,
                    version.version if version else None,
                    tool.name,
                    open_world=bool(d.egress),
                )
            )
        return agent, policy, defs

    def listing(
        self,
        principal: Principal,
        agent_id: str,
        fmt: str,
        strict: bool = False,
        mode: str = "direct",
        language: str = "python",
        names: str = "id",
    ) -> Listing:
        """The agent's tools in a provider's format; in code mode, one ``run_program`` tool
        whose description declares the code-mode tools in ``language``, or
        none when the workspace policy does not allow ``run_code``. ``names="name"``: custom
        tools under their own names where they can be (``by_own_name``).

        One statement reads the agent with its workspace's list version; a list rendered at
        that version is served as it was (services/tool_lists.py), else the list is read and
        rendered, and kept."""
        problems = []
        if names not in NAMES:
            problems.append({"field": "names", "message": f"one of {', '.join(NAMES)}"})
        if fmt not in FORMATS:
            problems.append({"field": "format", "message": f"one of {', '.join(FORMATS)}"})
        if mode not in MODES:
            problems.append({"field": "mode", "message": f"one of {', '.join(MODES)}"})
        if language not in PROGRAM_LANGUAGES:
            problems.append(
                {"field": "language", "message": f"one of {', '.join(PROGRAM_LANGUAGES)}"}
            )
        if problems:
            raise InvalidRequest(f"{problems[0]['field']} is not valid.", problems)
        principal.require("read")
        with self._uow(readonly=True, one_statement=True) as tx:
            found = tx.lists.agent(agent_id)
        if found is None or not principal.can_see(found[0].workspace_id):
            raise NotFound("No agent with that id.")
        agent, version = found
        key = (agent.id, fmt, strict, mode, language, names)
        cached = self.lists.get(agent.workspace_id, version, key)
        if cached is not None:
            return cached
        # Read after the version: what is rendered is of that version or newer, never older.
        _, defs = self.tool_defs(principal, agent_id, mode)
        listing = Listing.of(
            agent.workspace_id, self._render(defs, fmt, strict, mode, language, names)
        )
        self.lists.put(agent.workspace_id, version, key, listing)
        return listing

    def _render(
        self, defs: list[ToolDef], fmt: str, strict: bool, mode: str, language: str, names: str
    ) -> list[dict[str, Any]]:
        if mode == "code":
            # Offered only where the policy allows run_code (the router refuses it too).
            if not program_allowed(frozenset(d.name for d in defs if d.kind == "builtin")):
                return []
            return render([program_def(defs, language)], fmt, strict)
        if names == "name":
            defs = by_own_name(defs, self._router.is_builtin)
        return render(defs, fmt, strict)

    def list_changes(self, window: int, floor: int = 0) -> tuple[int, list[tuple[int, str]]]:
        """A marker that grows whenever some agent's tool list may have changed (on any
        replica), and the (id, workspace) of the rows that say so over ``floor`` among the
        last ``window`` audit ids. An agent offers only its own workspace's tools and policy,
        so a change is told to that workspace's clients alone (mcp_server/server.py)."""
        with self._uow(readonly=True) as tx:
            marker = tx.audit.last_id(list(LIST_CHANGING_EVENTS))
            after = max(marker - window, floor)
            return marker, tx.audit.changes_after(list(LIST_CHANGING_EVENTS), after)

    def enter(self, bearer: str | None, agent_id: str) -> Principal:
        """The principal of ``bearer``, which may read the agent ``agent_id``: one read (the
        MCP endpoint's check of each request; mcp_server/entrance.py). ``hints`` learns the
        token's workspace, as in ``dispatch``."""
        hashed = hash_of(bearer)  # no token: 401 before any read
        with self._uow(readonly=True) as tx:
            return self._entered(tx, hashed, agent_id)

    def _entered(self, tx: UnitOfWork, hashed: str, agent_id: str) -> Principal:
        """``enter``'s checks, in ``tx``."""
        principal = self._token(tx, hashed)
        principal.require("read")
        self._visible(tx, principal, agent_id)
        return principal

    def _token(self, tx: UnitOfWork, hashed: str) -> Principal:
        """Who the token is, read in ``tx``; ``hints`` learns its workspace (the turn of its
        next calls), and forgets a token refused (it takes no workspace's turns)."""
        try:
            principal = principal_from(tx.tokens.by_hash(hashed))
        except Unauthenticated:
            self.hints.forget(hashed)
            raise
        self.hints.note(hashed, principal.workspace_id)
        return principal

    # -- the one dispatch call

    def dispatch(
        self,
        credential: Principal | Bearer,
        agent_id: str,
        name: str,
        arguments: Any,
        who: CallContext,
        mode: str = "direct",
        on_status: Callable[[str], None] | None = None,
        entered: Callable[[], None] | None = None,
    ) -> Result:
        """One tool call of the agent. ``mode="code"`` (an MCP session in code mode) offers
        ``run_program`` alone. One read prepares it (the agent, its offer, the workspace
        policy, the custom tool ``name`` means, the call id: tests/mcp/test_call_reads.py,
        docs/decisions/402-an-mcp-call-reads-twice.md);
        ``on_status`` is then told the tool's status line, if it has one, before it runs.
        Given the request's ``Bearer`` (the REST route's fast path), the token is checked in
        that read too, first (``hints`` learns its workspace, as for invoke). Given
        ``entered`` too (an MCP ``tools/call``: mcp_server/fast.py), that read first makes
        the MCP entrance's checks (``enter``: the token may read the agent), and
        ``entered`` is called once they passed: what is raised before is the entrance's
        refusal."""
        hashed = ""
        if isinstance(credential, Principal):
            self._may_call(credential, who)
        else:
            hashed = hash_of(credential.value)  # no token: 401 before any read
        # run_program's ctx reaches the code-mode tools; any other name, the direct ones.
        code_only = mode == "code" and name != RUN_PROGRAM
        if code_only and entered is None:
            return _code_only(who)
        mode = "code" if name == RUN_PROGRAM else "direct"
        found: Found | None = None
        with self._uow(readonly=True) as tx:
            if isinstance(credential, Principal):
                principal = credential
            elif entered is not None:
                principal = self._entered(tx, hashed, agent_id)
                entered()
                self._may_call(principal, who)
                if code_only:
                    return _code_only(who)
            else:
                principal = self._token(tx, hashed)
                self._may_call(principal, who)
            agent, policy, defs = self._defs_in(tx, principal, agent_id, mode)
            offer = Offer(
                frozenset(d.name for d in defs if d.kind == "builtin"),
                {str(d.tool_id): d.pinned for d in defs if d.kind == "custom"},
            )
            caller = who.for_agent(agent.id).caller(
                principal, agent.workspace_id, agent_name=agent.name
            )
            call_id = who.call_id_in(tx, agent.workspace_id)
            # A custom tool's run is bounded by its own timeout_ms inside this deadline.
            budget = Budget.lasting(MAX_TIMEOUT_MS)
            budget.policy = policy
            origin = Origin.root(caller, call_id, budget, offer)
            if name != RUN_PROGRAM and not self._router.is_builtin(name):
                found = self._router.find(tx, origin, name)
        status = found.tool.execution_message_description if found and found.tool else None
        if status and on_status is not None:
            on_status(status)
        with raced_call_id(who):
            return self._router.call(origin, ByName(name, arguments, found)).result

    @staticmethod
    def _may_call(principal: Principal, who: CallContext) -> None:
        principal.require("invoke")
        check_ids(who)

    @staticmethod
    def _visible(tx: UnitOfWork, principal: Principal, agent_id: str) -> Agent:
        agent = tx.agents.get(agent_id)
        if agent is None or not principal.can_see(agent.workspace_id):
            raise NotFound("No agent with that id.")
        return agent


def _code_only(who: CallContext) -> Result:
    message = f"In code mode the one tool is {RUN_PROGRAM}."
    err = error("unknown_tool", message, {"available": [RUN_PROGRAM]})
    return refused(who.call_id(), None, None, err)
