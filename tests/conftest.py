"""Shared fixtures: real SQLite and real PostgreSQL, a fresh database per test run.

PostgreSQL is required (CI runs on a machine that has it). Point
``TOOLKILN_TEST_POSTGRES_URL`` at a server where the user may create databases; each run
creates its own database and drops it at the end.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.model_server import ScriptedModel
from toolkiln.api.app import create_app
from toolkiln.app import Runtime, build
from toolkiln.config import Settings
from toolkiln.domain.auth import Principal

# The runner shape the sandbox tests run in (tests/runners/rootless_suite.py, `make
# test-rootless`): unset, this process's own (the host's root in CI); "subuid": this process
# is an unprivileged user that makes its own user namespace before any test, as a runner
# does; "namespace-root": it was started as root of a user namespace. Both need the cgroup
# delegated to them, named by TOOLKILN_SANDBOX_CGROUP.
SHAPE = os.environ.get("TOOLKILN_TEST_SHAPE")
CGROUP_PARENT = os.environ.get("TOOLKILN_SANDBOX_CGROUP", "") if SHAPE else ""


def pytest_configure(config: pytest.Config) -> None:
    if SHAPE is None:
        return
    from toolkiln.sandbox import cgroups, runner, userns

    if SHAPE == "subuid":
        missing = userns.enter_own_namespace(os.environ.get("TOOLKILN_SANDBOX_SUBUIDS"))
        if missing:
            raise pytest.UsageError("; ".join(m.refusal() for m in missing))
    if userns.shape() != userns.NAMESPACE_ROOT:
        raise pytest.UsageError(f"TOOLKILN_TEST_SHAPE={SHAPE}, but this is {userns.shape()}")
    # Every sandbox and cgroup tree a test makes, directly or through a service, in the
    # delegated cgroup.
    for made in (runner.Sandbox.__init__, cgroups.Cgroups.__init__):
        assert made.__kwdefaults__ is not None
        made.__kwdefaults__["cgroup_parent" if made is runner.Sandbox.__init__ else "parent"] = (
            CGROUP_PARENT
        )


def cgroup_path(name: str) -> str:
    """How /proc/<pid>/cgroup names a sandbox's cgroup ``name`` (below the delegated one)."""
    return f"/{CGROUP_PARENT}/{name}" if CGROUP_PARENT else f"/{name}"


PG_URL = os.environ.get(
    "TOOLKILN_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    base = PG_URL.replace("postgresql+psycopg://", "postgresql://")
    name = f"toolkiln_t_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    head, _, _ = PG_URL.rpartition("/")
    yield f"{head}/{name}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def model_server() -> Iterator[ScriptedModel]:
    """The scripted chat-completions endpoint every shared runtime generates tools with."""
    with ScriptedModel() as server:
        yield server


# The key the shared runtimes send to the scripted model; tests check it leaks nowhere else.
LLM_KEY = "sk-test-" + secrets.token_hex(12)
LLM_TIMEOUT_S = 3.0


@pytest.fixture(scope="session")
def runtime(
    backend: str,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
    model_server: ScriptedModel,
) -> Iterator[Runtime]:
    data_dir = tmp_path_factory.mktemp(f"data-{backend}")
    url = None if backend == "sqlite" else request.getfixturevalue("postgres_url")
    rt = build(
        Settings(
            data_dir=data_dir,
            database_url=url,
            llm_base_url=model_server.url,
            llm_model="scripted-model",
            llm_api_key=LLM_KEY,
            llm_timeout_s=LLM_TIMEOUT_S,
        )
    )
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def client(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime.services), raise_server_exceptions=False) as c:
        yield c


@dataclass
class Space:
    """A workspace of this test's own, with tokens of each scope."""

    id: str
    name: str
    tokens: dict[str, str]

    def auth(self, *scopes: str) -> dict[str, str]:
        key = ",".join(sorted(scopes)) or "admin"
        return {"Authorization": f"Bearer {self.tokens[key]}"}


def make_space(runtime: Runtime) -> Space:
    access = runtime.services.access
    ws = access.create_workspace(None, f"t-{secrets.token_hex(6)}")
    tokens = {}
    for scopes in ("read", "write", "invoke", "admin", "invoke,read,write"):
        tokens[scopes] = access.create_token(None, ws.id, scopes).value
    return Space(ws.id, ws.name, tokens)


@pytest.fixture
def space(runtime: Runtime) -> Space:
    return make_space(runtime)


@pytest.fixture
def other_space(runtime: Runtime) -> Space:
    return make_space(runtime)


@pytest.fixture
def rw(space: Space) -> dict[str, str]:
    """Headers of a token with read, write and invoke on the test's workspace."""
    return space.auth("read", "write", "invoke")


SEED_TOOL = {
    "name": "lookup-order-status",
    "description": "Look up the fulfillment status of an order by id.",
    "language": "python",
    "code": (
        "def main(**params):\n"
        '    order_id = params["order_id"]\n'
        '    return {"message": f"Order {order_id} is shipped", "rawData": {"status": "shipped"}}'
    ),
    "parameters": {
        "order_id": {"type": "string", "required": True, "description": "The order id to look up."}
    },
    "execution_message_description": "Looking up order status",
    "enable_globally": False,
}


def seed_tool(space: Space, **over: object) -> dict[str, object]:
    return {**SEED_TOOL, "workspace_id": space.id, **over}


ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def own_service(
    data_dir: Path, token: str, *, hosted: bool = True, **settings: Any
) -> Iterator[tuple[Runtime, TestClient, Principal]]:
    """A service of a test module's own (SQLite), with an admin token of the given value.
    ``hosted``: its runner is served from the test's process (behind the same gRPC), so the
    test can look inside its sandboxes (``rt.sandboxes``); else a runner process of its own,
    as ``toolkiln serve`` starts it."""
    rt = build(Settings(data_dir=data_dir, **settings), hosted=hosted)
    try:
        rt.services.access.bootstrap(token)
        who = rt.services.access.authenticate(token)
        with TestClient(create_app(rt.services), raise_server_exceptions=False) as client:
            yield rt, client, who
    finally:
        rt.close()


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's pick). Tests never use a fixed
    port: `make test` passes while the README's own service holds 8080."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(rt: Runtime, wrap: Callable[[Any], Any] | None = None) -> Iterator[str]:
    """The runtime's app on a real uvicorn on a free loopback port: its base URL, until the
    block ends (the runtime stays open; its owner closes it). ``wrap``: an ASGI middleware
    of the test's own around the app."""
    import threading
    import time

    import uvicorn

    from toolkiln.app import build_app

    port = free_port()
    app = build_app(rt, close_on_exit=False)
    server = uvicorn.Server(
        uvicorn.Config(wrap(app) if wrap else app, port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
