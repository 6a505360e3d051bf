"""What the services ask a sandbox to run, and what the host observed when it ran."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

OutcomeKind = Literal[
    "return",  # the code returned a value (not yet checked against the contract)
    "exception",  # the code raised
    "timeout",  # wall clock or CPU time passed the limit
    "memory",  # the memory cap was reached
    "too_large",  # the result or a frame was over its cap
    "unserializable",  # the return value is not JSON
    "violation",  # killed by the sandbox for a forbidden operation
    "crash",  # the process ended without a report
    "garbled",  # the process sent something that is not a valid report
    "infra",  # the service failed; not the tool's fault
]


@dataclass(slots=True)
class RunRequest:
    language: str
    code: str
    entry: str
    input: dict[str, Any]
    timeout_ms: int
    context: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RunOutcome:
    kind: OutcomeKind
    value: Any = None
    error_type: str | None = None
    message: str = ""
    line: int | None = None
    column: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_ms: float = 0.0
    ctx_calls: int = 0
    details: dict[str, Any] = field(default_factory=dict)
