"""Runners with no host root (docs/security.md, "No host root"), in both shapes: an
unprivileged user that makes its own user namespace from /etc/subuid, and root of a user
namespace mapped to an unprivileged host range. An API process (this test's) sends them real
calls; the host's /proc shows that none of their processes holds host uid 0, and each layer
holds by its effect: per-call uids of the mapped range, seccomp, the read-only root, the
cgroup's memory cap, a call past its deadline killed. A host that cannot give a layer gets
the refusal that names it, unless the layer is accepted, and /healthz then lists it."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.api.calls import draft_run, in_both_languages
from tests.conftest import own_service
from tests.deploy.podman import HostView, host_view
from tests.reliability.harness import admin, wait_for
from tests.runners.harness import descendants
from tests.runners.rootless import (
    SHAPES,
    Delegated,
    Host,
    RootlessRunner,
    make_host,
    unprivileged_api,
    why_not,
)

pytestmark = pytest.mark.skipif(why_not() is not None, reason=str(why_not()))
TOKEN = "tk_rootless-" + secrets.token_hex(8)

PROBE = """
import os

def main(**p):
    seen = []
    try:
        open('/probe', 'w')
    except OSError as e:
        seen.append('root:' + str(e.errno))
    seen.append('proc:' + str(os.path.exists('/proc/self')))
    return {'message': ' '.join(seen), 'rawData': [os.getuid(), os.getgid()]}
"""
HOG = """
def main(**p):
    held = []
    for _ in range(12):
        block = bytearray(32 << 20)
        block[::4096] = b"x" * len(block[::4096])
        held.append(block)
    return {"message": "held"}
"""
SOCKET = "import socket\ndef main(**p):\n    socket.socket()\n    return {}"
JS = "function main(p) { return {message: 'js ' + p.x}; }"


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    import shutil

    made = make_host()
    yield made
    shutil.rmtree(made.base, ignore_errors=True)


@pytest.fixture(scope="module", params=SHAPES)
def served(
    request: pytest.FixtureRequest, host: Host, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RootlessRunner, TestClient, dict[str, str]]]:
    shape = request.param
    cgroup = Delegated(host.host_uid(shape)).make()
    runner = RootlessRunner(host, shape, cgroup)
    try:
        runner.wait_listening()
        settings: dict[str, Any] = {"runners": runner.address, "runner_token": runner.token}
        data = tmp_path_factory.mktemp(f"api-{shape}")
        with own_service(data, TOKEN, hosted=False, **settings) as (_, client, who):
            yield runner, client, {"Authorization": f"Bearer {TOKEN}", "ws": who.workspace_id}
    finally:
        runner.stop()
        cgroup.remove()


def _run(served: tuple[RootlessRunner, TestClient, dict[str, str]], code: str, **kw: Any) -> Any:
    """A test run of ``code`` (not stored), as the view's "Test" does."""
    _, client, auth = served
    headers = {"Authorization": auth["Authorization"]}
    return draft_run(client, headers, auth["ws"], code, name="rootless", **kw)


def _tree(runner: RootlessRunner) -> list[HostView]:
    pids = [runner.proc.pid, *descendants(runner.proc.pid)]
    return [v for v in (host_view(p) for p in pids) if v is not None]


def test_every_layer_holds_without_host_root(
    served: tuple[RootlessRunner, TestClient, dict[str, str]],
) -> None:
    runner, client, _ = served
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["degraded"] == [], health
    for name in ("python", "javascript"):
        runtime = health["runtimes"][name]
        assert runtime["missing_layers"] == [], runtime
        assert runtime["isolation"]["cgroup"] == "v1", runtime
        assert runtime["isolation"]["readonly_root"] is True
    seen = _run(served, PROBE)
    assert seen["status"] == "ok", seen["error"]
    assert seen["message"] == "root:30 proc:False", seen  # EROFS, no /proc
    uid, gid = seen["raw_data"]
    assert uid == gid and uid >= 20_000  # an id of the namespace's mapped range
    assert _run(served, SOCKET)["error"]["code"] == "sandbox_violation"  # seccomp: SIGSYS
    assert _run(served, HOG)["error"]["code"] == "memory_limit"  # the delegated cgroup
    js = _run(served, JS, language="javascript", payload={"x": "on"})
    assert js["status"] == "ok" and js["message"] == "js on", js
    spin = "def main(**p):\n    while True:\n        pass\n    return {}"
    assert _run(served, spin, timeout_ms=500)["error"]["code"] == "timeout"
    second = os.sysconf("SC_CLK_TCK")

    def none_spinning() -> bool:
        tools = runner.host.tool_uids(runner.shape)
        return not [p for p in _tree(runner) if p.uids[0] in tools and p.cpu_ticks >= second]

    # The kill crosses uids (the runner's to the call's): done in the namespace, it holds.
    wait_for("the call past its deadline killed", none_spinning, 15)


