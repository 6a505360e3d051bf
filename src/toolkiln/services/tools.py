"""The custom-tool registry: create, change, version, enable, disable, delete."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolkiln.domain.analysis import Analysis
from toolkiln.domain.auth import Principal
from toolkiln.domain.errors import Conflict, InvalidRequest, InvalidTool, NotFound, TestsFailed
from toolkiln.domain.ids import new_id, utcnow
from toolkiln.domain.opaque import Positions
from toolkiln.domain.problems import text_problems
from toolkiln.domain.records import AuditRow, Page
from toolkiln.domain.schema.budget import Searcher, on_behalf_of
from toolkiln.domain.stats import WINDOWS, span_of, summary
from toolkiln.domain.testcases import CaseSpec, check_test_cases
from toolkiln.domain.tools import (
    VERSIONED_FIELDS,
    Definition,
    Tool,
    ToolDraft,
    ToolVersion,
    validate_draft,
)
from toolkiln.services.paging import after, clamp_limit, listing_scope, page_of
from toolkiln.services.ports import CodeAnalyser, UnitOfWork, UnitOfWorkFactory
from toolkiln.services.testcases import CaseRunner, CasesRun

Prepare = Callable[[str, Sequence[str]], None]  # (language, the modules the code imports)
# The fields of a tool a PATCH may change besides its definition's.
SETTINGS = ("name", "execution_message_description", "enable_globally")
PATCHABLE = (*SETTINGS, *VERSIONED_FIELDS, "parameters")


def _columns(settings: Tool | ToolDraft, definition: Definition) -> dict[str, Any]:
    """A tool's stored fields that a change may move, by column name."""
    return {**{k: getattr(settings, k) for k in SETTINGS}, **definition.as_dict()}


@dataclass(slots=True)
class _Change:
    """What a PATCH would write, worked out from the tool as it is now."""

    draft: ToolDraft
    definition: Definition
    fields: dict[str, Any]

    @property
    def new_version(self) -> bool:
        return any(k in VERSIONED_FIELDS for k in self.fields)

    @property
    def cases(self) -> list[CaseSpec]:
        return check_test_cases(self.definition.test_cases)[0]

    @property
    def tested(self) -> Definition:
        """What the test cases ran against: if any of it moves meanwhile, they ran in vain."""
        return self.definition


