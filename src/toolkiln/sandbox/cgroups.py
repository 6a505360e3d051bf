"""Per-call cgroups for memory, process and CPU caps, on cgroup v1 or v2 (whichever has them).

On the reference host v2 is mounted but has no controllers, while v1 has memory, pids and
cpu; we take v2 when it offers memory and pids, else v1, and report which one is in use.
Slots are made once and reused: attaching to a pre-made group costs ~0.03 ms, while a
mkdir/rmdir per call costs far more (SANDBOX-NOTES). A slot holds one process, plus, while
a call runs, the processes of the runs nested under it (``join``), so the memory and CPU
caps hold for the whole tree of runs of one call.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

V1 = Path("/sys/fs/cgroup")
V2_CANDIDATES = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
CPU_PERIOD_US = 100_000
CLOSE_WAIT_S = 2.0  # how long close waits for a slot whose last process was just reaped


@dataclass(slots=True)
class Handle:
    """A slot's directories; ``shared`` are those a nested run's process joins (memory and
    cpu); ``oom_file`` counts the slot's OOM kills, and ``oom_before`` is that count when the
    slot was handed out. The files every child's attach, join and OOM check use are opened
    once, when the slot is made, and written and read in place: an open, a write and a close
    of each for every child cost the pool's reader thread ~25 us of CPU per call more
    (docs/decisions/105-cpu-group-entered-when-taken.md).

    ``holds`` counts the runs of the call this slot is charged for that have not ended:
    its own process's run and the nested runs whose processes joined it; ``vacated``: its
    own process was reaped while some still held it, so the slot goes back to the free
    list only when the last of them lets go (``Cgroups.let_go``)."""

    dirs: list[Path]
    shared: list[Path]
    oom_file: str
    cpu_dir: Path | None = None  # v1: the CPU controller's own slot directory
    oom_before: int = 0
    holds: int = 0
    vacated: bool = False
    procs: tuple[int, ...] = field(init=False)  # descriptors of each dir's cgroup.procs
    shared_procs: tuple[int, ...] = field(init=False)
    procs_but_cpu: tuple[int, ...] = field(init=False)
    cpu_procs: int | None = field(init=False)
    oom: int = field(init=False)

    def __post_init__(self) -> None:
        opened: list[int] = []
        try:
            for d in self.dirs:
                opened.append(os.open(d / "cgroup.procs", os.O_WRONLY))
            self.oom = os.open(self.oom_file, os.O_RDONLY)
        except OSError:
            for fd in opened:
                os.close(fd)
            raise
        self.procs = tuple(opened)
        pairs = list(zip(self.dirs, opened, strict=True))
        self.shared_procs = tuple(fd for d, fd in pairs if d in self.shared)
        self.procs_but_cpu = tuple(fd for d, fd in pairs if d != self.cpu_dir)
        self.cpu_procs = next((fd for d, fd in pairs if d == self.cpu_dir), None)

    def close(self) -> None:
        for fd in (*self.procs, self.oom):
            with contextlib.suppress(OSError):
                os.close(fd)


class Cgroups:
    """Caps each sandboxed child's memory, tasks and CPU, and tells afterwards if it hit OOM."""

    def __init__(
        self, name: str, memory_bytes: int, pids_max: int, cpus: float = 1.0, *, parent: str = ""
    ) -> None:
        self.memory_bytes = memory_bytes
        self.pids_max = pids_max
        self.cpu_quota_us = int(cpus * CPU_PERIOD_US) if cpus > 0 else 0
        self.version: str | None = None
        self.cpu = False  # whether a CPU limit is set per slot
        self.roots: list[Path] = []
        self._free: list[Handle] = []
        self._all: list[Handle] = []  # every slot made: its files are closed with the slots
        self._made = 0
        self._lock = threading.Lock()
        self._parent = parent
        v2 = _v2_root()
        if v2 is not None:
            self.version = "v2"
            self.cpu = self.cpu_quota_us > 0 and self._v2_has(v2, {"cpu"})
            wanted = "+memory +pids" + (" +cpu" if self.cpu else "")
            root = v2 / parent / f"toolkiln-{name}"
            root.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                (v2 / "cgroup.subtree_control").write_text(wanted)
            (root / "cgroup.subtree_control").write_text(wanted)
            self.roots = [root]
        elif (V1 / "memory" / "cgroup.procs").exists() and (V1 / "pids" / "cgroup.procs").exists():
            self.version = "v1"
            self.roots = [V1 / c / parent / f"toolkiln-{name}" for c in ("memory", "pids")]
            self.cpu = self.cpu_quota_us > 0 and (V1 / "cpu" / "cpu.cfs_quota_us").exists()
            if self.cpu:
                self.roots.append(V1 / "cpu" / parent / f"toolkiln-{name}")
            for root in self.roots:
                root.mkdir(exist_ok=True)
        for root in self.roots:  # what a process of the same name died holding (runner.py)
            for slot in root.glob("slot*"):
                with contextlib.suppress(OSError):  # still holding a dying process: reused
                    os.rmdir(slot)

    @staticmethod
    def _v2_has(path: Path, wanted: set[str]) -> bool:
        try:
            return wanted <= set((path / "cgroup.controllers").read_text().split())
        except OSError:
            return False

    def describe(self) -> dict[str, object]:
        cpus = self.cpu_quota_us / CPU_PERIOD_US if self.cpu else None
        return {"version": self.version, "memory_mb": self.memory_bytes >> 20, "cpus": cpus}

    def _weigh(self) -> None:
        """Below a delegated group (``parent``), which weighs one task (``delegate``), the
        sandboxes split its weight by the slots each has made. At the top, a sandbox's group
        keeps the kernel's weight, one task's: its calls' exits and warm-ups never outweigh
        the threads that answer a call (each slot's quota still caps it at its CPUs;
        docs/decisions/222-a-delegated-group-weighs-one-task.md,
        tests/sandbox/test_cgroup_weight.py)."""
        if not self.cpu or not self._parent:
            return
        with contextlib.suppress(OSError):
            if self.version == "v2":
                (self.roots[0] / "cpu.weight").write_text(str(min(10000, 100 * self._made)))
            else:
                (self.roots[2] / "cpu.shares").write_text(str(min(262144, 1024 * self._made)))

    def _make(self) -> Handle:
        self._made += 1
        dirs = [root / f"slot{self._made}" for root in self.roots]
        for d in dirs:
            d.mkdir(exist_ok=True)
        self._weigh()
        quota = f"{self.cpu_quota_us} {CPU_PERIOD_US}"
        if self.version == "v2":
            (dirs[0] / "memory.max").write_text(str(self.memory_bytes))
            swap = dirs[0] / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
            (dirs[0] / "pids.max").write_text(str(self.pids_max))
            if self.cpu:
                (dirs[0] / "cpu.max").write_text(quota)
            return self._keep(Handle(dirs, [dirs[0]], str(dirs[0] / "memory.events")))
        (dirs[0] / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
        (dirs[1] / "pids.max").write_text(str(self.pids_max))
        if self.cpu:
            (dirs[2] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (dirs[2] / "cpu.cfs_quota_us").write_text(str(self.cpu_quota_us))
        oom_file = str(dirs[0] / "memory.oom_control")
        return self._keep(
            Handle(dirs, [dirs[0], *dirs[2:]], oom_file, dirs[2] if self.cpu else None)
        )

    def _keep(self, handle: Handle) -> Handle:
        self._all.append(handle)
        return handle

    def attach(self, pid: int, cpu: bool = True) -> Handle | None:
        """Put a process (and any thread it starts) in a free slot of its own. With
        ``cpu=False`` it stays out of the slot's CPU group until ``enter_cpu`` (v1, where that
        group is a hierarchy of its own; on v2 one write moves it into all)."""
        if self.version is None:
            return None
        with self._lock:
            handle = self._free.pop() if self._free else self._make()
        handle.oom_before = self.oom_count(handle)
        for fd in handle.procs if cpu else handle.procs_but_cpu:
            _put(fd, pid)
        return handle

    @staticmethod
    def enter_cpu(handle: Handle, pid: int) -> None:
        """Into its slot's CPU group: a process attached with ``cpu=False``, before it runs
        anything of a call's (docs/decisions/105-cpu-group-entered-when-taken.md)."""
        if handle.cpu_procs is not None:
            _put(handle.cpu_procs, pid)

    def hold(self, handle: Handle) -> None:
        """A run of the slot's call holds it until ``let_go``: the root run (from before
        its request is sent), each nested run joined to it."""
        with self._lock:
            handle.holds += 1

    def join(self, pid: int, group: Handle) -> None:
        """Charge a process to another slot's memory and CPU (a nested run joins its root
        call's slot) until ``leave``; its task count stays its own slot's. The nested run
        holds the slot until ``let_go``, also if a write fails (the caller moves it back)."""
        self.hold(group)
        for fd in group.shared_procs:
            _put(fd, pid)

    def let_go(self, handle: Handle) -> None:
        """A run of the slot's call has ended (a nested one moved back to its own slot or
        gone): the slot is free once its own process is reaped and no run holds it."""
        with self._lock:
            handle.holds -= 1
            if handle.holds <= 0 and handle.vacated:
                handle.holds, handle.vacated = 0, False
                self._free.append(handle)

    @staticmethod
    def leave(pid: int, own: Handle) -> None:
        """Back to its own slot (a long-lived worker after a nested call)."""
        for fd in own.shared_procs:
            _put(fd, pid)

    def oom_count(self, handle: Handle) -> int:
        try:
            for line in os.pread(handle.oom, 4096, 0).decode().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def oom_killed(self, handle: Handle | None) -> bool:
        return handle is not None and self.oom_count(handle) > handle.oom_before

    def release(self, handle: Handle | None) -> None:
        """The slot's process has been reaped: the slot is free for the next one, unless a
        run of its call still holds it. Its own process can die while its call goes on: a
        nested run charged to the slot, or about to join it (the root exits, or the slot's
        OOM killer picks it). Handed to a fresh child then, the slot would put the next
        caller, of any workspace, under the same memory cap and CPU quota as that nested run
        (tests/security/test_slot_guests.py)."""
        if handle is not None:
            with self._lock:
                if handle.holds > 0:
                    handle.vacated = True
                else:
                    self._free.append(handle)

    def close(self) -> None:
        """Remove the slots and the roots. A slot whose last process has only just been
        reaped can still count as in use for a moment (EBUSY): it is tried again for up to
        CLOSE_WAIT_S, so a clean close leaves nothing behind."""
        deadline = time.monotonic() + CLOSE_WAIT_S
        with self._lock:
            made, self._all, self._free = self._all, [], []
        for handle in made:
            handle.close()
        for root in self.roots:
            for slot in root.glob("slot*"):
                while True:
                    try:
                        os.rmdir(slot)
                    except OSError as exc:
                        if exc.errno == errno.EBUSY and time.monotonic() < deadline:
                            time.sleep(0.01)
                            continue
                    break
            with contextlib.suppress(OSError):
                root.rmdir()


def _put(fd: int, pid: int) -> None:
    """Move ``pid`` into the cgroup whose ``cgroup.procs`` ``fd`` is open on.

    cgroup v1 lets a process be moved by a descriptor opened by the host's root, or by a
    writer whose effective uid was the process's own when it opened it. Root of a user
    namespace is neither for a child that already runs as its call's uid, so this thread
    (alone: credentials are per thread in the kernel, and raw system calls change only the
    caller's, unlike libc's) opens the file again as that uid, keeping its capabilities
    for the open (``SECBIT_NO_SETUID_FIXUP``), and goes back before the write
    (tests/sandbox/test_rootless.py)."""
    if not _outside_host_root():
        os.write(fd, str(pid).encode())
        return
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
        raise OSError(errno.EBADF, "cgroup.procs is not open for writing")  # as a write says
    # A new child drops to its uid while the host adopts it: read before the uid changed,
    # the write is refused (EACCES), and read again it is the new one, which stays.
    for attempt in range(3):
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except FileNotFoundError:
            raise OSError(errno.ESRCH, f"no process {pid}") from None  # as a write says
        try:
            _put_as(fd, pid, uid)
            return
        except PermissionError:
            if attempt == 2:
                raise


def _put_as(fd: int, pid: int, uid: int) -> None:
    _thread_call(_SYS_PRCTL, _PR_SET_SECUREBITS, _SECBIT_NO_SETUID_FIXUP, 0, 0)
    try:
        _thread_call(_SYS_SETRESUID, -1, uid, -1)
        try:
            again = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)
        finally:
            _thread_call(_SYS_SETRESUID, -1, 0, -1)
        try:
            os.write(again, str(pid).encode())
        finally:
            os.close(again)
    finally:
        _thread_call(_SYS_PRCTL, _PR_SET_SECUREBITS, 0, 0, 0)


@functools.cache
def _outside_host_root() -> bool:
    """Whether this process is root of a user namespace other than the host's (its uid 0
    maps to another host uid) rather than the host's root itself."""
    try:
        first = Path("/proc/self/uid_map").read_text().split("\n", 1)[0].split()
    except OSError:
        return False
    return os.geteuid() == 0 and first[:2] != ["0", "0"]


# x86_64 numbers (seccomp.py allows no other architecture)
_SYS_SETRESUID, _SYS_PRCTL = 117, 157
_PR_SET_SECUREBITS, _SECBIT_NO_SETUID_FIXUP = 28, 1 << 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _thread_call(number: int, *args: int) -> None:
    """A system call made directly, so that a credential change is this thread's alone."""
    if _libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"system call {number}: {os.strerror(err)}")