def test_no_process_of_a_rootless_runner_holds_host_root(
    served: tuple[RootlessRunner, TestClient, dict[str, str]],
) -> None:
    runner, _, _ = served
    assert _run(served, PROBE)["status"] == "ok"  # warm processes are there
    procs = _tree(runner)
    own = runner.host.host_uid(runner.shape)
    tools = runner.host.tool_uids(runner.shape)
    print(f"\nhost uids of the {runner.shape} runner's processes:")
    for p in procs:
        print(f"  {p.pid:>7} uid {p.uids} caps {p.cap_eff:#x} {p.name}")
        assert 0 not in p.uids, p
    jailed = [p for p in procs if p.uids[0] in tools]
    assert jailed, "no tool process at an id of the mapped range"
    checked = 0
    for p in jailed:
        assert len(set(p.uids)) == 1 and p.cap_eff == 0, p
        try:
            status = Path(f"/proc/{p.pid}/status").read_text()
        except FileNotFoundError:
            continue  # ended since it was listed (a served child is replaced)
        assert "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status, p
        checked += 1
    assert checked, "every tool process ended before it was read"
    # The runner and its templates hold the runner's host uid; nothing else is under it.
    assert {p.uids[0] for p in procs} <= {own, *tools}


def _host_userns(p: HostView) -> bool:
    """Whether ``p`` is in the host's user namespace (this test's, as the host's root), where
    capabilities are host-wide."""
    return os.stat(f"/proc/{p.pid}/ns/user").st_ino == os.stat("/proc/self/ns/user").st_ino


def test_an_unprivileged_api_and_its_embedded_runner_hold_no_host_root(
    host: Host, tmp_path: Path
) -> None:
    """`toolkiln serve` as an unprivileged user, nothing else given but a delegated cgroup:
    the API holds no capability, its embedded runner makes its own user namespace, and real
    calls run in both languages."""
    with unprivileged_api(host, TOKEN, 120) as (api, base):
        with httpx.Client(base_url=base, headers=admin(TOKEN), timeout=60) as http:
            in_both_languages(http, "rl", PROBE, JS)
        procs = [v for v in (host_view(p) for p in [api.proc.pid, *descendants(api.proc.pid)]) if v]
        print("\nhost uids of the unprivileged API's processes:")
        for p in procs:
            print(f"  {p.pid:>7} uid {p.uids} caps {p.cap_eff:#x} {p.name}")
            assert 0 not in p.uids, p
            # Capabilities only in a user namespace of its own (the runner and its jail).
            assert p.cap_eff == 0 or not _host_userns(p), p
        top = procs[0]
        assert top.uids == (host.user.pw_uid,) * 4 and top.cap_eff == 0 and top.cap_bnd != 0
        assert _host_userns(top)
        assert [p for p in procs if p.uids[0] in host.tool_uids("subuid")], "no tool process"


def _refused(runner: RootlessRunner) -> str:
    code = runner.wait_exit()
    out = runner.output()
    assert code == 2, out
    return out


def test_a_subuid_range_the_user_does_not_have_is_refused_naming_the_layer(host: Host) -> None:
    cgroup = Delegated(host.user.pw_uid).make()
    elsewhere = f"{host.outer}:65536"  # no one's range in /etc/subuid
    runner = RootlessRunner(host, "subuid", cgroup, TOOLKILN_SANDBOX_SUBUIDS=elsewhere)
    try:
        out = _refused(runner)
        assert "error: sandbox_refused:" in out
        for layer in ("namespaces", "uid"):
            assert f"its {layer} layer" in out and f"TOOLKILN_SANDBOX_ACCEPT={layer}" in out
        assert "/etc/subuid" in out and "usermod --add-subuids" in out
    finally:
        runner.stop()
        cgroup.remove()


def test_a_cgroup_the_runner_cannot_write_is_refused_unless_accepted(
    host: Host, tmp_path: Path
) -> None:
    """Not delegated: the directories are root's. Refused, naming the layer and how to give
    it; accepted, the runner serves and /healthz lists the layer as degraded."""
    cgroup = Delegated(host.user.pw_uid).make(owned=False)
    try:
        runner = RootlessRunner(host, "subuid", cgroup)
        try:
            out = _refused(runner)
            assert "its cgroup layer" in out and "TOOLKILN_SANDBOX_CGROUP" in out, out
            assert "TOOLKILN_SANDBOX_ACCEPT=cgroup" in out
        finally:
            runner.stop()
        runner = RootlessRunner(host, "subuid", cgroup, TOOLKILN_SANDBOX_ACCEPT="cgroup")
        try:
            runner.wait_listening()
            settings: dict[str, Any] = {"runners": runner.address, "runner_token": runner.token}
            with own_service(tmp_path, TOKEN, hosted=False, **settings) as (_, client, who):
                health = client.get("/healthz")
                assert health.status_code == 200, health.text
                parts = {d["part"] for d in health.json()["degraded"]}
                assert parts == {"runtime.python.layer.cgroup", "runtime.javascript.layer.cgroup"}
                auth = {"Authorization": f"Bearer {TOKEN}", "ws": who.workspace_id}
                served = (runner, client, auth)
                assert _run(served, PROBE)["status"] == "ok"
        finally:
            runner.stop()
    finally:
        cgroup.remove()
