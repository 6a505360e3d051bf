"""deploy/systemd: every unit passes `systemd-analyze verify` (an unknown or misspelt
directive is a warning there, so any output fails), in a scratch root that holds the host's
own units and a stand-in for the installed `toolkiln`; the API's unit grants nothing; the
runner's runs as an unprivileged user with no capability, bounded to what newuidmap needs;
the root runner's to the capabilities the image test grants a root container.

The API's and the runner's units are then started as they are written (``units.py``: the
user, capability sets, no_new_privs and environment each unit gives, applied with setpriv;
systemd is not PID 1 here) with the test user of tests/runners/rootless.py in place of
``toolkiln``: real calls go through the pair, and the host's /proc shows no process at uid
0, the API with no capability and the runner with none in the host's user namespace."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.api.calls import in_both_languages
from tests.conftest import ROOT, free_port
from tests.deploy import units
from tests.deploy.podman import CAPS, ROOT_RUNNER_CAPS, HostView, descendants
from tests.reliability.harness import admin, wait_healthy, wait_listening
from tests.runners.rootless import USER, Delegated, Host, make_host, why_not

UNITS = ROOT / "deploy" / "systemd"
NAMES = ["toolkiln-api.service", "toolkiln-runner.service", "toolkiln-runner-root.service"]
HOST_UNITS = Path("/usr/lib/systemd/system")
TOKEN = "tk_units-" + secrets.token_hex(8)
PYTHON = "import os\ndef main(**p):\n    return {'message': 'py', 'rawData': [os.getuid()]}\n"
JS = "function main(p) { return {message: 'js ' + p.x}; }"


def unit(name: str) -> dict[str, list[str]]:
    return units.service((UNITS / name).read_text())


@pytest.mark.parametrize("name", NAMES)
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


def test_the_runner_is_unprivileged_and_bounded_to_what_newuidmap_needs() -> None:
    runner = unit("toolkiln-runner.service")
    assert runner["User"] == ["toolkiln"] and runner["Group"] == ["toolkiln"]
    (bounding,) = runner["CapabilityBoundingSet"]
    assert set(bounding.split()) == {f"CAP_{c}" for c in CAPS}
    assert runner["AmbientCapabilities"] == [""]
    # newuidmap and newgidmap are set-uid: no_new_privs, said or implied, would stop them.
    assert not units.no_new_privs(runner)
    assert runner["ExecStart"][0].split()[1:3] == ["runner", "--listen"]
    assert any("TOOLKILN_SANDBOX_CGROUP=" in e for e in runner["Environment"])


def test_the_root_runner_is_bounded_to_the_jails_capabilities() -> None:
    runner = unit("toolkiln-runner-root.service")
    (bounding,) = runner["CapabilityBoundingSet"]
    assert set(bounding.split()) == {f"CAP_{c}" for c in ROOT_RUNNER_CAPS}
    assert runner["NoNewPrivileges"] == ["yes"] and runner["ProtectSystem"] == ["strict"]
    assert "User" not in runner
    assert runner["ExecStart"][0].split()[1:3] == ["runner", "--listen"]


# -- the units started


def _text(name: str, replace: dict[str, str]) -> str:
    """The unit with each of the test's values in place of the documented one (each must be
    there: the test starts what is shipped)."""
    text = (UNITS / name).read_text()
    for old, new in replace.items():
        assert old in text, f"{name} has no {old!r}"
        text = text.replace(old, new)
    return text


def _tree(pid: int) -> list[HostView]:
    return list(descendants(pid))


def _host_userns(pid: int) -> bool:
    return os.stat(f"/proc/{pid}/ns/user").st_ino == os.stat("/proc/self/ns/user").st_ino


def _no_new_privs(pid: int) -> bool:
    return "NoNewPrivs:\t1" in Path(f"/proc/{pid}/status").read_text()


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    made = make_host()
    yield made
    shutil.rmtree(made.base, ignore_errors=True)


@dataclass
class Place:
    """What one test's units get: a directory every uid can read (their environment files,
    state and output), a cgroup delegated to the runner's user, the units started (stopped,
    and all removed, when the test ends)."""

    host: Host
    work: Path
    cgroup: Delegated
    started: list[units.Started] = field(default_factory=list)

    def start(self, name: str, replace: dict[str, str], **env: str) -> units.Started:
        """The unit ``name`` with the test's values (``replace``; ``ENV``: its environment
        file, written with ``env``; the installed ``toolkiln``: the test's)."""
        stem = name.removesuffix(".service")
        path = self.work / f"{stem}.env"
        path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        path.chmod(0o600)
        replace = {"/opt/toolkiln/bin/toolkiln": str(self.host.python.parent / "toolkiln")} | {
            old: new.replace("ENV", str(path)) for old, new in replace.items()
        }
        made = units.start(_text(name, replace), self.work / "state", self.work / f"{stem}.log")
        self.started.append(made)
        return made

    def runner(self, token: str, port: int, **replace: str) -> units.Started:
        """The runner's unit as the test user, at ``port``, with the test's cgroup."""
        values = {
            "127.0.0.1:7700": f"127.0.0.1:{port}",
            "/etc/toolkiln/runner.env": "ENV",
            "User=toolkiln\n": f"User={USER}\n",
            "Group=toolkiln\n": f"Group={USER}\n",
            "SANDBOX_CGROUP=toolkiln-runner": f"SANDBOX_CGROUP={self.cgroup.name}",
            **replace,
        }
        return self.start(
            "toolkiln-runner.service",
            values,
            TOOLKILN_RUNNER_TOKEN=token,
            TOOLKILN_SANDBOX_WARM="2",
            TOOLKILN_SANDBOX_JS_WORKERS="1",
        )


