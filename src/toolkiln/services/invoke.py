"""Invoking tools: input validation, the sandbox run, ctx calls, counting, auto-disable, audit."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator

from toolkiln.domain.auth import Principal
from toolkiln.domain.builtin import BuiltinCall
from toolkiln.domain.code_check import check_code, entrypoint_of
from toolkiln.domain.errors import Conflict, Forbidden, InvalidRequest, NotFound
from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.domain.ids import new_id, utcnow
from toolkiln.domain.limits import MAX_TIMEOUT_MS
from toolkiln.domain.problems import nul_problems
from toolkiln.domain.records import AuditFilter, AuditRow, CallRecord, Policy
from toolkiln.domain.results import Result, error, last_error_text, refused, shape
from toolkiln.domain.schema import compile_validator, input_problems
from toolkiln.domain.tools import AUTO_DISABLE_REASON, Tool, ToolDraft
from toolkiln.services.dispatch import Dispatcher, envelope
from toolkiln.services.ports import CodeRunner, UnitOfWork, UnitOfWorkFactory
from toolkiln.services.tools import ToolService

MAX_CTX_CALLS = 50
MAX_CALL_ID_CHARS = 128
RUN_CODE_TIMEOUT_MS = 5000


@dataclass(slots=True)
class CallContext:
    """Who is calling, as the tool's ``ctx`` shows it."""

    tool_call_id: str | None = None
    agent_id: str | None = None
    agent_name: str | None = None
    conversation_id: str | None = None
    power_user_id: str | None = None
    source: str = "api"

    def for_code(self, call_id: str) -> dict[str, Any]:
        return {
            "agentId": self.agent_id,
            "agentName": self.agent_name,
            "powerUserId": self.power_user_id,
            "toolCallId": call_id,
            "conversationId": self.conversation_id,
        }


@dataclass
class _Budget:
    """Shared by a root call and every call nested under it."""

    deadline: float
    used: int = 0
    policy: Policy | None = None  # read once, at the first ctx call


