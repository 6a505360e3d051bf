"""Running a tool's test cases, and the generator's examples, once each in the sandbox.

This is the one place where those runs reach the sandbox. They go through the uncounted run
of an unsaved definition (``services.invoke.DraftRunner``), so a test run adds nothing to a
tool's usage or failure counts and stores no call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from toolkiln.domain.auth import Principal
from toolkiln.domain.ids import new_id
from toolkiln.domain.limits import MIN_TIMEOUT_MS
from toolkiln.domain.results import Result, error, refused
from toolkiln.domain.testcases import CaseReport, CaseSpec, report
from toolkiln.domain.tools import ToolDraft

RunOnce = Callable[[Principal, str, ToolDraft, Any], Result]

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

    def __init__(self, run_once: RunOnce | None = None, budget_s: float = CASES_BUDGET_S) -> None:
        self._run_once = run_once
        self._budget_s = budget_s

    def run_one(
        self, principal: Principal, workspace_id: str, draft: ToolDraft, payload: Any
    ) -> Result:
        if self._run_once is None:
            err = error("infra_error", "No sandbox is attached to run test cases.")
            return refused(new_id(), None, None, err)
        # The cases are not needed to run one input; leaving them out skips re-checking them.
        return self._run_once(principal, workspace_id, replace(draft, test_cases=[]), payload)

    def run(
        self, principal: Principal, workspace_id: str, draft: ToolDraft, cases: list[CaseSpec]
    ) -> list[CaseReport]:
        deadline = time.monotonic() + self._budget_s
        out: list[CaseReport] = []
        for case in cases:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms < MIN_TIMEOUT_MS:
                message = f"Not run: the test cases' time budget of {self._budget_s:g} s is spent."
                result = refused(new_id(), None, None, error("not_run", message))
            else:
                timed = replace(draft, timeout_ms=min(draft.timeout_ms, left_ms))
                result = self.run_one(principal, workspace_id, timed, case["input"])
            out.append(report(case, result))
        return out
