"""A Python child enters its slot's CPU group when it is taken (pool.py, ``cpu_when_taken``):
what happens when that move fails. The child ended meanwhile: it is never handed out (the
next one is); any other failure: in strict mode the call gets no process (infra), never one
outside its CPU cap."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import cgroup_path
from tests.sandbox.test_shares import groups
from toolkiln.sandbox.packages import PackageStore
from toolkiln.sandbox.pool import SandboxUnavailable, Template, WarmChild
from toolkiln.sandbox.runner import Sandbox
from toolkiln.sandbox.sandboxes import python_sandbox


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    sb = python_sandbox(PackageStore(tmp_path), warm=2, name="cpu-group-test")
    cg = sb.cgroups
    if cg is None or cg.version != "v1" or not cg.cpu:
        sb.close()
        pytest.skip("the CPU group is apart from the others on cgroup v1 only")
    yield sb
    sb.close()


def _ready_child(pool: Template) -> WarmChild:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if idle := pool.idle():
            return idle[0]
        time.sleep(0.02)
    raise AssertionError("no warm child")


def test_a_child_that_ended_before_its_move_is_not_handed_out(sandbox: Sandbox) -> None:
    pool = sandbox.template
    child = _ready_child(pool)
    with pool._cond:
        pool._ready.remove(child)
    signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
    select.select([child.pidfd], [], [], 5)  # it has ended
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child.global_pid}") and time.monotonic() < deadline:
        time.sleep(0.01)  # and been reaped: its pid is gone
    assert not os.path.exists(f"/proc/{child.global_pid}")  # the reaped case, not a zombie
    before = pool.health()["dead_children_discarded"]
    assert pool._into_cpu_group(child) is False
    assert pool.health()["dead_children_discarded"] == before + 1
    assert child.sock.fileno() == -1  # closed
    taken = pool.take(timeout=10)  # the next one is, in its CPU group
    try:
        assert taken is not child
        assert groups(taken.global_pid)["cpu"].startswith(cgroup_path("toolkiln-cpu-group-test-u"))
    finally:
        taken.close()


def test_a_move_that_fails_otherwise_gives_no_process_in_strict_mode(
    sandbox: Sandbox,
) -> None:
    pool = sandbox.template
    assert pool.strict
    child = _ready_child(pool)
    assert child.cgroup is not None and child.cgroup.cpu_procs is not None
    saved = child.cgroup.cpu_procs
    child.cgroup.cpu_procs = os.open("/dev/null", os.O_RDONLY)  # writing to it fails (EBADF)
    try:
        with pool._cond:
            pool._ready.remove(child)
        with pytest.raises(SandboxUnavailable, match="CPU limit"):
            pool._into_cpu_group(child)
        assert child.sock.fileno() == -1  # never handed out
    finally:
        os.close(child.cgroup.cpu_procs)
        child.cgroup.cpu_procs = saved


def test_a_child_that_ended_unreaped_is_not_handed_out(sandbox: Sandbox) -> None:
    """The kernel moves a zombie into a cgroup without an error (ESRCH comes only once it
    is reaped): the child's own end is checked after the move."""
    pool = sandbox.template
    child = _ready_child(pool)
    with pool._cond:
        pool._ready.remove(child)
    stat = Path(f"/proc/{child.global_pid}/stat").read_text()
    reaper = int(stat.rsplit(")", 1)[1].split()[1])  # the template that forked it
    os.kill(reaper, signal.SIGSTOP)  # so that it does not reap the child yet
    try:
        signal.pidfd_send_signal(child.pidfd, signal.SIGKILL)
        select.select([child.pidfd], [], [], 5)
        assert Path(f"/proc/{child.global_pid}").exists()  # ended, not reaped
        assert pool._into_cpu_group(child) is False
        assert child.sock.fileno() == -1
    finally:
        os.kill(reaper, signal.SIGCONT)


def test_take_hands_out_the_next_child_when_one_cannot_be_moved(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = sandbox.template
    _ready_child(pool)
    refused: list[WarmChild] = []
    real = pool._into_cpu_group

    def once(child: WarmChild) -> bool:
        if not refused:
            refused.append(child)
            child.close()
            return False
        return real(child)

    monkeypatch.setattr(pool, "_into_cpu_group", once)
    taken = pool.take(timeout=10)
    try:
        assert refused and taken is not refused[0]
        assert groups(taken.global_pid)["cpu"].startswith(cgroup_path("toolkiln-cpu-group-test-u"))
    finally:
        taken.close()
