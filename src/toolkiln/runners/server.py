"""The runner's gRPC server: the ``Run`` stream of each run, ``Analyse``, ``Describe``,
``Health`` and ``Prepare``, behind the runner credential.

A run's sandbox work happens on a thread of the runner's own (``_RUNS``); the gRPC thread
of its stream sends what that thread puts in the run's queue. Its link back to the API
(``StreamLink``) reads the API's answers from the same stream: a ctx call is answered by the
API process that sent the run, on that run's stream, and by nothing else.
"""

from __future__ import annotations

import hmac
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from opentelemetry.trace import SpanKind

from toolkiln.domain.errors import ServiceUnavailable, TooManyRequests
from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.runners import wire
from toolkiln.runners.host import RunnerHost
from toolkiln.sandbox.jail import protocol
from toolkiln.services import tracing

log = logging.getLogger("toolkiln.runner")
# A run whose process was ready within this long of its arrival keeps the admission the API
# gave when it sent it; a run that waited longer (its workspace's turn, a process) asks the
# API again (the status is decided when the run starts). The API's own window
# (services/admission.py ADMIT_FRESH_S) is as long.
ADMIT_FRESH_S = 0.001
# Runs at once on one runner, nested runs included; beyond the sandboxes' places a run waits
# in its sandbox's fair queue, not here.
MAX_RUNS = 512


# The answer to a ctx call whose input JSON cannot spell (the jail's reader takes 1e400 as
# infinity): the call never reaches the API (tests/security/test_unstorable_rows.py).
NOT_JSON = {
    "error": "invalid_input",
    "details": "the input holds a number JSON cannot spell (infinite or NaN)",
}


class LinkLost(Exception):
    """The API's side of the stream ended before the run did."""


class _Link:
    """What the links of both kinds of run share: the run's arrival, its process, which a
    cancelled call kills."""

    def __init__(self, start: wire.Start, admitted: Callable[[], None]) -> None:
        self._start = start
        self._admitted = admitted  # RunnerHost.admitted
        self._arrived = time.monotonic()
        self._arrived_ns = time.time_ns()
        # What this run's ctx calls tell the API to put their spans under: the runner's span
        # of the run when this runner traces, else the API's own (Start.traceparent).
        self.traceparent = start.traceparent
        self._kill: Callable[[], None] | None = None
        self._kill_lock = threading.Lock()
        self._cancelled = False

    def _fresh(self) -> bool:
        """Whether the run's process was ready soon enough to keep the API's admission."""
        if tracing.on():  # from its arrival until a process was ready for it
            tracing.started("sandbox.wait", self._arrived_ns, time.time_ns())
        return self._start.admitted and time.monotonic() - self._arrived <= ADMIT_FRESH_S

    def started(self, kill: Callable[[], None] | None) -> None:
        """The run's process, which a cancelled call kills; None once it is handed back."""
        with self._kill_lock:
            self._kill = kill
            if kill is not None and self._cancelled:
                kill()

    def cancel(self) -> None:
        """The call ended (the API cancelled, went away, or its deadline passed)."""
        with self._kill_lock:
            self._cancelled = True
            if self._kill is not None:
                self._kill()


