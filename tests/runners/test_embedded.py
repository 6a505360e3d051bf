"""The embedded runner (``toolkiln serve`` alone): killed, it is started again, and the
service answers again by itself; meanwhile /healthz says no runner takes calls."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.reliability.harness import Serve, admin, wait_for
from tests.runners.harness import cmdline, descendants
from toolkiln.runners.local import EMBEDDED_CGROUP
from toolkiln.sandbox import cgroups, userns

TOKEN = "tk_embedded-admin-token"
CODE = {"language": "python", "code": "def main(**p):\n    return {'message': 'back'}\n"}


def _runner_of(api: Serve) -> int | None:
    found = [p for p in descendants(api.proc.pid) if "toolkiln runner" in cmdline(p)]
    return found[0] if len(found) == 1 else None


def test_a_killed_embedded_runner_is_started_again(tmp_path: Path) -> None:
    api = Serve(tmp_path / "data", {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN}).wait_ready(120)
    try:
        http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
        assert http.post("/v1/run-code", json=CODE).json()["data"]["message"] == "back"
        first = wait_for("the runner", lambda: _runner_of(api), 30)
        # In the runner's own directory beside the data directory when the API is the
        # host's root (runners/local.py, OwnIds), else in the data directory (or, for a
        # path too long for a socket, a directory of its own under /tmp).
        listen = cmdline(first).split("--listen unix:", 1)[1].split()[0]
        assert Path(listen).stat().st_mode & 0o777 == 0o600, listen
        assert Path(listen).parent in (
            tmp_path / "data",
            tmp_path / "data-runner" / str(os.stat(listen).st_uid),
        ) or listen.startswith("/tmp/toolkiln-runner-"), listen
        os.killpg(first, signal.SIGKILL)  # the runner and its sandbox processes
        wait_for("a 503", lambda: httpx.get(f"{api.base}/healthz").status_code == 503, 30)
        wait_for("a 200", lambda: httpx.get(f"{api.base}/healthz").status_code == 200, 120)
        second = _runner_of(api)
        assert second is not None and second != first
        assert http.post("/v1/run-code", json=CODE).json()["data"]["message"] == "back"
    finally:
        api.terminate(60)
    # The runner stopped with it, cleanly (its reader of the API's pipe did not abort it).
    assert "Fatal Python error" not in api.log.read_text(errors="replace")


def _delegated_groups(api_pid: int) -> list[Path]:
    """The cgroups a host-root API delegated to its runner (runners/local.py, OwnIds)."""
    named = f"{EMBEDDED_CGROUP}{os.stat('/proc/self/ns/pid').st_ino}-{api_pid}-*"  # owned
    return [g for base in cgroups._places("") for g in base.glob(named)]


def test_an_api_killed_leaves_no_runner_behind(tmp_path: Path) -> None:
    """The embedded runner drains and ends when the API process that started it is gone,
    even killed (its standard input, a pipe from the API, closes): no runner, template or
    sandbox process of it stays, holding a uid slot. The cgroup a host-root API delegated
    to it, which the killed API could not remove, goes at the next API's start."""
    api = Serve(tmp_path / "data", {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN}).wait_ready(120)
    try:
        http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
        assert http.post("/v1/run-code", json=CODE).json()["data"]["message"] == "back"
        runner = wait_for("the runner", lambda: _runner_of(api), 30)
        tree = [runner, *descendants(runner)]
        assert len(tree) > 1  # its templates and warm processes
        groups = _delegated_groups(api.proc.pid)
        assert bool(groups) == (os.geteuid() == 0 and bool(cgroups._places("")))
        api.proc.kill()
        api.proc.wait(30)
        wait_for(
            "the runner's processes to end",
            lambda: not any(Path(f"/proc/{p}").exists() for p in tree),
            60,
        )
    finally:
        api.terminate(60)
    assert all(g.exists() for g in groups)  # left by the killed API
    again = Serve(tmp_path / "again", {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN}).wait_ready(120)
    try:
        assert not any(g.exists() for g in groups)
    finally:
        again.terminate(60)


SLOW = {
    "language": "python",
    "code": "import time\ndef main(**p):\n    time.sleep(10)\n    return {'message': 'slow'}\n",
}


def test_a_killed_api_s_range_stays_held_while_its_runner_drains(tmp_path: Path) -> None:
    """A killed host-root API's runner drains its calls in flight (up to their timeout) as
    root of a namespace of the API's range: until it has ended, no other root API on the
    host may take that range (sandbox/userns.py, ``embedded_range``)."""
    if os.geteuid() != 0:
        pytest.skip("the embedded runner has a range of its own only of a host-root API")
    api = Serve(tmp_path / "data", {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN}).wait_ready(120)
    try:
        http = httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60)
        runner = wait_for("the runner", lambda: _runner_of(api), 30)
        first = Path(f"/proc/{runner}/uid_map").read_text().split("\n")[0].split()
        outer, count = int(first[1]), int(first[2])

        def call() -> None:
            try:
                http.post("/v1/run-code", json=SLOW)
            except httpx.HTTPError:
                pass  # its API is killed under it

        threading.Thread(target=call, daemon=True).start()
        time.sleep(3)  # the call runs in the runner
        api.proc.kill()
        api.proc.wait(30)
        assert Path(f"/proc/{runner}").exists()  # draining the call in flight
        try:
            taken: userns.HeldRange | None = userns.embedded_range(f"{outer}:{count}")
        except userns.RangeHeld:
            taken = None
        alive = Path(f"/proc/{runner}").exists()
        if taken is not None:
            taken.close()
        assert taken is None or not alive, "the draining runner's range was handed out again"
        wait_for("the runner to end", lambda: not Path(f"/proc/{runner}").exists(), 60)
    finally:
        api.terminate(60)
