"""A call's runs share one cgroup slot: nested runs (either language) are charged to the root
run's memory and CPU caps while they run, and go back to their own slot after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolkiln.domain.execution import ResourceShare, RunRequest
from toolkiln.sandbox.packages import JsPackageStore, PackageStore
from toolkiln.sandbox.runner import Sandbox
from toolkiln.sandbox.sandboxes import javascript_sandbox, python_sandbox


def groups(pid: int) -> dict[str, str]:
    """controller -> cgroup path of a process (v1 lines read ``id:controllers:path``)."""
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") or [""]:
            out[name or "unified"] = path
    return out


def pids_of(low: int, high: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if low <= entry.stat().st_uid < high:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def uid_range(sb: Sandbox) -> tuple[int, int]:
    base = int(sb.uids.first)
    return base, base + int(sb.uids.count)


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Sandbox]]:
    py = python_sandbox(PackageStore(tmp_path_factory.mktemp("pkgs")), warm=2)
    js = javascript_sandbox(JsPackageStore(tmp_path_factory.mktemp("js")), warm=1, name="js")
    yield {"python": py, "javascript": js}
    py.close()
    js.close()


class Tree:
    """The platform side of one call: ``nested`` runs code with the call's share, ``where``
    tells where the asking process (by uid, or the busy JavaScript worker) is charged."""

    def __init__(self, sandboxes: dict[str, Sandbox]) -> None:
        self.sandboxes = sandboxes
        self.share = ResourceShare()

    def admit(self) -> bool:
        return True

    def audit(self, event: str, data: object) -> None:
        return None

    def run(self, language: str, code: str) -> Any:
        req = RunRequest(language, code, "handle", {}, 8000, share=self.share)
        return self.sandboxes[language].run(req, self)

    def call(self, name: str, payload: Any) -> Any:
        if name == "nested":
            out = self.run(payload["language"], payload["code"])
            return {"kind": out.kind, "value": out.value, "message": out.message}
        if name == "where":
            (pid,) = pids_of(payload["uid"], payload["uid"] + 1)
            return groups(pid)
        if name == "js-workers":
            return [groups(pid) for pid in pids_of(*uid_range(self.sandboxes["javascript"]))]
        return {"error": "unknown_tool"}


ROOT = (
    "import os\n"
    "def handle(i, ctx):\n"
    "    me = ctx.tools.where({'uid': os.getuid()})\n"
    "    py = ctx.tools.nested({'language': 'python', 'code': PY})\n"
    "    js = ctx.tools.nested({'language': 'javascript', 'code': JS})\n"
    "    return {'root': me, 'python': py, 'javascript': js}\n"
    "PY = '''import os\n"
    "def handle(i, ctx):\n"
    "    return ctx.tools.where({'uid': os.getuid()})\n"
    "'''\n"
    "JS = 'async function handle(i, ctx) { return await ctx.tools[\"js-workers\"]({}) }'\n"
)


def test_nested_runs_are_charged_to_the_root_runs_slot(
    sandboxes: dict[str, Sandbox],
) -> None:
    py = sandboxes["python"]
    assert py.cgroups is not None and py.cgroups.version is not None
    tree = Tree(sandboxes)
    out = tree.run("python", ROOT)
    assert out.kind == "return", (out.kind, out.message, out.stderr)
    root, nested = out.value["root"], out.value["python"]
    assert nested["kind"] == "return", nested
    shared = ["memory"] + (["cpu"] if py.cgroups.cpu else [])
    if py.cgroups.version == "v2":
        shared = ["unified"]
    for controller in shared:
        assert nested["value"][controller] == root[controller], controller
    if py.cgroups.version == "v1":  # the task cap stays per process
        assert nested["value"]["pids"] != root["pids"]
    memory = shared[0]
    workers = out.value["javascript"]
    assert workers["kind"] == "return", workers
    assert [w[memory] == root[memory] for w in workers["value"]].count(True) == 1, workers
    # After the call the worker is back in its own slot.
    for pid in pids_of(*uid_range(sandboxes["javascript"])):
        assert groups(pid)[memory] != root[memory]


def test_each_slot_has_a_cpu_limit(sandboxes: dict[str, Sandbox]) -> None:
    py = sandboxes["python"]
    assert py.cgroups is not None
    if not py.cgroups.cpu:
        pytest.skip("this host's cgroups offer no cpu controller (the limit is reported off)")
    tree = Tree(sandboxes)
    where = "import os\ndef handle(i, ctx):\n    return ctx.tools.where({'uid': os.getuid()})\n"
    out = tree.run("python", where)
    assert out.kind == "return", out.message
    if py.cgroups.version == "v1":
        slot = Path("/sys/fs/cgroup/cpu") / out.value["cpu"].lstrip("/")
        assert int((slot / "cpu.cfs_quota_us").read_text()) == 100_000
        assert int((slot / "cpu.cfs_period_us").read_text()) == 100_000
    assert py.describe()["limits"]["cpus"] == 1.0
