"""The image `make image` builds: what is in it, and the service it runs serving real calls
through a published port, started with the `podman run` command docs/deployment.md shows (the
image's unprivileged user, no capability but the bounding set its set-uid newuidmap needs, a
read-only root, lent cgroup directories), with every isolation layer of the sandbox on. From
the host's /proc: no process of the container holds uid 0 or, outside the runner's own user
namespace, any capability; the processes that run tool code hold the image's subuids."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.podman import (
    CAPS,
    HOST_LIMITS,
    IMAGE_UID,
    PODMAN,
    SUBUIDS,
    Delegated,
    HostView,
    build_image,
    cap_names,
    descendants,
    documented_run,
    logs,
    podman,
    substitute,
)
from tests.reliability.harness import free_port, wait_for
from toolkiln.sandbox.packages import JsPackageStore, PackageStore
from toolkiln.sandbox.userns import FIRST_NAMESPACE_ID  # per-call uids in a user namespace

TOKEN = "tk_image-admin-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def image() -> str:
    return build_image()


@pytest.fixture(scope="module")
def rootfs(image: str) -> Iterator[Path]:
    """The final image's files, mounted read-only on the host (nothing runs)."""
    path = Path(podman("image", "mount", image).strip())
    yield path
    podman("image", "unmount", image, check=False)


