"""The API<->runner protocol: the gRPC methods, every message either side sends, and the caps.

Both sides load this one module (as both sides of the jail load ``jail/protocol.py``).
Transport: gRPC over HTTP/2 (grpcio), a Unix socket or TCP; each message is one object of
UTF-8 JSON with ``op`` naming its kind, never pickle. Payloads are JSON values end to end
(a tool's input, its ctx calls, its result), so they stay JSON here (docs/decisions/
130-runners-over-grpc.md says why not protobuf).

``Run`` is one bidirectional stream per run: the API sends ``Start``; the runner answers
``Started`` once a process is ready (asking for admission when the call queued), then any
number of ``Call`` and ``AuditRow`` (each answered by the API with ``Reply`` or
``AuditAck`` on the same stream), ``Ended`` when the run is over but others wait for its
place (answered by ``Ack``), and ``Done``, the outcome. Everything a runner sends is
evidence from a process that runs tool code: it is read with caps, its types checked, its
text repaired (a lone surrogate), and anything outside these rules ends the run as
``infra`` (the runner's failure, never counted against the tool).

``RunOneWay`` is unary, for code that can make no ctx call (``Start.key`` names the run):
the runner sends ``STARTED_KEY`` as initial metadata once the run is admitted and answers
``Done``; or ``Declined`` (nothing of the run is left) when it would have had to wait or
ask for admission again, or the code made a ctx call after all: the API then sends the run
on the stream (or, when only its process was late, admits it again and sends it one way
once more). A one-way run that ended while calls waited for its place
is named in the ``Started.after`` of those calls, so their admission waits until the API
has noted its end (what ``Ended`` does on the stream).

``Analyse`` is unary: the API sends one text of tool code, the runner's code checkers answer
``Analysed`` (sandbox/checks.py). Its answer is evidence too: read under the same rules,
then checked as an answer of a checker is (``domain/analysis.Analysis.from_wire``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, get_args

from toolkiln.domain.analysis import Analysis
from toolkiln.domain.execution import OutcomeKind, RunOutcome
from toolkiln.sandbox.jail import protocol

SERVICE = "toolkiln.runner.v1.Runner"
RUN = f"/{SERVICE}/Run"
RUN_ONE_WAY = f"/{SERVICE}/RunOneWay"
# The runner's initial metadata on a one-way run, sent once the run is admitted there: a
# failure after it is the run's (infra), one before it means the run never started.
STARTED_KEY = "x-toolkiln-started"
DESCRIBE = f"/{SERVICE}/Describe"
HEALTH = f"/{SERVICE}/Health"
PREPARE = f"/{SERVICE}/Prepare"
ANALYSE = f"/{SERVICE}/Analyse"
# The runner credential travels in this metadata key (compared in constant time).
TOKEN_KEY = "x-toolkiln-runner-token"  # noqa: S105 (a name, not a value)

MIB = 1024 * 1024
# What the runner may send in one message: a result (1 MiB) with both logs (64 KiB each)
# and the rest of a report, or a ctx call's input (under the 1 MiB reply cap's sibling).
FROM_RUNNER_BYTES = 2 * MIB
# What the API may send: a run's code (<= 256K characters), input and context (the jail's
# request cap is 4 MiB) with room for JSON escapes.
TO_RUNNER_BYTES = 8 * MIB
# What an analysis may be: a JavaScript script can be ~4x its code, and JSON escapes more
# (the answer cap of a code checker's frame, sandbox/checks.py).
ANALYSED_BYTES = 8 * MIB
OUTCOME_KINDS = frozenset(get_args(OutcomeKind))
# A W3C traceparent is 55 characters (version 00); later versions may append fields.
MAX_TRACEPARENT_CHARS = 256


class WireError(Exception):
    """A message that is not within the protocol."""


# --- API -> runner


@dataclass(frozen=True, slots=True)
class Start:
    """The one request of a run. ``share``: the id of the call's resource share (the root
    run's cgroup slot and audit quota; every run nested under one call names the same);
    ``left_ms``: a nested run's time until its caller's deadline (clocks are per host);
    ``admitted``: the API admitted the run as it sent it (the runner asks again if the call
    had to wait for a process)."""

    language: str
    code: str
    entry: str
    input: dict[str, Any]
    timeout_ms: int
    context: dict[str, Any]
    workspace_id: str
    call_id: str
    share: str
    left_ms: int | None = None
    admitted: bool = True
    # From the code's analysis (the API's checkers), so the runner parses nothing: the
    # modules it imports, and a JavaScript engine's script form of it (RunRequest).
    imports: list[str] = field(default_factory=list)
    script: str = ""
    # The W3C traceparent of the API's span of this run, when the API traces: the runner's
    # own spans go under it, and its ctx calls carry one back (``Call.traceparent``).
    traceparent: str = ""
    # A one-way run's name (RunOneWay), unique in the API process that sent it; "" on the
    # stream.
    key: str = ""


@dataclass(frozen=True, slots=True)
class Admit:
    ok: bool


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to a ctx call. ``late``: the calling run's time ran out while it was
    answered, as the API counts it (the run then ends as a timeout, as in-process)."""

    id: int
    value: Any
    late: bool = False