class ToolService:
    """Use cases of the registry. Every write leaves an audit row in the same transaction."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        analyser: CodeAnalyser,
        cases: CaseRunner | None = None,
        prepare: Prepare | None = None,
        *,
        positions: Positions,
        searcher: Searcher | None,
    ) -> None:
        """``searcher``: where a tool's input schema's own patterns are compiled on save
        (domain/schema/budget.py)."""
        self._uow = uow
        self._searcher = searcher
        # Code is analysed outside any transaction: an analysis may take its whole time
        # limit, and no database connection waits for it.
        self._analyser = analyser
        self._positions = positions  # the list's cursors (services/paging.py)
        self.cases = cases or CaseRunner()
        # Told of every version's imports when it is saved, so the listed packages among
        # them are installed before its first call (the sandbox does it in the background).
        self._prepare = prepare or (lambda language, imports: None)

    def validate(self, principal: Principal, workspace_id: str, draft: ToolDraft) -> Definition:
        """The definition the draft stands for, or InvalidTool with every problem found."""
        return self._checked(principal, workspace_id, draft)[0]

    def _checked(
        self, principal: Principal, workspace_id: str, draft: ToolDraft
    ) -> tuple[Definition, Analysis]:
        principal.require_workspace(workspace_id)
        with self._uow(readonly=True) as tx:
            if tx.workspaces.get(workspace_id) is None:
                raise InvalidTool([{"field": "workspace_id", "message": "no such workspace"}])
            ceiling = tx.workspaces.policy(workspace_id).max_timeout_ms
        d = draft.definition
        analysis = self._analyser.analyse(d.language, d.code, workspace_id)
        searcher = on_behalf_of(self._searcher, workspace_id)
        definition, problems = validate_draft(draft, ceiling, analysis, searcher)
        if problems:
            raise InvalidTool(problems)
        return definition, analysis

    def preflight(self, principal: Principal, workspace_id: str, draft: ToolDraft) -> Definition:
        """Everything a create checks before running test cases: the rules and the name."""
        return self._preflight(principal, workspace_id, draft)[0]

    def _preflight(
        self, principal: Principal, workspace_id: str, draft: ToolDraft
    ) -> tuple[Definition, Analysis]:
        principal.require("write")
        checked = self._checked(principal, workspace_id, draft)
        with self._uow(readonly=True) as tx:
            if tx.tools.name_taken(workspace_id, draft.name):
                raise _name_taken(draft.name)
        return checked

    def create(
        self,
        principal: Principal,
        workspace_id: str,
        draft: ToolDraft,
        allow_failing_tests: bool = False,
    ) -> Tool:
        definition, analysis = self._preflight(principal, workspace_id, draft)
        cases = check_test_cases(definition.test_cases)[0]
        tool_id = new_id()  # before the cases run: their audit rows carry it
        if cases and not allow_failing_tests:
            self._require_passing(principal, workspace_id, draft, cases, tool_id)
        now = utcnow()
        tool = Tool(
            id=tool_id,
            workspace_id=workspace_id,
            name=draft.name,
            definition=definition,
            execution_message_description=draft.execution_message_description,
            enable_globally=draft.enable_globally,
            status="active",
            disabled_reason=None,
            usage_count=0,
            failure_count=0,
            last_error=None,
            version=1,
            created_at=now,
            updated_at=now,
        )
        with self._uow() as tx:
            if tx.tools.name_taken(workspace_id, draft.name):
                raise _name_taken(draft.name)
            tx.tools.add(tool)
            tx.tools.add_version(tool.snapshot())
            self._audit(tx, tool, "tool.created", {"name": tool.name, "version": 1})
        self._prepare(definition.language, analysis.imports)
        return tool

    def get(self, principal: Principal, tool_id: str) -> Tool:
        principal.require("read")
        with self._uow(readonly=True) as tx:
            return self._visible(tx, principal, tool_id)

    def stats(self, principal: Principal, tool_id: str, window: str) -> dict[str, Any]:
        """The tool's calls over the window (``1h``, ``24h``, ``7d``), per bucket: calls,
        failures by code, p50 and p99 (domain/stats.py)."""
        principal.require("read")
        if window not in WINDOWS:
            err = [{"field": "window", "message": f"one of {', '.join(WINDOWS)}"}]
            raise InvalidRequest("window is not a window the stats know.", err)
        now = utcnow()
        first, count, minutes = span_of(window, now)
        with self._uow(readonly=True) as tx:
            tool = self._visible(tx, principal, tool_id)
            rows = tx.stats.window(tool.id, first, count, minutes)
        return {"tool_id": tool.id, **summary(window, now, rows)}

    def page(
        self, principal: Principal, workspace_id: str | None, cursor: str | None, limit: int | None
    ) -> Page[Tool]:
        scope = listing_scope(principal, workspace_id)
        size = clamp_limit(limit)
        start = after(self._positions, "tools-cursor", cursor)
        with self._uow(readonly=True) as tx:
            rows = tx.tools.page(scope, start, size + 1)
        return page_of(rows, size, lambda t: t.seq, self._positions, "tools-cursor")

    def update(
        self,
        principal: Principal,
        tool_id: str,
        change: dict[str, Any],
        allow_failing_tests: bool = False,
        base_version: int | None = None,
    ) -> Tool:
        """Test cases run between two transactions, so no write lock is held while they do.
        ``base_version``: the version the change was made from; at another, 409."""
        principal.require("write")
        with self._uow(readonly=True) as tx:
            current = self._visible(tx, principal, tool_id)
            _require_base(current, base_version)
        draft = self._merged_draft(current, change)
        d = draft.definition
        analysis = self._analyser.analyse(d.language, d.code, current.workspace_id)
        with self._uow(readonly=True) as tx:
            planned = self._plan(tx, current, draft, analysis)
        if not planned.fields:
            return current
        must_test = planned.new_version and bool(planned.cases) and not allow_failing_tests
        if must_test:
            self._require_passing(
                principal, current.workspace_id, planned.draft, planned.cases, current.id
            )
        with self._uow() as tx:
            current = self._visible(tx, principal, tool_id, lock=True)
            _require_base(current, base_version)
            again = self._merged_draft(current, change)
            a = again.definition
            if (a.language, a.code) != (d.language, d.code):
                # Its code changed meanwhile: analysed by that change, so kept for the
                # workspace (services/analysis.py).
                analysis = self._analyser.analyse(a.language, a.code, current.workspace_id)
            final = self._plan(tx, current, again, analysis)
            if not final.fields:
                return current
            needs = final.new_version and bool(final.cases) and not allow_failing_tests
            if needs and (not must_test or final.tested != planned.tested):
                raise Conflict(
                    "The tool changed while its test cases ran; send the change again.",
                    [{"field": "version", "message": f"is now {current.version}"}],
                    code="edit_conflict",
                )
            fields = final.fields
            fields["updated_at"] = utcnow()
            if final.new_version:
                fields["version"] = current.version + 1
            tx.tools.update(current.id, fields)
            updated = self._visible(tx, principal, tool_id)
            if final.new_version:
                tx.tools.add_version(updated.snapshot())
                self._prepare(updated.definition.language, analysis.imports)
            self._audit(
                tx,
                updated,
                "tool.updated",
                {
                    "changed": sorted(k for k in fields if k != "updated_at"),
                    "version": updated.version,
                },
            )
            return updated

    def _plan(self, tx: UnitOfWork, current: Tool, draft: ToolDraft, analysis: Analysis) -> _Change:
        """What the change (``draft``: the tool with it applied; ``analysis``: of its code)
        would write, or InvalidTool."""
        ceiling = tx.workspaces.policy(current.workspace_id).max_timeout_ms
        searcher = on_behalf_of(self._searcher, current.workspace_id)
        definition, problems = validate_draft(draft, ceiling, analysis, searcher)
        if problems:
            raise InvalidTool(problems)
        if draft.name != current.name and tx.tools.name_taken(
            current.workspace_id, draft.name, except_id=current.id
        ):
            raise _name_taken(draft.name)
        proposed = _columns(draft, definition)
        before = _columns(current, current.definition)
        fields = {k: v for k, v in proposed.items() if before[k] != v}
        return _Change(draft, definition, fields)

    def _require_passing(
        self,
        principal: Principal,
        workspace_id: str,
        draft: ToolDraft,
        cases: list[CaseSpec],
        tool_id: str,
    ) -> None:
        reports = self.cases.run(principal, workspace_id, draft, cases, tool_id)
        if not all(r["passed"] for r in reports):
            raise TestsFailed(reports)

    def run_tests(self, principal: Principal, tool_id: str, number: int | None = None) -> CasesRun:
        """A version's test cases (the current one by default), run now, counting nothing."""
        principal.require("write")
        with self._uow(readonly=True) as tx:
            tool = self._visible(tx, principal, tool_id)
            found = tx.tools.version(tool_id, tool.version if number is None else number)
        if found is None:
            raise NotFound("No such version of this tool.")
        draft = ToolDraft(
            name=tool.name,
            definition=found.definition,
            schema_given=True,
            execution_message_description=tool.execution_message_description,
        )
        cases = check_test_cases(found.definition.test_cases)[0]
        reports = self.cases.run(principal, tool.workspace_id, draft, cases, tool.id)
        return CasesRun(found.version, reports)

    @staticmethod
    def _merged_draft(current: Tool, change: dict[str, Any]) -> ToolDraft:
        values: dict[str, Any] = _columns(current, current.definition)
        if "parameters" in change and "input_schema" not in change:
            values["input_schema"] = None  # the new parameters replace the schema
        values.update({k: v for k, v in change.items() if k in PATCHABLE})
        if values.get("description") is None:
            values["description"] = ""
        return ToolDraft.of(**values)

    def delete(self, principal: Principal, tool_id: str) -> None:
        principal.require("write")
        with self._uow() as tx:
            tool = self._visible(tx, principal, tool_id, lock=True)
            tx.tools.delete(tool.id)
            self._audit(tx, tool, "tool.deleted", {"name": tool.name, "version": tool.version})

    def enable(self, principal: Principal, tool_id: str) -> Tool:
        principal.require("write")
        with self._uow() as tx:
            tool = self._visible(tx, principal, tool_id, lock=True)
            tx.tools.update(
                tool.id,
                {
                    "status": "active",
                    "failure_count": 0,
                    "disabled_reason": None,
                    "updated_at": utcnow(),
                },
            )
            self._audit(tx, tool, "tool.enabled", {"previous_status": tool.status})
            return self._visible(tx, principal, tool_id)

    def disable(self, principal: Principal, tool_id: str, reason: str | None = None) -> Tool:
        principal.require("write")
        reason = reason or "disabled by a user"
        if problems := text_problems("reason", reason):
            raise InvalidRequest("The reason is not valid text.", problems)
        with self._uow() as tx:
            tool = self._visible(tx, principal, tool_id, lock=True)
            tx.tools.update(
                tool.id, {"status": "disabled", "disabled_reason": reason, "updated_at": utcnow()}
            )
            self._audit(tx, tool, "tool.disabled", {"reason": reason})
            return self._visible(tx, principal, tool_id)

    def versions(self, principal: Principal, tool_id: str) -> list[ToolVersion]:
        principal.require("read")
        with self._uow() as tx:
            self._visible(tx, principal, tool_id)
            return tx.tools.versions(tool_id)

    def version(self, principal: Principal, tool_id: str, number: int) -> ToolVersion:
        principal.require("read")
        with self._uow() as tx:
            self._visible(tx, principal, tool_id)
            found = tx.tools.version(tool_id, number)
        if found is None:
            raise NotFound("No such version of this tool.")
        return found

    @staticmethod
    def _visible(tx: UnitOfWork, principal: Principal, tool_id: str, lock: bool = False) -> Tool:
        """The tool if the principal may see it; ``lock``: its row held until the write
        transaction ends, so that concurrent edits go one after another (two PATCHes read
        the same version on PostgreSQL, and the second's new version met the first's: 409)."""
        tool = tx.tools.get(tool_id, for_update=lock)
        if tool is None or not principal.can_see(tool.workspace_id):
            raise NotFound("No custom tool with that id.")
        return tool

    @staticmethod
    def _audit(tx: UnitOfWork, tool: Tool, event: str, data: dict[str, Any]) -> None:
        tx.audit.add(AuditRow(tool.workspace_id, event, tool_id=tool.id, data=data))


def _require_base(current: Tool, base_version: int | None) -> None:
    if base_version is not None and current.version != base_version:
        raise Conflict(
            f"The tool was changed elsewhere: it is at version {current.version}, and this "
            f"change was made from version {base_version}. Reload it to edit the new version.",
            [{"field": "base_version", "message": f"the tool is now at {current.version}"}],
            code="edit_conflict",
        )


def _name_taken(name: str) -> Conflict:
    return Conflict(
        f"A tool named {name!r} exists in this workspace.",
        [{"field": "name", "message": "is taken in this workspace"}],
        code="name_taken",
    )