V1_DELEGATED = ("memory", "pids", "cpu")


def delegate(name: str, uid: int) -> list[Path]:
    """What an operator does for a runner of an unprivileged user (sandbox/layers.py, HOW):
    a cgroup ``name`` (below each v1 hierarchy, or the v2 root that has memory and pids)
    owned by ``uid``, for the runner to make its slots in. By the host's root; returns the
    directories made, for ``undelegate``. Its CPU weight stays the kernel's, one task's
    (docs/decisions/222-a-delegated-group-weighs-one-task.md,
    tests/sandbox/test_cgroup_weight.py)."""
    made = _places(name)
    for path in made:
        path.mkdir(parents=True, exist_ok=True)
    v2 = _v2_root()
    if v2 is not None:
        wanted = "+memory +pids" + (" +cpu" if Cgroups._v2_has(v2, {"cpu"}) else "")
        for parent in reversed(made[0].parents[: len(Path(name).parts)]):  # down to it
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text(wanted)
    for path in made:
        os.chown(path, uid, uid)
        for f in path.iterdir():
            if f.is_file():
                os.chown(f, uid, uid)
    return made


def _v2_root() -> Path | None:
    """The cgroup v2 mount that has the memory and pids controllers, if one has."""
    return next((p for p in V2_CANDIDATES if Cgroups._v2_has(p, {"memory", "pids"})), None)


