"""A default-deny seccomp-BPF allowlist for sandboxed CPython on x86_64, built by hand.

Rules (from how other sandboxes broke, see docs/security.md):
- the architecture is checked first and x32 syscall numbers are refused;
- anything not listed kills the whole process (SECCOMP_RET_KILL_PROCESS), which the host
  reports as ``sandbox_violation``;
- a few calls CPython probes and copes with are answered with an errno instead;
- ``clone`` only for threads, ``clone3`` answers ENOSYS so glibc falls back to ``clone``;
- W^X: no mapping both writable and executable, no executable anonymous memory, no
  ``mprotect(PROT_EXEC)``; with every writable place mounted ``noexec``, tool code cannot
  create native code of its own;
- no signal a tool could use to fake a death from outside (SIGKILL, SIGTERM, ...), no
  change of its own RLIMIT_CPU (the host sets it), no
  priority-inheritance futexes, no host-wide counters (``sysinfo``);
- argument checks compare the low 32 bits only where the kernel itself truncates to 32 bits
  (ioctl request, int options), and also require the high 32 bits to be zero elsewhere.
The filter is built once in the template and installed in each child before any tool byte
arrives. A Python child gets it in two parts (``split_filter``): most of it installed once by
the template and inherited, a short part installed by the child, so that the kernel does not
compile the whole program again for every child.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

RET_KILL_PROCESS = 0x80000000
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06
ALU_AND_K = 0x54

OFF_NR = 0
OFF_ARCH = 4


def _arg_lo(i: int) -> int:
    return 16 + 8 * i


def _arg_hi(i: int) -> int:
    return 16 + 8 * i + 4


CLONE_THREAD = 0x00010000
PROT_EXEC = 0x4
MAP_ANONYMOUS = 0x20
AF_UNIX = 1
PR_SET_NAME, PR_GET_NAME, PR_GET_DUMPABLE = 15, 16, 3
TCGETS, FIONREAD, FIONBIO, FIOCLEX, FIONCLEX = 0x5401, 0x541B, 0x5421, 0x5451, 0x5450

# x86_64 numbers of the calls CPython and its usual extension modules need.
ALLOW = {
    "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6,
    "poll": 7, "lseek": 8, "munmap": 11, "brk": 12, "rt_sigaction": 13,
    "rt_sigprocmask": 14, "rt_sigreturn": 15, "pread64": 17, "pwrite64": 18, "readv": 19,
    "writev": 20, "access": 21, "pipe": 22, "select": 23, "sched_yield": 24, "mremap": 25,
    "msync": 26, "mincore": 27, "madvise": 28, "dup": 32, "dup2": 33, "pause": 34,
    "nanosleep": 35, "getitimer": 36, "alarm": 37, "setitimer": 38, "getpid": 39,
    # sendfile: shutil.copyfile's way of copying on Linux (one read and one write in one call,
    # on descriptors the process holds already).
    "sendfile": 40, "sendto": 44, "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "shutdown": 48,
    "getsockname": 51, "getpeername": 52, "getsockopt": 55, "exit": 60, "wait4": 61,
    "uname": 63, "flock": 73, "fsync": 74, "fdatasync": 75,
    "truncate": 76, "ftruncate": 77, "getdents": 78, "getcwd": 79, "chdir": 80,
    "fchdir": 81, "rename": 82, "mkdir": 83, "rmdir": 84, "creat": 85, "link": 86,
    "unlink": 87, "symlink": 88, "readlink": 89, "chmod": 90, "fchmod": 91, "umask": 95,
    "gettimeofday": 96, "getrlimit": 97, "getrusage": 98, "times": 100,
    "getuid": 102, "getgid": 104, "geteuid": 107, "getegid": 108, "getppid": 110,
    "getpgrp": 111, "getgroups": 115, "getresuid": 118, "getresgid": 120, "getpgid": 121,
    "getsid": 124, "capget": 125, "rt_sigpending": 127, "rt_sigtimedwait": 128,
    "rt_sigsuspend": 130, "sigaltstack": 131, "utime": 132, "statfs": 137, "fstatfs": 138,
    "getpriority": 140, "sched_getparam": 143, "sched_getscheduler": 145,
    "sched_get_priority_max": 146, "sched_get_priority_min": 147, "arch_prctl": 158,
    "gettid": 186, "time": 201,
    "sched_getaffinity": 204, "epoll_create": 213, "getdents64": 217,
    "set_tid_address": 218, "restart_syscall": 219, "fadvise64": 221,
    "timer_settime": 223, "timer_gettime": 224, "timer_getoverrun": 225, "timer_delete": 226,
    "clock_gettime": 228, "clock_getres": 229, "clock_nanosleep": 230, "exit_group": 231,
    "epoll_wait": 232, "epoll_ctl": 233, "utimes": 235, "waitid": 247,
    "openat": 257, "mkdirat": 258, "futimesat": 261, "newfstatat": 262, "unlinkat": 263,
    "renameat": 264, "linkat": 265, "symlinkat": 266, "readlinkat": 267, "fchmodat": 268,
    "faccessat": 269, "pselect6": 270, "ppoll": 271, "set_robust_list": 273,
    "utimensat": 280, "epoll_pwait": 281, "timerfd_create": 283, "eventfd": 284,
    "fallocate": 285, "timerfd_settime": 286, "timerfd_gettime": 287, "eventfd2": 290,
    "epoll_create1": 291, "dup3": 292, "pipe2": 293, "preadv": 295, "pwritev": 296,
    "getcpu": 309, "renameat2": 316, "getrandom": 318, "membarrier": 324,
    "copy_file_range": 326, "preadv2": 327, "pwritev2": 328, "statx": 332, "rseq": 334,
    "close_range": 436, "openat2": 437, "faccessat2": 439, "epoll_pwait2": 441,
}  # fmt: skip

# Calls CPython may probe and handle: refuse them with an error instead of a kill.
REFUSE = {
    "chown": 92, "fchown": 93, "lchown": 94, "fchownat": 260,
    "sched_setaffinity": 203, "setpriority": 141, "mlock": 149, "munlock": 150,
    "mlockall": 151, "munlockall": 152, "sync": 162, "syncfs": 306, "seccomp": 317,
    "inotify_init1": 294, "inotify_init": 253, "mbind": 237, "set_mempolicy": 238,
    "get_mempolicy": 239, "pkey_alloc": 330, "pkey_free": 331,
    # Host-wide load, memory and process counters (not namespaced): nothing a tool needs.
    "sysinfo": 99,
    # A timer's signal is chosen by the caller: it could pick SIGKILL (see OUTSIDE_SIGNALS).
    "timer_create": 222,
}  # fmt: skip
# Extended attributes: refused as a file system without them answers (ENOTSUP), which the
# standard library expects and copes with (shutil.copy2 and copytree copy the rest); EPERM
# made them fail.
NO_XATTR = {
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "getxattr": 191, "lgetxattr": 192,
    "fgetxattr": 193, "listxattr": 194, "llistxattr": 195, "flistxattr": 196,
}  # fmt: skip

SYS = {
    "mmap": 9, "mprotect": 10, "ioctl": 16, "socketpair": 53, "clone": 56,
    "prctl": 157, "prlimit64": 302, "clone3": 435, "pkey_mprotect": 329,
    "kill": 62, "tkill": 200, "tgkill": 234, "fcntl": 72, "futex": 202, "setrlimit": 160,
}  # fmt: skip
RLIMIT_CPU = 0

# Signals a tool may not send itself, so that a death by one of them tells the host it came
# from outside (toolkiln.sandbox.exits.OUTSIDE_SIGNALS): SIGHUP, SIGINT, SIGQUIT, SIGKILL, SIGTERM.
OUTSIDE_SIGNALS = [1, 2, 3, 9, 15]
F_SETSIG = 10
# futex commands CPython and V8 use; the priority-inheritance ones (LOCK_PI, UNLOCK_PI,
# TRYLOCK_PI, WAIT_REQUEUE_PI, CMP_REQUEUE_PI, LOCK_PI2), behind a run of kernel escapes, are
# refused. The command is the op without FUTEX_PRIVATE_FLAG (128) and FUTEX_CLOCK_REALTIME (256).
FUTEX_CMDS = [0, 1, 3, 4, 5, 9, 10]  # WAIT, WAKE, REQUEUE, CMP_REQUEUE, WAKE_OP, WAIT/WAKE_BITSET
FUTEX_CMD_MASK = 0xFFFFFFFF & ~(128 | 256)
PROT_WRITE = 0x2


def _stmt(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def _ret(value: int) -> tuple[int, int, int, int]:
    return _stmt(RET_K, value)


def _load(offset: int) -> tuple[int, int, int, int]:
    return _stmt(LD_W_ABS, offset)


def _guarded(nr: int, body: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """``if nr == X: body`` where body ends in a return; otherwise fall through."""
    return [_stmt(JEQ_K, nr, 0, len(body)), *body]


def _only_if_zero(offset: int, ok: int, bad: int) -> list[tuple[int, int, int, int]]:
    """Return ``ok`` if the 32-bit word at offset is zero, else ``bad``."""
    return [_load(offset), _stmt(JEQ_K, 0, 0, 1), _ret(ok), _ret(bad)]


def _one_of(offset: int, values: list[int], ok: int, bad: int) -> list[tuple[int, int, int, int]]:
    """Return ``ok`` if the 32-bit word at offset is one of values, else ``bad``."""
    return [_load(offset), *_one_of_loaded(values, ok, bad)]


def _one_of_loaded(values: list[int], ok: int, bad: int) -> list[tuple[int, int, int, int]]:
    """The same test on the word already in the accumulator."""
    body = []
    for i, v in enumerate(values):
        remaining = len(values) - i - 1
        body.append(_stmt(JEQ_K, v, remaining + 1, 0))
    body += [_ret(bad), _ret(ok)]
    return body


def _rules() -> dict[int, list[tuple[int, int, int, int]]]:
    """The allowlist as one body per syscall number, each ending in a return (a number not
    here is killed). Every number has one rule, so their order in a program is free."""
    eperm = RET_ERRNO | errno.EPERM
    rules = {nr: [_ret(RET_ALLOW)] for nr in ALLOW.values()}
    rules.update({nr: [_ret(eperm)] for nr in REFUSE.values()})
    rules.update({nr: [_ret(RET_ERRNO | errno.ENOTSUP)] for nr in NO_XATTR.values()})
    rules[SYS["clone3"]] = [_ret(RET_ERRNO | errno.ENOSYS)]
    rules[SYS["clone"]] = [
        _load(_arg_lo(0)),
        _stmt(JSET_K, CLONE_THREAD, 1, 0),
        _ret(RET_KILL_PROCESS),
        *_only_if_zero(_arg_hi(0), RET_ALLOW, RET_KILL_PROCESS),
    ]
    # mmap(addr, len, prot, flags, fd, off): executable only when not writable (W^X, for any
    # mapping: a private writable+executable mapping of a library is native code of one's
    # own), and never for anonymous memory; executable pages can only hold a file's content,
    # and every file tool code can write sits on a noexec mount.
    rules[SYS["mmap"]] = [
        _load(_arg_lo(2)),
        _stmt(JSET_K, PROT_EXEC, 0, 5),
        _stmt(JSET_K, PROT_WRITE, 3, 0),
        _load(_arg_lo(3)),
        _stmt(JSET_K, MAP_ANONYMOUS, 1, 0),
        _ret(RET_ALLOW),
        _ret(eperm),
        _ret(RET_ALLOW),
    ]
    # mprotect never adds PROT_EXEC: pages written since they were mapped cannot turn
    # executable.
    rules[SYS["mprotect"]] = [
        _load(_arg_lo(2)),
        _stmt(JSET_K, PROT_EXEC, 0, 1),
        _ret(eperm),
        _ret(RET_ALLOW),
    ]
    # kill(pid, sig), tkill(tid, sig), tgkill(tgid, tid, sig): not with the outside signals.
    for name, arg in (("kill", 1), ("tkill", 1), ("tgkill", 2)):
        rules[SYS[name]] = _one_of(_arg_lo(arg), OUTSIDE_SIGNALS, eperm, RET_ALLOW)
    rules[SYS["fcntl"]] = _one_of(_arg_lo(1), [F_SETSIG], eperm, RET_ALLOW)
    rules[SYS["futex"]] = [
        _load(_arg_lo(1)),
        _stmt(ALU_AND_K, FUTEX_CMD_MASK),
        *_one_of_loaded(FUTEX_CMDS, RET_ALLOW, RET_ERRNO | errno.ENOSYS),
    ]
    rules[SYS["pkey_mprotect"]] = [_ret(eperm)]
    rules[SYS["ioctl"]] = _one_of(
        _arg_lo(1), [TCGETS, FIONREAD, FIONBIO, FIOCLEX, FIONCLEX], RET_ALLOW, eperm
    )
    rules[SYS["prctl"]] = _one_of(
        _arg_lo(0), [PR_SET_NAME, PR_GET_NAME, PR_GET_DUMPABLE], RET_ALLOW, eperm
    )
    # prlimit64 only on the calling process (pid 0): glibc's getrlimit/setrlimit use it. And
    # RLIMIT_CPU may be read, never set: the host sets it (see OUTSIDE_SIGNALS).
    rules[SYS["prlimit64"]] = [
        _load(_arg_lo(0)),
        _stmt(JEQ_K, 0, 1, 0),
        _ret(eperm),
        _load(_arg_lo(1)),
        _stmt(JEQ_K, RLIMIT_CPU, 1, 0),
        _ret(RET_ALLOW),
        _load(_arg_lo(2)),
        _stmt(JEQ_K, 0, 1, 0),
        _ret(eperm),
        *_only_if_zero(_arg_hi(2), RET_ALLOW, eperm),
    ]
    rules[SYS["setrlimit"]] = _one_of(_arg_lo(0), [RLIMIT_CPU], eperm, RET_ALLOW)
    # socketpair(AF_UNIX, ...) only: asyncio's self-pipe. No call can create any other socket.
    rules[SYS["socketpair"]] = _one_of(_arg_lo(0), [AF_UNIX], RET_ALLOW, RET_KILL_PROCESS)
    return rules


def _program(rules: dict[int, list[tuple[int, int, int, int]]], default: int) -> bytes:
    """The architecture and x32 checks, then ``if nr == X: rule`` for each rule, then
    ``default``."""
    prog: list[tuple[int, int, int, int]] = [
        _load(OFF_ARCH),
        _stmt(JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        _ret(RET_KILL_PROCESS),
        _load(OFF_NR),
        _stmt(JGE_K, X32_SYSCALL_BIT, 0, 1),
        _ret(RET_KILL_PROCESS),
    ]
    # Every rule ends in a return, so the number stays in the accumulator past each one.
    for nr in sorted(rules):
        prog += _guarded(nr, rules[nr])
    prog.append(_ret(default))
    if len(prog) > 4096:
        raise RuntimeError("seccomp program too long")
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def build_filter() -> bytes:
    """The whole allowlist in one program: what a JavaScript worker installs."""
    return _program(_rules(), RET_KILL_PROCESS)


# What the Python template and a child before its own filter need beyond the allowlist:
# forking, the child's uid, gid and groups, its rlimits (RLIMIT_CPU included), its prctl
# settings (no_new_privs, the filter itself), the scratch directory's owner, the nice value
# of a warm child, a pidfd of each child for the host, and a new scratch tmpfs for a uid
# whose child left files (detached, then mounted again).
TEMPLATE_ONLY = {
    "setgroups": 116,
    "setresuid": 117,
    "setresgid": 119,
    "pidfd_open": 434,
    "mount": 165,
    "umount2": 166,
}
TEMPLATE_EXTRA = (
    *(SYS[name] for name in ("clone", "prlimit64", "setrlimit", "prctl")),
    *(REFUSE[name] for name in ("chown", "fchown", "lchown", "fchownat", "setpriority")),
    *TEMPLATE_ONLY.values(),
)


def split_filter() -> tuple[bytes, bytes]:
    """The allowlist in two parts: one the Python template installs once, inherited by every
    child without being compiled again, and a short one each child adds (docs/security.md).

    The kernel runs every filter of a process and obeys the most severe answer (kill before
    errno before allow). The template's part is the whole allowlist with the rules of
    TEMPLATE_EXTRA replaced by "allow"; the child's part holds exactly those rules and allows
    everything else. So for every call a child makes, one part answers "allow" and the other
    what the whole allowlist answers: together they answer what the whole one does (checked
    call by call in tests/security/test_seccomp_split.py)."""
    rules = _rules()
    template = {**rules, **{nr: [_ret(RET_ALLOW)] for nr in TEMPLATE_EXTRA}}
    child = {nr: rules.get(nr, [_ret(RET_KILL_PROCESS)]) for nr in TEMPLATE_EXTRA}
    return _program(template, RET_KILL_PROCESS), _program(child, RET_ALLOW)


# What a code checker (sandbox/checker.py) may do once its imports are loaded: compute, talk
# on the socket it was given, read its own limits. A look for a file (CPython may search for
# a source file to quote in an error) is refused with EACCES; anything else kills it. A
# checker is not jailed like a tool's child: this list is why a parser bug reached by hostile
# text gives nothing beyond the checker's own answers (tests/sandbox/test_checks.py).
CHECKER_ALLOW = (
    "read", "write", "recvfrom", "sendto", "poll", "munmap", "brk", "mremap", "madvise",
    "rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "sigaltstack", "clock_gettime",
    "getrusage", "getpid", "gettid", "exit", "exit_group",
)  # fmt: skip
CHECKER_REFUSE = (
    "open", "openat", "stat", "lstat", "fstat", "newfstatat", "statx", "access",
    "faccessat", "readlink", "getcwd", "lseek",
)  # fmt: skip


def checker_filter(pid: int) -> bytes:
    """The allowlist of the code checker ``pid`` (CHECKER_ALLOW; memory never executable, as
    above). Signals only to itself (glibc's abort): every checker runs as nobody, and one
    must not stop or kill another workspace's."""
    rules = _rules()
    kept = {ALLOW[name]: [_ret(RET_ALLOW)] for name in CHECKER_ALLOW}
    kept.update({ALLOW[name]: [_ret(RET_ERRNO | errno.EACCES)] for name in CHECKER_REFUSE})
    for name in ("mmap", "mprotect", "futex", "prlimit64"):
        kept[SYS[name]] = rules[SYS[name]]
    eperm = RET_ERRNO | errno.EPERM
    for name in ("kill", "tkill", "tgkill"):  # the first argument: a pid, tid or tgid (int)
        kept[SYS[name]] = _one_of(_arg_lo(0), [pid], RET_ALLOW, eperm)
    return _program(kept, RET_KILL_PROCESS)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


class Installer:
    """Holds a compiled program so that a process installs it with one prctl."""

    def __init__(self, raw: bytes | None = None) -> None:
        if platform.machine() != "x86_64":
            raise RuntimeError(
                f"the seccomp allowlist is written for x86_64, not {platform.machine()}"
            )
        self._raw = build_filter() if raw is None else raw
        self._buf = ctypes.create_string_buffer(self._raw, len(self._raw))
        self._prog = _SockFprog(len(self._raw) // 8, ctypes.addressof(self._buf))
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.prctl.argtypes = [
            ctypes.c_int,
            ctypes.c_ulong,
            ctypes.c_void_p,
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]

    @property
    def program(self) -> bytes:
        """The compiled BPF program (what _spawn.c installs in each new child)."""
        return self._raw

    def install(self) -> None:
        if self._libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
        if (
            self._libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(self._prog), 0, 0)
            != 0
        ):
            raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP failed")
