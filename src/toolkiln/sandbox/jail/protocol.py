"""The host<->jail protocol: message kinds, the run each frame belongs to, caps, text rules.

Both sides load this one module: the host as ``toolkiln.sandbox.jail.protocol``, the jail
by path (its directory is on ``sys.path`` there), so it uses the standard library only.

Framing: a 4-byte big-endian length, then UTF-8 JSON; no pickle, ever. Every frame is an
object with ``op`` (a kind below) and ``run`` (the id the host gave the run in its ``run``
frame; every frame the jail sends must carry it). One run has one channel of its own: a
Python child's socketpair, or for a JavaScript worker a socketpair made for that call and
passed to the worker (``SCM_RIGHTS``), closed by both sides when the call ends. Nothing
written on it can be read by another call, whatever state it is left in.

Text: a body must be valid UTF-8 (else the frame is garbage). JSON escapes can still spell
lone surrogates (``"\\ud800"``), which no encoder or database downstream accepts; the reader
replaces them with U+FFFD and marks the frame ``repaired`` so the host can decide what that
means (a repaired return value is ``invalid_result``). Writers never fail on them: the host
replaces them before sending, the jail escapes them so the host sees them.
"""

from __future__ import annotations

import json
import re
import select
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

# Message kinds.
RUN = "run"  # host -> jail: the one request of a run (code, entry, input, context, caps)
CALL = "call"  # jail -> host: a ctx.tools call {id, tool, input}
REPLY = "reply"  # host -> jail: the answer to a call {id, result}
AUDIT = "audit"  # jail -> host: a ctx.audit row {event, data}
RESULT = "result"  # jail -> host: the report that ends a run
REPORT_KINDS = ("return", "exception", "unserializable", "too_large")
# The host's requests on a template's control socket, ``SPAWN + b"%d}" % n`` and ``STOP``
# (JSON, as every message there): the template's C loop (_spawn.c) matches these bytes.
SPAWN = b'{"op": "spawn", "n": '
STOP = b'{"op": "stop"}'

HEADER = struct.Struct(">I")
# Bound once, so tool code that monkeypatches the json module does not change our framing.
_dumps, _loads = json.dumps, json.loads
_LONE = re.compile("[\\ud800-\\udfff]")
KIB = 1024


@dataclass(frozen=True, slots=True)
class Caps:
    """Size caps of one call's frames and quotas. Documented in docs/security.md."""

    request_bytes: int = 4096 * KIB  # the run frame: code, input, context
    reply_bytes: int = 1024 * KIB  # one reply to a ctx call
    result_bytes: int = 1024 * KIB  # the result frame
    log_bytes: int = 64 * KIB  # stdout, and stderr, each
    ctx_frames: int = 1000  # call + audit frames one run may send
    # ... and their bytes: the host parses each one, in the service's process and outside
    # the call's CPU quota, at up to ~0.2 s of CPU per MiB for JSON made to be slow (a
    # frame of empty lists with a lone surrogate), so 1000 frames of 1 MiB could cost it
    # minutes (0.21 s measured for one).
    ctx_bytes: int = 4096 * KIB
    audit_rows: int = 200  # ctx.audit rows kept per call (the whole tree of runs)
    audit_row_bytes: int = 16 * KIB  # one row's frame; bigger rows are dropped
    audit_bytes: int = 512 * KIB  # all rows of one call together
    name_chars: int = 128  # a ctx tool name
    event_chars: int = 64  # an audit event name
    type_chars: int = 100  # an exception type
    message_chars: int = 2000  # an exception message

    @property
    def frame_bytes(self) -> int:
        """The largest frame the jail may send: a result with both logs."""
        return self.result_bytes + 2 * self.log_bytes + 4 * KIB


class FrameError(Exception):
    """The peer sent something that is not a frame within the rules."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # "eof", "too_large", "garbage", "timeout"


def scrub(value: Any) -> tuple[Any, int]:
    """``value`` with every lone surrogate (in strings and keys) replaced by U+FFFD, and how
    many strings changed."""
    if isinstance(value, str):
        fixed = _LONE.sub("\ufffd", value)
        return fixed, int(fixed != value)
    if isinstance(value, list):
        changed, out = 0, []
        for item in value:
            item, n = scrub(item)
            out.append(item)
            changed += n
        return out, changed
    if isinstance(value, dict):
        changed, obj = 0, {}
        for key, item in value.items():
            key, n = scrub(key)
            item, m = scrub(item)
            obj[key] = item
            changed += n + m
        return obj, changed
    return value, 0


def encode(obj: Any, *, repair: bool = False) -> bytes:
    """One frame. Lone surrogates never make this fail: with ``repair`` (the host) they are
    replaced, else (the jail) escaped, for the host's reader to see and judge."""
    try:
        body = _ENCODER.encode(obj).encode()
    except UnicodeEncodeError:
        if repair:
            body = _dumps(scrub(obj)[0], separators=(",", ":"), ensure_ascii=False).encode()
        else:
            body = _dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    return HEADER.pack(len(body)) + body


