"""The API's side of one runner: its channel, its last known load, and one run's stream.

A run's ctx calls are answered here, on the thread that made the run, through the run's own
``RunLink``: the runner gets nothing but the answers to the calls of that run.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.trace import SpanKind

from toolkiln.domain.execution import RunLink, RunOutcome, RunRequest
from toolkiln.runners import wire
from toolkiln.sandbox.jail.protocol import Caps
from toolkiln.services import tracing

# Beyond a run's own timeout: what a runner may need before and after it (its process's
# exit, the outcome's way back) before the API gives the run up as the runner's failure.
DEADLINE_MARGIN_S = 5.0
HEALTH_TIMEOUT_S = 2.0
CROWDED_S = 0.25  # how long a runner's busy answer keeps runs beyond it on the stream
CHANNEL_OPTIONS = [
    # The largest answer of any method (an analysis); a run's messages are held to
    # wire.FROM_RUNNER_BYTES as they are read (RunnerClient.run).
    ("grpc.max_receive_message_length", max(wire.FROM_RUNNER_BYTES, wire.ANALYSED_BYTES)),
    ("grpc.max_send_message_length", wire.TO_RUNNER_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A runner restarted on the same address is reconnected to at once, not after backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


# Upper bounds (seconds) of the histogram of runs' waits from being sent to starting.
WAIT_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
CAPS = Caps()
# Audit rows' bytes as the API reads them: the jail's cap on a call's rows, with room for the
# message around each row.
AUDIT_BYTES = CAPS.audit_bytes + CAPS.audit_rows * 256
# What a runner answers a run it never started: unreachable or draining, or our credential
# refused. Any other failure may come after the run started (its process killed with it).
NOT_STARTED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
FROM_RUNNER = (wire.Started, wire.Call, wire.AuditRow, wire.Ended, wire.Done)


class NotStarted(Exception):
    """The run never started on that runner (unreachable, draining): place it elsewhere.
    ``again``: what to send there instead of a fresh start, for a run a one-way try declined
    (its admission asked again, its time as ``_again`` says)."""

    def __init__(self, message: str = "", again: wire.Start | None = None) -> None:
        super().__init__(message)
        self.again = again


class _Answers:
    """The API's half of a run's stream: what it sends, in order, until it is closed."""

    def __init__(self, first: bytes) -> None:
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._queue.put(first)

    def __iter__(self) -> _Answers:
        return self

    def __next__(self) -> bytes:
        item = self._queue.get()
        if item is None:
            raise StopIteration
        return item

    def send(self, message: wire.Message) -> None:
        self._queue.put(wire.encode(message))

    def close(self) -> None:
        self._queue.put(None)


def infra(message: str, started: float) -> RunOutcome:
    return RunOutcome("infra", message=message, duration_ms=(time.perf_counter() - started) * 1000)


@dataclass
class RunnerClient:
    """One runner, by address. ``state``: "serving", "draining", "degraded" (it runs calls,
    a pool is healing), "unreachable", or "refused" (it does not accept our credential)."""

    address: str
    token: str
    credentials: grpc.ChannelCredentials | None = None
    state: str = "unknown"
    places: int = 0
    in_flight: int = 0  # as the runner last said
    waiting: int = 0
    analyses: int = 0  # code checks it made, as it last said
    started: int = 0  # runs admitted on it (from every API process), as it last said
    mine: int = 0  # runs and analyses of this process on it now
    runs: int = 0  # runs of this process that started on it
    waited_s: float = 0.0  # their time from being sent to starting (the hop, the queue)
    # Those times by WAIT_BUCKETS (a run counted in the first bucket it fits; the last: +Inf).
    waits: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))
    # How this process's runs went there: "one_way" (one unary call ran it), "stream" (sent
    # on the stream at once: traced, or its runner crowded), or declined one way and why
    # ("busy", "wait", "ctx"): a run declined is one more round trip, "wait" a status re-read.
    paths: dict[str, int] = field(default_factory=dict)
    checked: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.credentials is None:
            self.channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        else:
            self.channel = grpc.secure_channel(
                self.address, self.credentials, options=CHANNEL_OPTIONS
            )
        same = wire.identity
        self._run = self.channel.stream_stream(wire.RUN, same, same)
        self._run_one_way = self.channel.unary_unary(wire.RUN_ONE_WAY, same, same)
        # One-way runs of this process on the runner by key, until their end is noted: a
        # stream run's admission after one of them (Started.after) waits for that.
        self._noting: dict[str, threading.Event] = {}
        # Our runs on the runner when it last declined one as busy (its places taken), and
        # until when that holds: meanwhile, while as many are in flight, runs go straight on
        # the stream, where they queue (a busy answer is one more round trip).
        self._crowded = (0, 0.0)
        self._describe = self.channel.unary_unary(wire.DESCRIBE, same, same)
        self._health = self.channel.unary_unary(wire.HEALTH, same, same)
        self._prepare = self.channel.unary_unary(wire.PREPARE, same, same)
        self._analyse = self.channel.unary_unary(wire.ANALYSE, same, same)
        self.metadata = ((wire.TOKEN_KEY, self.token),)

    # --- what the fleet reads

    @property
    def usable(self) -> bool:
        return self.state in ("serving", "degraded")

    def load(self) -> float:
        """Busy share of its places, counting our own runs since it last said."""
        busy = max(self.in_flight, self.mine) + self.waiting
        return busy / max(self.places, 1)

    def check(self) -> None:
        """Ask the runner how it is (``Health``); an error makes it unusable until the next."""
        try:
            raw = self._health(b"{}", timeout=HEALTH_TIMEOUT_S, metadata=self.metadata)
            health = json.loads(raw)
            self.places = int(health["places"])
            self.in_flight = int(health["in_flight"])
            self.waiting = int(health["waiting"])
            self.analyses = int(health.get("analyses", 0))
            self.started = int(health.get("started", 0))
            self.state = str(health["state"])
        except grpc.RpcError as exc:
            code = exc.code()
            self.state = "refused" if code == grpc.StatusCode.UNAUTHENTICATED else "unreachable"
        except (ValueError, KeyError, TypeError):
            self.state = "unreachable"
        self.checked = time.monotonic()

    def describe(self) -> dict[str, Any]:
        raw = self._describe(b"{}", timeout=HEALTH_TIMEOUT_S, metadata=self.metadata)
        described = json.loads(raw)
        if not isinstance(described, dict):
            raise ValueError("a runner's description must be an object")
        return described

    def prepare(self, language: str, imports: list[str]) -> None:
        self._prepare(
            wire.encode(wire.Prepare(language, imports)),
            timeout=HEALTH_TIMEOUT_S,
            metadata=self.metadata,
        )

    def analyse(self, ask: wire.Analyse, timeout: float) -> wire.Analysed:
        """The runner's answer, read under the protocol's rules (``WireError`` outside them).
        ``NotStarted`` if it could not take the request (unreachable, draining, our
        credential refused, a runner of a release without ``Analyse``) or went away before
        answering; any other failure is the ``grpc.RpcError``."""
        with self._lock:
            self.mine += 1
        try:
            raw = self._analyse(wire.encode(ask), timeout=timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            code = exc.code()
            if code in NOT_STARTED or code == grpc.StatusCode.UNIMPLEMENTED:
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    self.state = "refused"
                raise NotStarted(str(code)) from None
            raise
        finally:
            with self._lock:
                self.mine -= 1
        answer: wire.Analysed = wire.decode(raw, wire.Analysed)
        return answer

    def close(self) -> None:
        self.channel.close()

    # --- one run

    def run(self, start: wire.Start, link: RunLink) -> RunOutcome:
        """The run on this runner, its ctx calls answered through ``link``. ``NotStarted``
        if the runner could not take it; once it started, any failure of the runner or the
        way to it is ``infra`` (never counted against the tool)."""
        attributes = {
            "rpc.system": "grpc",
            "rpc.service": wire.SERVICE,
            "rpc.method": "Run",
            "server.address": self.address,
        }
        begun = time.monotonic()
        with tracing.span("runner.run", attributes, SpanKind.CLIENT) as span:
            if span.is_recording():
                # Traced: on the stream, whose Started times the wait for the runner's
                # process (runner.wait); a one-way run's start reaches the API only with
                # its outcome.
                start = dataclasses.replace(start, traceparent=tracing.traceparent(), key="")
            crowded, until = self._crowded
            if start.key and self.mine + 1 >= crowded and time.monotonic() < until:
                start = dataclasses.replace(start, key="")  # to queue there, as admitted
            outcome = self._one_way(start, link) if start.key else None
            self._went("stream" if outcome is None else _path(outcome))
            if isinstance(outcome, wire.Declined) and outcome.why == "busy":
                self._crowded = (self.mine + 1, time.monotonic() + CROWDED_S)  # with this run
            if isinstance(outcome, wire.Declined) and outcome.why == "wait":
                # Its process was not ready at once: admitted again here, then sent once
                # more (a place is free, or the runner says busy and it goes on the stream).
                if not link.admit():
                    return RunOutcome("not_admitted")
                start = dataclasses.replace(start, key=secrets.token_hex(8))
                outcome = self._one_way(start, link)
                self._went(_path(outcome))
            if not isinstance(outcome, RunOutcome):  # on the stream, which asks again
                gave_up = isinstance(outcome, wire.Declined) and outcome.why == "ctx"
                rerun = _again(start, begun, whole=gave_up)
                if gave_up and rerun.left_ms is None and (again := getattr(link, "again", None)):
                    again()  # the API's deadlines for it too (RunLink.again is optional)
                try:
                    outcome = self._hop(rerun, link)
                except NotStarted as exc:
                    # placed elsewhere as the stream would have had it: admitted again
                    # (tests/runners/test_one_way_again.py)
                    raise NotStarted(str(exc), again=rerun) from None
            if span.is_recording():
                span.set_attribute("toolkiln.run.outcome", outcome.kind)
            return outcome

    def _went(self, path: str) -> None:
        with self._lock:
            self.paths[path] = self.paths.get(path, 0) + 1

    def _hop(self, start: wire.Start, link: RunLink) -> RunOutcome:
        begun = time.perf_counter()
        sent_ns = time.time_ns() if tracing.on() else 0
        # The run's end as this process counts it: a ctx call answered past it ends the run
        # as a timeout (the runner's own clock started a hop later).
        ends = time.monotonic() + start.timeout_ms / 1000
        if start.left_ms is not None:
            ends = min(ends, time.monotonic() + start.left_ms / 1000)
        answers = _Answers(wire.encode(start))
        timeout = start.timeout_ms / 1000 + DEADLINE_MARGIN_S
        call = self._run(answers, timeout=timeout, metadata=self.metadata)
        started = ended = False
        ran = False  # started and admitted: its end is told to the link (RunLink.ended)
        frames = rows = row_bytes = 0  # what the runner sent, against the jail's own caps
        with self._lock:
            self.mine += 1
        try:
            for raw in call:
                if len(raw) > wire.FROM_RUNNER_BYTES:
                    raise wire.WireError("a message over its cap")
                message = wire.decode(raw, *FROM_RUNNER)
                if isinstance(message, wire.Call | wire.AuditRow):
                    # A runner that keeps its sandbox's caps stays within these: past them the
                    # run ends there as the tool's CtxLimitError (sandbox/session.py). Past
                    # them here, the runner does not: its run is infra.
                    frames += 1
                    if isinstance(message, wire.AuditRow):
                        rows, row_bytes = rows + 1, row_bytes + len(raw)
                    if (
                        frames > CAPS.ctx_frames
                        or rows > CAPS.audit_rows
                        or row_bytes > AUDIT_BYTES
                    ):
                        raise wire.WireError("more ctx frames than a run may send")
                if isinstance(message, wire.Call):
                    with tracing.under(message.traceparent):
                        value = link.call(message.tool, message.input)
                    answers.send(wire.Reply(message.id, value, time.monotonic() >= ends))
                elif isinstance(message, wire.AuditRow):
                    answers.send(wire.AuditAck(link.audit(message.event, message.data)))
                elif isinstance(message, wire.Started):
                    started = ran = True
                    if sent_ns:  # sent to the runner until a process was ready for it there
                        tracing.started("runner.wait", sent_ns, time.time_ns())
                    waited = time.perf_counter() - begun
                    with self._lock:
                        self.runs += 1
                        self.waited_s += waited
                        self.waits[bisect.bisect_left(WAIT_BUCKETS, waited)] += 1
                    if message.ask:
                        self._noted(message.after, ends)
                        ran = bool(link.admit())
                        answers.send(wire.Admit(ran))
                elif isinstance(message, wire.Ended):
                    ended = _ended(link, ended)
                    answers.send(wire.Ack())
                else:
                    _ended(link, ended or not ran)
                    return message.outcome()
            return infra("The runner ended the run without an outcome.", begun)
        except grpc.RpcError as exc:
            code = exc.code()
            if not started and code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.UNAUTHENTICATED,
            ):
                self.state = "refused" if code == grpc.StatusCode.UNAUTHENTICATED else self.state
                raise NotStarted(str(code)) from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return infra("The runner did not answer within the run's time.", begun)
            return infra("The runner went away during the run.", begun)
        except wire.WireError as exc:
            call.cancel()
            return infra(f"The runner sent a message outside the protocol ({exc}).", begun)
        except BaseException:
            call.cancel()  # the runner kills the run's process
            raise
        finally:
            answers.close()
            with self._lock:
                self.mine -= 1

    def _one_way(self, start: wire.Start, link: RunLink) -> RunOutcome | wire.Declined | None:
        """The run as one unary call (wire.py ``RunOneWay``); ``Declined`` if the runner did
        not run it (it would have waited, or its code made a ctx call: nothing of it was
        seen), None if the runner knows no ``RunOneWay``. ``NotStarted`` and ``infra`` as
        on the stream: the runner's initial metadata says whether the run started."""
        begun = time.perf_counter()
        noted = threading.Event()
        self._noting[start.key] = noted
        with self._lock:
            self.mine += 1
        try:
            try:
                raw, call = self._run_one_way.with_call(
                    wire.encode(start),
                    timeout=start.timeout_ms / 1000 + DEADLINE_MARGIN_S,
                    metadata=self.metadata,
                )
            except grpc.RpcError as exc:
                code = exc.code()
                if _started(exc):
                    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        return infra("The runner did not answer within the run's time.", begun)
                    return infra("The runner went away during the run.", begun)
                if code == grpc.StatusCode.UNIMPLEMENTED:
                    return None  # a runner of a release before RunOneWay
                if code in NOT_STARTED:
                    if code == grpc.StatusCode.UNAUTHENTICATED:
                        self.state = "refused"
                    raise NotStarted(str(code)) from None
                return infra("The runner went away during the run.", begun)
            try:
                if len(raw) > wire.FROM_RUNNER_BYTES:
                    raise wire.WireError("a message over its cap")
                message = wire.decode(raw, wire.Done, wire.Declined)
            except wire.WireError as exc:
                return infra(f"The runner sent a message outside the protocol ({exc}).", begun)
            if isinstance(message, wire.Declined):
                return message
            started = _started(call)
            if started:  # at once, or it was declined: it never waited for a process
                with self._lock:
                    self.runs += 1
                    self.waits[0] += 1
            _ended(link, not started)
            outcome: RunOutcome = message.outcome()
            return outcome
        finally:
            noted.set()
            self._noting.pop(start.key, None)
            with self._lock:
                self.mine -= 1

    def _noted(self, keys: list[str], ends: float) -> None:
        """Until the ends of these one-way runs of this process are noted (within the run's
        time); keys of other processes' runs, or already noted, wait for nothing."""
        for key in keys:
            noted = self._noting.get(key)
            if noted is not None:
                noted.wait(max(0.0, ends - time.monotonic()))