class Waiters:
    """The stream runs of one runner not admitted yet, by language: a one-way run that ends
    while calls wait for its place names itself in theirs (``Started.after``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[str, set[StreamLink]] = {}

    def add(self, language: str, link: StreamLink) -> None:
        with self._lock:
            self._links.setdefault(language, set()).add(link)

    def take(self, language: str, link: StreamLink) -> list[str]:
        """``link`` waits no more: the one-way runs that ended while it waited."""
        with self._lock:
            self._links.get(language, set()).discard(link)
            after, link.after = link.after, []
            return after

    def ended(self, language: str, key: str) -> None:
        with self._lock:
            for link in self._links.get(language, ()):
                link.after.append(key)


class StreamLink(_Link):
    """One run's ``RunLink`` on the runner: each ctx call, audit row and admission goes to
    the API on the run's stream and waits for its answer there."""

    def __init__(
        self,
        start: wire.Start,
        answers: Iterator[bytes],
        out: queue.SimpleQueue[bytes | None],
        waiting: Callable[[], int],
        waiters: Waiters,
        admitted: Callable[[], None],
    ) -> None:
        super().__init__(start, admitted)
        self._answers = answers
        self._out = out
        self._waiting = waiting
        self._waiters = waiters
        self.after: list[str] = []  # guarded by the waiters' lock
        self._ids = 0
        self._lost = False
        waiters.add(start.language, self)

    def _send(self, message: wire.Message) -> None:
        self._out.put(wire.encode(message))

    def _next(self, kind: type[Any]) -> Any:
        """The API's next answer of ``kind`` (a late ``Ack`` nobody waited for is skipped)."""
        if self._lost:
            raise LinkLost()
        try:
            for raw in self._answers:
                message = wire.decode(raw, wire.Admit, wire.Reply, wire.AuditAck, wire.Ack)
                if isinstance(message, kind):
                    return message
                if not isinstance(message, wire.Ack):
                    break
        except (grpc.RpcError, ValueError):
            pass
        self._lost = True
        raise LinkLost()

    def admit(self) -> bool:
        ask = not self._fresh()
        after = self._waiters.take(self._start.language, self)
        self._send(wire.Started(ask, after if ask else []))
        if ask and not self._next(wire.Admit).ok:
            return False
        self._admitted()
        return True

    def gone(self) -> None:
        """The run is over (or never got a process)."""
        self._waiters.take(self._start.language, self)

    def call(self, name: str, payload: Any) -> Any:
        self._ids += 1
        try:
            self._send(wire.Call(self._ids, name, payload, self.traceparent))
        except wire.WireError:
            return dict(NOT_JSON)
        reply = self._next(wire.Reply)
        if reply.id != self._ids:
            self._lost = True
            raise LinkLost()
        if reply.late:  # the sandbox ends the run as a timeout (Sandbox.run_acquired)
            raise protocol.FrameError("timeout", "the run's time ran out during a ctx call")
        return reply.value

    def audit(self, event: str, data: Any) -> str | None:
        try:
            self._send(wire.AuditRow(event, data))
        except wire.WireError:
            return "data holds a number JSON cannot spell (infinite or NaN)"
        why = self._next(wire.AuditAck).why
        return why if isinstance(why, str) else None

    def ended(self) -> None:
        """A call waits for this run's place: the API notes the end first (RunLink.ended).
        Else the outcome, sent next, tells it."""
        if self._lost or not self._waiting():
            return
        self._send(wire.Ended())
        try:
            self._next(wire.Ack)
        except LinkLost:
            return


class OneWayCtx(Exception):
    """A one-way run's code made a ctx call: the run is given up, nothing of it kept."""


class OneWayLink(_Link):
    """The link of a one-way run (``RunOneWay``): nothing goes back to the API before the
    outcome. It keeps the API's admission only when a process was ready at once (else the
    run is declined and sent again on the stream, which asks), and a ctx call or audit row
    (code the API judged to take no ctx reaching it anyway) gives the run up: the tool's
    only way out of its process is ctx, so nothing of it was seen, and the API runs it
    again on the stream."""

    def __init__(
        self,
        start: wire.Start,
        context: grpc.ServicerContext,
        waiting: Callable[[], int],
        waiters: Waiters,
        admitted: Callable[[], None],
    ) -> None:
        super().__init__(start, admitted)
        self._context = context
        self._waiting = waiting
        self._waiters = waiters
        self.declined = ""

    def admit(self) -> bool:
        if not self._fresh():
            self.declined = "wait"
            return False
        self._context.send_initial_metadata(((wire.STARTED_KEY, "1"),))
        self._admitted()
        return True

    def call(self, name: str, payload: Any) -> Any:
        self.declined = "ctx"
        raise OneWayCtx()

    def audit(self, event: str, data: Any) -> str | None:
        self.declined = "ctx"
        raise OneWayCtx()

    def ended(self) -> None:
        """Calls wait for this run's place: each names it when it asks for admission."""
        if self._waiting():
            self._waiters.ended(self._start.language, self._start.key)