def readable(sock: socket.socket, timeout: float) -> bool:
    """Whether ``sock`` has something to read (or its close) within ``timeout`` seconds.
    ``poll``, not ``select``: ``select`` takes no descriptor of 1024 or more, and the
    service's channels get such numbers once it holds that many descriptors (idle client
    connections are enough), and a call handed such a child would end as ``infra_error``
    (tests/security/test_high_descriptors.py)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000 + 0.999))))  # ms, rounded up


def send(sock: socket.socket, obj: Any, *, repair: bool = False) -> None:
    sock.sendall(encode(obj, repair=repair))


def write(sock: socket.socket, data: bytes, deadline: float) -> None:
    """All of ``data`` written by ``deadline`` (``time.monotonic()``), else
    ``FrameError("timeout")``: the host's every write to a run's channel, so a peer that
    stops reading (its receive buffer full: a 1 MB reply, frames it never reads) cannot hold
    the host past the run's deadline, as a blocking ``sendall`` did. Each part is sent
    without blocking and the wait for room is bounded, whatever the socket's own mode."""
    view = memoryview(data)
    poller: select.poll | None = None
    while view:
        try:
            view = view[sock.send(view, socket.MSG_DONTWAIT) :]
            continue
        except (BlockingIOError, InterruptedError):
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            raise FrameError("timeout", "deadline passed while the peer did not read")
        if poller is None:
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
        poller.poll(max(1, int(left * 1000)))


def _no_constant(name: str) -> Any:
    """NaN and Infinity are not JSON: a frame holding them is not a frame (no database
    stores them as JSON, and the answer to the client could not be written)."""
    raise ValueError(f"{name} is not JSON")


# The usual frame's coder made once: json.dumps and json.loads with options build a new
# one per call (Python code run for every frame, in the jail and on the host).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def decode(body: bytes) -> tuple[Any, frozenset[str]]:
    """A frame's body parsed under the text rules, and which of its top-level fields had
    text repaired (``"*"`` when the frame is not an object)."""
    try:
        text = body.decode("utf-8")
        value = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise FrameError("garbage", f"not a UTF-8 JSON frame: {str(exc)[:200]}") from None
    if "\\ud" not in text and "\\uD" not in text:  # only escapes can spell a surrogate
        return value, frozenset()
    try:
        if not isinstance(value, dict):
            value, changed = scrub(value)
            return value, frozenset("*" if changed else ())
        fields, fixed = set(), {}
        for key, item in value.items():
            key, n = scrub(key)
            fixed[key], m = scrub(item)
            if n or m:
                fields.add(key)
        return fixed, frozenset(fields)
    except RecursionError:
        raise FrameError("garbage", "a frame nested too deeply") from None


