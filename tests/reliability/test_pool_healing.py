"""The sandbox pools heal themselves: real templates and children, killed as an operator (or
the kernel) would kill them, from outside the sandbox."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from toolkiln.domain.execution import RunOutcome, RunRequest
from toolkiln.sandbox.jail.config import JailConfig
from toolkiln.sandbox.packages import JsPackageStore, PackageStore
from toolkiln.sandbox.pool import SandboxUnavailable
from toolkiln.sandbox.python_runtime import PythonRuntime
from toolkiln.sandbox.runner import Sandbox
from toolkiln.sandbox.sandboxes import javascript_sandbox, python_sandbox

PY_OK = "def handle(i, c):\n    return 'fine'"
JS_OK = "function handle(i, c) { return 'fine'; }"
# The tool tells the host its uid (a uid of its own per process), then waits to be killed.
PY_REPORT_AND_WAIT = (
    "import os, time\n"
    "def handle(i, c):\n"
    "    c.audit('uid', os.getuid())\n"
    "    time.sleep(20)\n"
    "    return 'not killed'"
)


class Link:
    """A run link that remembers the audit rows and runs a hook on the first one."""

    def __init__(self, on_audit: Callable[[object], None] | None = None) -> None:
        self.on_audit = on_audit

    def admit(self) -> bool:
        return True

    def call(self, name: str, payload: object) -> object:
        return {"error": "unknown_tool"}

    def audit(self, event: str, data: object) -> None:
        if self.on_audit is not None:
            self.on_audit(data)


def until(check: Callable[[], bool], what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def run(sb: Sandbox, code: str, link: Link | None = None, timeout_ms: int = 5000):
    return sb.run(RunRequest(sb.language, code, "handle", {}, timeout_ms), link or Link())


def pids_of_uid_range(sb: Sandbox) -> dict[int, int]:
    """pid -> uid of every process running as one of this sandbox's uids."""
    low = sb.uids.first
    high = low + sb.uids.count
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
            except OSError:
                continue
            if low <= uid < high:
                found[int(entry.name)] = uid
    return found