@dataclass
class _CallState:
    """One sandbox run's ctx: where its calls go and what it wrote with ctx.audit."""

    service: InvokeService
    workspace_id: str
    call_id: str
    tool_id: str | None
    who: CallContext
    budget: _Budget
    chain: tuple[str, ...] = ()
    rows: list[AuditRow] = field(default_factory=list)

    def admit(self) -> bool:
        return True

    def call(self, name: str, payload: Any) -> Any:
        self.budget.used += 1
        if self.budget.used > MAX_CTX_CALLS:
            return envelope("call_limit", "", {"max_calls": MAX_CTX_CALLS})
        if time.monotonic() >= self.budget.deadline:
            return envelope("timeout", "The calling tool's time is up.")
        if not isinstance(name, str) or not 0 < len(name) <= 128:
            return envelope("unknown_tool", "Tool names are 1-128 characters.")
        return self.service._dispatch(name, payload, self)

    def audit(self, event: str, data: Any) -> None:
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
                agent_id=self.who.agent_id,
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
        # Set by the composition root: built-ins include run_code, which runs through us.
        self.dispatcher: Dispatcher | None = None

    # -- public use cases

    def invoke(self, principal: Principal, tool_id: str, payload: Any, who: CallContext) -> Result:
        principal.require("invoke")
        call_id = self._call_id(who.tool_call_id)
        with self._uow(readonly=True) as tx:  # one read: the tool and the call id
            tool = tx.tools.get(tool_id)
            if tool is None or not principal.can_see(tool.workspace_id):
                raise NotFound("No custom tool with that id.")
            if tx.calls.exists(call_id):
                raise _duplicate()
        return self._start(tool, payload, who, call_id)

    def invoke_tool(self, tool: Tool, payload: Any, who: CallContext) -> Result:
        """Invoke a tool the caller has already been allowed to reach (possibly a pinned
        version of it: the counters are the tool's, the code and schema the version's)."""
        call_id = self._call_id(who.tool_call_id)
        with self._uow(readonly=True) as tx:
            if tx.calls.exists(call_id):
                raise _duplicate()
        return self._start(tool, payload, who, call_id)

    def _start(self, tool: Tool, payload: Any, who: CallContext, call_id: str) -> Result:
        budget = _Budget(time.monotonic() + tool.timeout_ms / 1000)
        return self._invoke(tool, payload, who, call_id, budget, ())

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
        entry = entrypoint_of(draft.language, draft.code)
        budget = _Budget(time.monotonic() + draft.timeout_ms / 1000)
        state = _CallState(self, workspace_id, call_id, None, CallContext(), budget)
        run = self._run(draft.language, draft.code, entry, payload, draft.timeout_ms, state)
        return shape(call_id, None, None, entry, run)

    def run_code(
        self, principal: Principal, language: str, code: str, payload: Any, who: CallContext
    ) -> dict[str, Any]:
        """POST /v1/run-code: the run_code built-in, called by the API."""
        principal.require("invoke")
        assert self.dispatcher is not None
        call_id = self._call_id(who.tool_call_id)
        body = {"language": language, "code": code, "input": payload}
        result = self.dispatcher.call(
            principal.workspace_id,
            "run_code",
            body,
            source=who.source,
            tool_call_id=call_id,
            agent_id=who.agent_id,
        )
        if "status" not in result:  # an envelope: the dispatcher refused before running
            if result.get("error") == "not_allowed":
                raise Forbidden("This workspace's policy does not allow run_code.", result)
            raise InvalidRequest("run_code refused the input.", result.get("details"))
        return result

    def execute_code(
        self, language: str, code: str, payload: Any, call: BuiltinCall
    ) -> dict[str, Any]:
        """The body of the run_code built-in: one sandbox run, nothing stored."""
        call_id = call.tool_call_id or new_id()
        problems = check_code(language, code)
        if problems:
            first = problems[0]
            details = {
                "type": "SyntaxError",
                "message": first["message"],
                "line": first.get("line"),
            }
            err = error("runtime_error", first["message"], details)
            return refused(call_id, None, None, err).as_dict()
        left_ms = RUN_CODE_TIMEOUT_MS
        if call.deadline is not None:
            left_ms = min(left_ms, int((call.deadline - time.monotonic()) * 1000))
        if left_ms <= 0:
            return refused(call_id, None, None, error("timeout", "No time left.")).as_dict()
        budget = _Budget(time.monotonic() + left_ms / 1000)
        who = CallContext(tool_call_id=call_id, agent_id=call.agent_id, source=call.source)
        state = _CallState(self, call.workspace_id, call_id, None, who, budget)
        entry = entrypoint_of(language, code)
        run = self._run(
            language, code, entry, payload if isinstance(payload, dict) else {}, left_ms, state
        )
        return shape(call_id, None, None, entry, run).as_dict()

    def get_call(self, principal: Principal, call_id: str) -> tuple[CallRecord, list[AuditRow]]:
        principal.require("read")
        with self._uow(readonly=True) as tx:
            record = tx.calls.get(call_id)
            if record is None or not principal.can_see(record.workspace_id):
                raise NotFound("No tool call with that id.")
            rows = tx.audit.page(AuditFilter(tool_call_id=call_id), 0, 500)
        return record, rows

    # -- internals

    def _invoke(
        self,
        tool: Tool,
        payload: Any,
        who: CallContext,
        call_id: str,
        budget: _Budget,
        chain: tuple[str, ...],
        parent: str | None = None,
    ) -> Result:
        if tool.status != "active":
            err = error("tool_disabled", "The tool is disabled.", {"reason": tool.disabled_reason})
            return self._finish(tool, refused(call_id, tool.id, tool.version, err), who, [], parent)
        validator, entry = self._compiled(tool)
        problems = input_problems(validator, payload)
        if problems:
            err = error("invalid_input", "The input does not match the tool's schema.", problems)
            return self._finish(tool, refused(call_id, tool.id, tool.version, err), who, [], parent)
        left_ms = int((budget.deadline - time.monotonic()) * 1000)
        timeout_ms = max(1, min(tool.timeout_ms, left_ms))
        state = _CallState(
            self, tool.workspace_id, call_id, tool.id, who, budget, (*chain, tool.id)
        )
        run = self._run(tool.language, tool.code, entry, payload, timeout_ms, state)
        result = shape(call_id, tool.id, tool.version, entry, run)
        return self._finish(tool, result, who, state.rows, parent)

    def _dispatch(self, name: str, payload: Any, state: _CallState) -> Any:
        """Where a ctx.tools call goes: a built-in, or a custom tool of the same workspace."""
        assert self.dispatcher is not None
        if self.dispatcher.knows(name):
            if state.budget.policy is None:
                with self._uow(readonly=True) as tx:
                    state.budget.policy = tx.workspaces.policy(state.workspace_id)
            return self.dispatcher.call(
                state.workspace_id,
                name,
                payload,
                source="code",
                tool_call_id=state.call_id,
                agent_id=state.who.agent_id,
                tool_id=state.tool_id,
                deadline=state.budget.deadline,
                policy=state.budget.policy,
                sink=state.rows,
            )
        with self._uow(readonly=True) as tx:
            tool = tx.tools.by_name(state.workspace_id, name.removeprefix("custom_"))
            if tool is None and name.startswith("custom_"):
                found = tx.tools.get(name.removeprefix("custom_"))
                tool = found if found and found.workspace_id == state.workspace_id else None
        if tool is None:
            return envelope(
                "unknown_tool", f"No tool named {name!r} in this workspace.", {"name": name}
            )
        if tool.id in state.chain:
            chain = [*state.chain, tool.id]
            return envelope("recursion", "A tool may not reach itself.", {"chain": chain})
        who = CallContext(
            agent_id=state.who.agent_id, conversation_id=state.who.conversation_id, source="code"
        )
        nested = self._invoke(
            tool, payload, who, new_id(), state.budget, state.chain, state.call_id
        )
        if nested.error is not None:
            return {
                "error": nested.error["code"],
                "details": {**nested.error, "tool_call_id": nested.tool_call_id},
            }
        return {
            "message": nested.message,
            "rawData": nested.raw_data,
            "llm": nested.llm,
            "tool_call_id": nested.tool_call_id,
        }

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
        self, language: str, code: str, entry: str, payload: Any, timeout_ms: int, state: _CallState
    ) -> RunOutcome:
        runner = self._runners.get(language)
        if runner is None:
            return RunOutcome("infra", message=f"The {language} runtime is not available.")
        request = RunRequest(
            language,
            code,
            entry,
            payload if isinstance(payload, dict) else {},
            min(timeout_ms, MAX_TIMEOUT_MS),
            state.who.for_code(state.call_id),
        )
        started = time.perf_counter()
        try:
            return runner.run(request, state)
        except Exception as exc:
            return RunOutcome(
                "infra",
                message=f"The sandbox failed: {type(exc).__name__}",
                duration_ms=(time.perf_counter() - started) * 1000,
            )

    def _finish(
        self,
        tool: Tool,
        result: Result,
        who: CallContext,
        ctx_rows: list[AuditRow],
        parent: str | None,
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
            tx.audit.add_many(ctx_rows)
            summary = _summary(result)
            if parent is not None:
                summary["parent_call_id"] = parent
            self._audit(tx, tool, result, who, "tool.invoked", summary)
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
                source=who.source,
                tool_id=tool.id,
                tool_call_id=result.tool_call_id,
                agent_id=who.agent_id,
                data=data,
            )
        )


def _summary(result: Result) -> dict[str, Any]:
    return {
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
