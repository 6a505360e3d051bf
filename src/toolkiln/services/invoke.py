"""Invoking tools: input validation, the sandbox run, counting, auto-disable and audit."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from toolkiln.domain.auth import Principal
from toolkiln.domain.code_check import check_code, entrypoint_of
from toolkiln.domain.errors import Conflict, InvalidRequest, NotFound
from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.domain.ids import new_id, utcnow
from toolkiln.domain.problems import nul_problems
from toolkiln.domain.records import AuditFilter, AuditRow, CallRecord
from toolkiln.domain.results import Result, error, last_error_text, refused, shape
from toolkiln.domain.schema import compile_validator, input_problems
from toolkiln.domain.tools import AUTO_DISABLE_REASON, Tool, ToolDraft
from toolkiln.services.ports import CodeRunner, UnitOfWork, UnitOfWorkFactory
from toolkiln.services.tools import ToolService

MAX_CTX_CALLS = 50
MAX_CALL_ID_CHARS = 128


@dataclass(slots=True)
class CallContext:
    """Who is calling, as the tool's ``ctx`` shows it."""

    tool_call_id: str | None = None
    agent_id: str | None = None
    agent_name: str | None = None
    conversation_id: str | None = None
    power_user_id: str | None = None

    def for_code(self, call_id: str) -> dict[str, Any]:
        return {
            "agentId": self.agent_id,
            "agentName": self.agent_name,
            "powerUserId": self.power_user_id,
            "toolCallId": call_id,
            "conversationId": self.conversation_id,
        }


@dataclass
class _CallState:
    """What one invocation's ctx did; ctx rows are written with the call, in order."""

    workspace_id: str
    call_id: str
    tool_id: str | None
    agent_id: str | None
    rows: list[AuditRow] = field(default_factory=list)
    calls: int = 0

    def on_call(self, name: str, payload: Any) -> Any:
        self.calls += 1
        if self.calls > MAX_CTX_CALLS:
            return {"error": "call_limit", "details": {"max_calls": MAX_CTX_CALLS}}
        # Built-in tools arrive with the ctx issue; until then every name is unknown.
        return {"error": "unknown_tool", "details": {"name": name[:100]}}

    def on_audit(self, event: str, data: Any) -> None:
        if len(self.rows) >= 200 or not isinstance(event, str) or not 0 < len(event) <= 64:
            return
        if nul_problems("data", data) or nul_problems("event", event):
            return
        self.rows.append(
            AuditRow(
                self.workspace_id,
                f"custom.{event}",
                source="code",
                tool_id=self.tool_id,
                tool_call_id=self.call_id,
                agent_id=self.agent_id,
                data={"data": data},
            )
        )


