"""What the services ask a sandbox to run, and what the host observed when it ran."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from toolkiln.domain.analysis import Analysis


@dataclass(frozen=True, slots=True)
class Code:
    """What a run runs: a tool version, a draft, or a run_code snippet; with what its
    analysis found (the modules it imports, JavaScript's script form)."""

    language: str
    code: str
    entry: str
    timeout_ms: int
    imports: tuple[str, ...] = ()
    script: str = ""
    takes_ctx: bool = True

    @classmethod
    def analysed(cls, language: str, code: str, analysis: Analysis, timeout_ms: int) -> Code:
        return cls(
            language,
            code,
            analysis.entrypoint,
            timeout_ms,
            analysis.imports,
            analysis.script,
            analysis.takes_ctx,
        )


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
    "not_admitted",  # the link refused the run once a process was ready (nothing ran)
]


@dataclass(slots=True)
class ResourceShare:
    """Resources one root call shares with every sandbox run nested under it.

    Opaque to the services: the sandbox fills ``group`` on the root run (its resource
    group, e.g. a cgroup) and charges nested runs to the same group, so the per-call
    memory and CPU caps hold for the whole tree of runs, not per process."""

    group: Any = None


@dataclass(slots=True)
class RunRequest:
    language: str
    code: str
    entry: str
    input: dict[str, Any]
    timeout_ms: int
    context: dict[str, Any] = field(default_factory=dict)
    workspace_id: str = ""  # whose call this is (fair shares between workspaces)
    call_id: str = ""  # the call the run belongs to (every frame is tied to it)
    share: ResourceShare | None = None  # None: a root run with resources of its own
    # A nested run's end (time.monotonic()): its caller's deadline. Whatever it waits for
    # before it starts (a package install, a process), it never runs past it.
    not_after: float | None = None
    # From the code's Analysis (domain/analysis.py), so the sandbox parses nothing: the
    # modules it imports (the listed packages among them are installed first), and what a
    # JavaScript engine runs instead of ``code`` (exports stripped, imports as require).
    imports: tuple[str, ...] = ()
    script: str = ""
    # The code can make no ctx call (its Analysis.takes_ctx is False): a runner may run it
    # one way (runners/wire.py RunOneWay).
    one_way: bool = False


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


class RunLink(Protocol):
    """One run's way back to the platform, made per run by the service and dropped after.

    The sandbox never holds a service: it gets this for one run and calls it from the
    thread that runs the call."""

    def admit(self) -> bool:
        """Called once a sandbox process is ready, before any byte of the tool is sent:
        False refuses the run (outcome ``not_admitted``), e.g. the tool was disabled
        while the call waited for a process."""
        ...

    def ended(self) -> None:
        """Called once an admitted run is over, before its process and slot are handed to
        another call (optional: the sandbox calls it when the link has it), so that a call
        queued behind this one is admitted only once this run's record is written."""
        ...

    def call(self, name: str, payload: Any) -> Any:
        """A ``ctx.tools`` call; returns the value or error envelope the code receives."""
        ...

    def audit(self, event: str, data: Any) -> str | None:
        """A ``ctx.audit`` row: None when it was kept, else why it cannot be stored (it is
        dropped, and the run's ``logs.stderr`` says so)."""
        ...


def unavailable_runtime() -> dict[str, Any]:
    """How a language no sandbox or runner offers is described (a fresh value each time)."""
    return {
        "available": False,
        "ready": False,
        "entrypoints": [],
        "return_contract": "",
        "ctx": [],
        "limits": {},
        "isolation": {},
        "dependencies": [],
    }
