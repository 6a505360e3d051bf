"""The spans of a call: one place that names them and says what they carry.

Spans are made through the OpenTelemetry API with the tracer ``use`` was given; without one
(no ``OTEL_*`` configuration: ``toolkiln/telemetry.py``) every helper here answers a shared
do-nothing context at once, and nothing is made, attached or formatted: the call path pays
one ``is None`` per span (docs/decisions/300-traces.md).

What a span may hold: ids, names, versions, outcomes, error codes and durations. A call's
arguments and result are recorded only when the setting says so (``record_io``), capped,
through the redaction of logs (``redact``); never a secret's value, a token or a header
(tests/api/test_traces.py: no argument and no secret in any span by default).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from toolkiln.domain.origin import Origin
from toolkiln.domain.results import Result

# What a recorded argument or result may hold at most, in characters.
MAX_IO_CHARS = 4096
MAX_NAME_CHARS = 128
_W3C = TraceContextTextMapPropagator()


class _Off:
    """The context of a span not made: enters as the API's invalid span, whose methods do
    nothing, and attaches nothing."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return INVALID_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


OFF = _Off()


class _State:
    __slots__ = ("record_io", "redact", "tracer")

    def __init__(self) -> None:
        self.tracer: Tracer | None = None
        self.record_io = False
        self.redact: Callable[[str], str] = lambda text: text


_state = _State()


def use(
    tracer: Tracer | None,
    *,
    record_io: bool = False,
    redact: Callable[[str], str] | None = None,
) -> None:
    """Make spans with ``tracer`` from now on in this process (None: make none).
    ``record_io``: a tool call's arguments and result go into its span, through ``redact``."""
    _state.tracer = tracer
    _state.record_io = record_io
    _state.redact = redact or (lambda text: text)


def on() -> bool:
    return _state.tracer is not None


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> AbstractContextManager[Span]:
    """A child of the current span, current while the block runs."""
    tracer = _state.tracer
    if tracer is None:
        return OFF
    return tracer.start_as_current_span(
        name, kind=kind, attributes=attributes, record_exception=True
    )


def started(
    name: str,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """A span of something already over (a wait measured by its ends), under the current."""
    tracer = _state.tracer
    if tracer is not None:
        tracer.start_span(name, attributes=attributes, start_time=start_ns).end(end_ns)


def traceparent() -> str:
    """The current span as a W3C ``traceparent`` ("" when there is none)."""
    if _state.tracer is None:
        return ""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent", "")


def extract(headers: Mapping[str, str]) -> otel_context.Context | None:
    """The context a caller sent (``traceparent``, ``tracestate``), or None."""
    if _state.tracer is None or "traceparent" not in headers:
        return None
    found = _W3C.extract(headers)
    span_context = trace.get_current_span(found).get_span_context()
    return found if span_context.is_valid else None


@contextmanager
def _attached(ctx: otel_context.Context) -> Iterator[None]:
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def under(parent: str) -> AbstractContextManager[object]:
    """While the block runs, the span ``parent`` (a ``traceparent`` sent back by a runner)
    is current, when it belongs to the current trace; else nothing changes. A runner can
    only place spans within the trace of the run it was sent, never start or join another."""
    if _state.tracer is None or not parent:
        return OFF
    found = extract({"traceparent": parent})
    if found is None:
        return OFF
    given = trace.get_current_span(found).get_span_context().trace_id
    if given != trace.get_current_span().get_span_context().trace_id:
        return OFF
    return _attached(found)


def resumed(ctx: otel_context.Context | None) -> AbstractContextManager[object]:
    """While the block runs, ``ctx`` (a caller's, from ``extract``) is current."""
    if ctx is None:
        return OFF
    return _attached(ctx)


# -- the spans of a tool call


def tool_call(origin: Origin, name: str) -> AbstractContextManager[Span]:
    """``execute_tool {name}``: one call of a tool by name, root or nested, of any kind."""
    if _state.tracer is None:
        return OFF
    shown = name[:MAX_NAME_CHARS] if isinstance(name, str) else "?"
    caller = origin.caller
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": shown,
        "toolkiln.workspace.id": origin.workspace_id,
        "toolkiln.source": caller.source,
    }
    if caller.agent_id is not None:
        attributes["gen_ai.agent.id"] = caller.agent_id
    if caller.conversation_id is not None:
        attributes["session.id"] = caller.conversation_id
        attributes["gen_ai.conversation.id"] = caller.conversation_id
    return _state.tracer.start_as_current_span(
        f"execute_tool {shown}", attributes=attributes, record_exception=True
    )


