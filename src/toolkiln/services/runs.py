"""Sandbox runs: one run of code for one call, its link back to the platform, and its record.

The router decides *what* runs; this module runs it. Each run gets a ``RunLink`` of its own
(made here, dropped when the run ends) whose ``call`` goes to the router's one entrance with
this run's origin: the runner never holds a service, and nothing of one run's link can be
reached by another run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

from toolkiln.domain.analysis import Analysis
from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.domain.execution import Code, RunOutcome, RunRequest
from toolkiln.domain.ids import utcnow
from toolkiln.domain.limits import MAX_TIMEOUT_MS
from toolkiln.domain.origin import Origin
from toolkiln.domain.problems import scrub, text_problems
from toolkiln.domain.records import CallRecord
from toolkiln.domain.results import Result, error, last_error_text, refused, shape
from toolkiln.domain.stats import minute_of
from toolkiln.domain.tools import AUTO_DISABLE_REASON
from toolkiln.services import tracing
from toolkiln.services.admission import OPEN, Admission
from toolkiln.services.calls import Answer, FromCode, Request
from toolkiln.services.group_commit import GroupCommit
from toolkiln.services.ports import (
    CallObserver,
    CodeRunner,
    NoObserver,
    UnitOfWork,
    UnitOfWorkFactory,
)

log = logging.getLogger("toolkiln.runs")
MAX_AUDIT_EVENT_CHARS = 64


class Entrance(Protocol):
    """Where a run's ``ctx.tools`` calls go: the router's one entrance."""

    def call(self, origin: Origin, request: Request) -> Answer: ...


def unrunnable(call_id: str, analysis: Analysis) -> Result:
    """A run of code with problems, refused before it starts: the code's ``runtime_error``
    naming the first problem and its line, as a SyntaxError when it loaded would."""
    first = analysis.problems[0]
    details = {"type": "SyntaxError", "message": first["message"], "line": first.get("line")}
    return refused(call_id, None, None, error("runtime_error", first["message"], details))


class _Link:
    """One run's RunLink: ctx calls go to the router with this run's origin; whether the run
    starts, and that it ended, go to its admission."""

    __slots__ = ("_admission", "_by_code", "_entrance", "_origin", "_timeout_ms")

    def __init__(
        self, origin: Origin, entrance: Entrance, admission: Admission, timeout_ms: int
    ) -> None:
        self._origin = origin.within(timeout_ms)
        self._entrance = entrance
        self._admission = admission
        self._timeout_ms = timeout_ms
        self._by_code: Origin | None = None  # origin.from_code(), made once (it is frozen)

    def again(self) -> None:
        """The run goes again with its whole time (a one-way try given up at its ctx call,
        runners/client.py ``_again``): a root call's deadlines move with it; a nested run
        stays within its caller's (tests/api/test_one_way_again.py)."""
        if self._origin.parent_call_id is not None:
            return
        until = time.monotonic() + self._timeout_ms / 1000
        budget = self._origin.budget
        budget.deadline = max(budget.deadline, until)
        self._origin = replace(self._origin, run_deadline=until)
        self._by_code = None

    def admit(self) -> bool:
        return self._admission.admit()

    def ended(self) -> None:
        self._admission.ended()

    def _code(self) -> Origin:
        if self._by_code is None:
            self._by_code = self._origin.from_code()
        return self._by_code

    def call(self, name: str, payload: Any) -> Any:
        return self._entrance.call(self._code(), FromCode(name, payload)).value()

    def audit(self, event: str, data: Any) -> str | None:
        """``custom.<event>`` with ``data`` exactly as given. The sandbox side caps rows and
        bytes per call (``sandbox/session.py``); here a row that could not be stored is
        dropped rather than allowed to break the run's one write, and the reason is
        returned for the run's ``logs.stderr`` (never the event itself: it may be huge)."""
        with tracing.span("ctx.audit"):
            return self._audit(event, data)

    def _audit(self, event: str, data: Any) -> str | None:
        if not isinstance(event, str) or not 0 < len(event) <= MAX_AUDIT_EVENT_CHARS:
            return f"the event must be a string of 1-{MAX_AUDIT_EVENT_CHARS} characters"
        if found := text_problems("event", event) or text_problems("data", data):
            return f"{found[0]['field']} {found[0]['message']}"
        self._origin.rows.append(self._code().row(f"custom.{event}", data))
        return None


