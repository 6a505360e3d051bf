"""Runners with no host root, started as an operator would, in both shapes (docs/security.md,
"No host root"):

- ``subuid``: an unprivileged host user (``toolkiln-rl``, made here if missing, with a range
  in /etc/subuid and /etc/subgid) that makes its own user namespace with newuidmap;
- ``namespace-root``: uid 0 of a user namespace mapped to an unprivileged host range, as
  rootless Podman or a Kubernetes pod with ``hostUsers: false`` gives (``namespaced.py``).

The project's interpreter lives under /root (mode 700), out of reach of those users, so
they run Debian's ``/usr/bin/python3`` (the same 3.11) with a venv that reads this
checkout's packages. Each runner gets a cgroup of its own, delegated: a directory in each
cgroup v1 hierarchy owned by the runner's host uid.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port
from tests.reliability.harness import wait_healthy, wait_listening
from toolkiln.sandbox import cgroups

USER = "toolkiln-rl"
RANGE = 65536
SYSTEM_PYTHON = Path("/usr/bin/python3")
CONTROLLERS = cgroups.V1_DELEGATED
SHAPES = ("subuid", "namespace-root")


def why_not() -> str | None:
    """Why this host cannot run the rootless shapes' tests (a skip's reason), or None."""
    if os.geteuid() != 0:
        return "making the test user, its subuid range and delegated cgroups needs root"
    if not (Path("/sys/fs/cgroup/memory/cgroup.procs").exists()):
        return "the tests delegate cgroup v1 directories (memory, pids, cpu)"
    if shutil.which("newuidmap") is None or shutil.which("setpriv") is None:
        return "Debian's uidmap (newuidmap) and util-linux's setpriv are needed"
    probe = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.stdout.strip() != str(sys.version_info[:2]):
        return f"{SYSTEM_PYTHON} is not Python {sys.version_info[:2]} (it reads this venv)"
    return None


def _ranges(path: str) -> list[tuple[str, int, int]]:
    found = []
    for line in Path(path).read_text().splitlines() if Path(path).exists() else []:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            found.append((parts[0], int(parts[1]), int(parts[2])))
    return found


def _free_start() -> int:
    """A start above every range of /etc/subuid and /etc/subgid, and above what this
    module's namespaces use (two ranges past it)."""
    ends = [s + n for f in ("/etc/subuid", "/etc/subgid") for _, s, n in _ranges(f)]
    start = max([3_000_000, *ends])
    return -(-start // RANGE) * RANGE


def test_user() -> tuple[pwd.struct_passwd, int]:
    """``toolkiln-rl`` and the start of its subuid and subgid range (both the same)."""
    try:
        user = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER],
            check=True,
        )
        user = pwd.getpwnam(USER)
    mine = {
        f: [(s, n) for who, s, n in _ranges(f) if who in (USER, str(user.pw_uid)) and n >= RANGE]
        for f in ("/etc/subuid", "/etc/subgid")
    }
    both = set(mine["/etc/subuid"]) & set(mine["/etc/subgid"])
    if both:
        return user, min(both)[0]
    start = _free_start()
    span = f"{start}-{start + RANGE - 1}"
    subprocess.run(["usermod", "--add-subuids", span, "--add-subgids", span, USER], check=True)
    return user, start