@dataclass
class RunnerService:
    host: RunnerHost

    def __post_init__(self) -> None:
        self._runs = ThreadPoolExecutor(MAX_RUNS, thread_name_prefix="toolkiln-run")
        self._waiters = Waiters()
        self._closing = False

    def _begin(
        self, raw: bytes | None, context: grpc.ServicerContext
    ) -> tuple[wire.Start, Any, RunRequest]:
        """The run's ``Start``, its sandbox, and its request, its share held (``_run``
        leaves it, or the caller if it never runs); aborts the call if it cannot be
        taken."""
        try:
            if raw is None:
                raise wire.WireError("the stream ended")
            start: wire.Start = wire.decode(raw, wire.Start)
        except wire.WireError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"no run request: {exc}")
        sandbox = self.host.sandboxes.get(start.language)
        if sandbox is None:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "no such runtime")
        share = None if self._closing else self.host.enter(start.share)
        if share is None:  # draining or stopping: never started, so placed elsewhere
            _abort(context, grpc.StatusCode.UNAVAILABLE, "the runner is draining")
        not_after = None
        if start.left_ms is not None:
            not_after = time.monotonic() + start.left_ms / 1000
        req = RunRequest(
            start.language,
            start.code,
            start.entry,
            start.input,
            start.timeout_ms,
            start.context,
            workspace_id=start.workspace_id,
            call_id=start.call_id,
            share=share,
            not_after=not_after,
            imports=tuple(start.imports),
            script=start.script,
        )
        return start, sandbox, req

    def _run(self, start: wire.Start, sandbox: Any, req: RunRequest, link: _Link) -> RunOutcome:
        """The run in its sandbox, on this thread; then the share ``_begin`` held is left."""
        try:
            return traced(start, lambda: sandbox.run(req, link), link)
        finally:
            self.host.leave(start.share)  # held by the run, not by its stream

    def run(self, answers: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        start, sandbox, req = self._begin(next(answers, None), context)
        out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        link = StreamLink(
            start, answers, out, sandbox.fair.waiting, self._waiters, self.host.admitted
        )
        context.add_callback(link.cancel)

        def work() -> None:
            try:
                outcome = self._run(start, sandbox, req, link)
            except LinkLost:
                outcome = RunOutcome("infra", message="The API went away during the run.")
            except Exception:
                log.exception("a run failed on the runner")
                outcome = RunOutcome("infra", message="The runner failed.")
            finally:
                link.gone()
            out.put(done_of(outcome))
            out.put(None)

        try:
            self._runs.submit(work)
        except RuntimeError:  # closing
            self.host.leave(start.share)
            link.gone()
            context.abort(grpc.StatusCode.UNAVAILABLE, "the runner is stopping")
        while (message := out.get()) is not None:
            yield message

    def run_one_way(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """A run of code that makes no ctx call, on this thread, its outcome the answer
        (wire.py says when it is ``Declined``)."""
        start, sandbox, req = self._begin(request, context)
        if not start.key or not sandbox.at_once(req):
            # It would wait for a place: asked for admission then, which only a stream can.
            self.host.leave(start.share)
            return wire.encode(wire.Declined("busy"))
        link = OneWayLink(start, context, sandbox.fair.waiting, self._waiters, self.host.admitted)
        context.add_callback(link.cancel)
        try:
            outcome = self._run(start, sandbox, req, link)
        except OneWayCtx:
            outcome = None
        except Exception:
            log.exception("a run failed on the runner")
            outcome = RunOutcome("infra", message="The runner failed.")
        if link.declined:
            return wire.encode(wire.Declined(link.declined))
        assert outcome is not None
        return done_of(outcome)

    def describe(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return json.dumps({n: s.describe() for n, s in self.host.sandboxes.items()}).encode()

    def health(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return json.dumps(self.host.health()).encode()

    def prepare(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            ask = wire.decode(request, wire.Prepare)
        except wire.WireError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        sandbox = self.host.sandboxes.get(ask.language)
        if sandbox is not None:
            sandbox.prepare(ask.imports)
        return b"{}"

    def analyse(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """One text checked by the runner's code checkers, within their bounds and the
        workspace's fair share of them (sandbox/checks.py)."""
        try:
            ask = wire.decode(request, wire.Analyse)
        except wire.WireError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            analysis = self.host.analyse(ask.language, ask.code, ask.workspace_id)
        except TooManyRequests:
            return wire.encode(wire.Analysed(refused="queued"))
        except ServiceUnavailable:
            return wire.encode(wire.Analysed(refused="busy"))
        if analysis is None:  # draining: the API asks another runner
            context.abort(grpc.StatusCode.UNAVAILABLE, "the runner is draining")
            return b""
        return wire.encode(wire.Analysed.of(analysis))

    def close(self) -> None:
        self._closing = True
        self._runs.shutdown(wait=False, cancel_futures=True)


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, why: str) -> NoReturn:
    context.abort(code, why)
    raise AssertionError("ServicerContext.abort raises")


def done_of(outcome: RunOutcome) -> bytes:
    try:
        return wire.encode(wire.Done.of(outcome))
    except wire.WireError:
        return wire.encode(wire.Done("infra", message="The outcome is not JSON."))


def traced(start: wire.Start, run: Callable[[], RunOutcome], link: _Link) -> RunOutcome:
    """``run()`` under a span of this runner's (when it traces) below the API's span of the
    run, named by the traceparent the API sent."""
    if not tracing.on():
        return run()
    parent = tracing.extract({"traceparent": start.traceparent}) if start.traceparent else None
    attributes = {"toolkiln.language": start.language, "toolkiln.workspace.id": start.workspace_id}
    with (
        tracing.resumed(parent),
        tracing.span("runner.serve", attributes, SpanKind.SERVER) as span,
    ):
        link.traceparent = tracing.traceparent() or start.traceparent
        outcome = run()
        span.set_attribute("toolkiln.run.outcome", outcome.kind)
        return outcome


class TokenCheck(grpc.ServerInterceptor):
    """Refuses every call that does not carry the runner credential (constant-time compare)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

        def refuse(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the runner credential is wrong")

        self._refuse = grpc.unary_unary_rpc_method_handler(refuse)

    def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        given = b""
        for key, value in details.invocation_metadata or ():
            if key == wire.TOKEN_KEY:
                given = value.encode() if isinstance(value, str) else value
        if hmac.compare_digest(given, self._token):
            return continuation(details)
        return self._refuse


def handlers(service: RunnerService) -> grpc.GenericRpcHandler:
    same = wire.identity
    return grpc.method_handlers_generic_handler(
        wire.SERVICE,
        {
            "Run": grpc.stream_stream_rpc_method_handler(service.run, same, same),
            "RunOneWay": grpc.unary_unary_rpc_method_handler(service.run_one_way, same, same),
            "Describe": grpc.unary_unary_rpc_method_handler(service.describe, same, same),
            "Health": grpc.unary_unary_rpc_method_handler(service.health, same, same),
            "Prepare": grpc.unary_unary_rpc_method_handler(service.prepare, same, same),
            "Analyse": grpc.unary_unary_rpc_method_handler(service.analyse, same, same),
        },
    )


# Keepalive: an API that vanished without closing its connections (a host lost) is noticed
# within ~30 s and its runs are cancelled (their processes killed).
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", wire.TO_RUNNER_BYTES),
    ("grpc.max_send_message_length", max(wire.FROM_RUNNER_BYTES, wire.ANALYSED_BYTES)),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def make_server(
    service: RunnerService,
    listen: str,
    token: str,
    credentials: grpc.ServerCredentials | None = None,
) -> tuple[grpc.Server, int]:
    """A started server on ``listen`` (``unix:/path`` or ``host:port``; port 0: any free
    one), and the port it took."""
    server = grpc.server(
        ThreadPoolExecutor(MAX_RUNS + 16, thread_name_prefix="toolkiln-grpc"),
        handlers=[handlers(service)],
        interceptors=[TokenCheck(token)],
        options=SERVER_OPTIONS,
        maximum_concurrent_rpcs=MAX_RUNS + 64,
    )
    if credentials is None:
        bound = server.add_insecure_port(listen)
    else:
        bound = server.add_secure_port(listen, credentials)
    if not bound and not listen.startswith("unix:"):
        raise OSError(f"cannot listen on {listen}")
    server.start()
    return server, bound
