"""deploy/systemd: both units pass `systemd-analyze verify` (an unknown or misspelt directive
is a warning there, so any output fails), in a scratch root that holds the host's own units
and a stand-in for the installed `toolkiln`; the API's unit grants nothing, the runner's
exactly the capabilities the image test grants its container."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.deploy.podman import ROOT_RUNNER_CAPS

UNITS = ROOT / "deploy" / "systemd"
HOST_UNITS = Path("/usr/lib/systemd/system")


def unit(name: str) -> dict[str, list[str]]:
    """A unit's [Service] section, each key with every value it was given."""
    values: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


@pytest.mark.parametrize("name", ["toolkiln-api.service", "toolkiln-runner.service"])
def test_the_unit_verifies(name: str, tmp_path: Path) -> None:
    verify = shutil.which("systemd-analyze")
    assert verify, "no systemd-analyze (Debian's systemd package)"
    shutil.copytree(HOST_UNITS, tmp_path / HOST_UNITS.relative_to("/"), symlinks=True)
    local = tmp_path / "etc/systemd/system"
    local.mkdir(parents=True)
    shutil.copy(UNITS / name, local / name)
    program = tmp_path / "opt/toolkiln/bin/toolkiln"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    done = subprocess.run(
        [verify, "verify", f"--root={tmp_path}", name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and not done.stdout + done.stderr, done.stdout + done.stderr


def test_the_api_runs_as_a_user_of_its_own_with_nothing_granted() -> None:
    api = unit("toolkiln-api.service")
    assert api["DynamicUser"] == ["yes"]
    assert api["CapabilityBoundingSet"] == [""] and api["AmbientCapabilities"] == [""]
    assert api["NoNewPrivileges"] == ["yes"] and api["ProtectSystem"] == ["strict"]
    assert "User" not in api
    assert any("TOOLKILN_RUNNERS=" in e for e in api["Environment"])


def test_the_runner_is_bounded_to_the_jails_capabilities() -> None:
    runner = unit("toolkiln-runner.service")
    (bounding,) = runner["CapabilityBoundingSet"]
    wanted = {f"CAP_{c}" for c in ROOT_RUNNER_CAPS}
    assert set(bounding.split()) == wanted
    assert runner["NoNewPrivileges"] == ["yes"] and runner["ProtectSystem"] == ["strict"]
    assert runner["ExecStart"][0].split()[1:3] == ["runner", "--listen"]
