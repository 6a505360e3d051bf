"""The host's handle on one template process and the warm children it prepares.

The pool heals itself (docs/security.md, "When sandbox processes die"):
- a keeper thread restarts a dead template with backoff and survives its own errors;
- every child is checked alive (a poll of its pidfd) before it is handed out, and a dead
  one is discarded and replaced;
- how a child ended is reported with the host's judgement of whose doing it was
  (``ExitInfo.outside``), so a process killed from outside is not counted against the tool.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkiln.sandbox.cgroups import Cgroups, Handle
from toolkiln.sandbox.exits import ExitInfo, judge, last_words
from toolkiln.sandbox.jail import protocol
from toolkiln.sandbox.jail.config import JailConfig
from toolkiln.sandbox.layers import Missing, refused
from toolkiln.sandbox.warm import WarmChild

log = logging.getLogger("toolkiln.sandbox")
TEMPLATE = Path(__file__).parent / "jail" / "template.py"

BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.05, 5.0
READER_JOIN_S = 5.0


class SandboxUnavailable(Exception):
    """The template could not be started with the required isolation, or has died."""


class LayerRefused(SandboxUnavailable):
    """A layer is missing and not accepted: the sandbox does not start. The message names
    each such layer, how a host gives it, and the setting that accepts its absence."""

    def __init__(self, missing: Iterable[Missing]) -> None:
        self.missing = tuple(missing)
        super().__init__("; ".join(m.refusal() for m in self.missing))


class _Generation:
    """One started template process: its control socket and what it reported at start."""

    def __init__(self, number: int, config: JailConfig) -> None:
        self.number = number
        self.alive = False
        self.reader: threading.Thread | None = None  # the pool's thread reading its reports
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.ctl = host
        argv = [sys.executable, "-I", "-S", "-B", str(TEMPLATE)]
        self.proc = subprocess.Popen(
            [*argv, config.to_json(), str(child.fileno())],
            pass_fds=[child.fileno()],
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            # Read only if it dies before its hello: then its last words say why.
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        child.close()
        self.ctl.settimeout(30)
        try:
            raw = self.ctl.recv(65536)
        except (TimeoutError, OSError) as exc:
            self.stop()
            raise SandboxUnavailable("the sandbox template did not start in time") from exc
        self.ctl.settimeout(None)
        hello = json.loads(raw) if raw else {}
        self.layers: dict[str, Any] = hello.get("layers", {})
        told = (
            hello["problems"]
            if "problems" in hello
            else [("namespaces", last_words(self.proc.stderr))]
        )
        self.missing = [Missing(str(layer), str(reason)) for layer, reason in told]
        # Never read again: the template and its children write to a closed pipe (EPIPE),
        # so no child can fill it and hold another's write.
        self._close_stderr()
        for note in hello.get("notes", [])[:8]:
            log.warning("sandbox template (generation %d): %s", number, str(note)[:500])

    def _close_stderr(self) -> None:
        if self.proc.stderr is not None:
            with contextlib.suppress(OSError):
                self.proc.stderr.close()

    def request(self, n: int) -> None:
        with contextlib.suppress(OSError):
            self.ctl.send(protocol.SPAWN + b"%d}" % n)

    def stop(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.ctl.send(protocol.STOP)
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._close_stderr()
        self.ctl.close()


@dataclass
class Template:
    """Starts ``jail/template.py``, keeps a queue of warm children from it, and restarts it
    when it dies."""

    config: JailConfig
    cgroups: Cgroups | None
    # Why the sandbox has no cgroups (its own start failed), for the refusal.
    cgroup_problem: str = "no cgroup with memory and pids controllers"
    layers: dict[str, Any] = field(default_factory=dict)
    missing: list[Missing] = field(default_factory=list)  # the layers the host did not give

    @property
    def strict(self) -> bool:
        return self.config.strict

    @property
    def problems(self) -> list[str]:
        """Each missing layer, as ``layer: what the kernel answered``."""
        return [f"{m.layer}: {m.reason}" for m in self.missing]

    def __post_init__(self) -> None:
        self._ready: collections.deque[WarmChild] = collections.deque()
        self._exits: dict[tuple[int, int], ExitInfo] = {}
        # Children handed out whose end is to be replaced (``replace_on_exit``): the reader
        # thread asks for the replacement when the template reports the end, so the call's
        # own thread never wakes the template (docs/decisions/100-warm-children-from-a-template.md).
        self._served: set[tuple[int, int]] = set()
        # Takers waiting for a child, and children asked for and not yet here: while more
        # wait than are coming, more are asked for (``_take_ready``). Those beyond the warm
        # ones are ``_on_demand``: as many served children's ends are then not replaced, so
        # the pool shrinks back to warm.
        self._waiting = 0
        self._coming = 0
        self._on_demand = 0
        self._handles: dict[tuple[int, int], Handle | None] = {}
        # One lock, and one condition per kind of waiter, so that a child made or ended wakes
        # only those waiting for it: takers (a child ready), the runners waiting for their
        # child's end, and the keeper (a template died). With one condition for all, every
        # child woke the keeper and every waiting runner twice
        # (docs/decisions/112-pool-wake-ups.md).
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # a child ready, a template (re)started
        self._exit_cond = threading.Condition(lock)  # a child's end reported
        self._keep_cond = threading.Condition(lock)  # a template died, or the pool closed
        self._closed = threading.Event()
        self._adopting = threading.Lock()  # the reader putting a child in its cgroup
        self._gens = 0
        self._gen: _Generation | None = None
        self._dead_gens: set[int] = set()
        self._degraded: str | None = None
        self._restarts = 0
        self._discarded = 0
        self._start()  # the first start is synchronous: strict mode refuses to run without it
        self._keeper = threading.Thread(target=self._keep, name="sandbox-keeper", daemon=True)
        self._keeper.start()

    # --- starting, watching and restarting the template

    def _start(self) -> None:
        """Start a template process (again); callers see it only once it is ready."""
        self._gens += 1
        gen = _Generation(self._gens, self.config)
        layers, missing = gen.layers, gen.missing
        if self.cgroups is None or self.cgroups.version is None:
            missing.append(Missing("cgroup", self.cgroup_problem))
        layers["cgroup"] = self.cgroups.version if self.cgroups else None
        layers["kernel"] = os.uname().release
        stopping = refused(missing, self.config.accept)
        if stopping and self.strict:
            gen.stop()
            raise LayerRefused(stopping)
        self.layers, self.missing = layers, missing
        gen.alive = True
        with self._cond:
            if self._gen is not None:
                self._restarts += 1
                self._degraded = None
            self._gen = gen
            self._cond.notify_all()
        gen.reader = threading.Thread(
            target=self._read, args=(gen,), name="sandbox-template", daemon=True
        )
        gen.reader.start()

    def _notify_all(self) -> None:
        """Wake every waiter (the lock held): a template died or the pool closed."""
        for cond in (self._cond, self._exit_cond, self._keep_cond):
            cond.notify_all()

    def _keep(self) -> None:
        """Restart a dead template with backoff; never let one failure end the keeper."""
        delay = BACKOFF_FIRST_S
        while not self._closed.is_set():
            try:
                with self._cond:
                    while self._gen is not None and self._gen.alive and not self._closed.is_set():
                        self._keep_cond.wait()
                if self._closed.is_set():
                    return
                if self._closed.wait(delay):
                    return
                self._start()
                if self._closed.is_set():  # closed while starting: stop what just started
                    with self._cond:
                        gen = self._gen
                    if gen is not None:
                        gen.stop()
                    return
                log.warning("sandbox template restarted (%d so far)", self._restarts)
                delay = BACKOFF_FIRST_S
            except Exception as exc:  # the keeper must outlive any failure
                self._degraded = f"the sandbox template could not be restarted: {exc}"
                log.error("%s (next try in %.2f s)", self._degraded, delay)
                delay = min(delay * 2, BACKOFF_MAX_S)

    def _read(self, gen: _Generation) -> None:
        while True:
            try:
                raw, fds, _, _ = socket.recv_fds(gen.ctl, 65536, 2)
            except OSError:
                break
            if not raw:
                break
            try:
                msg = json.loads(raw)
                if msg.get("op") == "ready" and len(fds) == 2:
                    self._adopt(gen, msg, fds)
                    continue
                if msg.get("op") == "exit":
                    self._exited(gen, msg)
            except Exception:  # one bad message must not stop the pool
                log.exception("sandbox template message not handled")
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._died(gen)

    def _died(self, gen: _Generation) -> None:
        with self._cond:
            if not gen.alive:
                return
            gen.alive = False
            self._dead_gens.add(gen.number)
            self._served = {k for k in self._served if k[0] != gen.number}
            self._coming = self._on_demand = 0
            if not self._closed.is_set():
                self._degraded = "the sandbox template died; restarting it"
                log.error("sandbox template (generation %d) died; restarting it", gen.number)
            # Its children die with it (it is PID 1 of their namespace): none is handed out.
            stale = [c for c in self._ready if c.gen == gen.number]
            self._ready = collections.deque(c for c in self._ready if c.gen != gen.number)
            self._notify_all()
        for child in stale:
            child.close()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            gen.proc.kill()
            gen.proc.wait(timeout=5)

    def _adopt(self, gen: _Generation, msg: dict[str, Any], fds: list[int]) -> None:
        pidfd, chan = fds
        fds.clear()  # from here on, WarmChild owns (and closes) them
        # The template made it with socketpair(AF_UNIX, SOCK_STREAM): named here, so the
        # socket module does not ask the kernel (three syscalls a child).
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=chan)
        # close() stops the template only between two adoptions: a child made while the pool
        # closes is never put in a cgroup the sandbox is removing (ESRCH or ENOENT, logged as
        # errors at nearly every close while children were being made).
        with self._adopting:
            if self._closed.is_set():
                sock.close()
                os.close(pidfd)
                return
            global_pid = _pid_of(pidfd)
            child = WarmChild(int(msg["pid"]), global_pid, pidfd, sock, gen=gen.number, home=self)
            try:
                if self.cgroups is not None:
                    cpu = not self.config.cpu_when_taken
                    child.cgroup = self.cgroups.attach(global_pid, cpu=cpu)
            except OSError as exc:
                log.error("could not put sandbox child in its cgroup: %s", exc)
                if self.strict:
                    child.close()
                    return
        with self._cond:
            self._coming = max(0, self._coming - 1)
            self._handles[(gen.number, child.pid)] = child.cgroup
            if not gen.alive:
                child.close()
                return
            self._ready.append(child)
            # One child, one taker: waking every waiting taker for each child (16 under 16
            # clients) was ~10% of the service's GIL time (docs/decisions/112-pool-wake-ups.md).
            self._cond.notify()

    def _exited(self, gen: _Generation, msg: dict[str, Any]) -> None:
        key = (gen.number, int(msg["pid"]))
        with self._cond:
            handle = self._handles.pop(key, None)
            served = key in self._served
            self._served.discard(key)
            if served and self._on_demand:
                self._on_demand -= 1
                served = False  # it stood for a child made on demand: not replaced
        if served and gen.alive:
            self._request(1)  # a child that served a call: never one discarded or dead unused
        # The OOM killer ends a process with SIGKILL: any other end needs no read of the
        # slot's count (three system calls for every call's child on the reader's thread).
        killed = msg.get("signal") == signal.SIGKILL
        oom = self.cgroups.oom_killed(handle) if self.cgroups and killed else False
        if self.cgroups:
            self.cgroups.release(handle)
        info = judge(msg.get("code"), msg.get("signal"), oom)
        with self._cond:
            self._exits[key] = info
            if len(self._exits) > 4096:  # forget the oldest reports nobody asked for
                for old in list(self._exits)[:1024]:
                    del self._exits[old]
            self._exit_cond.notify_all()

    # --- what the runners use

    @property
    def alive(self) -> bool:
        gen = self._gen
        return gen is not None and gen.alive and gen.proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The running template's process (its PID 1 is that process's one child), if any."""
        gen = self._gen
        return gen.proc.pid if gen is not None and gen.alive else None

    def idle(self) -> list[WarmChild]:
        """The warm children waiting to be taken, oldest first: a copy."""
        with self._cond:
            return list(self._ready)

    def health(self) -> dict[str, Any]:
        """For /healthz: whether the pool is degraded, why, and what it has healed."""
        ready = len(self.idle())
        degraded = self._degraded
        if degraded is None and not self.alive:
            degraded = "the sandbox template is not running"
        return {
            "degraded": degraded is not None,
            "reason": degraded,
            "warm": ready,
            "template_restarts": self._restarts,
            "dead_children_discarded": self._discarded,
        }

    def warm_children(self) -> list[WarmChild]:
        """The children ready now (the start-up self-test looks at one from /proc)."""
        with self._cond:
            return list(self._ready)

    def _request(self, n: int) -> None:
        gen = self._gen
        if gen is not None and gen.alive:
            with self._cond:
                self._coming += n
            gen.request(n)

    def give_back(self, child: WarmChild) -> None:
        """A long-lived worker that finished a call cleanly waits for the next one."""
        with self._cond:
            if self._gen is not None and child.gen == self._gen.number and self._gen.alive:
                self._ready.append(child)
                self._cond.notify()
                return
        child.close()

    def replace(self, child: WarmChild | None = None) -> None:
        """Ask for one more child (a worker was retired); none for a dead template's, and
        none where the end of each child handed out is replaced (``replace_on_exit``)."""
        if self.config.replace_on_exit:
            return
        if child is None or (self._gen is not None and child.gen == self._gen.number):
            self._request(1)

    def take(
        self,
        timeout: float,
        replenish: bool = False,
        rank: Callable[[WarmChild], int] | None = None,
    ) -> WarmChild:
        """A live child of the running template, waiting up to ``timeout`` (also for a
        restart). A child found dead is discarded and replaced, never handed out. With
        ``rank``, the ready child ranked lowest is taken first. ``replenish`` asks for one
        more child at once; neither runtime does (a Python child is replaced when its end is
        reported, a JavaScript worker when it retires), so it is off unless asked for.

        With ``cpu_when_taken`` (Python), a child waits, and warms up, outside its slot's CPU
        group, at the warm nice value beside the service's threads; it enters that group
        here, before it is handed out, so no call's code runs outside it. Warming up in
        its CPU group made sequential calls ~0.3 ms slower at p50
        (docs/decisions/105-cpu-group-entered-when-taken.md)."""
        deadline = time.monotonic() + timeout
        while True:
            child = self._take_ready(deadline, replenish, rank)
            if self._into_cpu_group(child):
                return child

    def _into_cpu_group(self, child: WarmChild) -> bool:
        """False if the child ended while it waited (then closed; its end is reported and
        replaced as any other's). Not under the pool's lock: a move between cgroups can wait
        for the kernel (its threadgroup lock)."""
        if not self.config.cpu_when_taken or self.cgroups is None or child.cgroup is None:
            return True
        try:
            self.cgroups.enter_cpu(child.cgroup, child.global_pid)
            if child.alive():
                return True
            # Ended, not yet reaped: the kernel moves a zombie without a word (ESRCH comes
            # only once it is reaped). Handed out, its call would end as killed from outside.
        except OSError as exc:
            if exc.errno != errno.ESRCH:
                log.error("could not put a sandbox process in its CPU group: %s", exc)
                if not self.strict:
                    return True
                child.close()
                why = f"the sandbox's CPU limit could not be applied: {exc}"
                raise SandboxUnavailable(why) from None
        child.close()
        with self._cond:
            self._discarded += 1
        return False

    def _take_ready(
        self,
        deadline: float,
        replenish: bool,
        rank: Callable[[WarmChild], int] | None,
    ) -> WarmChild:
        dead: list[WarmChild] = []
        waiting = False
        try:
            with self._cond:
                while True:
                    if self._closed.is_set():
                        raise SandboxUnavailable("the sandbox is shut down")
                    current = self._gen.number if self.alive else -1  # type: ignore[union-attr]
                    if rank is not None and len(self._ready) > 1:
                        best = min(range(len(self._ready)), key=lambda i: rank(self._ready[i]))
                        chosen = self._ready[best]
                        del self._ready[best]
                        self._ready.appendleft(chosen)
                    while self._ready:
                        child = self._ready.popleft()
                        if child.gen == current and child.alive():
                            child.hurry()
                            if self.config.replace_on_exit:
                                self._served.add((child.gen, child.pid))
                            if replenish:
                                self._request(1)  # keep the pool warm while this one works
                            return child
                        dead.append(child)
                        if child.gen == current:
                            self._discarded += 1
                            self._request(1)
                    if not waiting:
                        waiting = True
                        self._waiting += 1
                    self._ask_for_takers()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        if not self.alive:
                            why = self._degraded or "the sandbox template is not running"
                            raise SandboxUnavailable(why)
                        raise SandboxUnavailable("no sandbox process became free in time")
                    self._cond.wait(left)
        except BaseException:
            # Leaving without a child: one this taker was woken for goes to the next taker.
            with self._cond:
                if self._ready:
                    self._cond.notify()
            raise
        finally:
            if waiting:
                with self._cond:
                    self._waiting -= 1
            for child in dead:
                child.close()

    def _ask_for_takers(self) -> None:
        """Under the lock: a child coming for each waiting taker. A taker holds a place of
        the sandbox's fair share, so its call runs now rather than when another call's child
        ends (a child made for one waiter may be taken by a taker that came later: then more
        are asked for). Without it, calls ran at most ``warm`` at once and waiting takers
        were woken in no order, the fair share's order lost (tests/security/test_slow_work.py).
        Only where each child serves one call (``replace_on_exit``)."""
        if not self.config.replace_on_exit or not self.alive:
            return
        need = self._waiting - self._coming
        if need > 0:
            self._on_demand += need
            self._request(need)

    def wait_exit(self, child: WarmChild, timeout: float) -> ExitInfo | None:
        """How ``child`` ended; None if the template did not say in time (then the process
        may still run: e.g. it closed its channel itself)."""
        key = (child.gen, child.pid)
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self._exits:
                if child.gen in self._dead_gens:
                    died = "the sandbox template died"
                    return ExitInfo(None, signal.SIGKILL, False, outside=died)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._exit_cond.wait(left)
            return self._exits.pop(key)

    def forget_exit(self, child: WarmChild) -> None:
        with self._cond:
            self._exits.pop((child.gen, child.pid), None)

    def close(self) -> None:
        with self._adopting:
            self._closed.set()
        with self._cond:
            gen = self._gen
            ready, self._ready = list(self._ready), collections.deque()
            self._notify_all()
        if gen is not None:
            gen.stop()
            # The reader's last reports (the children's ends) are read before the sandbox
            # removes their cgroups.
            if gen.reader is not None and gen.reader is not threading.current_thread():
                gen.reader.join(timeout=READER_JOIN_S)
        for child in ready:
            child.close()


def _pid_of(pidfd: int) -> int:
    """The pid in our namespace of the process a pidfd refers to (plain file descriptors:
    this runs for every child, on the pool's reader thread)."""
    fd = os.open(f"/proc/self/fdinfo/{pidfd}", os.O_RDONLY)
    try:
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    for line in text.splitlines():
        if line.startswith(b"Pid:"):
            return int(line.split()[1])
    raise OSError("pidfd without a Pid line")
