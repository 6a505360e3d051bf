"""The embedded runner: with no ``TOOLKILN_RUNNERS``, ``toolkiln serve`` starts one runner of its
own, as a child process on a Unix socket in the data directory.

It is a fresh program (``python -m toolkiln runner``), not a fork of the API: a fork would
carry the API's memory, credentials included. Its environment is built from nothing: the
sandbox settings, and the few variables package installers need (``KEPT``). Its credential,
made for this start only, reaches it on its standard input, never in its environment.

Of an API that is the host's root it is not the host's root (``OwnIds``): it starts as root
of a user namespace mapped to an unprivileged host range (``toolkiln runner --map``), in a
directory, cgroup and socket of that range's first id, and the data directory is closed to
others (docs/security.md, "Runners: what a compromise reaches";
tests/security/test_embedded_unprivileged.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from toolkiln import telemetry
from toolkiln.config import SandboxSettings
from toolkiln.domain.errors import ServiceUnavailable
from toolkiln.runners.client import RunnerClient
from toolkiln.sandbox import cgroups, userns

log = logging.getLogger("toolkiln.runners")
START_S = 120.0  # its sandboxes start (packages of a first start may be fetched later)
STOP_S = 45.0  # a drain: calls in flight end within their own timeout (30 s at most)
RESTART_FIRST_S, RESTART_MAX_S = 0.2, 10.0
# The delegated cgroup of a root API's runner: this prefix, then its owner (cgroups.owned;
# what an API killed before its stop left is swept at the next start: cgroups.sweep).
EMBEDDED_CGROUP = "toolkiln-embedded-"
# Host variables a runner's package installers (pip, npm) may need (where to find them,
# the host's CA bundle, a proxy); nothing else of the API's environment reaches it.
KEPT = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
)
KEPT_PREFIXES = ("PIP_", "NPM_CONFIG_", "npm_config_")


def runner_env(settings: SandboxSettings) -> dict[str, str]:
    """Besides KEPT: the traces' OTEL_* configuration, less the exporter's credentials."""
    env = {k: v for k, v in os.environ.items() if k in KEPT or k.startswith(KEPT_PREFIXES)}
    return {**env, **telemetry.runner_env(), **settings.sandbox_env()}


class OwnIds:
    """What the embedded runner of a host-root API is given: a range of host ids
    (``userns.embedded_range``), a directory of that range's own beside the data directory
    (``<data>-runner/<first id>``: its packages, its socket; two root processes on one data
    directory hold two ranges), a cgroup delegated to it; and the data directory loses the
    permissions of others, which the runner's uid is."""

    def __init__(self, settings: SandboxSettings) -> None:
        try:
            self.range = userns.embedded_range(settings.sandbox_subuids)
        except userns.RangeHeld as exc:
            raise ServiceUnavailable(str(exc), code="sandbox_unavailable") from None
        self.outer, self.count = self.range.outer, self.range.count
        data = settings.data_dir.resolve()
        os.chmod(data, os.stat(data).st_mode & 0o770)
        self.home = _homes(data.with_name(data.name + "-runner")) / str(self.outer)
        self.home.mkdir(mode=0o700, exist_ok=True)
        if os.lstat(self.home).st_uid != self.outer:  # a range changed since: its files too
            for below, dirs, files in os.walk(self.home):
                for name in [*dirs, *files]:
                    path = os.path.join(below, name)
                    os.chown(path, self.outer, self.outer, follow_symlinks=False)
        os.chown(self.home, self.outer, self.outer, follow_symlinks=False)
        os.chmod(self.home, 0o700)
        parent = settings.sandbox_cgroup
        cgroups.sweep(parent, EMBEDDED_CGROUP)
        self.cgroup = f"{parent}/{cgroups.owned(EMBEDDED_CGROUP)}".strip("/")
        self.cgroups = cgroups.delegate(self.cgroup, self.outer)

    def env(self) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "TOOLKILN_DATA_DIR": str(self.home),
            "TOOLKILN_SANDBOX_CGROUP": self.cgroup,
        }

    def close(self) -> None:
        cgroups.undelegate(self.cgroups)
        self.range.close()


