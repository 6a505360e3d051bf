"""The embedded runner is the API's "own unprivileged child" (CONTRACT 12): of an API that is
the host's root it is root of a user namespace mapped to an unprivileged host range, so code
that escapes a jail lands at a host uid that opens nothing of the API's (its database, its
data directory's keys, its /proc environment and memory); and every API process is not
dumpable, so a runner of the same uid (an unprivileged API's) cannot read it either
(docs/security.md, "Runners: what a compromise reaches"; docs/decisions/221-*.md)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.calls import created, first_workspace, invoked, tool_body
from tests.deploy.podman import host_view
from tests.reliability.harness import Serve, admin, wait_for
from tests.runners.harness import cmdline, descendants
from tests.runners.rootless import make_host, unprivileged_api, why_not

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nsenter") is None or shutil.which("setpriv") is None,
    reason="the API as the host's root, and util-linux's nsenter and setpriv to probe",
)
TOKEN = "tk_embedded-unpriv-" + secrets.token_hex(6)
LLM_KEY = "sk-embedded-" + secrets.token_hex(12)
UID = "import os\ndef main(**p):\n    return {'message': 'ran', 'rawData': [os.getuid()]}\n"
INNER = "def main(**p):\n    return {'message': 'inner ' + str(p.get('n'))}\n"
OUTER = "def handle(input, ctx):\n    return ctx.tools['inner']({'n': 7})\n"


def _runner_of(api: Serve) -> int | None:
    found = [p for p in descendants(api.proc.pid) if " -m toolkiln runner " in cmdline(p)]
    return found[0] if len(found) == 1 else None


def _mapping(pid: int) -> tuple[int, int, int]:
    """The first line of ``pid``'s uid_map: (inside, outside, count)."""
    inside, outside, count = Path(f"/proc/{pid}/uid_map").read_text().split("\n")[0].split()
    return int(inside), int(outside), int(count)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Serve, Path]]:
    # Under a directory every uid may search (pytest's own is root's alone): what keeps the
    # runner out is the data directory's mode, not the way to it.
    base = Path(tempfile.mkdtemp(prefix="toolkiln-embedded-", dir="/var/tmp"))
    base.chmod(0o755)
    env = {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN, "TOOLKILN_LLM_API_KEY": LLM_KEY}
    api = Serve(base / "data", env).wait_ready(180)
    try:
        yield api, base / "data"
    finally:
        api.terminate(60)
        shutil.rmtree(base, ignore_errors=True)


def _unprivileged_runner(api: Serve) -> tuple[int, int]:
    """The runner's pid and host uid, once its whole tree holds none but ids of its range."""
    runner = wait_for("the runner", lambda: _runner_of(api), 60)
    inside, outer, count = _mapping(runner)
    assert (inside, count) != (0, 4294967295), "the runner is in the host's user namespace"
    tree = [v for v in (host_view(p) for p in [runner, *descendants(runner)]) if v]
    assert len(tree) > 1, "no template under the runner"
    for view in tree:
        assert 0 not in view.uids, view
        assert all(outer <= u < outer + count for u in view.uids), (view, outer, count)
    assert tree[0].uids == (outer,) * 4
    return runner, outer


def test_every_kind_of_call_runs_under_a_runner_without_host_root(
    served: tuple[Serve, Path],
) -> None:
    api, _ = served
    with httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60) as http:
        got = http.post("/v1/run-code", json={"language": "python", "code": UID}).json()["data"]
        assert got["status"] == "ok", got
        assert 20_000 <= got["raw_data"][0] < 65_534  # a per-call id of the namespace
        _unprivileged_runner(api)
        js = {"language": "javascript", "code": "function main(p) { return {message: 'js'} }"}
        assert http.post("/v1/run-code", json=js).json()["data"]["message"] == "js"
        ws = first_workspace(http)
        # Created (201): each one's code check ran on the runner.
        inner, outer = created(http, ws, "inner", INNER), created(http, ws, "outer", OUTER)
        done = invoked(http, inner, {"n": 1})
        assert done.json()["data"]["message"] == "inner 1", done.text
        done = invoked(http, outer, {})
        data = done.json()["data"]
        assert data["message"] == "inner 7" and data["ctx_calls"] == 1, done.text
        r = http.post("/v1/custom-tools", json=tool_body(ws, "bad", "def main(:\n"))
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_tool", r.text


