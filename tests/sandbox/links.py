"""Run links for sandbox tests: a run with no platform behind it."""

from __future__ import annotations


class NoCtx:
    """Admits every run; every ctx call is an unknown tool; audit rows go nowhere."""

    def admit(self) -> bool:
        return True

    def call(self, name: str, payload: object) -> object:
        return {"error": "unknown_tool"}

    def audit(self, event: str, data: object) -> None:
        return None