def _path(outcome: RunOutcome | wire.Declined | None) -> str:
    """How a one-way try went, for ``RunnerClient.paths``."""
    if isinstance(outcome, wire.Declined):
        return outcome.why
    return "one_way" if outcome is not None else "stream"


def _started(call: Any) -> bool:
    """Whether the runner said a one-way run started (its initial metadata)."""
    return any(key == wire.STARTED_KEY for key, _ in call.initial_metadata() or ())


def _again(start: wire.Start, begun: float, whole: bool = False) -> wire.Start:
    """A run sent again on the stream after ``RunOneWay`` did not run it: its admission
    asked again when it starts, its time what is left of it; ``whole``: a run given up at
    its ctx call has its whole time again unless a calling run's deadline bounds it (the
    try was the platform's guess, not the tool's: tests/api/test_one_way_again.py)."""
    if not start.key:
        return start
    if whole and start.left_ms is None:
        return dataclasses.replace(start, key="", admitted=False)
    used_ms = int((time.monotonic() - begun) * 1000)
    left_ms = start.timeout_ms if start.left_ms is None else start.left_ms
    return dataclasses.replace(start, key="", admitted=False, left_ms=max(0, left_ms - used_ms))


def _ended(link: RunLink, already: bool) -> bool:
    """``link.ended()`` once per run (RunLink.ended is optional)."""
    if not already:
        ended = getattr(link, "ended", None)
        if ended is not None:
            ended()
    return True


def start_of(req: RunRequest, share: str, admitted: bool) -> wire.Start:
    left_ms = None
    if req.not_after is not None:
        left_ms = max(0, int((req.not_after - time.monotonic()) * 1000))
    return wire.Start(
        req.language,
        req.code,
        req.entry,
        req.input,
        req.timeout_ms,
        req.context,
        req.workspace_id,
        req.call_id,
        share,
        left_ms,
        admitted,
        list(req.imports),
        req.script,
        key=secrets.token_hex(8) if req.one_way else "",
    )
