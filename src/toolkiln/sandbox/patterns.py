"""A tool's regular expressions, matched against a caller's text in processes of their own.

A schema's ``pattern`` is its author's regular expression, and the text it is matched against
is a caller's: Python's ``re`` backtracks without bound (``^(a|a)*$`` on 27 characters: 4.8 s
of CPU), can take quadratic time and gigabytes to compile (``a{10000000}``, a long ``x|x``),
and holds the GIL throughout, so in the service one request stalled every workspace's calls.
Here each search (and each compile of a caller's ``format: regex`` text) runs in a small
``python -I -S`` process with its own address-space limit, as nobody; the service's thread
waits on a pipe with the GIL released, until the deadline the validation gives it, then kills
the process. Semantics are ``re``'s, exactly as jsonschema's.

One process per search at the moment, at most RUNNING at once (made on demand by one
long-lived thread, ~20-30 ms, not counted as the value's time; up to IDLE_KEPT kept for the
next). They are shared between workspaces as the sandbox's workers are (``fair.FairShare``):
a free one goes to the waiting search whose workspace holds fewest, and a workspace holds at
most all but one, so a workspace whose patterns run until their time is up cannot make
another's wait past WAIT_S (its saves refused as too slow to compile:
tests/security/test_pattern_share.py). A check names its workspace by ``for_workspace``.
A process that overran, answered out of step or died is killed and never reused.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import marshal
import os
import select
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from toolkiln.domain.fair import FairShare
from toolkiln.domain.schema.budget import OutOfTime, Unmatchable

log = logging.getLogger("toolkiln.sandbox")
IDLE_KEPT = 4
MEMORY_MB = 512  # address space of one process: the interpreter, re's cache and one compile
ANSWER_BYTES = 512
START_S = 10.0  # for a process to start (not a value's time)
# Processes matching at once: a search waits for one beyond this (its wait is not the value's
# time, up to WAIT_S), so that they hold at most RUNNING x MEMORY_MB.
RUNNING = max(4, 2 * (os.cpu_count() or 1))
WAIT_S = 10.0
NOBODY = 65534

# The process: length-prefixed marshal requests (op, pattern, text) in, one line out per
# request: b"1" (matches / compiles), b"0" (does not), or b"E" and why the pattern cannot be
# used. A MemoryError ends it after its answer: whatever it held is gone with it.
_PROGRAM = f"""
import ctypes, marshal, os, re, resource, sys
import unicodedata, warnings  # what re's parser imports when it needs them (\\N{{...}}, warnings)
warnings.simplefilter("ignore")
if os.geteuid() == 0:  # never the service's root: nobody, no groups (it reads nothing)
    os.setgroups([])
    os.setresgid({NOBODY}, {NOBODY}, {NOBODY})
    os.setresuid({NOBODY}, {NOBODY}, {NOBODY})
ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL (after setresuid, which clears it)
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)  # the service ended before the line above
resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_MB} << 20, {MEMORY_MB} << 20))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
inp, out = sys.stdin.buffer, sys.stdout.buffer
out.write(b"R\\n")  # started: what follows is the values' time
out.flush()
while True:
    head = inp.read(8)
    if len(head) < 8:
        break
    op, pattern, text = marshal.loads(inp.read(int.from_bytes(head, "little")))
    fatal = False
    try:
        if op == "s":
            answer = b"1" if re.search(pattern, text) else b"0"
        else:
            re.compile(text)
            answer = b"1"
    except BaseException as exc:
        fatal = isinstance(exc, MemoryError)  # answered "E": the host never reuses it
        if op == "s" or fatal:
            answer = b"E" + ascii(type(exc).__name__ + ": " + str(exc))[:300].encode()
        else:
            answer = b"0"
    out.write(answer + b"\\n")
    out.flush()
    if fatal:
        break
