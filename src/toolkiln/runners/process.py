"""``toolkiln runner --listen ADDR``: a process that runs tool code for the API processes that
connect to it, and holds no credential but the runner credential.

It reads ``RunnerSettings`` only (never the API's settings), serves until SIGTERM or
SIGINT, then drains: it takes no new run, lets the runs in flight end (each within its own
timeout), and exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from toolkiln.config import RunnerSettings, SandboxSettings
from toolkiln.runners.host import RunnerHost
from toolkiln.runners.server import RunnerService, make_server
from toolkiln.sandbox.checks import CheckerPool
from toolkiln.sandbox.layers import Missing
from toolkiln.sandbox.packages import JsPackageStore, PackageStore
from toolkiln.sandbox.runner import Limits, Sandbox
from toolkiln.sandbox.sandboxes import javascript_sandbox, python_sandbox

log = logging.getLogger("toolkiln.runner")


def sandboxes_for(settings: SandboxSettings) -> dict[str, Sandbox]:
    """A runner's two sandboxes, started (the JavaScript one closes the Python one if it
    cannot start)."""
    limits = Limits(memory_mb=settings.sandbox_memory_mb)
    strict = not settings.sandbox_insecure
    layers = {"accept": settings.accepted_layers, "cgroup_parent": settings.sandbox_cgroup}
    python = python_sandbox(
        PackageStore(settings.packages_dir),
        limits=limits,
        warm=settings.sandbox_warm,
        strict=strict,
        **layers,
    )
    try:
        javascript = javascript_sandbox(
            JsPackageStore(settings.js_packages_dir),
            limits=limits,
            warm=settings.sandbox_js_workers,
            strict=strict,
            **layers,
        )
    except BaseException:
        python.close()
        raise
    return {"python": python, "javascript": javascript}


def host_for(settings: SandboxSettings, missing: Sequence[Missing] = ()) -> RunnerHost:
    """A runner's sandboxes and code checkers, started (a spare checker in the background);
    ``missing``: the layers the runner process itself runs without, accepted (listed by
    /healthz with the sandboxes' own)."""
    sandboxes = sandboxes_for(settings)
    for box in sandboxes.values():
        box.runner_missing = tuple(missing)
    checks = CheckerPool(strict=not settings.sandbox_insecure)
    checks.warm()
    return RunnerHost(sandboxes, checks)


def server_credentials(settings: RunnerSettings) -> grpc.ServerCredentials | None:
    """Mutual TLS when a certificate is set: the runner proves itself with it and, with a
    client CA, accepts only API processes whose certificate that CA signed."""
    if settings.runner_tls_cert is None or settings.runner_tls_key is None:
        return None
    ca = settings.runner_tls_client_ca
    return grpc.ssl_server_credentials(
        [(settings.runner_tls_key.read_bytes(), settings.runner_tls_cert.read_bytes())],
        root_certificates=ca.read_bytes() if ca is not None else None,
        require_client_auth=ca is not None,
    )


def serve(
    listen: str,
    settings: RunnerSettings,
    token: str,
    until_closed: int | None = None,
    missing: Sequence[Missing] = (),
) -> None:
    """Serve until a stop signal, or until ``until_closed`` reads end of file (the pipe from
    the API process that started it: it ends when that process does, even killed), then
    drain and close. tests/runners/test_embedded.py guards the second."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    host = host_for(settings, missing)
    service = RunnerService(host)
    path = None
    if listen.startswith("unix:"):
        path = Path(listen.removeprefix("unix:").removeprefix("//"))
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
    server, _ = make_server(service, listen, token, server_credentials(settings))
    if path is not None:
        # Its owner's alone. Not by a umask around the bind: that is the whole process's,
        # and the sandboxes' threads made directories under it without their search bit
        # (tests/deploy/test_image.py). Until this chmod the usual umask leaves others no
        # write permission on it, which connecting needs.
        os.chmod(path, 0o600)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if until_closed is not None:
        threading.Thread(
            target=_stop_at_eof, args=(until_closed, stop), name="runner-parent", daemon=True
        ).start()
    log.info("runner listening on %s", listen)
    stop.wait()
    log.info("draining: no new runs; waiting for %d in flight", host.in_flight)
    if not host.drain(settings.runner_drain_s):
        log.warning("runs still in flight after %.0f s: stopping them", settings.runner_drain_s)
    server.stop(grace=1.0).wait(5)
    service.close()
    host.close()


def hosted_runner(
    settings: SandboxSettings, closers: list[Callable[[], None]]
) -> tuple[str, str, RunnerHost]:
    """A runner served from the calling process on a Unix socket of its own (tests that look
    inside its sandboxes and checkers): its address, credential and host; ``closers`` stop
    it."""
    token = secrets.token_urlsafe(32)
    home = Path(tempfile.mkdtemp(prefix="toolkiln-hosted-"))
    closers.append(lambda: shutil.rmtree(home, ignore_errors=True))
    path = home / "runner.sock"
    host = host_for(settings)
    closers.append(host.close)
    service = RunnerService(host)
    closers.append(service.close)
    server, _ = make_server(service, f"unix:{path}", token)
    closers.append(lambda: server.stop(grace=None).wait(5))
    return f"unix:{path}", token, host


def _stop_at_eof(fd: int, stop: threading.Event) -> None:
    """Reads the descriptor itself, not ``sys.stdin``: a daemon thread blocked in a buffered
    reader's lock at interpreter shutdown is a fatal error."""
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass
    if not stop.is_set():
        log.warning("the process that started this runner is gone: draining")
    stop.set()