@pytest.fixture(scope="module")
def service(image: str) -> Iterator[tuple[str, str]]:
    """The documented container, on a free port, with its own volume and cgroup directories."""
    tag = secrets.token_hex(4)
    name, volume, cgroups = f"toolkiln-test-{tag}", f"toolkiln-test-{tag}", Delegated(f"tk-{tag}")
    port = free_port()
    args = substitute(
        documented_run(),
        {
            "--name=toolkiln": f"--name={name}",
            "toolkiln-data:": f"{volume}:",
            "/toolkiln:/sys/fs/cgroup": f"/{cgroups.name}:/sys/fs/cgroup",
            "127.0.0.1:8080:8080": f"127.0.0.1:{port}:8080",
            "localhost/toolkiln:latest": image,
        },
    )
    cgroups.make()
    env = {**os.environ, "TOOLKILN_BOOTSTRAP_TOKEN": TOKEN}
    run = subprocess.run(
        [*PODMAN, args[0], *HOST_LIMITS, *args[1:]],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    try:
        assert run.returncode == 0, run.stderr
        base = f"http://127.0.0.1:{port}"
        wait_for("the container's /healthz", lambda: _healthy(base, name), deadline_s=120)
        yield base, name
    finally:
        podman("stop", "--time", "40", name, check=False, timeout=60)
        podman("rm", "--force", name, check=False)
        podman("volume", "rm", "--force", volume, check=False)
        cgroups.remove()


def _healthy(base: str, name: str) -> bool:
    state = podman("inspect", "--format", "{{.State.Status}}", name, check=False).strip()
    assert state in ("created", "running"), logs(name)
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_final_image_has_no_build_tools_or_package_caches(image: str, rootfs: Path) -> None:
    for tool in ("gcc", "cc", "cpp", "node", "npm", "make"):
        assert not (rootfs / "usr/bin" / tool).exists(), tool
    assert not list((rootfs / "usr/include").glob("python3*")), "Python headers"
    assert not any((rootfs / "var/lib/apt/lists").glob("*_Packages*")), "apt lists"
    assert not any((rootfs / "var/cache/apt").glob("*.bin")), "apt caches"
    assert not (rootfs / "root/.cache").exists() and not (rootfs / "root/.npm").exists()
    site = rootfs / "opt/toolkiln/lib/python3.11/site-packages"
    assert list((site / "toolkiln/sandbox/jail").glob("_spawn.cpython-311-*.so")), "C module"
    assert (site / "toolkiln/web/static/app.js").stat().st_size > 100_000, "the view's bundle"
    assert not (rootfs / "src").exists() and not (rootfs / "opt/toolkiln/src").exists()
    packages = rootfs / "var/lib/toolkiln/packages"
    # The curated packages, as the service's own stores find them (read-only: no __init__,
    # which makes the directory): runners need no egress for them.
    for store, root in ((PackageStore, "python"), (JsPackageStore, "javascript")):
        seen = store.__new__(store)
        seen.root = packages / root
        assert all(seen.installed(spec) for spec in seen.specs(store.listed)), root
    config = podman("image", "inspect", "--format", "{{.Config.User}}", image).strip()
    assert config == "10001:10001"
    passwd = (rootfs / "etc/passwd").read_text()
    assert "toolkiln:x:10001:10001:" in passwd
    # Its runner's user namespace: the user's ranges, and newuidmap to map them.
    for ids in ("etc/subuid", "etc/subgid"):
        assert (rootfs / ids).read_text() == f"toolkiln:{SUBUIDS.start}:{len(SUBUIDS)}\n"
    assert ((rootfs / "usr/bin/newuidmap").stat().st_mode & 0o4000) != 0  # set-uid


def _call(base: str, method: str, path: str, **kw: Any) -> Any:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    answer = httpx.request(method, f"{base}{path}", headers=headers, timeout=60, **kw)
    assert answer.status_code < 300, (path, answer.status_code, answer.text)
    return answer.json()["data"]


def _workspace(base: str) -> str:
    return str(_call(base, "GET", "/v1/workspaces")[0]["id"])


PY_TOOL = (
    "def main(**p):\n    import os\n    return {'message': 'py ' + p['x'], 'rawData': os.getuid()}"
)
JS_TOOL = "function main(p) { return {message: 'js ' + p.x}; }"


@pytest.mark.parametrize(
    ("language", "code", "prefix"), [("python", PY_TOOL, "py "), ("javascript", JS_TOOL, "js ")]
)
def test_a_tool_is_created_and_invoked_through_the_published_port(
    service: tuple[str, str], language: str, code: str, prefix: str
) -> None:
    base, _ = service
    tool = _call(
        base,
        "POST",
        "/v1/custom-tools",
        json={
            "workspace_id": _workspace(base),
            "name": f"image-{language}",
            "language": language,
            "code": code,
            "parameters": {"x": {"type": "string", "required": True}},
        },
    )
    for n in range(3):  # a fresh jailed process (or a JavaScript isolate) each time
        result = _call(
            base, "POST", f"/v1/custom-tools/{tool['id']}/invoke", json={"input": {"x": str(n)}}
        )
        assert result["status"] == "ok", result
        assert result["message"] == f"{prefix}{n}"
        if language == "python":
            assert result["raw_data"] >= FIRST_NAMESPACE_ID  # the per-call uid in its namespace


def test_curated_packages_come_with_the_image(service: tuple[str, str]) -> None:
    """Imported from the image's copies: the service installs nothing (it logs each install)."""
    base, name = service
    py = "import yaml\ndef main(**p):\n    return {'message': yaml.safe_dump({'a': 1}).strip()}"
    js = "const _ = require('lodash');\nfunction main(p) { return {message: _.join(['a', 1], ': ')}; }"
    for language, code in (("python", py), ("javascript", js)):
        result = _run(base, language, code)
        assert result["status"] == "ok", result["error"]
        assert result["message"] == "a: 1"
    assert "installing" not in logs(name)


def _run(base: str, language: str, code: str) -> dict[str, Any]:
    body = {"language": language, "code": code, "input": {}}
    return dict(_call(base, "POST", "/v1/run-code", json=body))


PROBE = """
import os

def main(**p):
    seen = []
    try:
        open('/probe', 'w')
    except OSError as e:
        seen.append('root:' + str(e.errno))
    seen.append('proc:' + str(os.path.exists('/proc/self')))
    seen.append('etc:' + ','.join(sorted(os.listdir('/etc'))))
    return {'message': ' '.join(seen)}
"""


# Pages touched one by one, so the memory is charged, not only reserved.
HOG = """
def main(**p):
    held = []
    for _ in range(12):
        block = bytearray(32 << 20)
        block[::4096] = b"x" * len(block[::4096])
        held.append(block)
    return {"message": "held"}
"""


def test_the_sandbox_layers_hold_in_the_container(service: tuple[str, str]) -> None:
    base, _ = service
    seen = _run(base, "python", PROBE)
    assert seen["status"] == "ok", seen["error"]
    assert seen["message"] == "root:30 proc:False etc:", seen  # EROFS, no /proc, empty /etc
    socket = _run(
        base, "python", "import socket\ndef main(**p):\n    socket.socket()\n    return {}"
    )
    assert socket["error"]["code"] == "sandbox_violation", socket["error"]  # seccomp: SIGSYS
    hog = _run(base, "python", HOG)
    assert hog["error"]["code"] == "memory_limit", hog["error"]  # the cgroup's 256 MB
    for language, code in (("python", PY_TOOL), ("javascript", JS_TOOL)):
        again = _run(base, language, code.replace("p['x']", "'on'").replace("p.x", "'on'"))
        assert again["status"] == "ok", again["error"]


def _spinning(name: str) -> list[HostView]:
    """Sandboxed processes of the container that have used a second of CPU or more (a warm
    process uses a few ticks; one that ran past its deadline and lives on, far more)."""
    init = int(podman("inspect", "--format", "{{.State.Pid}}", name).strip())
    second = os.sysconf("SC_CLK_TCK")
    return [p for p in descendants(init) if p.uids[0] in SUBUIDS and p.cpu_ticks >= second]


def test_a_call_past_its_deadline_is_killed_in_the_container(service: tuple[str, str]) -> None:
    """The kill crosses uids (the runner's to the call's): it holds CAP_KILL in its user
    namespace only; without it the process would spin on until its CPU rlimit (31 s)."""
    base, name = service
    for language, spin in (
        ("python", "def main(**p):\n    while True:\n        pass\n    return {}"),
        ("javascript", "function main(p) { while (true) {} return {}; }"),
    ):
        stuck = _run(base, language, spin)
        assert stuck["error"]["code"] == "timeout", stuck["error"]
    wait_for("no sandboxed process spinning on", lambda: not _spinning(name), deadline_s=15)


def _host_userns(p: HostView) -> bool:
    """Whether ``p`` is in the host's user namespace (this test's, as the host's root)."""
    return os.stat(f"/proc/{p.pid}/ns/user").st_ino == os.stat("/proc/self/ns/user").st_ino


def test_from_the_host_no_process_of_the_container_holds_root_or_a_capability(
    service: tuple[str, str],
) -> None:
    """The container runs as the image's user: tini, the API and its runner hold host uid
    10001 and no capability; the runner's user namespace (newuidmap, set-uid, is what the
    granted capabilities are for) gives the jail its capabilities over its own ids only, and
    each call one of the image's subuids."""
    base, name = service
    _run(base, "python", PY_TOOL.replace("p['x']", "'warm'"))  # warm processes are there
    init = int(podman("inspect", "--format", "{{.State.Pid}}", name).strip())
    procs = list(descendants(init))
    print("\nhost uids of the container's processes:")
    for p in procs:
        userns = "host" if _host_userns(p) else "own"
        caps = sorted(cap_names(p.cap_eff))
        print(f"  {p.pid:>7} uid {p.uids} caps {caps} userns {userns} {p.name}")
    for p in procs:
        assert 0 not in p.uids, p
        assert p.uids[0] == IMAGE_UID or p.uids[0] in SUBUIDS, p
        if _host_userns(p):  # (a user namespace starts with a full bounding set of its own)
            assert cap_names(p.cap_bnd) <= set(CAPS), p  # nothing the command did not grant
            assert p.cap_eff == 0 and p.uids == (IMAGE_UID,) * 4, p
    outside = {p.name for p in procs if _host_userns(p)}
    assert {"tini", "toolkiln"} <= outside
    tools = [p for p in procs if p.uids[0] in SUBUIDS]
    assert tools, "no warm process at a sandbox uid"
    for p in tools:
        assert p.cap_eff == 0 and len(set(p.uids)) == 1, p


def test_the_view_is_served_from_the_image(service: tuple[str, str]) -> None:
    base, _ = service
    page = httpx.get(f"{base}/ui", timeout=10)
    assert page.status_code == 200 and "app.js" in page.text
    bundle = httpx.get(f"{base}/ui/assets/app.js", timeout=10)
    assert bundle.status_code == 200 and len(bundle.content) > 100_000
