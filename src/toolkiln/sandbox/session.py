"""The host's side of one run: what each frame from the jail is allowed to do, under caps.

The jail's frames are evidence, never instructions: a ``call`` is answered through the
run's ``RunLink``, an ``audit`` row is kept if it fits the per-row and per-call caps, and
the ``result`` becomes the outcome the host decides on.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from toolkiln.domain.execution import RunLink, RunOutcome
from toolkiln.sandbox.jail import protocol


@dataclass(slots=True)
class AuditQuota:
    """Audit rows and bytes left to one call, shared by every run nested under it."""

    rows: int = 0
    bytes: int = 0
    dropped: int = 0  # rows past a cap
    refused: dict[str, int] = field(default_factory=dict)  # rows that cannot be stored, by why


class Session:
    """Handles the frames of one run, in order, until its result."""

    def __init__(
        self,
        caps: protocol.Caps,
        run: str,
        link: RunLink,
        deadline: float,
        audit: AuditQuota | None = None,
    ) -> None:
        self.caps = caps
        self.run = run
        self.link = link
        self.deadline = deadline  # time.monotonic(): no write to the run waits past it
        self.audit = audit if audit is not None else AuditQuota()
        self.calls = 0
        self.frames = 0
        self.ctx_bytes = 0  # of the call and audit frames read
        self.ended = False  # a result frame was read: the run ended by its own report

    def handle(
        self,
        msg: protocol.Call | protocol.Audit | protocol.Report,
        chan: socket.socket,
        size: int = 0,
    ):
        """The outcome once the run is over, else None (the frame was answered or kept).
        ``size``: the frame's body in bytes, counted against the run's ctx bytes."""
        if isinstance(msg, protocol.Report):
            self.ended = True
            return self._outcome(msg)
        self.frames += 1
        self.ctx_bytes += size
        if self.frames > self.caps.ctx_frames:
            return RunOutcome(
                "exception",
                error_type="CtxLimitError",
                message=f"the tool sent more than {self.caps.ctx_frames} ctx frames in one call",
            )
        if self.ctx_bytes > self.caps.ctx_bytes:
            return RunOutcome(
                "exception",
                error_type="CtxLimitError",
                message=(
                    f"the tool sent more than {self.caps.ctx_bytes} bytes of ctx frames "
                    "(ctx.tools calls and ctx.audit rows) in one call"
                ),
            )
        if isinstance(msg, protocol.Call):
            self.calls += 1
            reply = self.link.call(msg.tool, msg.input)
            protocol.write(chan, protocol.reply(self.run, msg.id, reply, self.caps), self.deadline)
        else:
            self._audit(msg)
        return None

    def _audit(self, row: protocol.Audit) -> None:
        quota, caps = self.audit, self.caps
        if (
            row.size > caps.audit_row_bytes
            or quota.rows >= caps.audit_rows
            or quota.bytes + row.size > caps.audit_bytes
        ):
            quota.dropped += 1
            return
        why = self.link.audit(row.event, row.data)
        if why is not None:  # dropped like a row past a cap, and the note says why
            why = why[:MAX_REASON_CHARS]
            if why not in quota.refused and len(quota.refused) >= MAX_REASONS:
                why = "other rows that cannot be stored"
            quota.refused[why] = quota.refused.get(why, 0) + 1
            return
        quota.rows += 1
        quota.bytes += row.size

    def _outcome(self, report: protocol.Report) -> RunOutcome:
        out = RunOutcome("garbled", stdout=report.stdout, stderr=self._stderr(report.stderr))
        if report.kind == "return" and report.repaired:
            out.kind = "unserializable"
            out.message = "It holds text that is not valid Unicode (a lone surrogate)."
        elif report.kind == "return":
            out.kind, out.value = "return", report.value
        elif report.kind == "exception":
            out.kind = "memory" if report.type == "MemoryError" else "exception"
            out.error_type, out.message = report.type, report.message
            out.line, out.column = report.line, report.column
        elif report.kind == "unserializable":
            out.kind, out.message = "unserializable", report.message[:500]
        else:
            out.kind, out.details = "too_large", {"max_bytes": self.caps.result_bytes}
        return out

    def _stderr(self, text: str) -> str:
        quota, caps = self.audit, self.caps
        notes = [f"[ctx.audit: {n} {_rows(n)} dropped: {why}]" for why, n in quota.refused.items()]
        if quota.dropped:
            notes.append(
                f"[ctx.audit: {quota.dropped} rows dropped; a row may take "
                f"{caps.audit_row_bytes} bytes, a call {caps.audit_rows} rows and "
                f"{caps.audit_bytes} bytes]"
            )
        if not notes:
            return text
        note = "\n".join(notes)
        return f"{text}\n{note}" if text else note


MAX_REASONS = 8  # distinct reasons a note lists (then one line for the rest)
MAX_REASON_CHARS = 200


def _rows(n: int) -> str:
    return "row" if n == 1 else "rows"
