"""Host-wide claims on names: an exclusive ``flock`` on a file of a private directory, kept
for as long as the descriptor is open. The kernel drops the lock when its holder closes it or
dies, killed or not, so a name is never held by a process that is gone (uids.py: the uid
slots of sandboxes; userns.py: the id ranges of root APIs' embedded runners).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path


def private_directory(candidates: list[Path]) -> Path | None:
    """The first of ``candidates`` that is, or is made, a directory of this euid's that no
    one else can write (a world-writable ``/tmp`` would let another user plant or swap the
    files); None if none is."""
    for path in candidates:
        with contextlib.suppress(OSError):
            path.mkdir(mode=0o700, exist_ok=True)
            info = path.lstat()
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
                # 0700 whatever the umask it was made under: without its search bit only
                # a process with CAP_DAC_OVERRIDE could use it (tests/security/test_uid_ranges.py).
                os.chmod(path, 0o700)
                info = path.lstat()
            if (
                stat.S_ISDIR(info.st_mode)
                and info.st_uid == os.geteuid()
                and not (info.st_mode & 0o077)
            ):
                return path
    return None


def take(directory: Path, name: str) -> int | None:
    """The descriptor that holds ``directory/name``, or None while another process does."""
    path = directory / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # Locked the file the name still means (not one removed from under it).
        held, named = os.fstat(fd), os.stat(path, follow_symlinks=False)
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
            raise BlockingIOError
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    return fd