def template_pid1(sb: Sandbox) -> int:
    """The global pid of the template's PID 1 (the outer process only waits for it)."""
    outer = sb.template.pid
    assert outer is not None
    children = Path(f"/proc/{outer}/task/{outer}/children").read_text().split()
    return int(children[0])


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sb = python_sandbox(PackageStore(tmp_path_factory.mktemp("pkgs")), warm=3, name="heal-py")
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def javascript(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    store = JsPackageStore(tmp_path_factory.mktemp("jspkgs"))
    sb = javascript_sandbox(store, warm=2, name="heal-js")
    yield sb
    sb.close()


def kill_template(sb: Sandbox, which: str) -> None:
    pid = sb.template.pid if which == "outer" else template_pid1(sb)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("which", ["outer", "pid1"])
def test_a_killed_python_template_is_restarted(python: Sandbox, which: str) -> None:
    assert run(python, PY_OK).kind == "return"
    before = python.template.health()["template_restarts"]
    kill_template(python, which)
    until(lambda: "died" in (python.template.health()["reason"] or ""), "the death to be seen")
    # A call made while the template is down waits for the restart instead of failing.
    out = run(python, PY_OK)
    assert out.kind == "return" and out.value == "fine", (out.kind, out.message)
    health = python.template.health()
    assert health["template_restarts"] == before + 1 and not health["degraded"]
    until(lambda: python.template.health()["warm"] >= 2, "a warm pool again")


def test_the_python_template_for_async_code_heals_on_its_own(python: Sandbox) -> None:
    """A Python sandbox has two templates (runner.needs_asyncio): killing the one for code
    that says ``async`` shows in the sandbox's one pool health until it is restarted; async
    code waits for it, other code never notices."""
    py_async = "async def handle(i, c):\n    return 'fine'"
    assert run(python, py_async).value == "fine"
    assert python.async_template is not None
    lean_before = python.template.health()["template_restarts"]
    before = python.describe()["pool"]["template_restarts"]
    pid = python.async_template.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    until(lambda: "died" in (python.describe()["pool"]["reason"] or ""), "the death to be seen")
    lean, said = run(python, PY_OK), run(python, py_async)
    assert (lean.kind, lean.value, said.kind, said.value) == ("return", "fine") * 2, said.message
    pool = python.describe()["pool"]
    assert pool["template_restarts"] == before + 1 and not pool["degraded"], pool
    assert python.template.health()["template_restarts"] == lean_before


def test_killed_warm_children_are_never_handed_out(python: Sandbox) -> None:
    assert run(python, PY_OK).kind == "return"
    until(lambda: python.template.health()["warm"] >= 3, "three warm children")
    discarded = python.template.health()["dead_children_discarded"]
    killed = kill_all(python)
    outcomes = [run(python, PY_OK) for _ in range(5)]
    assert [o.kind for o in outcomes] == ["return"] * 5, [(o.kind, o.message) for o in outcomes]
    assert python.template.health()["dead_children_discarded"] >= discarded + killed


def kill_all(sb: Sandbox) -> int:
    """SIGKILL every idle process of the pool from outside, and wait until they are dead."""
    idle = sb.template.idle()
    for child in idle:
        os.kill(child.global_pid, signal.SIGKILL)
    until(lambda: not any(c.alive() for c in idle), "the killed to be dead")
    return len(idle)


def kill_when_reported(sb: Sandbox, sig: int) -> Link:
    """A link that, when the tool reports its uid, kills that process from outside."""

    def kill(uid: object) -> None:
        pids = [p for p, u in pids_of_uid_range(sb).items() if u == uid]
        assert len(pids) == 1, pids
        os.kill(pids[0], sig)

    return Link(kill)


BURN_REPORT_AND_WAIT = (
    "import os, time\n"
    "def handle(i, c):\n"
    "    while time.process_time() < 1.2:\n"  # a busy tool: past any CPU-time guess
    "        pass\n"
    "    c.audit('uid', os.getuid())\n"
    "    time.sleep(20)\n"
    "    return 'not killed'"
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("code", [PY_REPORT_AND_WAIT, BURN_REPORT_AND_WAIT], ids=["idle", "busy"])
def test_a_python_call_killed_from_outside_is_infra(python: Sandbox, sig: int, code: str) -> None:
    out = run(python, code, kill_when_reported(python, sig), timeout_ms=15000)
    assert out.kind == "infra", (out.kind, out.message)
    assert signal.Signals(sig).name in out.message
    assert run(python, PY_OK).kind == "return"


def test_a_call_in_flight_when_the_template_dies_is_infra(python: Sandbox) -> None:
    link = Link(lambda uid: kill_template(python, "pid1"))
    out = run(python, PY_REPORT_AND_WAIT, link)
    assert out.kind == "infra", (out.kind, out.message)
    assert run(python, PY_OK).kind == "return"


def test_a_killed_javascript_template_is_restarted(javascript: Sandbox) -> None:
    assert run(javascript, JS_OK).kind == "return"
    before = javascript.template.health()["template_restarts"]
    kill_template(javascript, "pid1")
    until(lambda: "died" in (javascript.template.health()["reason"] or ""), "the death seen")
    out = run(javascript, JS_OK, timeout_ms=10000)
    assert out.kind == "return" and out.value == "fine", (out.kind, out.message)
    assert javascript.template.health()["template_restarts"] == before + 1


def test_killed_idle_javascript_workers_are_never_handed_out(
    javascript: Sandbox,
) -> None:
    assert run(javascript, JS_OK).kind == "return"
    until(lambda: javascript.template.health()["warm"] >= 2, "two idle workers")
    kill_all(javascript)
    outcomes = [run(javascript, JS_OK, timeout_ms=10000) for _ in range(3)]
    assert [o.kind for o in outcomes] == ["return"] * 3, [(o.kind, o.message) for o in outcomes]


def test_a_javascript_call_killed_from_outside_is_infra(javascript: Sandbox) -> None:
    code = "async function handle(i, c) {\n  await c.audit('started');\n  while (true) {}\n}"
    box: dict[str, RunOutcome] = {}
    started = threading.Event()
    link = Link(lambda _: started.set())
    worker = threading.Thread(target=lambda: box.setdefault("out", run(javascript, code, link)))
    worker.start()
    until(started.is_set, "the call to start")
    # Idle workers wait in the queue; the busy one is the one not there. A worker being made
    # (a replacement the earlier tests asked for) is not there yet either: wait until it is.
    busy: list[int] = []

    def one_busy() -> bool:
        idle = {c.global_pid for c in javascript.template.idle()}
        busy[:] = [p for p in pids_of_uid_range(javascript) if p not in idle]
        return len(busy) == 1

    until(one_busy, "only the running call's worker outside the queue")
    os.kill(busy[0], signal.SIGKILL)
    worker.join(timeout=15)
    assert not worker.is_alive()
    assert box["out"].kind == "infra", (box["out"].kind, box["out"].message)


def _slots_held() -> set[str]:
    """The uid slot files this process holds open (a sandbox holds its slot's)."""
    held = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if "toolkiln-uid-slots" in target:
            held.add(target)
    return held


class _BrokenAsync(PythonRuntime):
    """Python whose second template (for code that says async) cannot start."""

    slots: list[int] = []  # the uid slot each one claimed

    def configs(self, base: JailConfig) -> list[JailConfig]:
        assert self.sandbox is not None
        self.slots.append(self.sandbox.uids.slot)
        lean, with_asyncio = super().configs(base)
        return [lean, with_asyncio.replace(packages_dir="/nonexistent/toolkiln-gone")]


def test_a_sandbox_whose_second_template_fails_to_start_leaves_nothing(tmp_path: Path) -> None:
    """Strict mode refuses a sandbox whose template for async code cannot start; what the
    first template had started (its warm children in cgroup slots, the cgroup tree, the uid
    slot) is gone with it."""
    before = _slots_held()
    with pytest.raises(SandboxUnavailable):
        Sandbox(_BrokenAsync(), PackageStore(tmp_path / "pkgs"), warm=2, name="heal-half")
    # Its own slot's tree (another run killed before its close may have left another's).
    name = f"toolkiln-heal-half-u{_BrokenAsync.slots[-1]}"
    left = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{name}")]
    left += [str(p) for p in Path("/sys/fs/cgroup").glob(name)]
    assert not left, left
    assert _slots_held() == before


def test_a_broken_restart_is_retried_and_reported(tmp_path: Path) -> None:
    """The keeper survives a failing start: it reports why and tries again with backoff."""
    sb = python_sandbox(PackageStore(tmp_path / "pkgs"), warm=1, name="heal-broken")
    try:
        config = sb.template.config
        sb.template.config = config.replace(packages_dir=str(tmp_path / "gone"))  # start fails
        kill_template(sb, "pid1")
        until(
            lambda: "could not be restarted" in (sb.template.health()["reason"] or ""), "a report"
        )
        assert sb.template.health()["degraded"]
        out = run(sb, PY_OK, timeout_ms=1000)
        assert out.kind == "infra"
        sb.template.config = config
        until(lambda: not sb.template.health()["degraded"], "the restart to succeed")
        assert run(sb, PY_OK).kind == "return"
    finally:
        sb.close()
