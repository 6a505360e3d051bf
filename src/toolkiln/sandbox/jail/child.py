"""Turning a freshly forked child into a jailed, unprivileged process, before any tool byte."""

from __future__ import annotations

import _signal
import os
import resource
import signal
import socket

import linux


def _limits(cfg: dict) -> None:
    mb = 1024 * 1024
    # A Python child serves one call: max_cpu_s. A JavaScript worker serves several, so its
    # limit is for its life (``worker_cpu_s``), and it stops serving before a call could
    # start with less than max_cpu_s of it left (jsrunner.spent): CPU time earlier calls
    # used never cuts a later call short.
    cpu = int(cfg.get("worker_cpu_s") or cfg["max_cpu_s"])
    # A backstop: the host's clock ends each call. Tool code may not change RLIMIT_CPU
    # (seccomp), and the hard limit's SIGKILL must never come before the host's deadline, or
    # it would look like a kill from outside (pool.OUTSIDE_SIGNALS): every CPU busy for the
    # longest call, and a margin. (The host cannot lower it per call: prlimit on another
    # uid's process needs CAP_SYS_RESOURCE, which the reference host's root lacks.)
    hard = cpu * len(os.sched_getaffinity(0)) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, hard))
    if cfg.get("runtime") != "javascript":
        # V8 aborts under RLIMIT_AS; JavaScript workers rely on V8's heap limit and the cgroup.
        resource.setrlimit(resource.RLIMIT_AS, (int(cfg["address_space_mb"]) * mb,) * 2)
    for res, value in [
        (resource.RLIMIT_NPROC, int(cfg["max_threads"])),
        (resource.RLIMIT_NOFILE, int(cfg["max_open_files"])),
        (resource.RLIMIT_FSIZE, int(cfg["max_file_mb"]) * mb),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_MEMLOCK, 0),
        (resource.RLIMIT_MSGQUEUE, 0),
    ]:
        resource.setrlimit(res, (value, value))


# The environment of every child but its HOME and TMPDIR, set once in the template.
ENVIRONMENT = {
    "LANG": "C.UTF-8",
    "PATH": "/nonexistent",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


def prepare() -> None:
    """What is the same for every child, done once in the template before it forks: a child
    inherits it. (Each page a child's Python touches is a copy-on-write fault, ~4 us here:
    setting the whole environment and three signals in every child cost ~100 of them.)"""
    os.environ.clear()
    os.environ.update(ENVIRONMENT)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)


def become(sock: socket.socket, uid: int, scratch: str, cfg: dict, installer) -> None:
    """Order matters: fds, signals, limits, identity, then no_new_privs + seccomp last."""
    linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    keep = sock.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    signal.set_wakeup_fd(-1)
    # The template's SIGCHLD handler back to the default, through the C function: signal's
    # wrapper looks the old handler up among its enum members, an exception for a function.
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    os.chdir(scratch)
    os.environ["HOME"] = os.environ["TMPDIR"] = scratch  # the rest: prepare()
    _limits(cfg)
    if os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    linux.prctl(linux.PR_SET_DUMPABLE, 0)
    if installer is not None:
        installer.install()
