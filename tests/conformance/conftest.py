"""A real ``toolkiln serve`` of a test module's own: a subprocess on a free loopback port, a
fresh data directory, and an admin token of the module's own."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Served:
    url: str
    token: str
    data_dir: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def served_token() -> str:
    """The bootstrap admin token of the module's service (a module may override it)."""
    return f"tk-test-{secrets.token_hex(8)}"


@pytest.fixture(scope="module")
def served_env() -> dict[str, str]:
    """More settings of the module's service (a module may override it)."""
    return {}


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, served_token: str, served_env: dict[str, str]
) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("served")
    port = free_port()
    token = served_token
    env = {
        **os.environ,
        "TOOLKILN_DATA_DIR": str(root / "data"),
        "TOOLKILN_PORT": str(port),
        "TOOLKILN_BOOTSTRAP_TOKEN": token,
        "TOOLKILN_SANDBOX_WARM": "2",
        "TOOLKILN_SANDBOX_JS_WORKERS": "1",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("TOOLKILN_DATABASE_URL", None)
    env.update(served_env)
    log = (root / "serve.log").open("wb")
    proc = subprocess.Popen(
        [str(BIN / "toolkiln"), "serve"],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"toolkiln serve exited: {(root / 'serve.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("toolkiln serve did not become healthy within 120 s")
            time.sleep(0.1)  # polling a condition with a deadline, not a fixed wait
        yield Served(url, token, root / "data", env)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
