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
import logging
import os
import pwd
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolkiln.sandbox import held
from toolkiln.sandbox.jail import linux
from toolkiln.sandbox.layers import Missing

log = logging.getLogger("toolkiln.sandbox")

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
    names = (user.pw_name, str(user.pw_uid))
    return [(start, count) for who, start, count in _all_ranges(path) if who in names]


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

    def write(parent: str) -> str | None:
        # newuidmap is set-uid root, which works only from outside the new namespace.
        maps = [
            [tools[0], parent, "0", str(me), "1", "1", str(uids[0]), str(uids[1])],
            [tools[1], parent, "0", str(group), "1", "1", str(gids[0]), str(gids[1])],
        ]
        for argv in maps:
            run = subprocess.run(argv, capture_output=True, text=True, check=False)
            if run.returncode != 0:
                return run.stderr.strip()[-400:] or "failed"
        return None

    why = _unshare_mapped(write)
    return None if why is None else f"newuidmap/newgidmap: {why}"


def _unshare_mapped(write: Callable[[str], str | None]) -> str | None:
    """``unshare(CLONE_NEWUSER)`` with this process's maps written by a helper forked
    before it (a map is written from outside the new namespace), then root in it."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        os.close(done_r)
        code = 1
        try:
            if os.read(ready_r, 1) == b"u":
                why = write(str(os.getppid()))
                if why is None:
                    code = 0
                else:
                    os.write(done_w, why.encode()[-400:] or b"failed")
        except BaseException as exc:  # the helper says why, and never returns to the caller
            os.write(done_w, f"{type(exc).__name__}: {exc}".encode()[-400:])
        finally:
            os._exit(code)
    os.close(ready_r)
    os.close(done_w)
    try:
        linux.unshare(CLONE_NEWUSER)
    except OSError as exc:
        os.close(ready_w)
        os.close(done_r)
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
        return told.decode(errors="replace") or "failed"
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.setgroups([])
    return None


# The embedded runner of an API that is the host's root (runners/local.py) is root of a
# user namespace mapped to this range of host ids, unless TOOLKILN_SANDBOX_SUBUIDS names
# one: the range of the user ``toolkiln`` in both /etc/subuid and /etc/subgid if listed,
# else one above every range listed there, from DEFAULT_OUTER (0x70000000: above what
# useradd hands out from 100,000 and systemd-nspawn's container ranges, below 2^31).
EMBEDDED_USER = "toolkiln"
DEFAULT_OUTER = 0x70000000
RANGE = 65_536  # ids 0 .. 65,535 in the namespace: the runner and its per-call uids


# Each root API holds the blocks of RANGE ids its runner's range covers, by a lock file per
# block here, for as long as it lives (the kernel lets go when it dies, killed or not).
HELD = Path("/run/toolkiln-id-ranges")
LAST_HOST_ID = 4294967294


class RangeHeld(Exception):
    """The range chosen for the embedded runner is another root API's on this host, or
    processes with its ids still run."""


@dataclass(slots=True)
class HeldRange:
    """(first host id, count) of a root API's embedded runner, and the locks that keep
    every other root API on the host out of it until ``close``."""

    outer: int
    count: int
    locks: list[int]

    def close(self) -> None:
        for fd in self.locks:
            os.close(fd)
        self.locks = []


def embedded_range(chosen: str | None) -> HeldRange:
    """The range for the embedded runner of a host-root API (docs/deployment.md, "The
    embedded runner as the host's root"), held: two root APIs on one host never share ids.
    ``TOOLKILN_SANDBOX_SUBUIDS`` (``chosen``) held by another is refused; the user
    ``toolkiln``'s range, or the default, gives way to the next free one above every range
    listed (tests/sandbox/test_userns_ranges.py)."""
    if chosen is not None:
        start, count = (int(x) for x in chosen.split(":"))
        if start < 1:  # no range of unprivileged ids: the runner refuses it (runner_uid)
            return HeldRange(start, count, [])
        taken = _hold(start, count)
        if taken is None:
            raise RangeHeld(
                f"TOOLKILN_SANDBOX_SUBUIDS={chosen} is the embedded runner's range of another "
                "toolkiln process on this host, or processes of it still run: give each its own"
            )
        return taken
    listed = {f: _all_ranges(f) for f in ("/etc/subuid", "/etc/subgid")}
    try:
        user = pwd.getpwnam(EMBEDDED_USER)
        names = {user.pw_name, str(user.pw_uid)}
    except KeyError:
        names = {EMBEDDED_USER}
    mine = [{(s, n) for who, s, n in listed[f] if who in names and n >= RANGE} for f in listed]
    both = mine[0] & mine[1]
    if both and (taken := _hold(min(both)[0], RANGE)) is not None:
        return taken
    ends = [s + n for f in listed for _, s, n in listed[f]]
    start = -(-max([DEFAULT_OUTER, *ends]) // RANGE) * RANGE
    while start + RANGE - 1 <= LAST_HOST_ID:
        if (taken := _hold(start, RANGE)) is not None:
            return taken
        start += RANGE
    raise RangeHeld("no free range of host ids is left for the embedded runner")


def _hold(start: int, count: int) -> HeldRange | None:
    """The range held, or None if another process holds a block of it or a process of it
    still runs (a killed API's runner draining its calls; a runner that holds no lock, of
    the user ``toolkiln``'s range). Where no lock can be kept (``/run`` read-only), it is
    taken unheld when no process of it runs."""
    directory = held.private_directory([HELD])
    locks: list[int] = []
    try:
        for block in range(start // RANGE, (start + count - 1) // RANGE + 1):
            fd = held.take(directory, str(block)) if directory is not None else None
            if fd is None and directory is not None:
                raise BlockingIOError
            if fd is not None:
                locks.append(fd)
        if _running(start, count):
            raise BlockingIOError
    except BlockingIOError:
        for taken in locks:
            os.close(taken)
        return None
    except BaseException:
        for taken in locks:
            os.close(taken)
        raise
    if directory is None:
        log.warning("no lock for the runner's ids (%s cannot be made): taken unheld", HELD)
    return HeldRange(start, count, locks)


def _running(start: int, count: int) -> bool:
    """Whether a process this PID namespace sees has a uid of ``start`` .. + ``count``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:  # its status, not its directory's owner: that is root's for one not dumpable
            with open(f"/proc/{entry.name}/status", "rb") as f:
                uids = next(line for line in f if line.startswith(b"Uid:")).split()[1:]
        except (OSError, StopIteration):
            continue  # gone meanwhile
        if any(start <= int(uid) < start + count for uid in uids):
            return True
    return False


def _all_ranges(path: str) -> list[tuple[str, int, int]]:
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            found.append((parts[0], int(parts[1]), int(parts[2])))
    return found


def enter_mapped_namespace(outer: int, count: int, own: tuple[str, ...] = ()) -> str | None:
    """The host's root (a single-threaded runner, before anything else) becomes root of a
    new user namespace whose ids 0 .. count-1 are host ids ``outer`` ..: a process of an
    unprivileged host uid from here on, the second shape. First, in a mount namespace of
    its own, the interpreter and this package are laid open to it when a directory above
    them is closed to others (a venv on pyenv under /root, mode 700): only those
    directories, read-only, and its ``own`` directories (its data directory, made for that
    range's first id), writable. Returns why not, or None once inside
    (tests/security/test_embedded_unprivileged.py)."""
    if shape() != HOST_ROOT:
        return "only the host's root maps a range of its choice"
    if outer < 1 or count < 1 or outer + count > 4294967295:
        # Checked before the namespace is made: a map refused after it would leave this
        # process in a namespace with no ids, where running on (accepted) means nothing.
        return f"{outer}:{count} is not a range of unprivileged host ids (1 .. 4294967294)"
    if threading.active_count() != 1:
        return "the runner started threads before making its user namespace"
    try:
        linux.unshare(linux.CLONE_NEWNS)
        # Nothing of what follows reaches the host's mounts; the host's still reach here.
        linux.mount(None, "/", None, linux.MS_REC | linux.MS_SLAVE)
        _lay_open({**dict.fromkeys(_needed(), False), **dict.fromkeys(own, True)})
    except OSError as exc:
        return f"a mount namespace for the runner: {exc}"

    def write(parent: str) -> str | None:
        for kind in ("uid", "gid"):
            Path(f"/proc/{parent}/{kind}_map").write_text(f"0 {outer} {count}\n")
        return None

    why = _unshare_mapped(write)
    if why is not None:
        return why
    # Dumpable again, as a runner started in its namespace is (its uid change made it
    # not): its templates read their own /proc as root of the namespace.
    linux.prctl(linux.PR_SET_DUMPABLE, 1)
    return None


def _needed() -> list[str]:
    """What the runner reads of the host's that is not its own: the interpreter's prefix,
    the venv's, and this package's directory (an editable install: the checkout's src)."""
    import toolkiln

    here = Path(toolkiln.__file__).resolve().parent.parent
    found = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, here)}
    return sorted(found)


def _lay_open(paths: dict[str, bool]) -> None:
    """For each path whose way down passes a directory others may not search: a tmpfs over
    the highest such directory, with only those paths bound back into it, read-only unless
    marked writable. What else that directory holds (root's home, say) stays out of sight."""
    covers: dict[str, list[str]] = {}
    for path in paths:
        parts = Path(path).parts
        for i in range(2, len(parts)):
            above = str(Path(*parts[:i]))
            if not os.stat(above).st_mode & 0o001:
                covers.setdefault(above, []).append(path)
                break
    for above, below in covers.items():
        held = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in below}
        mode = os.stat(above).st_mode & 0o7777 | 0o111  # searchable, not listable, by others
        opts = f"size=64k,mode={mode:o}"
        linux.mount("tmpfs", above, "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, opts)
        for path, fd in held.items():
            os.makedirs(path, mode=0o711, exist_ok=True)
            try:
                linux.mount(f"/proc/self/fd/{fd}", path, None, linux.MS_BIND | linux.MS_REC)
            finally:
                os.close(fd)
            ro = 0 if paths[path] else linux.MS_RDONLY
            linux.mount(None, path, None, linux.MS_REMOUNT | linux.MS_BIND | linux.MS_NOSUID | ro)