class InvokeService:
    def __init__(
        self, uow: UnitOfWorkFactory, runners: dict[str, CodeRunner], tools: ToolService
    ) -> None:
        self._uow = uow
        self._runners = runners
        self._tools = tools
        self._compiled_cache: OrderedDict[tuple[str, int], tuple[Draft202012Validator, str]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    # -- public use cases

    def invoke(self, principal: Principal, tool_id: str, payload: Any, who: CallContext) -> Result:
        principal.require("invoke")
        call_id = self._call_id(who.tool_call_id)
        with self._uow(readonly=True) as tx:
            tool = tx.tools.get(tool_id)
            if tool is None or not principal.can_see(tool.workspace_id):
                raise NotFound("No custom tool with that id.")
            if tx.calls.exists(call_id):
                raise _duplicate()
        if tool.status != "active":
            err = error("tool_disabled", "The tool is disabled.", {"reason": tool.disabled_reason})
            return self._finish(tool, refused(call_id, tool.id, tool.version, err), who, [])
        validator, entry = self._compiled(tool)
        problems = input_problems(validator, payload)
        if problems:
            err = error("invalid_input", "The input does not match the tool's schema.", problems)
            return self._finish(tool, refused(call_id, tool.id, tool.version, err), who, [])
        state = _CallState(tool.workspace_id, call_id, tool.id, who.agent_id)
        run = self._run(
            tool.language, tool.code, entry, payload, tool.timeout_ms, who, call_id, state
        )
        result = shape(call_id, tool.id, tool.version, entry, run)
        return self._finish(tool, result, who, state.rows)

    def test(
        self, principal: Principal, workspace_id: str, draft: ToolDraft, payload: Any
    ) -> Result:
        """Run an unsaved tool once; nothing is saved or counted."""
        principal.require("write")
        schema = self._tools.validate(principal, workspace_id, draft)
        call_id = new_id()
        problems = input_problems(compile_validator(schema), payload)
        if problems:
            err = error("invalid_input", "The input does not match the tool's schema.", problems)
            return refused(call_id, None, None, err)
        state = _CallState(workspace_id, call_id, None, None)
        entry = entrypoint_of(draft.language, draft.code)
        run = self._run(
            draft.language,
            draft.code,
            entry,
            payload,
            draft.timeout_ms,
            CallContext(),
            call_id,
            state,
        )
        return shape(call_id, None, None, entry, run)

    def run_code(
        self,
        principal: Principal,
        language: str,
        code: str,
        payload: Any,
        who: CallContext,
        source: str = "api",
    ) -> Result:
        """The run_code built-in: one run, nothing stored but the audit row."""
        principal.require("invoke")
        call_id = self._call_id(who.tool_call_id)
        problems = check_code(language, code)
        if problems:
            first = problems[0]
            details = {
                "type": "SyntaxError",
                "message": first["message"],
                "line": first.get("line"),
            }
            result = refused(call_id, None, None, error("runtime_error", first["message"], details))
        else:
            state = _CallState(principal.workspace_id, call_id, None, who.agent_id)
            timeout = 5000
            entry = entrypoint_of(language, code)
            run = self._run(language, code, entry, payload, timeout, who, call_id, state)
            result = shape(call_id, None, None, entry, run)
        with self._uow() as tx:
            tx.audit.add(
                AuditRow(
                    principal.workspace_id,
                    "builtin.called",
                    source=source,
                    tool_call_id=call_id,
                    agent_id=who.agent_id,
                    data=_summary(result, name="run_code", language=language),
                )
            )
        return result

    def get_call(self, principal: Principal, call_id: str) -> tuple[CallRecord, list[AuditRow]]:
        principal.require("read")
        with self._uow(readonly=True) as tx:
            record = tx.calls.get(call_id)
            if record is None or not principal.can_see(record.workspace_id):
                raise NotFound("No tool call with that id.")
            rows = tx.audit.page(AuditFilter(tool_call_id=call_id), 0, 500)
        return record, rows

    # -- internals

    @staticmethod
    def _call_id(given: str | None) -> str:
        if given is None:
            return new_id()
        if not 0 < len(given) <= MAX_CALL_ID_CHARS or not given.isprintable():
            raise InvalidRequest(
                "tool_call_id must be 1 to 128 printable characters.",
                [{"field": "tool_call_id", "message": "1 to 128 printable characters"}],
            )
        return given

    def _compiled(self, tool: Tool) -> tuple[Draft202012Validator, str]:
        """The input validator and entrypoint of a tool version, made once and cached."""
        key = (tool.id, tool.version)
        with self._lock:
            found = self._compiled_cache.get(key)
            if found is not None:
                self._compiled_cache.move_to_end(key)
                return found
        made = (compile_validator(tool.input_schema), entrypoint_of(tool.language, tool.code))
        with self._lock:
            self._compiled_cache[key] = made
            while len(self._compiled_cache) > 1024:
                self._compiled_cache.popitem(last=False)
        return made

    def _run(
        self,
        language: str,
        code: str,
        entry: str,
        payload: Any,
        timeout_ms: int,
        who: CallContext,
        call_id: str,
        state: _CallState,
    ) -> RunOutcome:
        runner = self._runners.get(language)
        if runner is None:
            return RunOutcome("infra", message=f"The {language} runtime is not available.")
        request = RunRequest(
            language,
            code,
            entry,
            payload if isinstance(payload, dict) else {},
            timeout_ms,
            who.for_code(call_id),
        )
        started = time.perf_counter()
        try:
            return runner.run(request, state.on_call, state.on_audit)
        except Exception as exc:
            return RunOutcome(
                "infra",
                message=f"The sandbox failed: {type(exc).__name__}",
                duration_ms=(time.perf_counter() - started) * 1000,
            )

    def _finish(
        self, tool: Tool, result: Result, who: CallContext, ctx_rows: list[AuditRow]
    ) -> Result:
        """Counters, the stored call and its audit rows, in one transaction."""
        with self._uow() as tx:
            counted = None
            if result.reached_execution:
                counted = tx.tools.count_outcome(
                    tool.id, result.counts_as_failure, last_error_text(result)
                )
            tx.calls.add(
                CallRecord(
                    result.tool_call_id,
                    tool.workspace_id,
                    tool.id,
                    tool.version,
                    "invoke",
                    result.status,
                    result.error["code"] if result.error else None,
                    result.as_dict(),
                    who.agent_id,
                    utcnow(),
                )
            )
            for row in ctx_rows:
                tx.audit.add(row)
            self._audit(tx, tool, result, who, "tool.invoked", _summary(result))
            if counted is not None and counted.just_disabled:
                data = {"reason": AUTO_DISABLE_REASON, "failure_count": counted.failure_count}
                self._audit(tx, tool, result, who, "tool.disabled", data)
        return result

    @staticmethod
    def _audit(
        tx: UnitOfWork, tool: Tool, result: Result, who: CallContext, event: str, data: Any
    ) -> None:
        tx.audit.add(
            AuditRow(
                tool.workspace_id,
                event,
                source="llm" if who.agent_id else "api",
                tool_id=tool.id,
                tool_call_id=result.tool_call_id,
                agent_id=who.agent_id,
                data=data,
            )
        )


def _summary(result: Result, **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        "status": result.status,
        "error": result.error["code"] if result.error else None,
        "duration_ms": result.duration_ms,
        "ctx_calls": result.ctx_calls,
        "version": result.version,
    }


def _duplicate() -> Conflict:
    return Conflict(
        "That tool_call_id was used before.",
        [{"field": "tool_call_id", "message": "already used"}],
        code="duplicate_tool_call_id",
    )
