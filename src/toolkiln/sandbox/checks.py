"""Code checks: tool code parsed in checker processes, bounded, on a runner.

A runner answers the API's ``Analyse`` with this pool (runners/server.py); the API's
``CodeAnalyser`` asks the runners (runners/analyser.py) and never parses. Each analysis runs
in a checker (``sandbox/checker.py``): a fresh ``python -I`` program with an empty
environment, not a fork of the runner, confined before any text reaches it (nobody,
rlimits, a seccomp allowlist). The asking thread waits on a socket with the GIL released,
until the analysis' deadline; then the checker is killed and the text refused as too slow
to parse. Over its memory the checker ends, and the text is refused as too large to parse.
Either way the runner, and every other analysis and run, goes on
(tests/security/test_parse_bounds.py).

Fair between workspaces: at most ``workers`` analyses run at once, and one workspace holds
at most all but one of them (``FairShare``), whichever API processes send them. A checker
serves one workspace for its whole life (idle ones are kept per workspace, a spare is kept
ready for the next workspace): a checker a hostile text took over could only lie to the
workspace that sent it. Every answer is checked before it is used (``Analysis.from_wire``),
and again by the API (runners/analyser.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from toolkiln.domain.analysis import FAILED, Analysis, CheckQueue, precheck
from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.sandbox.fair import FairShare
from toolkiln.sandbox.jail import protocol

log = logging.getLogger("toolkiln.sandbox")

WORKERS = 3  # analyses at once (a workspace: two), sized for a host of two cores
SECONDS = 3.0  # one analysis, wall clock; a 256 KiB tool of ordinary code takes ~0.3 s
MEMORY_MB = 256  # a checker's address space; a 256 KiB tool of ordinary code peaks at ~80 MB
CPU_S = 60  # a checker's CPU time for its whole life (a backstop; retired at half of it)
SPARES = 1  # started ahead, for a workspace without a checker of its own
IDLE_KEPT = 4  # idle checkers kept for the workspaces that used them last
KEEP_RSS_MB = 64  # a checker holding more after an analysis is retired
RECYCLE_AFTER = 500  # analyses one checker makes at most
WAIT_S = 10.0  # for a place, beyond which the checkers are too busy (503)
START_S = 10.0  # for a checker to start and confine itself
ANSWER_BYTES = 8 * 1024 * 1024  # one answer frame: a JavaScript script can be ~4x its code


class _Checker:
    """One checker process and the host's end of its socket."""

    def __init__(self, argv: Sequence[str]) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={},
                cwd="/",
                start_new_session=True,
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.sock = mine
        self.reader = protocol.Reader(mine)
        self.owner: str | None = None
        self.uses = 0
        try:
            ready = self.reader.recv(1024, time.monotonic() + START_S)
        except protocol.FrameError as exc:
            self.kill()
            raise OSError(f"the code checker did not start ({exc})") from None
        if ready != {"op": "ready"}:
            self.kill()
            raise OSError("the code checker did not start")

    def ask(self, language: str, code: str, deadline: float) -> Any:
        """The checker's answer (a parsed frame); ``protocol.FrameError`` when the deadline
        passed, the checker ended or it answered out of the rules."""
        request = protocol.encode({"language": language, "code": code})
        protocol.write(self.sock, request, deadline)
        answer = self.reader.recv(ANSWER_BYTES, deadline)
        if self.reader.repaired or self.reader.pending():
            raise protocol.FrameError("garbage", "an answer out of the rules")
        return answer

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fit(self) -> bool:
        """Whether it may serve again: within its memory and half its life's CPU time."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])  # utime + stime
            rss_pages = int(fields[21])
        except (OSError, IndexError, ValueError):
            return False
        cpu_s = ticks / os.sysconf("SC_CLK_TCK")
        rss_mb = rss_pages * os.sysconf("SC_PAGE_SIZE") / (1 << 20)
        return cpu_s < CPU_S / 2 and rss_mb < KEEP_RSS_MB

    def ended(self, wait_s: float = 1.0) -> int | None:
        """How it ended (``Popen.returncode``), waiting a moment for it."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout=wait_s)
        return None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self.sock.close()


