"""Built-in tools as the domain sees them: a spec, the call's context, and a failure."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolkiln.domain.results import error

if TYPE_CHECKING:  # domain/records.py reads domain/egress.py, which raises BuiltinFailure
    from toolkiln.domain.records import Policy

# Time a built-in called from code leaves its caller: the tool must still read the reply and
# return before its own deadline, or the host stops it as a ``timeout`` of the tool's.
REPLY_RESERVE_S = 0.25
CALLER_OUT_OF_TIME = "the calling tool's time ran out"


@dataclass(frozen=True, slots=True)
class BuiltinSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    # It acts outside the call (sends, stores, requests): under a dry budget (a generation's
    # example runs) it answers ``dry_run`` instead (services/dispatch.py).
    effects: bool = False


def dry_run(name: str) -> dict[str, Any]:
    """The error a call that would act outside a dry run gets instead: ``{"code": "dry_run",
    "message", "details"}``."""
    message = (
        f"{name} was not run: a generation's example runs are dry, so nothing is sent, "
        "stored or called."
    )
    return error("dry_run", message, {"name": name, "message": message})


@dataclass(slots=True)
class BuiltinCall:
    """Who calls a built-in, under which workspace policy."""

    workspace_id: str
    policy: Policy
    source: str  # "llm" | "code" | "api"
    tool_call_id: str | None = None
    agent_id: str | None = None
    deadline: float | None = None  # time.monotonic(): when the calling call must be over
    cost: dict[str, Any] = field(default_factory=dict)
    # The hosts this call may reach: the calling tool version's egress list, else the
    # workspace policy's (domain/egress.py).
    egress: tuple[str, ...] = ()
    # Audit rows the built-in asks for besides its builtin.called row: (event, data).
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def until(self, cap_s: float) -> tuple[float, bool]:
        """When the built-in's own work must end (``time.monotonic()``): ``cap_s`` from now,
        or sooner when the caller has less time left (a caller in code keeps
        ``REPLY_RESERVE_S`` of it to read the reply). The flag says the caller's time is the
        tighter bound. Raises the ``timeout`` failure when none is left."""
        now = time.monotonic()
        own = now + cap_s
        if self.deadline is None:
            return own, False
        callers = self.deadline - (REPLY_RESERVE_S if self.source == "code" else 0.0)
        if callers <= now:
            raise self.out_of_time()
        return (callers, True) if callers < own else (own, False)

    @staticmethod
    def out_of_time(doing: str = "") -> BuiltinFailure:
        message = f"Stopped{f' while {doing}' if doing else ''}: {CALLER_OUT_OF_TIME}."
        return BuiltinFailure(
            "timeout", message, {"message": message, "reason": CALLER_OUT_OF_TIME}
        )


class BuiltinFailure(Exception):
    """A built-in refused or failed: the caller gets a result with the error ``code``, its
    message and details (services/dispatch.py)."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


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
