"""The one answer to "what happens when something calls a tool".

Every caller comes in through one entrance, ``Router.call(origin, request)``: the invoke
endpoint, an agent's tool call, MCP, the built-in endpoint, ``run_code``, a test run, and
``ctx.tools`` from tool code (the run's link). The router resolves a name (a built-in the
policy allows, ``run_code``, or a custom tool of the caller's workspace, within what the
caller is offered), applies the recursion guard, runs it, and answers an ``Answer``: the
``Result``, and what ``ctx.tools`` resolves to (services/calls.py). Calls from code
additionally spend the shared budget.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, assert_never

from toolkiln.domain.analysis import Analysis
from toolkiln.domain.builtin import RUN_CODE_SPEC, BuiltinSpec, dry_run
from toolkiln.domain.codemode import (
    PROGRAM_TIMEOUT_MS,
    RUN_PROGRAM,
    RUN_PROGRAM_SCHEMA,
    program_allowed,
)
from toolkiln.domain.errors import ServiceUnavailable, TooManyRequests
from toolkiln.domain.execution import Code
from toolkiln.domain.formats import CUSTOM_PREFIX
from toolkiln.domain.ids import new_id
from toolkiln.domain.limits import MAX_CTX_NAME_CHARS
from toolkiln.domain.origin import Offer, Origin
from toolkiln.domain.problems import problem
from toolkiln.domain.records import Policy
from toolkiln.domain.results import Result, error, refused
from toolkiln.domain.schema.budget import Searcher, on_behalf_of
from toolkiln.domain.schema.validation import InputValidator, compile_validator, input_problems
from toolkiln.domain.tools import NAME_RE, Tool
from toolkiln.services import tracing
from toolkiln.services.admission import Admissions
from toolkiln.services.calls import (
    Answer,
    ByName,
    DraftCode,
    Found,
    FromCode,
    Kind,
    Request,
    StoredTool,
)
from toolkiln.services.dispatch import Builtins
from toolkiln.services.places import Places
from toolkiln.services.ports import (
    CallObserver,
    CodeAnalyser,
    NoObserver,
    UnitOfWork,
    UnitOfWorkFactory,
)
from toolkiln.services.runs import Runs, test_run, unrunnable

MAX_NAME_CHARS = MAX_CTX_NAME_CHARS
RUN_CODE_TIMEOUT_MS = 5000


class Router:
    def __init__(
        self,
        uow: UnitOfWorkFactory,
        builtins: Builtins,
        runs: Runs,
        analyser: CodeAnalyser,
        places: Places | None = None,
        observer: CallObserver | None = None,
        *,
        searcher: Searcher | None,
    ) -> None:
        """``searcher``: where a tool's input schema's patterns are searched against a value
        (domain/schema/budget.py)."""
        self._uow = uow
        self._observer: CallObserver = observer or NoObserver()
        self._searcher = searcher
        self._builtins = builtins
        self._runs = runs
        self.analyser = analyser
        # run_code and run_program called at the root are long work: one place each.
        self._places = places or Places()
        self._compiled_cache: OrderedDict[tuple[str, int], InputValidator] = OrderedDict()
        self._lock = threading.Lock()
        self._admissions = Admissions(uow)

    # -- the one entrance

    def call(self, origin: Origin, request: Request) -> Answer:
        """The call ``request`` names (services/calls.py), made as ``origin`` says: the one
        entrance of every caller. A root call by name (an agent's tool call, MCP, the
        built-in endpoint, ``POST /v1/run-code``) writes what rows it left at its end; a
        ``ctx.tools`` call from code spends the shared budget first."""
        match request:
            case FromCode(name, payload):
                with tracing.span("ctx.tools") as span:
                    answer = self._from_code(origin, name, payload)
                    if span.is_recording():
                        span.set_attribute("toolkiln.ctx.calls_used", origin.budget.used)
                    return answer
            case ByName(name, payload, found):
                try:
                    return self._route(origin, name, payload, nested=False, found=found)
                finally:
                    self._runs.flush(origin)
            case StoredTool(tool, payload, read_at):
                return self._traced(
                    origin,
                    tool.name,
                    payload,
                    lambda: ("custom", self._run_tool(origin, tool, payload, read_at=read_at)),
                )
            case DraftCode(code, schema, payload, name):
                origin.budget.counting = False
                with tracing.tool_call(origin, name) as span:
                    span.set_attribute("toolkiln.test_run", True)
                    result = self._draft(origin, code, schema, payload)
                    tracing.called(span, origin, "custom", result, payload)
                    return Answer("custom", result)
        assert_never(request)

    def find(self, tx: UnitOfWork, origin: Origin, name: str) -> Found:
        """The custom tool ``name`` means to the caller of ``origin``: its name (or the name
        with ``_`` for ``-``) or ``custom_{id}``, in the caller's workspace; with an offer,
        only a tool offered, at its pinned version. Read in ``tx``: the caller's own unit
        of work (an agent's call reads its offer in the same), or one of the router's."""
        read_at = time.monotonic()
        return Found(self._custom_in(tx, origin, name, origin.offer), read_at)

    def specs(self) -> list[BuiltinSpec]:
        """Every built-in, ``run_code`` included, by name."""
        return sorted([*self._builtins.specs(), RUN_CODE_SPEC], key=lambda s: s.name)

    def is_builtin(self, name: str) -> bool:
        return name == RUN_CODE_SPEC.name or self._builtins.knows(name)

    # -- what each request runs

    def _from_code(self, origin: Origin, name: str, payload: Any) -> Answer:
        refusal = origin.budget.spend()
        if refusal is None and time.monotonic() >= origin.deadline:
            refusal = "timeout"  # the run this call is made from has no time left
        if refusal == "call_limit":
            max_calls = {"max_calls": origin.budget.max_calls}
            err = error("call_limit", "Too many ctx.tools calls.", max_calls)
        elif refusal == "timeout":
            err = error("timeout", "The calling tool's time is up.")
        elif not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            err = error("unknown_tool", "Tool names are 1-128 characters.")
        else:
            try:
                return self._route(origin, name, payload, nested=True)
            except (ServiceUnavailable, TooManyRequests) as exc:
                # The database went away under this ctx call (its tool's read, a nested
                # run's admission or record, a built-in's write), or the workspace has its
                # share of code checks under way (a nested run_code's): the code gets the
                # error envelope, as for any failing call, and its own record decides the
                # rest.
                err = error(exc.code, exc.message)
        return Answer("refused", refused(origin.call_id, None, None, err))

    def _run_tool(self, origin: Origin, tool: Tool, payload: Any, *, read_at: float) -> Result:
        if origin.parent_call_id is None:
            origin.budget.narrow(tool.definition.timeout_ms)
        run = origin.entering(tool.id, tuple(tool.definition.egress))
        if tool.status != "active":
            err = error("tool_disabled", "The tool is disabled.", {"reason": tool.disabled_reason})
            return self._recorded(run, tool, refused(run.call_id, tool.id, tool.version, err))
        if problems := input_problems(self._compiled(tool), payload):
            err = error("invalid_input", "The input does not match the tool's schema.", problems)
            return self._recorded(run, tool, refused(run.call_id, tool.id, tool.version, err))
        # Analysed when it was saved: kept for the workspace (services/analysis.py).
        d = tool.definition
        analysis = self.analyser.analyse(d.language, d.code, tool.workspace_id)
        if analysis.problems:
            return self._recorded(run, tool, _unchecked(run.call_id, tool, analysis))
        code = Code.analysed(d.language, d.code, analysis, d.timeout_ms)
        with self._admissions.of(tool.id, read_at, run.deadline) as admission:
            outcome = self._runs.run(run, code, payload, self, admission)
            return self._recorded(run, tool, Runs.shape(run, code, tool.version, outcome))

    def _draft(self, origin: Origin, code: Code, schema: dict[str, Any], payload: Any) -> Result:
        result: Result | None = None
        try:
            searcher = on_behalf_of(self._searcher, origin.workspace_id)
            if problems := input_problems(compile_validator(schema, searcher), payload):
                err = error(
                    "invalid_input", "The input does not match the tool's schema.", problems
                )
                result = refused(origin.call_id, origin.tool_id, None, err)
            else:
                outcome = self._runs.run(origin, code, payload, self)
                result = Runs.shape(origin, code, None, outcome)
            return result
        finally:
            if result is not None and origin.tool_id is not None:  # a stored tool's own case
                self._runs.record_uncounted(origin, origin.tool_id, result)
            else:
                self._runs.flush(origin)

    # -- routing

    def _route(
        self, origin: Origin, name: str, payload: Any, *, nested: bool, found: Found | None = None
    ) -> Answer:
        return self._traced(
            origin,
            name,
            payload,
            lambda: self._routed(origin, name, payload, nested=nested, found=found),
        )

    def _traced(
        self, origin: Origin, name: str, payload: Any, work: Callable[[], tuple[Kind, Result]]
    ) -> Answer:
        """A call's span (services/tracing.py) around ``work``, and its count in the metrics."""
        started = time.perf_counter()
        with tracing.tool_call(origin, name) as span:
            kind, result = work()
            tracing.called(span, origin, kind, result, payload)
        self._observed(origin, name, kind, result, started)
        return Answer(kind, result)

    def _observed(
        self, origin: Origin, name: str, kind: Kind, result: Result, started: float
    ) -> None:
        """Counted in the metrics, unless under a test run (which counts nothing)."""
        if origin.budget.counting:
            seconds = time.perf_counter() - started
            self._observer.called(origin.workspace_id, name, kind, result.status, seconds)

    def _routed(
        self, origin: Origin, name: str, payload: Any, *, nested: bool, found: Found | None
    ) -> tuple[Kind, Result]:
        offer = origin.offer
        if name == RUN_PROGRAM and offer is not None and not nested:
            return "custom", self._program(origin, payload)
        if self.is_builtin(name):
            policy = self._policy(origin)
            if (offer is not None and name not in offer.builtins) or name not in policy.builtins:
                return "refused", self._not_offered(origin, name, offer, policy)
            if name == RUN_CODE_SPEC.name:
                return self._snippet(origin, payload, nested)
            return "builtin", self._builtins.call(origin, policy, name, payload)
        if found is None:
            with self._uow(readonly=True) as tx:
                found = self.find(tx, origin, name)
        tool, read_at = found
        if tool is None:
            return "refused", self._not_offered(origin, name, offer, None)
        if tool.id in origin.chain:
            chain = [*origin.chain, tool.id]
            err = error("recursion", "A tool may not reach itself.", {"chain": chain})
            return "refused", refused(origin.call_id, tool.id, tool.version, err)
        if origin.budget.holds_back(acts=True):  # a custom tool may act outside the call
            held = refused(origin.call_id, tool.id, tool.version, dry_run(name[:64]))
            if nested:
                self._called(origin, tool, held)
            return "refused", held
        if not nested:
            return "custom", self._run_tool(origin, tool, payload, read_at=read_at)
        result = self._run_tool(origin.nested(new_id()), tool, payload, read_at=read_at)
        self._called(origin, tool, result)
        return "custom", result

    @staticmethod
    def _called(origin: Origin, tool: Tool, result: Result) -> None:
        """The ``tool.called`` row of a custom tool reached from code. It is about the tool
        called, so it carries that tool's id: a program's, ``run_code``'s, a
        test run's or a generated example's call of a stored tool is in the tool's trail."""
        data: dict[str, Any] = {
            "name": tool.name,
            "tool_id": tool.id,
            "tool_call_id": result.tool_call_id,
            "status": result.status,
            "error": result.error["code"] if result.error else None,
        }
        if origin.tool_id is not None:
            data["caller_tool_id"] = origin.tool_id
        if not origin.budget.counting:
            data = test_run(data)
        origin.rows.append(origin.row("tool.called", data, tool_id=tool.id))

    def _program(self, origin: Origin, payload: Any) -> Result:
        """Code mode's ``run_program``: one sandbox run whose ``ctx.tools`` reach exactly the
        agent's code-mode offer (``origin.offer``), under this call's one budget. Refused,
        unrun, where the workspace policy does not allow ``run_code``."""
        if not program_allowed(self._policy(origin).builtins):
            message = (
                f"No tool named {RUN_PROGRAM!r} is available to this agent: the workspace "
                "policy does not allow run_code."
            )
            err = error("unknown_tool", message, {"name": RUN_PROGRAM, "available": []})
            return refused(origin.call_id, None, None, err)
        if problems := input_problems(_RUN_PROGRAM_VALIDATOR, payload):
            err = error("invalid_input", "The input does not match the schema.", problems)
            return refused(origin.call_id, None, None, err)
        timeout_ms = int(payload.get("timeout_ms") or PROGRAM_TIMEOUT_MS)
        with self._places.take(origin.workspace_id, "program"):
            result = self._source(origin, payload, timeout_ms, {}, only="handle")
        self._runs.record_run(origin, result, RUN_PROGRAM, kind="program")
        return result

    def _snippet(self, origin: Origin, payload: Any, nested: bool) -> tuple[Kind, Result]:
        if problems := input_problems(_RUN_CODE_VALIDATOR, payload):
            err = error("invalid_input", "The input does not match the schema.", problems)
            return "refused", refused(origin.call_id, None, None, err)
        run = origin.nested(new_id()) if nested else origin
        # Nested, it runs within its caller's time (and place, if the caller holds one).
        place: AbstractContextManager[object] = (
            nullcontext() if nested else self._places.take(run.workspace_id, "run_code")
        )
        with place:
            result = self._source(run, payload, RUN_CODE_TIMEOUT_MS, payload.get("input", {}))
        self._runs.record_run(run, result, RUN_CODE_SPEC.name)
        return "run_code", result

    def _source(
        self, run: Origin, payload: Any, timeout_ms: int, given: Any, only: str | None = None
    ) -> Result:
        """Run code given as source (``run_code``, ``run_program``). A problem found before
        it runs is the code's ``runtime_error`` with its line, as a tool's would be.

        Source given at call time never passed the save-time check of ``timeout_ms``
        against the workspace's ``max_timeout_ms``: its time is held to that ceiling here,
        where it is chosen (tests/security/test_policy_ceilings.py)."""
        timeout_ms = min(timeout_ms, self._policy(run).max_timeout_ms)
        if run.parent_call_id is None:
            run.budget.narrow(timeout_ms)  # a root call learns its own limit
        language, source = payload["language"], payload["code"]
        analysis = self.analyser.analyse(language, source, run.workspace_id)
        if only is not None and not analysis.problems and analysis.entrypoint != only:
            need = problem("code", f"The program must define {only}(input, ctx).")
            analysis = Analysis((need,))
        if analysis.problems:
            return unrunnable(run.call_id, analysis)
        code = Code.analysed(language, source, analysis, timeout_ms)
        return Runs.shape(run, code, None, self._runs.run(run, code, given, self))

    def _custom_in(
        self, tx: UnitOfWork, origin: Origin, name: str, offer: Offer | None
    ) -> Tool | None:
        if "\x00" in name:  # no stored name or id holds one, and PostgreSQL cannot compare
            return None  # text that does (a DataError, which would be a 500)

        # Only a name a tool may have is looked up (check_name, on create and update): not
        # custom_{id}, which every agent's call of a custom tool names it by.
        def named(text: str) -> Tool | None:
            return tx.tools.by_name(origin.workspace_id, text) if NAME_RE.fullmatch(text) else None

        tool = named(name)
        if tool is None and "_" in name and not name.startswith(CUSTOM_PREFIX):
            tool = named(name.replace("_", "-"))
        if tool is None and name.startswith(CUSTOM_PREFIX):
            tool = tx.tools.get(name.removeprefix(CUSTOM_PREFIX))
        if tool is None or tool.workspace_id != origin.workspace_id:
            return None
        if offer is None:
            return tool
        if tool.id not in offer.custom:
            return None
        pinned = offer.custom[tool.id]
        version = tx.tools.version(tool.id, pinned) if pinned else None
        return tool.at(version) if version is not None else tool

    def _not_offered(
        self, origin: Origin, name: str, offer: Offer | None, policy: Policy | None
    ) -> Result:
        shown = name[:64]
        if policy is not None and offer is None:
            err = error("not_allowed", f"The workspace does not allow {shown}.", {"name": shown})
        elif offer is not None:
            available = sorted(offer.builtins) + [f"{CUSTOM_PREFIX}{t}" for t in offer.custom]
            code = "tool_not_enabled" if name.startswith(CUSTOM_PREFIX) else "unknown_tool"
            message = (
                f"No tool named {shown!r} is available to this agent. "
                f"Available: {', '.join(available)}."
            )
            err = error(code, message, {"available": available})
        else:
            err = error(
                "unknown_tool", f"No tool named {shown!r} in this workspace.", {"name": shown}
            )
        return refused(origin.call_id, None, None, err)

    # -- helpers

    def _recorded(self, run: Origin, tool: Tool, result: Result) -> Result:
        if run.budget.counting:
            self._runs.record_tool(run, tool.id, result)
        else:  # under a test run (test runs count nothing): the rows only
            self._runs.record_uncounted(run, tool.id, result)
        return result

    def _policy(self, origin: Origin) -> Policy:
        budget = origin.budget
        if budget.policy is None:
            with self._uow(readonly=True) as tx:
                budget.policy = tx.workspaces.policy(origin.workspace_id)
        return budget.policy

    def _compiled(self, tool: Tool) -> InputValidator:
        """The input validator of a tool version, made once and cached."""
        key = (tool.id, tool.version)
        with self._lock:
            found = self._compiled_cache.get(key)
            if found is not None:
                self._compiled_cache.move_to_end(key)
                return found
        made = compile_validator(
            tool.definition.input_schema, on_behalf_of(self._searcher, tool.workspace_id)
        )
        with self._lock:
            self._compiled_cache[key] = made
            while len(self._compiled_cache) > 1024:
                self._compiled_cache.popitem(last=False)
        return made


def _unchecked(call_id: str, tool: Tool, analysis: Analysis) -> Result:
    """A stored version whose code has problems now: its ``runtime_error``, as for code
    given at call time, or (its analysis did not finish: not the tool's doing) an
    ``infra_error``."""
    if not analysis.limit:
        found = unrunnable(call_id, analysis)
        return refused(call_id, tool.id, tool.version, found.error or {})
    why = f"The tool's code could not be checked: it {analysis.problems[0]['message']}."
    return refused(call_id, tool.id, tool.version, error("infra_error", why))


_RUN_CODE_VALIDATOR = compile_validator(RUN_CODE_SPEC.input_schema, None)  # the service's own
_RUN_PROGRAM_VALIDATOR = compile_validator(RUN_PROGRAM_SCHEMA, None)