class CheckerPool:
    """A runner's code checkers: analyses in checker processes (see above)."""

    def __init__(
        self,
        *,
        workers: int = WORKERS,
        seconds: float = SECONDS,
        memory_mb: int = MEMORY_MB,
        strict: bool = True,
        argv: Sequence[str] | None = None,
    ) -> None:
        self.seconds = seconds
        self.memory_mb = memory_mb
        self.fair = FairShare(workers)
        self.queue = CheckQueue(int(seconds) + 1)  # per workspace: running or waiting
        self._argv = list(argv) if argv is not None else [
            sys.executable, "-I", "-m", "toolkiln.sandbox.checker",
            str(memory_mb), str(CPU_S), str(os.getpid()), str(int(strict)),
        ]  # fmt: skip
        self._lock = threading.Lock()
        self._spares: list[_Checker] = []
        self._idle: list[_Checker] = []  # oldest first
        self._starting = 0
        self._closed = False
        self.started = 0  # checkers started (tests read it)
        self.over_limit = 0  # analyses refused for their time or memory
        # Checkers are started by one thread that lives as long as the pool: the kernel's
        # parent-death signal follows the thread that started them, and a request's ends.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="toolkiln-checks")

    # -- the port

    def analyse(self, language: str, code: str, workspace_id: str) -> Analysis:
        if problems := precheck(language, code):
            return Analysis(tuple(problems))
        with self.queue.place(workspace_id):
            return self._in_turn(language, code, workspace_id)

    def _in_turn(self, language: str, code: str, workspace_id: str) -> Analysis:
        if not self.fair.acquire(workspace_id, time.monotonic() + WAIT_S):
            raise ServiceUnavailable("Every code checker is busy; try again shortly.")
        try:
            checker = self._take(workspace_id)
            keep = False
            try:
                analysis, keep = self._ask(checker, language, code)
                return analysis
            finally:
                self._give_back(checker, keep)
        finally:
            self.fair.release(workspace_id)

    def _ask(self, checker: _Checker, language: str, code: str) -> tuple[Analysis, bool]:
        """The analysis, and whether the checker may serve again."""
        try:
            answer = checker.ask(language, code, time.monotonic() + self.seconds)
        except protocol.FrameError as exc:
            if exc.kind == "timeout":
                return self._refused("time"), False
            return self._ended(checker, exc), False
        except OSError as exc:
            return self._ended(checker, protocol.FrameError("eof", str(exc))), False
        if answer == {"limit": "memory"}:
            return self._refused("memory"), False
        try:
            return Analysis.from_wire(answer, language, code), True
        except ValueError as exc:
            log.error("a code checker answered out of the rules (%s); it was replaced", exc)
            return self._refused("failed"), False

    def _ended(self, checker: _Checker, exc: protocol.FrameError) -> Analysis:
        """What a checker that stopped answering tells by how it ended."""
        code = checker.ended() if exc.kind == "eof" else None
        if code in (-signal.SIGXCPU, -signal.SIGKILL):  # its CPU time (RLIMIT_CPU)
            return self._refused("time")
        if code == -signal.SIGABRT:  # what the JavaScript parser does when malloc fails
            return self._refused("memory")
        log.error("a code checker failed (%s, exit %s); it was replaced", exc, code)
        return self._refused("failed")

    def _refused(self, limit: str) -> Analysis:
        if limit == "time":
            self.over_limit += 1
            return Analysis.refused(
                f"took longer than {self.seconds:g} s to parse: make it shorter or simpler",
                "time",
            )
        if limit == "memory":
            self.over_limit += 1
            return Analysis.refused(
                f"took more than {self.memory_mb} MB of memory to parse: make it shorter or "
                "simpler",
                "memory",
            )
        return Analysis.refused(FAILED, "failed")

    # -- checkers

    def _take(self, workspace_id: str) -> _Checker:
        """The workspace's own idle checker, else a spare (which becomes its own)."""
        with self._lock:
            for checker in reversed(self._idle):
                if checker.owner == workspace_id:
                    self._idle.remove(checker)
                    if checker.alive():
                        return checker
                    checker.kill()
                    break
            spare = self._spares.pop() if self._spares else None
        while spare is None or not spare.alive():
            if spare is not None:
                spare.kill()
            try:
                spare = self._spawner.submit(self._start).result(timeout=START_S + 5)
            except Exception as exc:
                log.error("a code checker could not be started: %s", exc)
                raise ServiceUnavailable("The code checker could not be started.") from None
        spare.owner = workspace_id
        self.warm()
        return spare

    def _give_back(self, checker: _Checker, keep: bool) -> None:
        checker.uses += 1
        keep = keep and checker.uses < RECYCLE_AFTER and checker.fit()
        evicted: list[_Checker] = []
        with self._lock:
            if keep and not self._closed:
                self._idle.append(checker)
                evicted, self._idle = self._idle[:-IDLE_KEPT], self._idle[-IDLE_KEPT:]
            else:
                evicted = [checker]
        for old in evicted:
            old.kill()

    def _start(self) -> _Checker:
        checker = _Checker(self._argv)
        self.started += 1
        return checker

    def warm(self) -> None:
        """Start spares, in the background, until ``SPARES`` are ready or starting."""
        with self._lock:
            wanted = SPARES - len(self._spares) - self._starting
            if self._closed or wanted <= 0:
                return
            self._starting += wanted
        for _ in range(wanted):
            with contextlib.suppress(RuntimeError):  # closing
                self._spawner.submit(self._start_spare)

    def _start_spare(self) -> None:
        checker = None
        try:
            checker = self._start()
        except Exception as exc:
            log.error("a spare code checker could not be started: %s", exc)
        with self._lock:
            self._starting -= 1
            if checker is not None and not self._closed:
                self._spares.append(checker)
                checker = None
        if checker is not None:
            checker.kill()

    def idle(self) -> dict[int, str | None]:
        """The idle checkers, oldest first: each one's process id and the workspace it serves."""
        with self._lock:
            return {c.proc.pid: c.owner for c in self._idle}

    def pids(self) -> list[int]:
        """The live checkers' process ids (spares and idle ones)."""
        with self._lock:
            return [c.proc.pid for c in [*self._spares, *self._idle] if c.alive()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            left, self._spares, self._idle = [*self._spares, *self._idle], [], []
        for checker in left:
            checker.kill()
        self._spawner.shutdown(wait=False, cancel_futures=True)
