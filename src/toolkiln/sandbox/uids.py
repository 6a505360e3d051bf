"""Uid ranges for sandboxes: no two sandboxes on the host share a uid, whichever process runs
them (replicas on one host, test runs beside a service).

Each sandbox claims a slot by an exclusive ``flock`` on a file of a host-wide directory and
keeps it for as long as it lives; the kernel drops the lock when the sandbox closes it or its
process dies, so a slot is never held by a process that is gone. (Deriving the range from the
pid, as before, gave two processes whose pids were equal modulo 1000 the same uids: their
calls shared the per-uid process limit, and one could signal the other's processes.)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from toolkiln.sandbox import held, userns

UIDS_PER_SANDBOX = 256
FIRST_UID = 1_000_000
SLOTS = 8192  # 8192 x 256 uids above FIRST_UID: under 2^31


class NoUidRange(Exception):
    """Every slot is held by a running sandbox."""


def _slots_dir() -> Path:
    """``/run/toolkiln-uid-slots`` (root's); elsewhere only for a runner that is not the
    host's root (in a user namespace its ids are its host user's alone: the directory is
    named by that user; without a jail, the development mode), and only a directory of its
    own that nobody else can write (``held.private_directory``)."""
    candidates = [Path("/run") / "toolkiln-uid-slots"]
    if userns.shape() != userns.HOST_ROOT:
        name = f"toolkiln-uid-slots-{userns.outside_uid()}"
        candidates.append(Path(tempfile.gettempdir()) / name)
    path = held.private_directory(candidates)
    if path is None:
        raise NoUidRange("no private directory for the uid slots (/run/toolkiln-uid-slots)")
    return path


class UidRange:
    """``first`` .. ``first + count - 1``, this sandbox's alone until ``release``."""

    def __init__(self) -> None:
        directory = _slots_dir()
        # Root of a user namespace gives ids of its mapped range (userns.call_ids).
        first, count = userns.call_ids() or (FIRST_UID, SLOTS * UIDS_PER_SANDBOX)
        for slot in range(count // UIDS_PER_SANDBOX):
            fd = held.take(directory, str(slot))
            if fd is None:
                continue
            self._fd: int | None = fd
            self.slot = slot
            self.first = first + slot * UIDS_PER_SANDBOX
            self.count = UIDS_PER_SANDBOX
            return
        raise NoUidRange(
            f"all {count // UIDS_PER_SANDBOX} sandbox uid ranges from {first} are in use"
        )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the lock: the slot is free again
            self._fd = None
