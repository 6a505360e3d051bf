"""Runs a command as root of a new user namespace that maps to an unprivileged host range,
what rootless Podman or a Kubernetes pod with ``hostUsers: false`` gives a container:

    python namespaced.py OUTER COUNT -- COMMAND...

Run by the host's root (which may write any map). It stays as the command's parent, as
the outer uid (never the host's root), and hands SIGTERM and SIGINT on to it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

CLONE_NEWUSER = 0x10000000


def main() -> int:
    outer, count = int(sys.argv[1]), int(sys.argv[2])
    argv = sys.argv[sys.argv.index("--") + 1 :]
    unshared_r, unshared_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWUSER) != 0:
            os._exit(97)
        os.write(unshared_w, b"u")
        if os.read(mapped_r, 1) != b"m":
            os._exit(98)
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        os.execv(argv[0], argv)
    if os.read(unshared_r, 1) != b"u":
        return 97
    for kind in ("uid", "gid"):
        with open(f"/proc/{pid}/{kind}_map", "w") as out:
            out.write(f"0 {outer} {count}\n")
    os.setgroups([])
    os.setresgid(outer, outer, outer)
    os.setresuid(outer, outer, outer)
    os.write(mapped_w, b"m")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _: os.kill(pid, s))
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
