"""The embedded runner (``toolkiln serve`` alone): killed, it is started again, and the
service answers again by itself; meanwhile /healthz says no runner takes calls."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx

from tests.reliability.harness import Serve, admin, wait_for
from tests.runners.harness import cmdline, descendants
from toolkiln.runners.local import EMBEDDED_CGROUP
from toolkiln.sandbox import cgroups

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
        # host's root (runners/local.py, OwnIds), else in the data directory.
        sockets = [
            *tmp_path.glob("data/runner-*.sock"),
            *tmp_path.glob("data-runner/runner-*.sock"),
        ]
        assert sockets and all(p.stat().st_mode & 0o777 == 0o600 for p in sockets)
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
    prefix = f"{EMBEDDED_CGROUP}{api_pid}-"
    return [g for base in cgroups._places("") for g in base.glob(f"{prefix}*")]


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