def system_venv(base: Path) -> Path:
    """Debian's python3 in a venv whose site reads this checkout's (editable) packages."""
    venv = base / "venv"
    subprocess.run([str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = next((venv / "lib").glob("python3*")) / "site-packages"
    (site / "toolkiln-checkout.pth").write_text(
        f"import site; site.addsitedir({str(ours / 'site-packages')!r})\n"
    )
    command = venv / "bin" / "toolkiln"  # as pip would make it (tests run `toolkiln`)
    command.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom toolkiln.__main__ import main\n"
        "sys.exit(main())\n"
    )
    command.chmod(0o755)
    return venv / "bin" / "python"


@dataclass
class Delegated:
    """A cgroup v1 directory in each hierarchy, owned by ``uid`` (what an operator delegates
    to a runner's user), removed deepest first."""

    uid: int
    name: str = field(default_factory=lambda: f"toolkiln-rl-{secrets.token_hex(4)}")

    def paths(self) -> list[Path]:
        return [Path("/sys/fs/cgroup") / c / self.name for c in CONTROLLERS]

    def make(self, owned: bool = True) -> Delegated:
        if owned:  # as the API delegates to its embedded runner (cgroups.delegate)
            cgroups.delegate(self.name, self.uid)
            return self
        for path in self.paths():
            path.mkdir(exist_ok=True)
        return self

    def remove(self) -> None:
        cgroups.undelegate(self.paths())


@dataclass
class Host:
    """What both shapes start from: the test user, its range, the interpreter they run."""

    user: pwd.struct_passwd
    subuid: int  # the start of the user's range (RANGE ids)
    outer: int  # the host range a namespace-root runner's namespace maps to: no one's
    python: Path
    base: Path  # a directory every uid here can read

    def host_uid(self, shape: str) -> int:
        """The host uid of the runner (and its templates) in ``shape``."""
        return self.user.pw_uid if shape == "subuid" else self.outer

    def tool_uids(self, shape: str) -> range:
        """Host uids a tool process may hold in ``shape``: the mapped ids but the runner's."""
        if shape == "subuid":
            return range(self.subuid, self.subuid + RANGE)
        return range(self.outer + 1, self.outer + RANGE)


def make_host() -> Host:
    user, subuid = test_user()
    base = Path(tempfile.mkdtemp(prefix="toolkiln-rootless-", dir="/var/tmp"))
    base.chmod(0o755)
    return Host(user, subuid, _free_start(), system_venv(base), base)


class RootlessRunner:
    """``toolkiln runner --listen unix:...`` in one of the shapes, with its own data
    directory and delegated cgroup; with ``serve`` (a port), ``toolkiln serve`` instead, the
    API with its embedded runner."""

    def __init__(
        self,
        host: Host,
        shape: str,
        cgroup: Delegated | None,
        serve: int | None = None,
        **env: str,
    ) -> None:
        self.host, self.shape = host, shape
        uid = host.host_uid(shape)
        self.home = Path(tempfile.mkdtemp(prefix=f"{shape}-", dir=host.base))
        self.home.chmod(0o755)
        os.chown(self.home, uid, uid)
        self.token = secrets.token_urlsafe(24)
        self.address = f"unix:{self.home}/runner.sock"
        self.log = host.base / f"{self.home.name}.log"
        full = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "TOOLKILN_DATA_DIR": str(self.home / "data"),
            "TOOLKILN_SANDBOX_WARM": "2",
            "TOOLKILN_SANDBOX_JS_WORKERS": "1",
            **({"TOOLKILN_SANDBOX_CGROUP": cgroup.name} if cgroup is not None else {}),
            **env,
        }
        command = [str(host.python), "-m", "toolkiln", "runner", "--listen", self.address]
        command.append("--token-stdin")
        if serve is not None:
            command = [str(host.python), "-m", "toolkiln", "serve", "--port", str(serve)]
        if shape == "subuid":
            name = host.user.pw_name
            argv = ["setpriv", "--reuid", name, "--regid", name, "--clear-groups", *command]
        else:
            here = Path(__file__).with_name("namespaced.py")
            argv = [str(host.python), str(here), str(uid), str(RANGE), "--", *command]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                env=full,
                cwd=self.home,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        assert self.proc.stdin is not None
        self.proc.stdin.write(self.token.encode() + b"\n")
        self.proc.stdin.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def wait_listening(self) -> RootlessRunner:
        wait_listening(f"the {self.shape} runner", self.proc, self.output)
        return self

    def wait_exit(self, timeout_s: float = 120) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        stop(self.proc)
        shutil.rmtree(self.home, ignore_errors=True)


@contextmanager
def unprivileged_api(
    host: Host, token: str, deadline_s: float
) -> Iterator[tuple[RootlessRunner, str]]:
    """``toolkiln serve`` as the test user (the ``subuid`` shape), given nothing but a
    delegated cgroup and ``token`` to bootstrap: the process and its base URL once /healthz
    answers; stopped, and its cgroup removed, when the block ends."""
    cgroup = Delegated(host.user.pw_uid).make()
    port = free_port()
    api = RootlessRunner(host, "subuid", cgroup, serve=port, TOOLKILN_BOOTSTRAP_TOKEN=token)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy("the unprivileged API", base, api.proc, api.output, deadline_s)
        yield api, base
    finally:
        api.stop()
        cgroup.remove()


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a runner drains its calls), then its whole session killed after 60 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(30)