"""


class _Process:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _PROGRAM, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={},
            cwd="/",
            start_new_session=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.to, self.back = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self.poller = select.poll()  # not select(): descriptors past 1023 are common here
        self.poller.register(self.back, select.POLLIN)
        try:
            ready = self._line(time.monotonic() + START_S)
        except BaseException:
            self.kill()
            raise
        if ready != b"R":
            self.kill()
            raise OSError("the pattern process did not start")

    def _line(self, deadline: float) -> bytes | None:
        answer = b""
        while not answer.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not self.poller.poll(left * 1000):
                return None
            chunk = os.read(self.back, ANSWER_BYTES)
            if not chunk:
                raise EOFError("the pattern process ended")
            answer += chunk
            if len(answer) > ANSWER_BYTES:
                raise EOFError("the pattern process answered out of step")
        return answer[:-1]

    def ask(self, op: str, pattern: str, text: str, deadline: float) -> bytes | None:
        """The answer line, or None when the deadline passed first (then the process must
        be killed: it may still be searching)."""
        payload = marshal.dumps((op, pattern, text))
        _write_all(self.to, len(payload).to_bytes(8, "little") + payload)
        return self._line(deadline)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class PatternProcesses:
    """The searcher of a tool's schema patterns, given to the checks by app.py
    (``domain.schema.budget.Searcher``)."""

    def __init__(self) -> None:
        self._idle: list[_Process] = []
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0  # processes started (tests read it)
        self._running = FairShare(RUNNING)
        # Processes are started by one thread that lives as long as the pool: the kernel's
        # parent-death signal follows the thread that forked, and a request's thread ends.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="toolkiln-patterns")

    def for_workspace(self, workspace_id: str) -> _ForWorkspace:
        """This pool's searches, taking turns as ``workspace_id``'s."""
        return _ForWorkspace(self, workspace_id)

    def search(self, pattern: str, text: str, deadline: float, workspace: str = "") -> bool:
        answer = self._ask("s", pattern, text, deadline, workspace)
        if answer.startswith(b"E"):
            why = answer[1:].decode("ascii", "replace")[:300]
            raise Unmatchable(f"{pattern[:200]!r} cannot be matched: {why}")
        return answer == b"1"

    def compiles(self, text: str, deadline: float, workspace: str = "") -> bool:
        return self._ask("c", "", text, deadline, workspace) == b"1"

    def _ask(self, op: str, pattern: str, text: str, deadline: float, workspace: str) -> bytes:
        started = time.monotonic()
        if started >= deadline:
            raise OutOfTime
        if not self._running.acquire(workspace, started + WAIT_S):
            raise OutOfTime
        try:
            try:
                process = self._take()
            except Exception as exc:
                log.error("could not start a process to match patterns in: %s", exc)
                raise Unmatchable(f"{pattern[:200]!r} cannot be matched now ({exc})") from None
            # Waiting for a free process, or for one to start, is not the value's time.
            deadline += time.monotonic() - started
            keep = False
            try:
                answer = process.ask(op, pattern, text, deadline)
                if answer is None:
                    raise OutOfTime
                if answer not in (b"0", b"1") and not answer.startswith(b"E"):
                    raise Unmatchable(f"{pattern[:200]!r} cannot be matched here")
                keep = not answer.startswith(b"E")
                return answer
            except (OSError, EOFError, ValueError) as exc:
                raise Unmatchable(f"{pattern[:200]!r} cannot be matched here ({exc})") from None
            finally:
                self._give_back(process, keep)
        finally:
            self._running.release(workspace)

    def _take(self) -> _Process:
        with self._lock:
            while self._idle:
                process = self._idle.pop()
                if process.proc.poll() is None:
                    return process
                process.kill()
        process = self._spawner.submit(_Process).result()
        self.started += 1
        return process

    def _give_back(self, process: _Process, keep: bool) -> None:
        with self._lock:
            if keep and not self._closed and len(self._idle) < IDLE_KEPT:
                self._idle.append(process)
                return
        process.kill()

    def close_idle(self) -> None:
        """Kill the idle processes, and count the started ones from zero."""
        with self._lock:
            idle, self._idle = self._idle, []
            self.started = 0
        for process in idle:
            process.kill()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for process in idle:
            process.kill()
        self._spawner.shutdown(wait=False)


class _ForWorkspace:
    """A pool's searcher for one workspace's checks."""

    __slots__ = ("_pool", "_workspace")

    def __init__(self, pool: PatternProcesses, workspace: str) -> None:
        self._pool, self._workspace = pool, workspace

    def search(self, pattern: str, text: str, deadline: float) -> bool:
        return self._pool.search(pattern, text, deadline, self._workspace)

    def compiles(self, text: str, deadline: float) -> bool:
        return self._pool.compiles(text, deadline, self._workspace)


_SHARED: PatternProcesses | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> PatternProcesses:
    """The process's one pool (every Runtime of a process uses it; closed at exit)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = PatternProcesses()
            atexit.register(_SHARED.close)
        return _SHARED
