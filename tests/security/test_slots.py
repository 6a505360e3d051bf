"""Each call's process has a cgroup slot of its own: two calls running at the same time, of two
workspaces, never share the memory, task or CPU caps that bound them (a shared slot would let
one call's memory or processes count against another's, and the OOM killer pick either), and
each slot carries the per-call caps. The slots are reused from call to call, so this is checked
after the pool has handed several out."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import cgroup_path
from tests.sandbox.test_shares import groups, pids_of
from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.sandbox.packages import PackageStore
from toolkiln.sandbox.runner import Sandbox
from toolkiln.sandbox.sandboxes import python_sandbox

WHERE = "import os\ndef handle(i, ctx):\n    return ctx.tools.where({'uid': os.getuid()})\n"


class _Where:
    """Answers ``where`` with the cgroups of the asking process, read by the host."""

    def admit(self) -> bool:
        return True

    def audit(self, event: str, data: object) -> None:
        return None

    def call(self, name: str, payload: Any) -> Any:
        if name != "where":
            return {"error": "unknown_tool"}
        (pid,) = pids_of(payload["uid"], payload["uid"] + 1)
        return groups(pid)


class _Meeting(_Where):
    """Answers ``where`` only once both runs have asked: their two processes are alive at
    the same time."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=20)

    def call(self, name: str, payload: Any) -> Any:
        here = super().call(name, payload)
        if name == "where":
            self.barrier.wait()
        return here


def _together(sb: Sandbox) -> list[dict[str, str]]:
    link = _Meeting()
    outcomes: list[RunOutcome | None] = [None, None]

    def run(i: int) -> None:
        req = RunRequest("python", WHERE, "handle", {}, 20000, workspace_id=f"ws-{i}")
        outcomes[i] = sb.run(req, link)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    found = []
    for out in outcomes:
        assert out is not None and out.kind == "return", out
        found.append(out.value)
    return found


def test_two_calls_running_together_never_share_a_cgroup_slot(tmp_path: Path) -> None:
    sb = python_sandbox(PackageStore(tmp_path), warm=2, name="slots-test")
    try:
        cg = sb.cgroups
        assert cg is not None and cg.version is not None
        if cg.version == "v1":
            controllers = ["memory", "pids"] + (["cpu"] if cg.cpu else [])
        else:
            controllers = ["unified"]
        for _ in range(3):  # slots handed out, released and handed out again
            a, b = _together(sb)
            for controller in controllers:
                assert a[controller] != b[controller], controller
                for found in (a, b):
                    assert found[controller].startswith(cgroup_path("toolkiln-slots-test-u")), found
            for found in (a, b):
                if cg.version == "v1":
                    memory = Path("/sys/fs/cgroup/memory") / found["memory"].lstrip("/")
                    limit = (memory / "memory.limit_in_bytes").read_text()
                    pids = Path("/sys/fs/cgroup/pids") / found["pids"].lstrip("/")
                    tasks = (pids / "pids.max").read_text()
                else:
                    unified = cg.roots[0].parent / found["unified"].lstrip("/")
                    limit = (unified / "memory.max").read_text()
                    tasks = (unified / "pids.max").read_text()
                assert int(limit) == cg.memory_bytes
                assert int(tasks) == cg.pids_max
    finally:
        sb.close()


def test_a_warm_child_waits_outside_the_cpu_slots_and_runs_in_its_own(tmp_path: Path) -> None:
    """A Python child warms up outside its slot's CPU group (beside the service's threads,
    at the warm nice value) and is moved into it when it is taken, before the request that
    carries a call's code is sent: the call's code never runs outside its CPU cap."""
    sb = python_sandbox(PackageStore(tmp_path), warm=2, name="warm-cpu-test")
    try:
        cg = sb.cgroups
        assert cg is not None
        if cg.version != "v1" or not cg.cpu:
            pytest.skip(
                "the CPU group is apart from the memory and pids groups on cgroup v1 only (on "
                "v2 one write moves a process into all of its slot's controllers)"
            )
        prefix = cgroup_path("toolkiln-warm-cpu-test-u")
        base, count = int(sb.uids.first), int(sb.uids.count)
        deadline = time.monotonic() + 20
        warm: list[int] = []
        while time.monotonic() < deadline:  # the warm children, all adopted by the pool
            warm = pids_of(base, base + count)
            if len(warm) >= 2 and all(groups(p)["memory"].startswith(prefix) for p in warm):
                break
            time.sleep(0.05)
        assert len(warm) >= 2, warm
        for pid in warm:
            found = groups(pid)
            assert found["memory"].startswith(prefix), found
            assert found["pids"].startswith(prefix), found
            assert not found["cpu"].startswith(cgroup_path("toolkiln-")), (
                found
            )  # in no slot's CPU group
        for i in range(3):
            req = RunRequest("python", WHERE, "handle", {}, 20000, workspace_id=f"ws-{i}")
            out = sb.run(req, _Where())
            assert out.kind == "return", out
            assert out.value["cpu"].startswith(prefix), out.value
            # the CPU group of the call's own slot, the one its memory and tasks are in
            assert out.value["cpu"] == out.value["memory"] == out.value["pids"], out.value
            cpu = Path("/sys/fs/cgroup/cpu") / out.value["cpu"].lstrip("/")
            assert int((cpu / "cpu.cfs_quota_us").read_text()) == cg.cpu_quota_us
    finally:
        sb.close()