def test_the_runner_opens_nothing_of_the_apis(served: tuple[Serve, Path]) -> None:
    """Probed with exactly the runner's powers: its user and mount namespaces, as their root
    (nsenter), and as its host uid alone (setpriv)."""
    api, data = served
    with httpx.Client(base_url=api.base, headers=admin(TOKEN), timeout=60) as http:
        assert (
            http.post("/v1/run-code", json={"language": "python", "code": UID}).status_code == 200
        )
    runner, outer = _unprivileged_runner(api)
    assert (data / "toolkiln.db").exists() and (data / "secrets.key").exists()
    targets = [
        data / "toolkiln.db",
        data / "secrets.key",
        Path(f"/proc/{api.proc.pid}/environ"),
        Path(f"/proc/{api.proc.pid}/mem"),
    ]
    as_runner = ["nsenter", "-t", str(runner), "-U", "-m", "--"]
    as_uid = ["setpriv", f"--reuid={outer}", f"--regid={outer}", "--clear-groups"]
    for prefix in (as_runner, as_uid):
        for target in targets:
            probe = subprocess.run([*prefix, "cat", str(target)], capture_output=True, check=False)
            assert probe.returncode != 0, f"{prefix[0]} read {target}"
            assert b"Permission denied" in probe.stderr, (target, probe.stderr)
        listing = subprocess.run([*prefix, "ls", str(data)], capture_output=True, check=False)
        assert listing.returncode != 0, f"{prefix[0]} listed the data directory"


def test_two_root_apis_runners_share_no_host_id(served: tuple[Serve, Path], tmp_path: Path) -> None:
    """Each root API holds its runner's range while it lives (sandbox/userns.py,
    ``embedded_range``): a second one on the host takes another, and one told the first's
    range by TOOLKILN_SANDBOX_SUBUIDS is refused at start, naming it."""
    api, _ = served
    _, first, count = _mapping(wait_for("the runner", lambda: _runner_of(api), 60))
    env = {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN}
    other = Serve(tmp_path / "other", env).wait_ready(180)
    try:
        _, second, _ = _mapping(_unprivileged_runner(other)[0])
        assert second >= first + count or second + count <= first, (first, second)
    finally:
        other.terminate(60)
    same = Serve(tmp_path / "same", {**env, "TOOLKILN_SANDBOX_SUBUIDS": f"{first}:{count}"})
    try:
        assert same.proc.wait(120) != 0
    finally:
        same.terminate(60)
    assert "TOOLKILN_SANDBOX_SUBUIDS" in same.log.read_text(errors="replace")


def test_an_unprivileged_apis_runner_cannot_read_it() -> None:
    """An API of an unprivileged user and its embedded runner's top process share a host uid:
    the API is not dumpable, so that uid opens neither its environment nor its memory."""
    if (why := why_not()) is not None:
        pytest.skip(why)
    host = make_host()
    try:
        with unprivileged_api(host, TOKEN, 180) as (api, _):
            (view,) = [v for v in [host_view(api.proc.pid)] if v]
            assert view.uids == (host.user.pw_uid,) * 4
            name = host.user.pw_name
            as_api = ["setpriv", "--reuid", name, "--regid", name, "--clear-groups"]
            for what in ("environ", "mem"):
                target = f"/proc/{api.proc.pid}/{what}"
                probe = subprocess.run(
                    [*as_api, "cat", target], capture_output=True, text=True, check=False
                )
                assert probe.returncode != 0 and "Permission denied" in probe.stderr, probe.stderr
    finally:
        shutil.rmtree(host.base, ignore_errors=True)


def test_a_runner_that_cannot_leave_host_root_is_refused_unless_accepted(tmp_path: Path) -> None:
    """A range the runner cannot be mapped to (here: one holding the host's uid 0) stops the
    start, naming the ``runner_uid`` layer; accepted, the runner runs as the host's root and
    /healthz lists the layer (ready: the operator chose it)."""
    env = {"TOOLKILN_BOOTSTRAP_TOKEN": TOKEN, "TOOLKILN_SANDBOX_SUBUIDS": "0:65536"}
    refused = Serve(tmp_path / "refused" / "data", env)
    try:
        assert refused.proc.wait(180) != 0
    finally:
        refused.kill()
    said = refused.output()
    assert "runner_uid" in said and "TOOLKILN_SANDBOX_ACCEPT=runner_uid" in said, said
    accepted = Serve(
        tmp_path / "accepted" / "data", env | {"TOOLKILN_SANDBOX_ACCEPT": "runner_uid"}
    )
    try:
        accepted.wait_ready(180)
        health = httpx.get(f"{accepted.base}/healthz", timeout=10).json()
        parts = [d["part"] for d in health["degraded"]]
        assert "runtime.python.layer.runner_uid" in parts, health
        runner = wait_for("the runner", lambda: _runner_of(accepted), 60)
        assert _mapping(runner) == (0, 0, 4294967295)  # the host's root, as accepted
    finally:
        accepted.terminate(60)
