"""Who a runner is on the host, and the user namespace an unprivileged runner makes for
itself (docs/security.md, "No host root").

A runner is one of three shapes: the host's root; root of a user namespace that maps to an
unprivileged host range (rootless Podman, a Kubernetes pod with ``hostUsers: false``); or an
unprivileged host user, which makes such a namespace itself from its ``/etc/subuid`` and
``/etc/subgid`` ranges (``newuidmap``/``newgidmap``, Debian's uidmap) before anything else
runs, and is then the second shape. In a namespace, the jail's capabilities count only
inside it, and each call's uid is an id of the mapped range: an unprivileged uid on the host.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from toolkiln.sandbox.jail import linux
from toolkiln.sandbox.layers import Missing

HOST_ROOT = "host root"
NAMESPACE_ROOT = "root of a user namespace"
UNPRIVILEGED = "unprivileged"

CLONE_NEWUSER = 0x10000000
# Per-call uids in a namespace: ids of the mapped range from here up, clear of the image's
# and system's own users (the image's is 10001), and below nobody (65534).
FIRST_NAMESPACE_ID = 20_000
LAST_NAMESPACE_ID = 65_533


@dataclass(frozen=True, slots=True)
class Stretch:
    """Ids ``inside`` .. ``inside + count - 1`` of a namespace, ``outside`` .. on its parent."""

    inside: int
    outside: int
    count: int


def id_map(kind: str = "uid", pid: str = "self") -> list[Stretch]:
    """``/proc/<pid>/uid_map`` (or ``gid_map``): the host's root has ``0 0 4294967295``."""
    found = []
    for line in Path(f"/proc/{pid}/{kind}_map").read_text().splitlines():
        inside, outside, count = (int(x) for x in line.split())
        found.append(Stretch(inside, outside, count))
    return found


def shape() -> str:
    """Which of the three this process is."""
    if os.geteuid() != 0:
        return UNPRIVILEGED
    whole = Stretch(0, 0, 4294967295)
    return HOST_ROOT if whole in id_map() else NAMESPACE_ROOT


def call_ids() -> tuple[int, int] | None:
    """(first, count) of the ids a namespace root may give calls: mapped as uids and gids
    both, between FIRST_NAMESPACE_ID and LAST_NAMESPACE_ID; None when the host's root
    (uids.py's own range) or none is mapped."""
    if shape() != NAMESPACE_ROOT:
        return None
    best: tuple[int, int] | None = None
    for u in id_map("uid"):
        for g in id_map("gid"):
            low = max(u.inside, g.inside, FIRST_NAMESPACE_ID)
            high = min(u.inside + u.count, g.inside + g.count, LAST_NAMESPACE_ID + 1)
            if high > low and (best is None or high - low > best[1]):
                best = (low, high - low)
    return best


def outside_uid() -> int:
    """The host uid this process's uid 0 (or own uid) is."""
    uid = os.geteuid()
    for s in id_map():
        if s.inside <= uid < s.inside + s.count:
            return s.outside + uid - s.inside
    return uid


_SYS_CAPSET = 126  # x86_64
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAPABILITY_VERSION_3 = 0x20080522


def drop_capabilities() -> None:
    """An unprivileged process keeps no capability it was started with: a container runtime
    gives a non-root user the capabilities granted to the container as ambient ones, so the
    API and the runner would hold them host-wide. Its bounding set stays: that is what the
    set-uid newuidmap and newgidmap get theirs from (tests/deploy/test_image.py)."""
    if os.geteuid() == 0:
        return  # the host's or a namespace's root: the jail's capabilities are its own
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    none = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; two words each
    if libc.syscall(_SYS_CAPSET, header, none) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def _ranges(path: str, user: pwd.struct_passwd) -> list[tuple[int, int]]:
    """``user``'s ranges in /etc/subuid or /etc/subgid (by name or number)."""
    found = []
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in (user.pw_name, str(user.pw_uid)):
            if parts[1].isdigit() and parts[2].isdigit():
                found.append((int(parts[1]), int(parts[2])))
    return found


def _wanted(chosen: str | None, path: str, user: pwd.struct_passwd) -> tuple[int, int] | str:
    ranges = _ranges(path, user)
    if chosen is not None:
        start, count = (int(x) for x in chosen.split(":"))
        if not any(s <= start and start + count <= s + n for s, n in ranges):
            return f"{start}:{count} is not a range of {user.pw_name}'s in {path}"
        return start, count
    if not ranges:
        return f"{user.pw_name} has no range in {path}"
    return max(ranges, key=lambda r: r[1])


def enter_own_namespace(subuids: str | None = None) -> list[Missing]:
    """Make this (unprivileged, single-threaded) process root of a new user namespace:
    its own uid as 0, and ``subuids`` (START:COUNT; unset: its largest ranges) of
    /etc/subuid and /etc/subgid as ids 1 and up. Returns the layers that cannot be had
    without it (each with why), or [] once inside."""
    user = pwd.getpwuid(os.geteuid())
    why = _enter(user, subuids)
    if why is None:
        return []
    needs = ("namespaces", "readonly_root", "uid")
    return [Missing(layer, f"no user namespace: {why}") for layer in needs]


def _enter(user: pwd.struct_passwd, subuids: str | None) -> str | None:
    if threading.active_count() != 1:
        return "the runner started threads before making its user namespace"
    uids = _wanted(subuids, "/etc/subuid", user)
    gids = _wanted(subuids, "/etc/subgid", user)
    for found in (uids, gids):
        if isinstance(found, str):
            return found
    assert not isinstance(uids, str) and not isinstance(gids, str)  # for mypy: returned above
    located = [shutil.which(t) for t in ("newuidmap", "newgidmap")]
    tools = [t for t in located if t is not None]
    if len(tools) != 2:
        return "newuidmap and newgidmap are not installed (Debian's uidmap package)"
    me, group = os.geteuid(), os.getegid()
    # A helper forked before the unshare writes the maps: newuidmap is set-uid root, which
    # works only from outside the new namespace.
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        os.close(done_r)
        code = 1
        try:
            if os.read(ready_r, 1) == b"u":
                parent = str(os.getppid())
                maps = [
                    [tools[0], parent, "0", str(me), "1", "1", str(uids[0]), str(uids[1])],
                    [tools[1], parent, "0", str(group), "1", "1", str(gids[0]), str(gids[1])],
                ]
                for argv in maps:
                    run = subprocess.run(argv, capture_output=True, text=True, check=False)
                    if run.returncode != 0:
                        os.write(done_w, run.stderr.strip().encode()[-400:] or b"failed")
                        break
                else:
                    code = 0
        finally:
            os._exit(code)
    os.close(ready_r)
    os.close(done_w)
    try:
        linux.unshare(CLONE_NEWUSER)
    except OSError as exc:
        os.close(ready_w)
        os.waitpid(helper, 0)
        return f"unshare(CLONE_NEWUSER): {exc} (sysctl user.max_user_namespaces)"
    os.write(ready_w, b"u")
    os.close(ready_w)
    told = b""
    while chunk := os.read(done_r, 512):
        told += chunk
    os.close(done_r)
    _, status = os.waitpid(helper, 0)
    if status != 0:
        return f"newuidmap/newgidmap: {told.decode(errors='replace') or 'failed'}"
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.setgroups([])
    return None
