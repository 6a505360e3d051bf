"""Running a tool's test cases, and the generator's examples, once each in the sandbox.

This is the one place where those runs reach the sandbox. They go through the uncounted run
of an unsaved definition (``services.invoke.DraftRunner``), so a test run adds nothing to a
tool's usage or failure counts and stores no call. A version's cases run in one place of
the workspace's long work (``services/places.py``); a generation's examples run in the
generation's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from toolkiln.domain.auth import Principal
from toolkiln.domain.ids import new_id
from toolkiln.domain.limits import MIN_TIMEOUT_MS
from toolkiln.domain.origin import Budget
from toolkiln.domain.results import Result, error, refused
from toolkiln.domain.testcases import CaseReport, CaseSpec, report
from toolkiln.domain.tools import ToolDraft
from toolkiln.services.places import Places

# (principal, workspace, draft, input, budget, tool id): the budget shared by runs that
# belong together (a generation's examples), or None for a run with a budget of its own; the
# stored tool's id when the draft is one's version (its test cases), or None.
RunOnce = Callable[[Principal, str, ToolDraft, Any, Budget | None, str | None], Result]

# All the cases of one write share this much wall-clock time; what is left over is not run.
CASES_BUDGET_S = 120.0


@dataclass(slots=True)
class CasesRun:
    """The outcome of one version's test cases."""

    version: int | None
    cases: list[CaseReport]

    @property
    def passed(self) -> int:
        return sum(1 for c in self.cases if c["passed"])

    @property
    def failed(self) -> int:
        return len(self.cases) - self.passed

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "passed": self.passed,
            "failed": self.failed,
            "cases": self.cases,
        }


class CaseRunner:
    """Runs a definition once per input without saving or counting anything."""

    def __init__(
        self,
        run_once: RunOnce | None = None,
        budget_s: float = CASES_BUDGET_S,
        places: Places | None = None,
    ) -> None:
        self._run_once = run_once
        self._budget_s = budget_s
        self._places = places or Places()

    def run_one(
        self,
        principal: Principal,
        workspace_id: str,
        draft: ToolDraft,
        payload: Any,
        budget: Budget | None = None,
        tool_id: str | None = None,
    ) -> Result:
        """One run of ``draft``; ``budget``: one shared with the other runs of the same
        work (a generation's examples), else the run has one of its own."""
        if self._run_once is None:
            err = error("infra_error", "No sandbox is attached to run test cases.")
            return refused(new_id(), None, None, err)
        # The cases are not needed to run one input; leaving them out skips re-checking them.
        slim = replace(draft, definition=replace(draft.definition, test_cases=[]))
        return self._run_once(principal, workspace_id, slim, payload, budget, tool_id)

    def run(
        self,
        principal: Principal,
        workspace_id: str,
        draft: ToolDraft,
        cases: list[CaseSpec],
        tool_id: str | None = None,
    ) -> list[CaseReport]:
        """Every case, in one place of the workspace's long work (``TooManyRequests`` when
        it has none free). ``tool_id``: the tool whose version ``draft`` is (or is about to
        be, on a create): the runs' audit rows carry it, marked as test runs."""
        if not cases:
            return []
        with self._places.take(workspace_id, "test_cases"):
            return self._run_all(principal, workspace_id, draft, cases, tool_id)

    def _run_all(
        self,
        principal: Principal,
        workspace_id: str,
        draft: ToolDraft,
        cases: list[CaseSpec],
        tool_id: str | None,
    ) -> list[CaseReport]:
        deadline = time.monotonic() + self._budget_s
        out: list[CaseReport] = []
        for case in cases:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms < MIN_TIMEOUT_MS:
                message = f"Not run: the test cases' time budget of {self._budget_s:g} s is spent."
                result = refused(new_id(), None, None, error("not_run", message))
            else:
                timed = draft.timed(min(draft.definition.timeout_ms, left_ms))
                result = self.run_one(
                    principal, workspace_id, timed, case["input"], tool_id=tool_id
                )
            out.append(report(case, result))
        return out
