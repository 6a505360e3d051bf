"""Class: the work a run can make the host do is bounded by the run's own caps.

The host parses every frame a run sends, in the service's own process, outside the call's
CPU quota: the cost lands on every workspace's calls. A frame may be ~1.2 MB (the result's
cap) and a run may send 1000 ctx frames, so a tool sending prebuilt frames of JSON made to
be slow (a million empty lists, a lone surrogate that makes the host repair every string)
cost the host ~0.2 s of CPU per frame, minutes per call (until 2026-12-06, when 4 such
calls at once made another workspace's trivial call take ~1 s). Now the call and audit
frames of one run may hold 4 MiB (``protocol.Caps.ctx_bytes``); past that the run ends as
``runtime_error`` (``CtxLimitError``) before the host reads any more.
"""

from __future__ import annotations

from tests.security.conftest import Target

# Prebuilt audit frames of ~1 MiB, written to the run's own channel.
RAW_FRAMES = """
import struct

def main(*, ctx, **p):
    link = ctx._link
    items = ",".join(["[]"] * 330_000)
    body = ('{"op":"audit","run":"%s","event":"e","data":["\\\\ud800",%s]}' % (link.run, items)).encode()
    frame = struct.pack(">I", len(body)) + body
    for _ in range(p.get("frames", 12)):
        link.sock.sendall(frame)
    return {"message": "sent"}
"""

# The same through ctx.tools: inputs of ~1 MiB that the built-in refuses.
BIG_CALLS = """
def main(*, ctx, **p):
    refused = 0
    for _ in range(p.get("calls", 12)):
        out = ctx.tools.calculate({"expression": "1" * 1_000_000})
        refused += out.get("error") is not None
    return {"message": "refused %d" % refused}
"""


def _limit(res: dict) -> bool:
    err = res["error"]
    return (
        err is not None
        and err["code"] == "runtime_error"
        and err["details"]["type"] == "CtxLimitError"
        and "bytes of ctx frames" in err["details"]["message"]
    )


def test_prebuilt_slow_frames_end_the_run_past_the_ctx_bytes(target: Target) -> None:
    res = target.run(RAW_FRAMES, {"frames": 12}, timeout_ms=20_000)
    assert _limit(res), res["error"] or res["raw_data"]
    target.assert_contained()


def test_big_ctx_inputs_end_the_run_past_the_ctx_bytes(target: Target) -> None:
    res = target.run(BIG_CALLS, {"calls": 12}, timeout_ms=20_000)
    assert _limit(res), res["error"] or res["raw_data"]
    target.assert_contained()


def test_a_run_within_the_ctx_bytes_goes_on(target: Target) -> None:
    """Three inputs of ~1 MiB fit: each is refused by the built-in, the run returns."""
    res = target.run(BIG_CALLS, {"calls": 3}, timeout_ms=20_000)
    assert res["status"] == "ok", res["error"]
    assert res["message"] == "refused 3"