@dataclass(frozen=True, slots=True)
class AuditAck:
    why: str | None  # None: the row was kept; else why it cannot be stored


@dataclass(frozen=True, slots=True)
class Ack:
    """The API has taken note that the run ended (``Ended``)."""


@dataclass(frozen=True, slots=True)
class Prepare:
    language: str
    imports: list[str]


@dataclass(frozen=True, slots=True)
class Analyse:
    """A static check of one text of tool code (parse, entrypoint, imports), for the
    workspace whose text it is (its fair share of the runner's code checkers)."""

    language: str
    code: str
    workspace_id: str


# --- runner -> API


@dataclass(frozen=True, slots=True)
class Started:
    ask: bool  # the call waited for a process: the API decides again whether it runs
    # With ``ask``: the one-way runs (``Start.key``) that ended while this run waited for a
    # place, whose ends the API notes before it decides.
    after: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Declined:
    """A one-way run that did not run to its end and left nothing: ``why`` "busy" (no
    place was free: it would have waited in the queue), "wait" (its process was not ready
    at once: it would have had to ask for admission again; the API may admit it again and
    send it once more) or "ctx" (its code made a ctx call)."""

    why: str


@dataclass(frozen=True, slots=True)
class Call:
    """A ctx call. ``traceparent``: where the API's span of it goes (the runner's span of
    the run, or the run's own ``Start.traceparent``); the API takes it only within the
    run's trace."""

    id: int
    tool: str
    input: Any
    traceparent: str = ""


@dataclass(frozen=True, slots=True)
class AuditRow:
    event: str
    data: Any


@dataclass(frozen=True, slots=True)
class Ended:
    """The run is over and another call waits for its place: the API notes it (``Ack``)."""


@dataclass(frozen=True, slots=True)
class Done:
    kind: str
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

    @classmethod
    def of(cls, outcome: RunOutcome) -> Done:
        return cls(
            outcome.kind,
            outcome.value,
            outcome.error_type,
            outcome.message,
            outcome.line,
            outcome.column,
            outcome.stdout,
            outcome.stderr,
            outcome.duration_ms,
            outcome.ctx_calls,
            outcome.details,
        )

    def outcome(self) -> RunOutcome:
        return RunOutcome(
            self.kind,  # type: ignore[arg-type]
            self.value,
            self.error_type,
            self.message,
            self.line,
            self.column,
            self.stdout,
            self.stderr,
            self.duration_ms,
            self.ctx_calls,
            self.details,
        )


@dataclass(frozen=True, slots=True)
class Analysed:
    """The answer to ``Analyse``. ``refused``: "" (the analysis is in the other fields),
    "queued" (the workspace has its share of checks under way on the runner), "busy" (no
    code checker was free in time). ``limit``: the analysis did not finish (over its time
    or memory, or its checker failed: ``Analysis.limit``), its one problem says which.
    The other fields are ``Analysis.to_wire``'s."""

    refused: str = ""
    limit: str = ""
    problems: list[Any] = field(default_factory=list)
    entrypoint: str = ""
    imports: list[str] = field(default_factory=list)
    script: str = ""
    takes_ctx: bool = True

    @classmethod
    def of(cls, analysis: Analysis) -> Analysed:
        wired = analysis.to_wire()
        return cls(
            "",
            analysis.limit,
            wired["problems"],
            wired["entrypoint"],
            wired["imports"],
            wired["script"],
            wired["takes_ctx"],
        )

    def analysis(self) -> dict[str, Any]:
        """The fields an ``Analysis`` is read from (``Analysis.from_wire``)."""
        return {
            "problems": self.problems,
            "entrypoint": self.entrypoint,
            "imports": self.imports,
            "script": self.script,
            "takes_ctx": self.takes_ctx,
        }


