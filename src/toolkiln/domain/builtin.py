"""Built-in tools as the domain sees them: a spec, the call's context, and a failure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolkiln.domain.records import Policy


@dataclass(frozen=True, slots=True)
class BuiltinSpec:
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(slots=True)
class BuiltinCall:
    """Who calls a built-in, under which workspace policy."""

    workspace_id: str
    policy: Policy
    source: str  # "llm" | "code" | "api"
    tool_call_id: str | None = None
    agent_id: str | None = None
    deadline: float | None = None  # time.monotonic() of the root call's deadline
    cost: dict[str, Any] = field(default_factory=dict)


class BuiltinFailure(Exception):
    """A built-in refused or failed: it becomes ``{"error": code, "details": ...}``."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def envelope(self) -> dict[str, Any]:
        details = self.details if self.details is not None else {"message": self.message}
        return {"error": self.code, "details": details}


RUN_CODE_SPEC = BuiltinSpec(
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
"""``run_code`` runs in the sandbox, under the caller's budget: the router runs it, not a
built-in module."""
