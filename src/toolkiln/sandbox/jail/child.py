"""What a freshly forked child becomes before any tool byte: decided here, done by _spawn.c."""

from __future__ import annotations

import os
import resource
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from config import JailConfig


def limits(cfg: JailConfig) -> list[tuple[int, int, int]]:
    """(resource, soft, hard) for every rlimit a child gets; set by _spawn.c in each new
    child before any of its Python runs."""
    mb = 1024 * 1024
    # A Python child serves one call: max_cpu_s. A JavaScript worker serves several, so its
    # limit is for its life (``worker_cpu_s``), and it stops serving before a call could
    # start with less than max_cpu_s of it left (jsrunner.spent): CPU time earlier calls
    # used never cuts a later call short.
    cpu = cfg.worker_cpu_s or cfg.max_cpu_s
    # A backstop: the host's clock ends each call. Tool code may not change RLIMIT_CPU
    # (seccomp), and the hard limit's SIGKILL must never come before the host's deadline, or
    # it would look like a kill from outside (exits.OUTSIDE_SIGNALS): every CPU busy for the
    # longest call, and a margin. (The host cannot lower it per call: prlimit on another
    # uid's process needs CAP_SYS_RESOURCE, which the reference host's root lacks.)
    hard = cpu * len(os.sched_getaffinity(0)) + 2
    found = [(resource.RLIMIT_CPU, cpu, hard)]
    if not cfg.javascript:
        # V8 aborts under RLIMIT_AS; JavaScript workers rely on V8's heap limit and the cgroup.
        found.append((resource.RLIMIT_AS, *(cfg.address_space_mb * mb,) * 2))
    for res, value in [
        (resource.RLIMIT_NPROC, cfg.max_threads),
        (resource.RLIMIT_NOFILE, cfg.max_open_files),
        (resource.RLIMIT_FSIZE, cfg.max_file_mb * mb),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_MEMLOCK, 0),
        (resource.RLIMIT_MSGQUEUE, 0),
    ]:
        found.append((res, value, value))
    return found


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


def become(scratch: str) -> None:
    """What a new child does in Python, once _spawn.c has made it what ``limits`` and the
    template's seccomp part say (the parent's death signal, every descriptor but its channel
    closed, SIGCHLD back to the default and the template's signal mask, its scratch as its
    directory, its rlimits, its own uid, non-dumpable, no_new_privs and the filter, in that
    order): its HOME and TMPDIR."""
    os.environ["HOME"] = os.environ["TMPDIR"] = scratch  # the rest: prepare()
