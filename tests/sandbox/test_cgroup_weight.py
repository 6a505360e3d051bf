"""CPU weight and leftovers of the sandbox's cgroups, with real cgroups and real processes.

A sandbox's group at the top weighs one task, as does a group delegated to a runner, which
its sandboxes split by the slots each has made (``Cgroups._weigh``,
docs/decisions/222-a-delegated-group-weighs-one-task.md). ``cgroups.sweep`` removes what a
killed API's ``delegate`` left, and nothing of a live process's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from toolkiln.sandbox import cgroups
from toolkiln.sandbox.cgroups import Cgroups

PREFIX = f"test-weight-{os.getpid()}-"


def _weight(group: Path) -> int:
    name = "cpu.weight" if cgroups._v2_root() is not None else "cpu.shares"
    return int((group / name).read_text())


def _cpu_place(name: str) -> Path:
    """The group ``name`` in the hierarchy that weighs it."""
    v2 = cgroups._v2_root()
    return v2 / name if v2 is not None else cgroups.V1 / "cpu" / name


def _sleeper(procs: list[subprocess.Popen[bytes]]) -> int:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs.append(p)
    return p.pid


@pytest.fixture
def groups() -> Iterator[Callable[..., Cgroups]]:
    """Makes a sandbox's groups (``Cgroups``), closed after the test; skips the test on a
    host without a CPU controller for them."""
    made: list[Cgroups] = []

    def make(name: str, parent: str = "") -> Cgroups:
        made.append(Cgroups(name, 64 << 20, 16, parent=parent))
        if not made[-1].cpu:
            pytest.skip("no CPU controller for the sandbox's groups on this host")
        return made[-1]

    yield make
    for cg in made:
        cg.close()


@pytest.fixture
def delegated() -> Iterator[str]:
    name = f"{PREFIX}{os.getpid()}-own"
    made = cgroups.delegate(name, os.getuid())
    if not made:
        pytest.skip("no cgroup controllers for memory and pids on this host")
    yield name
    cgroups.undelegate(made)


def _slots(cg: Cgroups, n: int, procs: list[subprocess.Popen[bytes]]) -> int:
    """``n`` slots made, each with a process in it; the weight of one task."""
    for _ in range(n):
        cg.attach(_sleeper(procs))
    return 100 if cg.version == "v2" else 1024


def test_a_sandbox_group_at_the_top_weighs_one_task(
    groups: Callable[..., Cgroups], procs: list[subprocess.Popen[bytes]]
) -> None:
    unit = _slots(groups(f"{PREFIX}top"), 3, procs)
    assert _weight(_cpu_place(f"toolkiln-{PREFIX}top")) == unit


def test_a_delegated_group_weighs_one_task_split_by_slots(
    delegated: str, groups: Callable[..., Cgroups], procs: list[subprocess.Popen[bytes]]
) -> None:
    unit = _slots(groups("a", delegated), 2, procs)
    _slots(groups("b", delegated), 3, procs)
    assert _weight(_cpu_place(delegated)) == unit
    assert _weight(_cpu_place(f"{delegated}/toolkiln-a")) == 2 * unit
    assert _weight(_cpu_place(f"{delegated}/toolkiln-b")) == 3 * unit


def _gone_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_sweep_removes_a_gone_process_s_groups_only(
    procs: list[subprocess.Popen[bytes]],
) -> None:
    ns = os.stat("/proc/self/ns/pid").st_ino  # as cgroups.owned names a group
    gone, live = f"{PREFIX}{ns}-{_gone_pid()}-aa", f"{PREFIX}{ns}-{os.getpid()}-bb"
    holding = f"{PREFIX}{ns}-{_gone_pid()}-cc"
    made = {n: cgroups.delegate(n, os.getuid()) for n in (gone, live, holding)}
    if not made[gone]:
        pytest.skip("no cgroup controllers for memory and pids on this host")
    try:
        for name in (gone, live, holding):  # what a runner makes below its group
            for path in made[name]:
                (path / "toolkiln-python" / "slot1").mkdir(parents=True)
        pid = _sleeper(procs)
        for path in made[holding]:
            (path / "toolkiln-python" / "slot1" / "cgroup.procs").write_text(str(pid))

        cgroups.sweep("", PREFIX)

        assert not any(p.exists() for p in made[gone])
        assert all((p / "toolkiln-python" / "slot1").is_dir() for p in made[live])
        assert all((p / "toolkiln-python" / "slot1").is_dir() for p in made[holding])
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for paths in made.values():
            cgroups.undelegate(paths)


def test_sweep_keeps_a_live_runner_s_group_of_another_pid_namespace() -> None:
    """An API in a container of its own PID namespace that shares the host's cgroups names
    its runner's group by its pid there, which may be no live process here: the sweep of a
    root API here must not remove that group, nor the free slots whose files its runner
    holds open (a write to a removed group's ``cgroup.procs`` fails, ENODEV)."""
    if not cgroups._places(""):
        pytest.skip("no cgroup controllers for memory and pids on this host")
    if os.geteuid() != 0:
        pytest.skip("a PID namespace of its own needs the host's root here")
    gone = _gone_pid()  # its pid there: no process here
    inner = (
        "import os, sys\n"
        "from toolkiln.sandbox import cgroups\n"
        f"made = cgroups.delegate(cgroups.owned({PREFIX!r}), 0)\n"
        "for m in made: (m / 'slot1').mkdir()\n"
        "fds = [os.open(m / 'slot1' / 'cgroup.procs', os.O_WRONLY) for m in made]\n"
        "print(os.getpid(), flush=True)\n"
        "sys.stdin.readline()\n"
        "try:\n"
        "    for fd in fds: os.write(fd, str(os.getpid()).encode())\n"
        "    print('kept', flush=True)\n"
        "except OSError as exc:\n"
        "    print('broken', exc, flush=True)\n"
        "cgroups.undelegate(made)\n"
    )
    outer = (  # pid 1 of the namespace: its next child gets the pid ``gone``
        "import subprocess, sys\n"
        f"open('/proc/sys/kernel/ns_last_pid', 'w').write(str({gone} - 1))\n"
        f"sys.exit(subprocess.run([sys.executable, '-c', {inner!r}]).returncode)\n"
    )
    there = subprocess.Popen(
        ["unshare", "--pid", "--fork", sys.executable, "-c", outer],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert there.stdin is not None and there.stdout is not None
    try:
        assert there.stdout.readline().strip() == str(gone)
        cgroups.sweep("", PREFIX)
        there.stdin.write("\n")
        there.stdin.flush()
        assert there.stdout.readline().strip() == "kept"
    finally:
        # Its end, not a kill: a kill of unshare leaves the processes inside running, in the
        # group, which then cannot be removed.
        there.stdin.close()
        try:
            there.wait(30)
        except subprocess.TimeoutExpired:
            there.kill()
            there.wait()
        for base in cgroups._places(""):
            cgroups.undelegate(list(base.glob(f"{PREFIX}*-{gone}-*")))


def test_sweep_passes_over_a_name_that_is_no_pid() -> None:
    """A group whose name only looks like ``cgroups.owned``'s (``str.isdigit`` is true of
    '²', which ``int`` refuses) is left alone, and the API's start goes on."""
    odd = f"{PREFIX}{os.stat('/proc/self/ns/pid').st_ino}-\u00b2-aa"
    made = cgroups.delegate(odd, os.getuid())
    if not made:
        pytest.skip("no cgroup controllers for memory and pids on this host")
    try:
        cgroups.sweep("", PREFIX)
        assert all(p.is_dir() for p in made)
    finally:
        cgroups.undelegate(made)
