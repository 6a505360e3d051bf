"""How the sandbox's processes ended: a child's exit as its template reports it, and the last
words of a template that ended before its hello."""

from __future__ import annotations

import os
import select
import signal
import time
from dataclasses import dataclass
from typing import IO

# Signals tool code cannot send itself: seccomp refuses them in kill/tkill/tgkill and refuses
# the other ways to pick a signal (timer_create, fcntl F_SETSIG). The kernel's own SIGKILL
# for RLIMIT_CPU cannot come first either: tools may not change RLIMIT_CPU, and its hard
# limit is past what any call can use before its deadline (jail/child.py). So a death by
# one of them that the cgroup's OOM killer does not explain came from outside the sandbox.
OUTSIDE_SIGNALS = frozenset(
    {signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
)
# What a template that ended before its hello wrote to stderr: read for at most this long, its
# last bytes kept, and its last line reported.
STDERR_WAIT_S = 5.0
STDERR_TAIL_BYTES = 4096
STDERR_TAIL_CHARS = 300


@dataclass(slots=True)
class ExitInfo:
    """How a child ended, as the template saw it, and what the host makes of it."""

    code: int | None
    signal: int | None
    oom: bool
    outside: str | None = None  # set when the death is not the tool's doing (infra_error)


def judge(code: int | None, sig: int | None, oom: bool) -> ExitInfo:
    info = ExitInfo(code, sig, oom)
    if sig in OUTSIDE_SIGNALS and not oom:
        info.outside = f"the sandbox process was killed by {signal.Signals(sig).name} from outside"
    return info


def last_words(stream: IO[bytes] | None) -> str:
    """Why a template ended before its hello: the last line it wrote to ``stream``, its
    stderr (an ImportError's, say; tests/sandbox/test_template_start.py)."""
    tail = b""
    deadline = time.monotonic() + STDERR_WAIT_S
    poller = select.poll()  # not select: the pipe's number may be past 1023
    if stream is not None:
        poller.register(stream.fileno(), select.POLLIN)
    while stream is not None and (left := deadline - time.monotonic()) > 0:
        ready = poller.poll(int(left * 1000) + 1)
        chunk = os.read(stream.fileno(), 65536) if ready else b""
        if not chunk:
            break
        tail = (tail + chunk)[-STDERR_TAIL_BYTES:]
    said = [line for line in tail.decode("utf-8", "replace").splitlines() if line.strip()]
    why = f": {said[-1].strip()[:STDERR_TAIL_CHARS]}" if said else ""
    return f"the template exited during set-up{why}"