def called(span: Span, origin: Origin, kind: str, result: Result, payload: Any = None) -> None:
    """What a tool call came to, on its ``execute_tool`` span. ``toolkiln.counted``: the call
    moved a stored tool's counters (it ran, outside a test run)."""
    if not span.is_recording():
        return
    counted = (
        kind == "custom"
        and result.tool_id is not None
        and origin.budget.counting
        and result.reached_execution
    )
    span.set_attribute("gen_ai.tool.call.id", result.tool_call_id)
    span.set_attribute("gen_ai.tool.type", "function" if kind == "custom" else "extension")
    span.set_attribute("toolkiln.kind", kind)
    span.set_attribute("toolkiln.outcome", result.status)
    span.set_attribute("toolkiln.counted", counted)
    span.set_attribute("toolkiln.ctx_calls", result.ctx_calls)
    if result.tool_id is not None:
        span.set_attribute("toolkiln.tool.id", result.tool_id)
    if result.version is not None:
        span.set_attribute("toolkiln.tool.version", result.version)
    if result.error is not None:
        span.set_attribute("error.type", str(result.error["code"]))
        span.set_status(trace.StatusCode.ERROR)
    if _state.record_io:
        span.set_attribute("gen_ai.tool.call.arguments", _shown(payload))
        span.set_attribute("gen_ai.tool.call.result", _shown(result.as_dict()))


def _shown(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        text = "[not JSON]"
    return _state.redact(text)[:MAX_IO_CHARS]  # redacted whole: no secret cut in two


# -- the span of an MCP message

# The methods whose span names a target, and the attribute that holds it (the conventions'
# ``{mcp.method.name} {target}``): a tool's or a prompt's name, from the message's params.
_MCP_TARGETS = {"tools/call": "gen_ai.tool.name", "prompts/get": "gen_ai.prompt.name"}


def mcp_message(
    method: str,
    params: Mapping[str, Any] | None,
    meta: Mapping[str, Any] | None,
    *,
    request_id: str | int | None,
    protocol_version: str,
    session_id: str | None,
    transport: str,
) -> AbstractContextManager[Span]:
    """``{mcp.method.name} {target}``: one MCP message the server received, a request or a
    notification, served or not, as a SERVER span under the ``traceparent`` the client put
    in its ``_meta`` (else under the current span). ``transport``: ``tcp`` (streamable
    HTTP) or ``pipe`` (stdio). What the client names (the method, a tool) is capped; no
    params but the target's name are read. The span records no exception: its message may
    quote what the client sent (``mcp_answered`` sets what it came to)."""
    tracer = _state.tracer
    if tracer is None:
        return OFF
    method = method[:MAX_NAME_CHARS] if isinstance(method, str) else "?"
    attributes: dict[str, Any] = {
        "mcp.method.name": method,
        "mcp.protocol.version": protocol_version,
        "network.transport": transport,
    }
    if transport == "tcp":
        attributes["network.protocol.name"] = "http"
    if request_id is not None:
        attributes["jsonrpc.request.id"] = str(request_id)
    if session_id:
        attributes["mcp.session.id"] = session_id[:MAX_NAME_CHARS]
    name = method
    key = _MCP_TARGETS.get(method)
    target = params.get("name") if key is not None and isinstance(params, Mapping) else None
    if key is not None and isinstance(target, str):
        target = target[:MAX_NAME_CHARS]
        attributes[key] = target
        name = f"{method} {target}"
        if method == "tools/call":
            attributes["gen_ai.operation.name"] = "execute_tool"
    carrier: dict[str, str] = {}
    if isinstance(meta, Mapping):
        carrier = {k: v for k in ("traceparent", "tracestate") if isinstance(v := meta.get(k), str)}
    return tracer.start_as_current_span(
        name,
        context=extract(carrier),
        kind=SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    )


def mcp_answered(span: Span, error_type: str | None, rpc_code: int | None = None) -> None:
    """What an MCP message came to, on its span: ``error_type`` when it failed (a JSON-RPC
    error's code, ``tool_error`` for a tool call answered as failed, a Toolkiln error's
    code, an exception's type), ``rpc_code`` the JSON-RPC error code the client was sent."""
    if error_type is None or not span.is_recording():
        return
    span.set_attribute("error.type", error_type[:MAX_NAME_CHARS])
    if rpc_code is not None:
        span.set_attribute("rpc.response.status_code", str(rpc_code))
    span.set_status(trace.StatusCode.ERROR)


# -- the span of a code check


def code_check(language: str, workspace_id: str) -> AbstractContextManager[Span]:
    """``code_check``: one text of tool code sent to a runner's code checkers (its
    ``Analyse``), under the request that saves, validates or runs it. Names the language
    and the workspace; never the code."""
    if _state.tracer is None:
        return OFF
    attributes = {
        "toolkiln.code.language": language[:MAX_NAME_CHARS],
        "toolkiln.workspace.id": workspace_id,
    }
    return _state.tracer.start_as_current_span(
        "code_check", kind=SpanKind.CLIENT, attributes=attributes, record_exception=False
    )


def code_checked(span: Span, outcome: str, problems: int = 0) -> None:
    """What a code check came to: ``toolkiln.code_check.outcome`` (``ok``; ``problems``;
    ``time`` or ``memory``, the limit the analysis met; ``failed``, the checkers failed on
    it or a runner answered out of the rules; else the error's code: ``unavailable``,
    ``too_many_requests``) and how many problems it found. The last two kinds are errors."""
    if not span.is_recording():
        return
    span.set_attribute("toolkiln.code_check.outcome", outcome)
    span.set_attribute("toolkiln.code_check.problems", problems)
    if outcome not in ("ok", "problems", "time", "memory"):
        span.set_attribute("error.type", outcome)
        span.set_status(trace.StatusCode.ERROR)