class Reader:
    """Reads frames from one socket, keeping what arrived beyond the current frame.

    One ``recv`` of up to 64 KiB usually brings a whole frame, so a frame costs one poll and
    one read instead of two of each. Caps are checked before any body is accumulated.
    ``repaired`` and ``size`` describe the last frame read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.repaired: frozenset[str] = frozenset()
        self.size = 0

    def _fill(self, need: int, deadline: float | None) -> None:
        while len(self.buf) < need:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FrameError("timeout", "deadline passed")
                if not readable(self.sock, left):
                    raise FrameError("timeout", "deadline passed")
            chunk = self.sock.recv(max(65536, min(need - len(self.buf), 1 << 20)))
            if not chunk:
                raise FrameError("eof", "the peer closed the channel")
            self.buf += chunk

    def recv(self, max_bytes: int, deadline: float | None = None) -> Any:
        self._fill(HEADER.size, deadline)
        (length,) = HEADER.unpack_from(self.buf)
        if length > max_bytes:
            raise FrameError("too_large", f"frame of {length} bytes is over the cap of {max_bytes}")
        self._fill(HEADER.size + length, deadline)
        body = bytes(self.buf[HEADER.size : HEADER.size + length])
        del self.buf[: HEADER.size + length]
        self.size = length
        value, self.repaired = decode(body)
        return value

    def pending(self) -> bool:
        """Whether bytes beyond the frames read so far have arrived (the peer's close is not)."""
        if self.buf:
            return True
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except (BlockingIOError, InterruptedError):
            return False


# -- what the host reads: typed, validated messages


@dataclass(slots=True)
class Call:
    id: int
    tool: str
    input: Any


@dataclass(slots=True)
class Audit:
    event: str
    data: Any
    size: int  # bytes of the frame, for the per-row and per-call caps


@dataclass(slots=True)
class Report:
    kind: str  # one of REPORT_KINDS
    value: Any = None
    type: str = "Exception"
    message: str = ""
    line: int | None = None
    column: int | None = None
    stdout: str = ""
    stderr: str = ""
    repaired: bool = False  # the returned value held text that is not valid Unicode


def _text(value: Any, cap: int, default: str = "") -> str:
    return value[:cap] if isinstance(value, str) else default


def _log(value: Any, cap: int) -> str:
    """A log as the host keeps it: at most ``cap`` bytes of UTF-8 (and the jail's truncation
    marker), whatever the jail counted. Cut by characters, a log of 65,000 three-byte
    characters was ~190 KB under a 64 KB cap (the JavaScript prelude counts UTF-16 units)."""
    if not isinstance(value, str):
        return ""
    if len(value) * 4 <= cap + MARKER_BYTES:  # short enough whatever its characters
        return value
    data = value.encode("utf-8", "replace")
    if len(data) <= cap + MARKER_BYTES:
        return value
    kept = data[:cap].decode("utf-8", "ignore")
    return f"{kept}\n[truncated: {len(data) - len(kept.encode())} more bytes]"


MARKER_BYTES = 100  # room for the jail's "[truncated: N more bytes]" past a log's cap


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def parse(
    frame: Any, run: str, caps: Caps, repaired: frozenset[str] = frozenset(), size: int = 0
) -> Call | Audit | Report:
    """A frame from the jail as a ``Call``, ``Audit`` or ``Report``; ``FrameError`` for
    anything else, including a frame of another run."""
    if not isinstance(frame, dict):
        raise FrameError("garbage", "a frame that is not an object")
    if frame.get("run") != run:
        raise FrameError("garbage", "a frame of another run")
    op = frame.get("op")
    if op == CALL:
        ident = _int(frame.get("id"))
        if ident is None:
            raise FrameError("garbage", "a call without an id")
        # A name over the cap is cut one past it, so the platform refuses it as too long.
        return Call(ident, _text(frame.get("tool"), caps.name_chars + 1), frame.get("input"))
    if op == AUDIT:
        return Audit(_text(frame.get("event"), caps.event_chars + 1), frame.get("data"), size)
    if op != RESULT:
        raise FrameError("garbage", f"a frame of unknown kind {str(op)[:40]!r}")
    kind = frame.get("kind")
    if kind not in REPORT_KINDS:
        raise FrameError("garbage", "a result of unknown kind")
    return Report(
        str(kind),
        value=frame.get("value"),
        type=_text(frame.get("type"), caps.type_chars, "Exception") or "Exception",
        message=_text(frame.get("message"), caps.message_chars),
        line=_int(frame.get("line")),
        column=_int(frame.get("column")),
        stdout=_log(frame.get("stdout"), caps.log_bytes),
        stderr=_log(frame.get("stderr"), caps.log_bytes),
        repaired="value" in repaired or "*" in repaired,
    )


def reply(run: str, ident: int, result: Any, caps: Caps) -> bytes:
    """The host's answer to a call, never over the jail's reply cap: a result too large for
    it becomes an error envelope the code can read."""
    data = encode({"op": REPLY, "run": run, "id": ident, "result": result}, repair=True)
    if len(data) - HEADER.size <= caps.reply_bytes:
        return data
    envelope = {
        "error": "too_large",
        "details": {
            "message": f"The reply is larger than the {caps.reply_bytes}-byte cap of ctx replies.",
            "size": len(data) - HEADER.size,
            "max_bytes": caps.reply_bytes,
        },
    }
    return encode({"op": REPLY, "run": run, "id": ident, "result": envelope})
