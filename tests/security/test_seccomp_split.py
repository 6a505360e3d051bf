"""A Python child's seccomp filter comes in two parts (the template's, inherited, and its own):
together they must answer every call exactly as the whole allowlist does.

The programs are run here by a small classic-BPF interpreter over the real bytes, and the two
parts combined as the kernel combines stacked filters (kernel/seccomp.c, seccomp_run_filters:
every filter runs, the most severe action wins, the newest filter on a tie).
"""

from __future__ import annotations

import itertools
import random
import struct

import pytest

from toolkiln.sandbox.jail import seccomp

I386 = 0x40000003
MASK = 0xFFFFFFFF


def _run(program: bytes, data: bytes) -> int:
    prog = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == seccomp.LD_W_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == seccomp.ALU_AND_K:
            acc &= k
        elif code == seccomp.RET_K:
            return k
        elif code in (seccomp.JEQ_K, seccomp.JGE_K, seccomp.JSET_K):
            taken = {
                seccomp.JEQ_K: acc == k,
                seccomp.JGE_K: acc >= k,
                seccomp.JSET_K: bool(acc & k),
            }[code]
            pc += jt if taken else jf
        else:  # pragma: no cover - an instruction the builder does not emit
            raise AssertionError(f"unknown BPF instruction {code:#x}")


def _action(ret: int) -> int:
    value = ret & 0xFFFF0000
    return value - (1 << 32) if value & 0x80000000 else value  # as the kernel's s32


def _stacked(filters_newest_first: list[bytes], data: bytes) -> int:
    ret = seccomp.RET_ALLOW
    for program in filters_newest_first:
        cur = _run(program, data)
        if _action(cur) < _action(ret):
            ret = cur
    return ret


def _data(nr: int, arch: int, args: tuple[int, ...]) -> bytes:
    return struct.pack("=iIQ6Q", nr, arch, 0, *args)


ARG_VALUES = [
    0,
    1,
    2,
    3,
    4,
    9,
    10,
    15,
    seccomp.CLONE_THREAD,
    seccomp.CLONE_THREAD | 0x3D0F00,
    seccomp.PROT_EXEC,
    seccomp.PROT_EXEC | seccomp.PROT_WRITE,
    seccomp.PROT_EXEC | 0x1,
    seccomp.MAP_ANONYMOUS | 0x2,
    seccomp.TCGETS,
    seccomp.FIONREAD,
    0x5402,
    seccomp.PR_SET_NAME,
    38,
    22,
    seccomp.F_SETSIG,
    6,
    128 | 6,
    (1 << 32) | seccomp.CLONE_THREAD,
    (1 << 32) | 5,
    MASK,
]


def _arg_vectors(n: int) -> list[tuple[int, ...]]:
    rng = random.Random(15)
    vectors = [tuple([v] * 6) for v in ARG_VALUES]
    vectors += [(a, b, c, d, 0, 0) for a, b, c, d in itertools.product([0, 4, 9], repeat=4)]
    vectors += [tuple(rng.choice(ARG_VALUES) for _ in range(6)) for _ in range(n)]
    return vectors


def test_the_two_parts_answer_every_call_as_the_whole_allowlist() -> None:
    whole = seccomp.build_filter()
    template_part, child_part = seccomp.split_filter()
    rules = seccomp._rules()
    many, one = _arg_vectors(300), [(0,) * 6]
    checked = 0
    for nr in [*range(0, 600), seccomp.X32_SYSCALL_BIT | 1, seccomp.X32_SYSCALL_BIT | 56, -1]:
        # Calls whose rule is a bare return do not look at their arguments.
        arg_dependent = len(rules.get(nr, [None])) > 1 or nr in seccomp.TEMPLATE_EXTRA
        for arch in (seccomp.AUDIT_ARCH_X86_64, I386):
            for args in many if arg_dependent and arch != I386 else one:
                data = _data(nr, arch, args)
                expected = _run(whole, data)
                assert _stacked([child_part, template_part], data) == expected, (nr, arch, args)
                checked += 1
    assert checked > 5000


@pytest.mark.parametrize(
    ("name", "nr", "args"),
    [
        ("fork", seccomp.SYS["clone"], (0x11,)),
        ("setresuid", 117, (0, 0, 0)),
        ("pidfd_open", 434, (1, 0)),
        ("setrlimit RLIMIT_CPU", seccomp.SYS["setrlimit"], (seccomp.RLIMIT_CPU,)),
    ],
)
def test_what_the_template_keeps_for_itself_is_refused_to_a_child(
    name: str, nr: int, args: tuple[int, ...]
) -> None:
    template_part, child_part = seccomp.split_filter()
    data = _data(nr, seccomp.AUDIT_ARCH_X86_64, (*args, *(0,) * (6 - len(args))))
    assert _run(template_part, data) == seccomp.RET_ALLOW, name
    assert _stacked([child_part, template_part], data) != seccomp.RET_ALLOW, name


def test_the_child_part_is_short() -> None:
    """What the split is for: each child makes the kernel compile a few dozen instructions,
    not the whole allowlist."""
    whole = seccomp.build_filter()
    _, child_part = seccomp.split_filter()
    assert len(child_part) * 5 < len(whole)
