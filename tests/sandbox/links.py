"""Run links and requests for sandbox tests: a run with no platform behind it."""

from __future__ import annotations

from typing import Any

from toolkiln.domain.code_check import analyse
from toolkiln.domain.execution import RunRequest


def analysed(language: str, code: str, timeout_ms: int, **fields: Any) -> RunRequest:
    """A ``handle`` run as the service asks for one: with what the code's analysis found
    (here made in the test's process; the service's comes from a code checker)."""
    found = analyse(language, code)
    return RunRequest(
        language, code, "handle", {}, timeout_ms, imports=found.imports, script=found.script,
        **fields,
    )  # fmt: skip


class NoCtx:
    """Admits every run; every ctx call is an unknown tool; audit rows go nowhere."""

    def admit(self) -> bool:
        return True

    def call(self, name: str, payload: object) -> object:
        return {"error": "unknown_tool"}

    def audit(self, event: str, data: object) -> None:
        return None