def _homes(path: Path) -> Path:
    """``<data>-runner``: the host root's, others may only pass through it to the directory
    of their range. One that a range owns (the layout of one range) becomes that range's."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        path.mkdir(mode=0o711)
        return path
    if info.st_uid != 0:
        moving = path.with_name(f"{path.name}.{os.getpid()}")
        os.rename(path, moving)
        path.mkdir(mode=0o711)
        os.rename(moving, path / str(info.st_uid))
    os.chown(path, 0, 0, follow_symlinks=False)
    os.chmod(path, 0o711)  # noqa: S103 (search only: into the directory of their range)
    return path


class LocalRunner:
    """One runner process of this API's own; ``address`` once it answers."""

    def __init__(self, settings: SandboxSettings) -> None:
        data = settings.data_dir.resolve()
        self._argv = [sys.executable, "-m", "toolkiln", "runner"]
        self._env = runner_env(settings)
        self._cwd = data
        self.ids: OwnIds | None = None
        if userns.shape() == userns.HOST_ROOT:
            self.ids = OwnIds(settings)
            self._env |= self.ids.env()
            self._cwd = self.ids.home
        # A socket of this process's own: other processes on the same data directory (a
        # second `serve`, `toolkiln mcp`) start runners of their own. Under /tmp when the
        # data directory's path is too long for a Unix socket (108 bytes).
        path = self._cwd / f"runner-{secrets.token_hex(6)}.sock"
        if len(str(path)) > 100:
            path = Path(tempfile.mkdtemp(prefix="toolkiln-runner-")) / "runner.sock"
            if self.ids is not None:
                os.chown(path.parent, self.ids.outer, self.ids.outer)
        self.path = path
        self.address = f"unix:{path}"
        self.token = secrets.token_urlsafe(32)
        self._argv += ["--listen", self.address]
        if self.ids is not None:
            self._argv += ["--map", f"{self.ids.outer}:{self.ids.count}"]
        self._stopping = threading.Event()
        self.restarts = 0
        try:
            self.proc = self._spawn()
        except BaseException:
            if self.ids is not None:
                self.ids.close()
            raise
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._keeper = threading.Thread(target=self._keep, name="runner-keeper", daemon=True)
        self._keeper.start()

    def _spawn(self) -> subprocess.Popen[bytes]:
        # Its standard input stays open while this process lives: the runner drains and
        # ends when it closes, so a killed API leaves no runner behind (test_embedded.py).
        proc = subprocess.Popen(
            [*self._argv, "--token-stdin", "--with-stdin"],
            stdin=subprocess.PIPE,
            # Its log goes to standard error; standard output may be a protocol's channel
            # (``toolkiln mcp`` speaks MCP on it), which the runner must never hold.
            stdout=subprocess.DEVNULL,
            env=self._env,
            cwd=self._cwd,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the API, which stops it
        )
        assert proc.stdin is not None
        try:
            proc.stdin.write(self.token.encode() + b"\n")
            proc.stdin.flush()
        except OSError:
            pass  # it died at once: the keeper or the start sees it
        return proc

    def _keep(self) -> None:
        """A runner that ended while the API runs (killed, crashed) is started again, with
        backoff; meanwhile /healthz says no runner takes calls (503), and calls not started
        wait for it within their own time. Its address and credential stay the same."""
        delay = RESTART_FIRST_S
        while not self._stopping.is_set():
            code = self.proc.wait()
            _close_stdin(self.proc)
            if self._stopping.is_set():
                return
            log.error("the sandbox runner ended (status %s); starting it again", code)
            if self._stopping.wait(delay):
                return
            try:
                self.proc = self._spawn()
                if self._stopping.is_set():  # stopped meanwhile: this one goes too
                    self.proc.terminate()
                    return
                self._wait_ready()
                self.restarts += 1
                delay = RESTART_FIRST_S
            except Exception as exc:  # the keeper outlives any one failure
                log.error("the sandbox runner could not be started again: %s", exc)
                delay = min(delay * 2, RESTART_MAX_S)

    def _wait_ready(self) -> None:
        probe = RunnerClient(self.address, self.token)
        try:
            deadline = time.monotonic() + START_S
            while True:
                if self.proc.poll() is not None:
                    raise ServiceUnavailable(
                        f"The sandbox runner exited at start (status {self.proc.returncode}); "
                        "its log above says why.",
                        code="sandbox_unavailable",
                    )
                probe.check()
                if probe.usable:
                    return
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(
                        "The sandbox runner did not start in time.", code="sandbox_unavailable"
                    )
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(0.05)
        finally:
            probe.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM (it drains), then SIGKILL if it has not ended in time."""
        self._stopping.set()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        _close_stdin(self.proc)
        with contextlib.suppress(OSError):
            self.path.unlink()
        if self.ids is not None:
            self.ids.close()


def _close_stdin(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()


def channel_credentials(
    ca: Path | None, cert: Path | None, key: Path | None
) -> grpc.ChannelCredentials | None:
    """TLS to remote runners: ``ca`` verifies them; ``cert`` and ``key`` prove this API
    process to runners that require client certificates (mutual TLS)."""
    if ca is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=key.read_bytes() if key is not None else None,
        certificate_chain=cert.read_bytes() if cert is not None else None,
    )