Message = (
    Start
    | Admit
    | Reply
    | AuditAck
    | Ack
    | Prepare
    | Analyse
    | Started
    | Declined
    | Call
    | AuditRow
    | Ended
    | Done
    | Analysed
)
OPS: dict[str, type[Any]] = {
    "start": Start,
    "admit": Admit,
    "reply": Reply,
    "audit_ack": AuditAck,
    "ack": Ack,
    "prepare": Prepare,
    "analyse": Analyse,
    "started": Started,
    "declined": Declined,
    "call": Call,
    "audit": AuditRow,
    "ended": Ended,
    "done": Done,
    "analysed": Analysed,
}
_OP_OF = {kind: op for op, kind in OPS.items()}
# What each field may hold (JSON types), checked on decode: a field of another type is a
# message outside the protocol. "any": any JSON value.
_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "dict": (dict,),
    "strs": (list,),
    "list": (list,),
}
_SPEC: dict[type[Any], dict[str, tuple[str, bool]]] = {}  # kind -> field -> (type, optional)
_ANNOTATIONS = {
    "str": ("str", False),
    "int": ("int", False),
    "bool": ("bool", False),
    "float": ("float", False),
    "dict[str, Any]": ("dict", False),
    "list[str]": ("strs", False),
    "list[Any]": ("list", False),
    "Any": ("any", True),
    "str | None": ("str", True),
    "int | None": ("int", True),
}
for _kind in OPS.values():
    _SPEC[_kind] = {f.name: _ANNOTATIONS[str(f.type)] for f in fields(_kind)}


_UNSENT_EMPTY = ("traceparent", "key", "after")


def encode(message: Message) -> bytes:
    """One message as UTF-8 JSON. Lone surrogates in its text are replaced (U+FFFD); a
    value JSON cannot spell (a number past a float's range, read from the jail as
    infinity) is ``WireError``."""
    # The fields as they are, not ``asdict``'s deep copy: no field holds a dataclass (their
    # types are JSON's, _ANNOTATIONS), and encoding reads them without changing them.
    kind = type(message)
    body = {"op": _OP_OF[kind]}
    for name in _SPEC[kind]:
        body[name] = getattr(message, name)
    for name in _UNSENT_EMPTY:
        if name in body and not body[name]:
            # Not traced, not one-way, nothing to wait for: as a peer without them knows it.
            del body[name]
    try:
        return protocol.encode(body, repair=True)[protocol.HEADER.size :]
    except (ValueError, TypeError, RecursionError) as exc:
        raise WireError(f"not JSON: {str(exc)[:200]}") from None


def decode(raw: bytes, *expected: type[Any]) -> Any:
    """The message in ``raw``, one of the ``expected`` kinds, its fields checked; else
    ``WireError``. Text is repaired (a lone surrogate becomes U+FFFD); a ``Done`` whose
    returned value needed that is reported as ``unserializable``, as the host reports a
    repaired result from the jail."""
    try:
        # The jail protocol's text rules: UTF-8, no NaN, lone surrogates repaired and named.
        body, repaired = protocol.decode(raw)
    except protocol.FrameError as exc:
        raise WireError(str(exc)) from None
    if not isinstance(body, dict):
        raise WireError("a message must be an object")
    kind = OPS.get(str(body.pop("op", "")))
    if kind is None or kind not in expected:
        raise WireError("an unexpected kind of message")
    spec = _SPEC[kind]
    if set(body) - set(spec):
        raise WireError("unknown fields in a message")
    for name, (type_name, optional) in spec.items():
        if name not in body:
            continue
        value = body[name]
        if (value is None and optional) or type_name == "any":
            continue
        allowed = _TYPES[type_name]
        if not isinstance(value, allowed) or (type_name != "bool" and isinstance(value, bool)):
            raise WireError(f"field {name} has the wrong type")
        if isinstance(value, list) and type_name == "strs":
            if not all(isinstance(item, str) for item in value):
                raise WireError(f"field {name} has the wrong type")
    if len(body.get("traceparent", "")) > MAX_TRACEPARENT_CHARS:
        raise WireError("field traceparent is too long")
    try:
        message = kind(**body)
    except TypeError:
        raise WireError("missing fields in a message") from None
    if kind is Analysed and repaired:  # a checker's answer is refused for it too
        raise WireError("an analysis holding text that is not valid Unicode")
    if kind is Done:
        if message.kind not in OUTCOME_KINDS:
            raise WireError("an unknown outcome kind")
        if "value" in repaired and message.kind == "return":
            message = Done(
                "unserializable",
                message="It holds text that is not valid Unicode (a lone surrogate).",
                stdout=message.stdout,
                stderr=message.stderr,
                duration_ms=message.duration_ms,
                ctx_calls=message.ctx_calls,
            )
    return message


def identity(data: bytes) -> bytes:
    """gRPC's (de)serializer: messages are bytes to gRPC, decoded here with their rules."""
    return data
