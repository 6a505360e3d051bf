"""The invoking use cases of the API: invoke a stored tool, test an unsaved one, run code,
call a built-in, read a stored call. Each builds the call's ``Origin`` and hands it to the
router; what happens then is the router's alone."""

from __future__ import annotations

import time
from typing import Any

from toolkiln.domain.auth import Bearer, Principal
from toolkiln.domain.builtin import RUN_CODE_SPEC
from toolkiln.domain.errors import Forbidden, InvalidRequest, NotFound, Unauthenticated
from toolkiln.domain.execution import Code
from toolkiln.domain.ids import new_id
from toolkiln.domain.limits import MAX_TIMEOUT_MS
from toolkiln.domain.origin import Budget, Caller, Origin
from toolkiln.domain.records import AuditFilter, AuditRow, CallRecord, Policy
from toolkiln.domain.results import Result
from toolkiln.domain.tools import ToolDraft, definition_of
from toolkiln.services.access import hash_of, principal_from
from toolkiln.services.audit import AuditService
from toolkiln.services.calls import (
    ByName,
    CallContext,
    DraftCode,
    StoredTool,
    check_ids,
    raced_call_id,
)
from toolkiln.services.places import Places
from toolkiln.services.ports import UnitOfWorkFactory
from toolkiln.services.router import RUN_CODE_TIMEOUT_MS, Router
from toolkiln.services.runs import Runs, unrunnable
from toolkiln.services.tools import ToolService
from toolkiln.services.turns import UNVERIFIED, WorkspaceHints


class DraftRunner:
    """Runs a validated, unsaved definition once: nothing stored or counted, the audit rows
    of its ctx calls written (test runs, test cases, the generator's examples)."""

    def __init__(self, router: Router, runs: Runs) -> None:
        self._router = router
        self._runs = runs

    def run(
        self,
        principal: Principal,
        workspace_id: str,
        draft: ToolDraft,
        payload: Any,
        budget: Budget | None = None,
        tool_id: str | None = None,
    ) -> Result:
        """``budget``: shared with other runs of the same work (a generation's examples,
        whose budget is dry); None: one of its own, lasting the draft's time.
        ``tool_id``: the stored tool the draft is a version of (its test cases), whose id
        the run's rows carry."""
        # Validated before (its analysis is the workspace's, kept: services/analysis.py).
        d = definition_of(draft)
        analysis = self._router.analyser.analyse(d.language, d.code, workspace_id)
        budget = budget if budget is not None else Budget.lasting(d.timeout_ms)
        caller = Caller(principal, workspace_id)
        origin = Origin.root(caller, new_id(), budget, egress=tuple(d.egress))
        if tool_id is not None:
            origin = origin.entering(tool_id, tuple(d.egress))
        if analysis.problems:
            return unrunnable(origin.call_id, analysis)
        self._runs.prepare(d.language, analysis.imports)
        code = Code.analysed(d.language, d.code, analysis, d.timeout_ms)
        request = DraftCode(code, d.input_schema, payload, draft.name)
        return self._router.call(origin, request).result


