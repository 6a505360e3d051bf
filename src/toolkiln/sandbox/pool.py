"""The host's handle on one template process and the warm children it prepares."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkiln.sandbox.cgroups import Cgroups, Handle

log = logging.getLogger("toolkiln.sandbox")
TEMPLATE = Path(__file__).parent / "jail" / "template.py"


class SandboxUnavailable(Exception):
    """The template could not be started with the required isolation, or has died."""


@dataclass(slots=True)
class WarmChild:
    """A forked, fully isolated child waiting for its one request."""

    pid: int  # in the template's PID namespace
    global_pid: int
    pidfd: int
    sock: socket.socket
    cgroup: Handle | None = None
    uses: int = 0  # calls served (JavaScript workers serve several)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.sock.close()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)


@dataclass(slots=True)
class ExitInfo:
    code: int | None
    signal: int | None
    oom: bool


@dataclass
class Template:
    """Starts ``jail/template.py`` and keeps a queue of warm children from it."""

    config: dict[str, Any]
    cgroups: Cgroups | None
    strict: bool = True
    layers: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ready: queue.Queue[WarmChild] = queue.Queue()
        self._exits: dict[int, ExitInfo] = {}
        self._handles: dict[int, Handle | None] = {}
        self._cond = threading.Condition()
        self._alive = False
        host, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._ctl = host
        argv = [sys.executable, "-I", "-S", "-B", str(TEMPLATE)]
        self._proc = subprocess.Popen(
            [*argv, json.dumps({**self.config, "strict": self.strict}), str(child.fileno())],
            pass_fds=[child.fileno()],
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        child.close()
        self._ctl.settimeout(30)
        try:
            raw = self._ctl.recv(65536)
        except TimeoutError as exc:
            self._proc.kill()
            raise SandboxUnavailable("the sandbox template did not start in time") from exc
        hello = json.loads(raw) if raw else {}
        self.layers = hello.get("layers", {})
        self.problems = list(hello.get("problems", ["the template exited during set-up"]))
        if self.cgroups is None or self.cgroups.version is None:
            self.problems.append("no cgroup with memory and pids controllers")
        self.layers["cgroup"] = self.cgroups.version if self.cgroups else None
        if self.problems and self.strict:
            self.close()
            raise SandboxUnavailable("; ".join(self.problems))
        self._ctl.settimeout(None)
        self._alive = True
        self._reader = threading.Thread(target=self._read, name="sandbox-template", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._alive and self._proc.poll() is None

    def _read(self) -> None:
        while True:
            try:
                raw, fds, _, _ = socket.recv_fds(self._ctl, 65536, 2)
            except OSError:
                break
            if not raw:
                break
            try:
                msg = json.loads(raw)
                if msg.get("op") == "ready" and len(fds) == 2:
                    self._adopt(msg, fds)
                    continue
                if msg.get("op") == "exit":
                    self._exited(msg)
            except Exception:  # one bad message must not stop the pool
                log.exception("sandbox template message not handled")
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._alive = False
        with self._cond:
            self._cond.notify_all()

    def _adopt(self, msg: dict[str, Any], fds: list[int]) -> None:
        pidfd, chan = fds
        fds.clear()  # from here on, WarmChild owns (and closes) them
        sock = socket.socket(fileno=chan)
        global_pid = _pid_of(pidfd)
        handle = None
        try:
            if self.cgroups is not None:
                handle = self.cgroups.attach(global_pid)
        except OSError as exc:
            log.error("could not put sandbox child in its cgroup: %s", exc)
            if self.strict:
                WarmChild(msg["pid"], global_pid, pidfd, sock).close()
                return
        with self._cond:
            self._handles[msg["pid"]] = handle
        self._ready.put(WarmChild(msg["pid"], global_pid, pidfd, sock, handle))

    def _exited(self, msg: dict[str, Any]) -> None:
        pid = int(msg["pid"])
        with self._cond:
            handle = self._handles.pop(pid, None)
        oom = self.cgroups.oom_killed(handle) if self.cgroups else False
        if self.cgroups:
            self.cgroups.release(handle)
        with self._cond:
            self._exits[pid] = ExitInfo(msg.get("code"), msg.get("signal"), oom)
            if len(self._exits) > 4096:  # forget the oldest reports nobody asked for
                for old in list(self._exits)[:1024]:
                    del self._exits[old]
            self._cond.notify_all()

    def _request(self, n: int) -> None:
        with contextlib.suppress(OSError):
            self._ctl.send(json.dumps({"op": "spawn", "n": n}).encode())

    def give_back(self, child: WarmChild) -> None:
        """A long-lived worker that finished a call cleanly waits for the next one."""
        self._ready.put(child)

    def replace(self) -> None:
        """Ask for one more child (a worker was retired)."""
        self._request(1)

    def take(self, timeout: float, replenish: bool = True) -> WarmChild:
        if not self.alive:
            raise SandboxUnavailable("the sandbox template is not running")
        try:
            child = self._ready.get(timeout=timeout)
        except queue.Empty:
            raise SandboxUnavailable("no sandbox process became free in time") from None
        if replenish:
            self._request(1)  # keep the pool warm while this one works
        return child

    def wait_exit(self, pid: int, timeout: float) -> ExitInfo | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while pid not in self._exits:
                left = deadline - time.monotonic()
                if left <= 0 or not self._alive:
                    return None
                self._cond.wait(left)
            return self._exits.pop(pid)

    def forget_exit(self, pid: int) -> None:
        with self._cond:
            self._exits.pop(pid, None)

    def close(self) -> None:
        self._alive = False
        with contextlib.suppress(OSError):
            self._ctl.send(json.dumps({"op": "stop"}).encode())
        with contextlib.suppress(OSError):
            self._proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)
        while True:
            try:
                self._ready.get_nowait().close()
            except queue.Empty:
                break
        self._ctl.close()


def _pid_of(pidfd: int) -> int:
    """The pid in our namespace of the process a pidfd refers to."""
    for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines():
        if line.startswith("Pid:"):
            return int(line.split()[1])
    raise OSError("pidfd without a Pid line")
