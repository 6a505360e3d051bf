"""Thin ctypes wrappers for the Linux calls the standard library lacks in Python 3.11."""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]
_libc.syscall.restype = ctypes.c_long
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MNT_DETACH = 2

MADV_COLLAPSE = 25
HUGE_PAGE = 1 << 21

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
SYS_PIVOT_ROOT = 155


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(value: str | None) -> bytes | None:
    return value.encode() if value is not None else None


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def umount2(target: str, flags: int) -> None:
    _check(_libc.umount2(_b(target), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    _check(_libc.syscall(SYS_PIVOT_ROOT, _b(new_root), _b(put_old)), "pivot_root")


def prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl {option}")


def anonymous_ranges() -> list[tuple[int, int]]:
    """The private anonymous writable mappings of this process (its heap and the
    allocator's arenas), from /proc/self/maps: read it while /proc is still there."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if parts[1] == "rw-p" and (len(parts) == 5 or parts[5] == "[heap]"):
                low, high = (int(x, 16) for x in parts[0].split("-"))
                found.append((low, high))
    return found


def collapse(ranges: list[tuple[int, int]]) -> int:
    """Ask the kernel to back each 2 MiB-aligned stretch of ``ranges`` with 2 MiB folios
    (MADV_COLLAPSE, Linux 6.1+; an older kernel, or a stretch it cannot collapse, stays as
    it was). Returns how many bytes it collapsed."""
    done = 0
    for low, high in ranges:
        start = (low + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        end = high & ~(HUGE_PAGE - 1)
        if end > start and _libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
            done += end - start
    return done
