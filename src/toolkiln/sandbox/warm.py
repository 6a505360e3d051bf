"""A warm child: a forked, fully isolated process of a template, waiting for its request."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkiln.sandbox.cgroups import Handle

if TYPE_CHECKING:
    from toolkiln.sandbox.pool import Template


@dataclass(slots=True)
class WarmChild:
    """A forked, fully isolated child waiting for its one request."""

    pid: int  # in the template's PID namespace
    global_pid: int
    pidfd: int
    sock: socket.socket
    cgroup: Handle | None = None
    uses: int = 0  # calls served (JavaScript workers serve several)
    gen: int = 0  # which template process forked it
    owner: str | None = None  # the one workspace a long-lived worker serves, once it served one
    home: Template | None = None  # the pool that made it (set by it; a Python sandbox has two)

    def alive(self) -> bool:
        """A pidfd polls readable once its process has ended."""
        try:
            poller = select.poll()
            poller.register(self.pidfd, select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    def hurry(self) -> None:
        """Back to the service's own priority for its call (it was made at a lower one)."""
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, self.global_pid, os.getpriority(os.PRIO_PROCESS, 0))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.sock.close()
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