class InvokeService:
    def __init__(
        self,
        uow: UnitOfWorkFactory,
        router: Router,
        tools: ToolService,
        drafts: DraftRunner,
        audit: AuditService,
        places: Places | None = None,
    ) -> None:
        self._audit = audit
        self._uow = uow
        self._router = router
        self._tools = tools
        self._drafts = drafts
        self._places = places or Places()
        # Whose turn a call waits for before its thread reads its token (services/turns.py).
        self.hints = WorkspaceHints()

    def turn_key(self, bearer: str | None) -> str:
        """The workspace a call with this token waits for a thread as (services/turns.py)."""
        return self.hints.key(hash_of(bearer)) if bearer else UNVERIFIED

    # -- public use cases

    def invoke(
        self, credential: Principal | Bearer, tool_id: str, payload: Any, who: CallContext
    ) -> Result:
        """Invoke a stored tool. Given the request's ``Bearer``, the token is checked in the
        call's one read (the token, the tool, the call id, the agent, the workspace policy);
        the token, the tool and the policy come in one statement (``ToolRepo.get_as``)."""
        # No token is a 401 before any connection is taken (and so never a 503).
        hashed = "" if isinstance(credential, Principal) else hash_of(credential.value)
        # With nothing else to read (no call id to check, no agent), the read is one
        # statement: on PostgreSQL no BEGIN and COMMIT around it
        # (docs/decisions/108-one-read-per-call.md; tests/services/test_invoke_reads.py).
        alone = bool(hashed) and who.tool_call_id is None and who.agent_id is None
        with self._uow(readonly=True, one_statement=alone) as tx:
            policy: Policy | None = None
            read_at = time.monotonic()  # the status read below is this old when the run starts
            if isinstance(credential, Principal):
                principal = credential
                tool = tx.tools.get(tool_id)
            else:
                found = tx.tools.get_as(hashed, tool_id)
                token, tool, policy = found or (None, None, None)
                try:
                    principal = principal_from(token)
                except Unauthenticated:
                    self.hints.forget(hashed)  # a revoked token takes no workspace's turns
                    raise
            principal.require("invoke")
            check_ids(who)
            if tool is None or not principal.can_see(tool.workspace_id):
                raise NotFound("No custom tool with that id.")
            if hashed:
                self.hints.note(hashed, tool.workspace_id)
            call_id = who.call_id_in(tx, tool.workspace_id)
            agent = tx.agents.get(who.agent_id) if who.agent_id else None
            # The workspace policy a ctx call checks, read here rather than in a read
            # transaction of its own at the run's first ctx call
            # (docs/decisions/108-one-read-per-call.md).
            if policy is None:
                policy = tx.workspaces.policy(tool.workspace_id)
        name = agent.name if agent and agent.workspace_id == tool.workspace_id else None
        caller = who.caller(principal, tool.workspace_id, agent_name=name)
        budget = Budget.lasting(tool.definition.timeout_ms)
        budget.policy = policy
        origin = Origin.root(caller, call_id, budget)
        with raced_call_id(who):
            return self._router.call(origin, StoredTool(tool, payload, read_at)).result

    def test(
        self, principal: Principal, workspace_id: str, draft: ToolDraft, payload: Any
    ) -> Result:
        """Run an unsaved tool once; nothing is saved or counted, its ctx calls audited. It
        holds one of the workspace's places for long work while it runs."""
        principal.require("write")
        self._tools.validate(principal, workspace_id, draft)
        with self._places.take(workspace_id, "test_run"):
            return self._drafts.run(principal, workspace_id, draft, payload)

    def run_code(
        self, principal: Principal, language: str, code: str, payload: Any, who: CallContext
    ) -> dict[str, Any]:
        """POST /v1/run-code: the run_code built-in as a root call."""
        principal.require("invoke")
        check_ids(who)
        caller = who.caller(principal, principal.workspace_id)
        call_id = self.fresh_call_id(principal.workspace_id, who)
        origin = Origin.root(caller, call_id, Budget.lasting(RUN_CODE_TIMEOUT_MS))
        body = {"language": language, "code": code, "input": payload}
        with raced_call_id(who):
            result = self._router.call(origin, ByName(RUN_CODE_SPEC.name, body)).result
        if result.error is not None and result.error["code"] == "not_allowed":
            raise Forbidden("This workspace's policy does not allow run_code.", result.error)
        if result.error is not None and result.error["code"] == "invalid_input":
            raise InvalidRequest("run_code refused the input.", result.error["details"])
        return result.as_dict()

    def call_builtin(self, principal: Principal, name: str, payload: Any, who: CallContext) -> Any:
        """POST /v1/builtin-tools/{name}/call: a built-in as a model would call it; the
        answer is what ``ctx.tools`` would resolve to (the value or the error envelope)."""
        principal.require("invoke")
        check_ids(who)
        caller = who.caller(principal, principal.workspace_id)
        call_id = self.fresh_call_id(principal.workspace_id, who)
        origin = Origin.root(caller, call_id, Budget.lasting(MAX_TIMEOUT_MS))
        if not self._router.is_builtin(name):
            shown = name[:64]
            return {"error": "unknown_tool", "details": {"name": shown}}
        with raced_call_id(who):
            return self._router.call(origin, ByName(name, payload)).value()

    def get_call(
        self, principal: Principal, call_id: str, workspace_id: str | None = None
    ) -> tuple[CallRecord, list[AuditRow]]:
        """A stored call of the caller's workspace (an admin may name the workspace; else
        the newest call with that id in any workspace)."""
        principal.require("read")
        where = workspace_id if principal.is_admin else principal.workspace_id
        with self._uow(readonly=True) as tx:
            record = tx.calls.get(where, call_id)
            if record is None or not principal.can_see(record.workspace_id):
                raise NotFound("No tool call with that id.")
            filt = AuditFilter(workspace_id=record.workspace_id, tool_call_id=call_id)
            rows = tx.audit.page(filt, 0, 500)
        return record, self._audit.shown(rows)

    # -- shared by the transports

    def fresh_call_id(self, workspace_id: str, who: CallContext) -> str:
        """The call's id: the client's if it was not used before in the workspace (else
        409 ``duplicate_tool_call_id``), or a new one."""
        if who.tool_call_id is None:
            return new_id()
        with self._uow(readonly=True) as tx:
            return who.call_id_in(tx, workspace_id)
