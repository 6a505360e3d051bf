"""A slot goes back to the free list only when its own process is reaped and no run of its
call holds it (``Cgroups.hold``/``join``/``let_go``/``release``), in every order of the
events, with real cgroups and real processes. The pool's reaper calls ``release`` when the
slot's process has been reaped; here the test does, at the moment the order under test
needs it (tests/security/test_slot_guests.py shows the harm end to end)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from toolkiln.domain.execution import ResourceShare, RunRequest
from toolkiln.sandbox.cgroups import Cgroups, Handle
from toolkiln.sandbox.pool import WarmChild
from toolkiln.sandbox.shares import enter


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    cg = Cgroups(f"test-holds-{os.getpid()}", 64 << 20, 16)
    if cg.version is None:
        pytest.skip("no cgroup controllers for memory and pids on this host")
    yield cg
    cg.close()


def _child(cg: Cgroups, procs: list[subprocess.Popen[bytes]]) -> WarmChild:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs.append(p)
    handle = cg.attach(p.pid)
    return WarmChild(pid=p.pid, global_pid=p.pid, pidfd=-1, sock=None, cgroup=handle)  # type: ignore[arg-type]


def _reap(cg: Cgroups, child: WarmChild, procs: list[subprocess.Popen[bytes]]) -> None:
    """The child's process ends and is reaped; the pool's reaper then releases its slot."""
    p = next(p for p in procs if p.pid == child.pid)
    p.kill()
    p.wait()
    cg.release(child.cgroup)


def _free(cg: Cgroups) -> list[Handle]:
    return list(cg._free)


def _request(share: ResourceShare) -> RunRequest:
    return RunRequest("python", "", "main", {}, 1000, share=share)


def test_a_root_reaped_before_its_nested_run_joins_keeps_its_slot(
    cgroups: Cgroups, procs: list[subprocess.Popen[bytes]]
) -> None:
    """The order the first fix missed (found by review): the root made a ctx call and
    exited; it was reaped before the nested run's process joined the slot."""
    share = ResourceShare()
    root_child, nested_child = _child(cgroups, procs), _child(cgroups, procs)
    root = enter(_request(share), root_child, cgroups)
    _reap(cgroups, root_child, procs)
    assert root_child.cgroup not in _free(cgroups)  # the root's run still holds it
    nested = enter(_request(share), nested_child, cgroups)
    assert nested.held is root_child.cgroup
    assert cgroups.attach(_child(cgroups, procs).pid) is not root_child.cgroup
    nested.exit()
    assert root_child.cgroup not in _free(cgroups)  # the root's run has not ended
    root.exit()
    assert _free(cgroups).count(root_child.cgroup) == 1


def test_a_root_reaped_while_its_nested_run_is_in_the_slot_keeps_it(
    cgroups: Cgroups, procs: list[subprocess.Popen[bytes]]
) -> None:
    share = ResourceShare()
    root_child, nested_child = _child(cgroups, procs), _child(cgroups, procs)
    root = enter(_request(share), root_child, cgroups)
    nested = enter(_request(share), nested_child, cgroups)
    _reap(cgroups, root_child, procs)
    root.exit()  # the root's run ended (its process gone) while the nested run goes on
    assert root_child.cgroup not in _free(cgroups)
    nested.exit()
    assert _free(cgroups).count(root_child.cgroup) == 1


def test_a_call_that_ends_before_its_process_is_reaped_frees_the_slot_at_the_reaping(
    cgroups: Cgroups, procs: list[subprocess.Popen[bytes]]
) -> None:
    """The usual order: the runs end, then the process is reaped."""
    share = ResourceShare()
    root_child, nested_child = _child(cgroups, procs), _child(cgroups, procs)
    root = enter(_request(share), root_child, cgroups)
    nested = enter(_request(share), nested_child, cgroups)
    nested.exit()
    root.exit()
    assert root_child.cgroup not in _free(cgroups)  # its process still lives in it
    _reap(cgroups, root_child, procs)
    assert _free(cgroups).count(root_child.cgroup) == 1
    _reap(cgroups, nested_child, procs)
    assert _free(cgroups).count(nested_child.cgroup) == 1