@pytest.fixture
def place(host: Host) -> Iterator[Place]:
    work = Path(host.base) / f"units-{secrets.token_hex(4)}"
    work.mkdir()
    work.chmod(0o755)
    made = Place(host, work, Delegated(host.user.pw_uid))
    try:
        made.cgroup.make()
        yield made
    finally:
        for unit_ in reversed(made.started):
            unit_.stop()
        made.cgroup.remove()
        shutil.rmtree(work, ignore_errors=True)


def test_the_api_and_runner_units_serve_calls_with_no_host_root(place: Place) -> None:
    token = secrets.token_urlsafe(24)
    runner_port, api_port = free_port(), free_port()
    runner = place.runner(token, runner_port)
    wait_listening("the runner unit", runner.proc, runner.output)
    api = place.start(
        "toolkiln-api.service",
        {
            "TOOLKILN_RUNNERS=127.0.0.1:7700": f"TOOLKILN_RUNNERS=127.0.0.1:{runner_port}",
            "/etc/toolkiln/api.env": "ENV",
        },
        TOOLKILN_RUNNER_TOKEN=token,
        TOOLKILN_BOOTSTRAP_TOKEN=TOKEN,
        TOOLKILN_PORT=str(api_port),
    )
    base = f"http://127.0.0.1:{api_port}"
    wait_healthy("the API unit", base, api.proc, api.output, 120)
    with httpx.Client(base_url=base, headers=admin(TOKEN), timeout=60) as http:
        results = in_both_languages(http, "unit", PYTHON, JS)
    (uid,) = results["python"]["raw_data"]
    assert uid >= 20_000, uid  # the call ran at an id of the runner's range
    _check_api(api)
    _check_runner(runner, place.host)


def _check_api(api: units.Started) -> None:
    procs = _tree(api.proc.pid)
    print(f"\nthe API unit's processes (uid {api.uid}):")
    for p in procs:
        print(f"  {p.pid:>7} uid {p.uids} caps {p.cap_eff:#x}/{p.cap_bnd:#x} {p.name}")
        assert set(p.uids) == {api.uid}, p  # never 0
        assert p.cap_eff == 0 and p.cap_bnd == 0, p
        assert _host_userns(p.pid) and _no_new_privs(p.pid), p


def _check_runner(runner: units.Started, host: Host) -> None:
    procs = _tree(runner.proc.pid)
    tools = host.tool_uids("subuid")
    print(f"\nthe runner unit's processes (uid {runner.uid}):")
    for p in procs:
        print(f"  {p.pid:>7} uid {p.uids} caps {p.cap_eff:#x}/{p.cap_bnd:#x} {p.name}")
        assert 0 not in p.uids, p
        # Capabilities only in the user namespace the runner made (over its own ids).
        assert p.cap_eff == 0 or not _host_userns(p.pid), p
        assert p.uids[0] in (runner.uid, *tools), p
    # The runner itself made its user namespace (newuidmap's set-uid wrote its maps): its
    # capabilities are root's of that namespace, over its own ids alone.
    top = procs[0]
    assert top.uids == (runner.uid,) * 4 and not _host_userns(top.pid), top
    assert [p for p in procs if p.uids[0] in tools], "no tool process at an id of the range"


@pytest.mark.parametrize("cap", sorted(CAPS))
def test_each_capability_of_the_runners_bounding_set_is_needed(place: Place, cap: str) -> None:
    """Without any one of them newuidmap or newgidmap cannot write the runner's maps, and the
    runner refuses to start, naming its namespaces layer."""
    (bounding,) = unit("toolkiln-runner.service")["CapabilityBoundingSet"]
    fewer = " ".join(c for c in bounding.split() if c != f"CAP_{cap}")
    line = {f"CapabilityBoundingSet={bounding}\n": f"CapabilityBoundingSet={fewer}\n"}
    runner = place.runner(secrets.token_urlsafe(24), free_port(), **line)
    assert runner.proc.wait(120) == 2, runner.output()
    out = runner.output()
    assert "error: sandbox_refused:" in out and "its namespaces layer" in out, out