class Runs:
    """Runs code in the language's sandbox, and records what a run did."""

    def __init__(
        self,
        uow: UnitOfWorkFactory,
        runners: dict[str, CodeRunner],
        observer: CallObserver | None = None,
    ) -> None:
        self._uow = uow
        self._runners = runners
        self._observer: CallObserver = observer or NoObserver()
        # The one write each call ends with, committed together with the writes of calls
        # ending at the same time (services/group_commit.py).
        self.writes = GroupCommit(uow)

    def prepare(self, language: str, imports: Sequence[str]) -> None:
        """Code was saved or is about to run: the packages it imports start installing now.
        Never a reason to fail the save: a package that cannot be installed fails its calls."""
        runner = self._runners.get(language)
        if runner is None or not imports:
            return
        try:
            runner.prepare(imports)
        except Exception:  # the install is the sandbox's business; the save goes on
            log.exception("preparing %s code failed", language)

    def run(
        self,
        origin: Origin,
        code: Code,
        payload: Any,
        entrance: Entrance,
        admission: Admission = OPEN,
    ) -> RunOutcome:
        """One run, bounded by the code's timeout and the time the whole call has left (the
        sandbox may wait for a process within that time, then runs with what is left);
        ``admission`` decides whether it starts once a process is ready."""
        runner = self._runners.get(code.language)
        if runner is None:
            return RunOutcome("infra", message=f"The {code.language} runtime is not available.")
        timeout_ms = min(code.timeout_ms, origin.left_ms(), MAX_TIMEOUT_MS)
        # A nested run given less than its own timeout_ms is bounded by its caller's time:
        # running out of it is not the nested tool's failure. (A root call's budget is its
        # own timeout: there the two are the same limit.)
        by_caller = origin.parent_call_id is not None and timeout_ms < code.timeout_ms
        uncounted = {"reason": "the calling tool's time ran out", "counted": False}
        if timeout_ms <= 0:
            return RunOutcome("timeout", message="No time was left for it.", details=uncounted)
        request = RunRequest(
            code.language,
            code.code,
            code.entry,
            payload if isinstance(payload, dict) else {},
            timeout_ms,
            origin.for_code(),
            workspace_id=origin.workspace_id,
            call_id=origin.call_id,
            share=origin.budget.share,
            not_after=origin.deadline if origin.parent_call_id is not None else None,
            imports=code.imports,
            script=code.script,
            one_way=not code.takes_ctx,
        )
        attributes = {"toolkiln.language": code.language, "toolkiln.timeout_ms": timeout_ms}
        with tracing.span(f"run {code.language}", attributes) as span:
            outcome = self._run(runner, request, origin, timeout_ms, entrance, admission)
            if span.is_recording():
                span.set_attribute("toolkiln.run.outcome", outcome.kind)
                span.set_attribute("toolkiln.run.duration_ms", outcome.duration_ms)
        if outcome.kind == "timeout" and by_caller:
            outcome.details = {**outcome.details, **uncounted}
        return outcome

    @staticmethod
    def _run(
        runner: CodeRunner,
        request: RunRequest,
        origin: Origin,
        timeout_ms: int,
        entrance: Entrance,
        admission: Admission,
    ) -> RunOutcome:
        started = time.perf_counter()
        try:
            # The run's ctx calls (built-ins above all) are bounded by this run's deadline.
            link = _Link(origin, entrance, admission, timeout_ms)
            return runner.run(request, link)
        except ServiceUnavailable:
            # The database (the run's admission, a ctx call's read or write), not the
            # sandbox: the caller's outage, answered 503 (or, under a ctx call, the
            # ``unavailable`` envelope: Router.call), never a stored infra_error.
            raise
        except Exception as exc:
            return RunOutcome(
                "infra",
                message=f"The sandbox failed: {type(exc).__name__}",
                duration_ms=(time.perf_counter() - started) * 1000,
            )

    @staticmethod
    def shape(origin: Origin, code: Code, version: int | None, run: RunOutcome) -> Result:
        """The Result of a run, decided here from what the host saw. Text the sandbox sent
        that is not storable Unicode never reaches a write: logs and error text are
        scrubbed; a result value holding such text is the tool's ``invalid_result``."""
        if run.kind == "not_admitted":
            err = error("tool_disabled", "The tool was disabled before its run started.")
            return refused(origin.call_id, origin.tool_id, version, err)
        run.stdout, run.stderr, run.message = (
            scrub(run.stdout),
            scrub(run.stderr),
            scrub(run.message),
        )
        if run.error_type is not None:
            run.error_type = scrub(run.error_type)
        if run.kind == "return" and (bad := text_problems("result", run.value)):
            run = RunOutcome(
                "unserializable",
                message=f"{bad[0]['field']} {bad[0]['message']}.",
                stdout=run.stdout,
                stderr=run.stderr,
                duration_ms=run.duration_ms,
                ctx_calls=run.ctx_calls,
            )
        return shape(origin.call_id, origin.tool_id, version, code.entry, run)

    # -- records

    def record_tool(self, origin: Origin, tool_id: str, result: Result) -> None:
        """Counters, the stored call and every row of the run, in one transaction."""
        rows = _take(origin)
        disabled = 0  # the failure count that disabled it

        def write(tx: UnitOfWork) -> None:
            nonlocal disabled
            counted = None
            if result.reached_execution:
                counted = tx.tools.count_outcome(
                    tool_id, result.counts_as_failure, last_error_text(result)
                )
            self._store(tx, origin, result, "invoke", tool_id)
            code = result.error["code"] if result.error else ""
            tx.stats.add(tool_id, minute_of(utcnow()), code, result.duration_ms)
            tx.audit.add_many(rows)
            tx.audit.add(origin.row("tool.invoked", _summary(origin, result), tool_id=tool_id))
            if counted is not None and counted.just_disabled:
                disabled = counted.failure_count
                data = {"reason": AUTO_DISABLE_REASON, "failure_count": counted.failure_count}
                tx.audit.add(origin.row("tool.disabled", data, tool_id=tool_id))

        self.writes.run(write, key=tool_id)
        if disabled:  # committed (a batch retried writes it again: counted once here)
            self._observer.disabled(origin.workspace_id)
            log.warning(
                "tool %s of workspace %s was disabled after %d consecutive failures",
                tool_id,
                origin.workspace_id,
                disabled,
            )

    def record_uncounted(self, origin: Origin, tool_id: str, result: Result) -> None:
        """A stored tool's run under a test run (its own test case, or reached through the
        ``ctx`` of a test run, a test case or a generated example): the run's rows and one
        ``tool.invoked`` row with the tool's id marked ``"test_run": true``,
        and nothing else: no counter moves and no call is stored."""
        rows = _take(origin)
        rows.append(origin.row("tool.invoked", test_run(_summary(origin, result)), tool_id=tool_id))
        self.writes.run(lambda tx: tx.audit.add_many(rows))

    def record_run(self, origin: Origin, result: Result, name: str, kind: str = "") -> None:
        """A run that is no stored tool's: ``run_code`` (no call stored; its own
        ``builtin.called`` row) or a code-mode program (``kind="program"``: stored, with a
        ``tool.invoked`` row), after the rows of its ctx calls, in one transaction."""
        rows = _take(origin)
        data = {"name": name, **_summary(origin, result)}

        def write(tx: UnitOfWork) -> None:
            if kind:
                self._store(tx, origin, result, kind, None)
            tx.audit.add_many(rows)
            tx.audit.add(origin.row("tool.invoked" if kind else "builtin.called", data))

        self.writes.run(write)

    def flush(self, origin: Origin) -> None:
        """Rows of a call that made no run of its own (a built-in called at the root, a
        test run): written in one transaction."""
        rows = _take(origin)
        if rows:
            self.writes.run(lambda tx: tx.audit.add_many(rows))

    @staticmethod
    def _store(
        tx: UnitOfWork, origin: Origin, result: Result, kind: str, tool_id: str | None
    ) -> None:
        tx.calls.add(
            CallRecord(
                result.tool_call_id,
                origin.workspace_id,
                tool_id,
                result.version,
                kind,
                result.status,
                result.error["code"] if result.error else None,
                result.as_dict(),
                origin.caller.agent_id,
                utcnow(),
            )
        )


def test_run(data: dict[str, Any]) -> dict[str, Any]:
    """A row's data, marked as written under a test run (which counts nothing)."""
    return {**data, "test_run": True}


def _take(origin: Origin) -> list[Any]:
    rows = list(origin.rows)
    origin.rows.clear()
    return rows


def _summary(origin: Origin, result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {
        "status": result.status,
        "error": result.error["code"] if result.error else None,
        "duration_ms": result.duration_ms,
        "ctx_calls": result.ctx_calls,
        "version": result.version,
    }
    if origin.parent_call_id is not None:
        out["parent_call_id"] = origin.parent_call_id
    return out
