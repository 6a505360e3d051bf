"""What the reliability tests run against: a PostgreSQL cluster of their own (so they may stop
it), real ``toolkiln serve`` processes, and waiting on conditions with a deadline."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.conftest import free_port

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
TOOLKILN = str(Path(sys.executable).with_name("toolkiln"))


def wait_for(what: str, check: Callable[[], T | None], deadline_s: float = 60.0) -> T:
    """Polls ``check`` until it returns something truthy; fails after the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    assert found, "PostgreSQL server binaries (initdb, pg_ctl) are required"
    return Path(found[-1]).parent


def wait_running(
    what: str,
    proc: subprocess.Popen[bytes],
    output: Callable[[], str],
    check: Callable[[], bool],
    deadline_s: float,
) -> None:
    """Polls ``check`` as ``wait_for`` does; fails at once, with ``output()``, should ``proc``
    (what it waits on) exit first."""

    def alive_and_done() -> bool:
        assert proc.poll() is None, f"{what} exited: {output()}"
        return check()

    wait_for(what, alive_and_done, deadline_s)


def wait_healthy(
    what: str,
    base: str,
    proc: subprocess.Popen[bytes],
    output: Callable[[], str],
    deadline_s: float = 90.0,
) -> None:
    """Waits until ``base``/healthz answers 200 (``proc`` serves it)."""

    def healthy() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_running(what, proc, output, healthy, deadline_s)


def wait_listening(
    what: str, proc: subprocess.Popen[bytes], output: Callable[[], str], deadline_s: float = 120
) -> None:
    """Waits until a runner's ``output()`` says it listens."""
    wait_running(what, proc, output, lambda: "runner listening on" in output(), deadline_s)


class PgCluster:
    """A throwaway PostgreSQL cluster on its own port and data directory.

    initdb refuses to run as root, so as root the cluster belongs to the ``postgres`` user
    (or ``nobody``); trust auth on 127.0.0.1 for the user ``root`` the tests connect as.
    """

    def __init__(self) -> None:
        self.bin = _pg_bin()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="toolkiln-pg-"))
        self.data = self.dir / "data"
        self.user: str | None = None
        if os.geteuid() == 0:
            self.user = "postgres" if _has_user("postgres") else "nobody"
            shutil.chown(self.dir, self.user)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "root", "--no-sync")
        conf = self.data / "postgresql.conf"
        with conf.open("a") as f:
            f.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.dir}'\nfsync = off\n"
                "max_connections = 200\nshared_buffers = 32MB\n"
            )
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [str(self.bin / tool), *args],
            check=True,
            capture_output=True,
            user=self.user,
            cwd=self.dir,
            timeout=120,
        )

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://root@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        log = str(self.dir / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Fast shutdown: open connections are cut, as in a real outage."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def processes(self) -> list[int]:
        """The postmaster's pid, then its children's (backends and auxiliary processes)."""
        main = int((self.data / "postmaster.pid").read_text().split()[0])
        children = Path(f"/proc/{main}/task/{main}/children").read_text().split()
        return [main, *map(int, children)]

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then every process it has: the server stops answering
        but its TCP connections stay open (the kernel still accepts and acknowledges)."""
        main, *_ = self.processes()
        os.kill(main, signal.SIGSTOP)  # stopped first, so it forks no more
        for pid in self.processes()[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in reversed(self.processes()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def destroy(self) -> None:
        subprocess.run(
            [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"],
            capture_output=True,
            user=self.user,
            cwd=self.dir,
            timeout=60,
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@contextmanager
def pg_cluster() -> Iterator[PgCluster]:
    cluster = PgCluster()
    try:
        yield cluster
    finally:
        cluster.destroy()


class Serve:
    """One real ``toolkiln serve`` process."""

    def __init__(self, data_dir: Path, env: dict[str, str], port: int | None = None) -> None:
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log = data_dir.parent / f"serve-{self.port}.log"
        full = {
            **os.environ,
            "TOOLKILN_DATA_DIR": str(data_dir),
            "TOOLKILN_SANDBOX_WARM": "2",
            "TOOLKILN_SANDBOX_JS_WORKERS": "1",
            **env,
        }
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [TOOLKILN, "serve", "--port", str(self.port)],
                env=full,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, deadline_s: float = 90.0) -> Serve:
        wait_healthy(f"serve on {self.port}", self.base, self.proc, self.output, deadline_s)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def terminate(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains ``text`` (sandbox templates and children
    carry the data directory in theirs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(
                (
                    line
                    for line in (entry / "status").read_text().splitlines()
                    if line.startswith("State:")
                ),
                "",
            )
        except OSError:
            continue
        if text in cmd and "zombie" not in state:
            found.append((int(entry.name), cmd))
    return found


def admin(token: str) -> dict[str, Any]:
    return {"Authorization": f"Bearer {token}"}


def listed_then_changed(
    base: str, token: str, agent_id: str, change: Callable[[], None], deadline_s: float = 30.0
) -> tuple[list[str], list[str]]:
    """Opens an MCP session on ``base``, lists the agent's tools, runs ``change`` and waits
    for ``notifications/tools/list_changed``; returns the names before and after."""
    import anyio
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    got = anyio.Event()

    async def on_message(message: object) -> None:
        if type(getattr(message, "root", message)).__name__ == "ToolListChangedNotification":
            got.set()

    async def run() -> tuple[list[str], list[str]]:
        async with httpx2.AsyncClient(headers=admin(token), timeout=30) as http:
            url = f"{base}/mcp/agents/{agent_id}"
            async with streamable_http_client(url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write, message_handler=on_message) as session:
                    await session.initialize()
                    before = [t.name for t in (await session.list_tools()).tools]
                    await anyio.to_thread.run_sync(change)
                    with anyio.fail_after(deadline_s):
                        await got.wait()
                    after = [t.name for t in (await session.list_tools()).tools]
                    return before, after

    return anyio.run(run)


@contextmanager
def fresh_postgres_database(base_url: str) -> Iterator[str]:
    """A new, empty database on the test server (one nobody has migrated yet)."""
    import secrets

    import psycopg

    base = base_url.replace("postgresql+psycopg://", "postgresql://")
    name = f"toolkiln_fresh_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base_url.rpartition('/')[0]}/{name}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def nginx_binary() -> str:
    """Debian's nginx: installed, or unpacked into the venv by ``make test``."""
    found = shutil.which("nginx") or str(ROOT / ".venv" / "nginx" / "usr" / "sbin" / "nginx")
    assert os.access(found, os.X_OK), "nginx is missing: `make test` installs it (make nginx)"
    return found


class Nginx:
    """nginx in front of the replicas, with the site configuration of docs/deployment.md."""

    def __init__(self, site: str, workdir: Path) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        temp = "\n".join(
            f"    {kind}_temp_path {self.dir / kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        conf = self.dir / "nginx.conf"
        conf.write_text(
            f"daemon off;\npid {self.dir / 'nginx.pid'};\nerror_log {self.dir / 'error.log'};\n"
            "events { worker_connections 512; }\n"
            "http {\n    access_log off;\n"
            "    add_header X-Upstream $upstream_addr always;\n"
            f"{temp}\n{site}\n}}\n"
        )
        binary = nginx_binary()
        check = subprocess.run(
            [binary, "-t", "-p", str(self.dir), "-c", str(conf), "-e", str(self.dir / "error.log")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stderr
        self.proc = subprocess.Popen(
            [binary, "-p", str(self.dir), "-c", str(conf), "-e", str(self.dir / "error.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