def _places(name: str) -> list[Path]:
    """Where a group ``name`` is: below the v2 root that has memory and pids, else below
    each v1 hierarchy of V1_DELEGATED; none without either."""
    v2 = _v2_root()
    if v2 is not None:
        return [v2 / name]
    if (V1 / "memory" / "cgroup.procs").exists():
        return [V1 / c / name for c in V1_DELEGATED if (V1 / c / "cgroup.procs").exists()]
    return []


def owned(prefix: str) -> str:
    """A group name ``<prefix><pid namespace>-<pid>-<random>`` by which ``sweep`` knows its
    owner: this process, in its PID namespace."""
    return f"{prefix}{os.stat('/proc/self/ns/pid').st_ino}-{os.getpid()}-{os.urandom(4).hex()}"


def sweep(parent: str, prefix: str) -> None:
    """Removes the groups ``<parent>/`` ``owned`` by a process of this PID namespace that is
    gone (killed before it could ``undelegate``). A live process's groups stay, and so do
    those of another PID namespace (a container's, whose pids mean nothing here) and any
    name not made by ``owned`` (tests/sandbox/test_cgroup_weight.py)."""
    ours = os.stat("/proc/self/ns/pid").st_ino
    whose = re.compile(rf"{re.escape(prefix)}(\d+)-(\d+)-[0-9a-f]+", re.ASCII)
    for base in _places(parent):
        for group in base.glob(f"{prefix}*"):
            found = whose.fullmatch(group.name)
            if found and int(found[1]) == ours and not _alive(int(found[2])):
                if group.is_dir():
                    undelegate([group])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def undelegate(made: list[Path]) -> None:
    """Removes what ``delegate`` made and what the runner left in it, deepest first."""
    for path in made:
        if not path.exists():
            continue
        for sub in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if sub.is_dir():
                with contextlib.suppress(OSError):
                    sub.rmdir()
        with contextlib.suppress(OSError):
            path.rmdir()
