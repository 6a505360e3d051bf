"""``run_code``: run a snippet once in the sandbox, with the same entrypoints as a tool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolkiln.domain.builtin import BuiltinCall, BuiltinSpec

Execute = Callable[[str, str, Any, BuiltinCall], dict[str, Any]]


class RunCode:
    spec = BuiltinSpec(
        "run_code",
        "Run Python or JavaScript code once in the sandbox. The code defines main(**params) or "
        "handle(input, ctx); the answer is a tool Result.",
        {
            "type": "object",
            "properties": {
                "language": {"enum": ["python", "javascript"]},
                "code": {"type": "string", "minLength": 1, "maxLength": 262144},
                "input": {"type": "object"},
            },
            "required": ["language", "code"],
            "additionalProperties": False,
        },
    )

    def __init__(self, execute: Execute) -> None:
        self._execute = execute

    def call(self, payload: dict[str, Any], call: BuiltinCall) -> dict[str, Any]:
        return self._execute(payload["language"], payload["code"], payload.get("input", {}), call)
