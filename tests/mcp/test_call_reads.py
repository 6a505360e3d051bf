"""An MCP ``tools/call`` over HTTP reads the database once before its sandbox run when its
session's transport answers it (mcp_server/fast.py): the entrance (the token and the agent)
and the call's preparation (the agent's offer, the policy, the tool) in one unit; twice when
the SDK serves it (a ``progressToken``: the entrance first, then the preparation). Counted with SQLAlchemy's event hooks on the service's engine, on SQLite
and PostgreSQL, every statement included (the prepared ones too: storage/prepared.py).

Not counted: the status re-read a run's admission makes once its sandbox process is ready,
when the call waited for one longer than the read's window (one statement, a unit of its own:
docs/decisions/108-one-read-per-call.md). It is the run's start deciding the status, and
at most one."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import sqlalchemy as sa
import uvicorn
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.routing import Mount

from tests.conftest import PG_URL, free_port
from tests.mcp.offered import WHO, python_tool
from tests.reliability.harness import fresh_postgres_database
from toolkiln.app import Runtime, build
from toolkiln.config import Settings
from toolkiln.mcp_server.http import McpHttp
from toolkiln.storage.prepared import ONE_STATEMENT

TOKEN = "tk_mcp-reads-admin"


@dataclass
class Unit:
    """One transaction: whether it was opened to read, and its statements."""

    readonly: bool
    one_statement: bool
    statements: list[str] = field(default_factory=list)


@dataclass
class Recorder:
    """Every transaction on the engine, and how many had begun when a sandbox run started."""

    units: list[Unit] = field(default_factory=list)
    open: dict[int, Unit] = field(default_factory=dict)
    runs_at: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self, conn: sa.Connection) -> None:
        unit = Unit(bool(conn.info.get("toolkiln_readonly")), ONE_STATEMENT in conn.info)
        with self.lock:
            self.units.append(unit)
            self.open[id(conn)] = unit

    def statement(self, conn: sa.Connection, _cursor: Any, sql: str, *_: Any) -> None:
        with self.lock:
            unit = self.open.get(id(conn))
            if unit is not None:
                unit.statements.append(sql)

    def before_run(self) -> list[Unit]:
        """The transactions that began before the first sandbox run."""
        with self.lock:
            assert self.runs_at, "no sandbox run started"
            return self.units[: self.runs_at[0]]


@dataclass
class Served:
    runtime: Runtime
    url: str
    tool_id: str


@pytest.fixture(params=["sqlite", "postgresql"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    """A service whose MCP transport runs alone on a real uvicorn: no background loop (the
    list watcher, SQLite's checkpoint) reads the database while a call is counted."""
    # A database of its own: the bootstrap token counts only where no admin exists yet.
    with contextlib.ExitStack() as stack:
        url = (
            None
            if request.param == "sqlite"
            else stack.enter_context(fresh_postgres_database(PG_URL))
        )
        yield from _served(request, tmp_path, url)


def _served(request: pytest.FixtureRequest, tmp_path: Path, url: str | None) -> Iterator[Served]:
    rt = build(Settings(data_dir=tmp_path, database_url=url), hosted=True)
    try:
        rt.services.access.bootstrap(TOKEN)
        who = rt.services.access.authenticate(TOKEN)
        ws = rt.services.access.create_workspace(None, f"reads-{request.param}")
        tool = python_tool(
            rt,
            who,
            ws.id,
            "greet",
            "def main(**p):\n    return {'message': 'hello ' + p['who']}",
            parameters=WHO,
            execution_message_description="Greeting someone",
        )
        agent = rt.services.agents.create(who, ws.id, "counted")
        rt.services.agents.enable_tool(who, agent.id, tool.id, None)
        mcp = McpHttp(rt.services)

        @asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            async with mcp.manager.run():
                yield

        app = Starlette(routes=[Mount("/mcp", app=mcp)], lifespan=lifespan)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            assert thread.is_alive()
            thread.join(0.01)
        try:
            yield Served(rt, f"http://127.0.0.1:{port}/mcp/agents/{agent.id}", tool.id)
        finally:
            server.should_exit = True
            thread.join(30)
    finally:
        rt.close()


def recording(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    engine = rt.database.engine
    sa.event.listen(engine, "begin", recorder.begin)
    sa.event.listen(engine, "before_cursor_execute", recorder.statement)
    sandbox = rt.sandboxes["python"]
    run = sandbox.run

    def spied(*args: Any, **kwargs: Any) -> Any:
        with recorder.lock:
            recorder.runs_at.append(len(recorder.units))
        return run(*args, **kwargs)

    monkeypatch.setattr(sandbox, "run", spied)
    return recorder


def call(
    served: Served, name: str, arguments: dict[str, Any], before: Any, progress: bool = False
) -> Any:
    async def told(value: float, total: float | None, message: str | None) -> None:
        pass

    async def go() -> Any:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            async with streamable_http_client(served.url, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    await session.list_tools()
                    before()
                    return await session.call_tool(
                        name, arguments, progress_callback=told if progress else None
                    )

    return anyio.run(go)


@pytest.mark.parametrize("progress", [False, True], ids=["answered-by-transport", "sdk"])
def test_a_tools_call_reads_once_or_twice_before_its_sandbox_run(
    served: Served, monkeypatch: pytest.MonkeyPatch, progress: bool
) -> None:
    recorder: Recorder | None = None

    def start() -> None:
        nonlocal recorder
        recorder = recording(served.runtime, monkeypatch)

    result = call(served, f"custom_{served.tool_id}", {"who": "counted"}, start, progress)
    assert result.is_error is False and result.content[0].text == "hello counted"
    assert recorder is not None
    units = recorder.before_run()
    described = [(u.readonly, u.one_statement, u.statements) for u in units]
    assert all(u.readonly and u.statements for u in units), described  # nothing is written
    admissions = [u for u in units if u.one_statement]
    assert len(admissions) <= 1, described
    assert all(u.statements[0].startswith("SELECT tools.status") for u in admissions)
    reads = [u for u in units if not u.one_statement]
    assert len(reads) == (2 if progress else 1), described
    entrance, preparation = " ".join(reads[0].statements), " ".join(reads[-1].statements)
    assert "FROM tokens" in entrance and "FROM agents" in entrance
    assert "FROM agents" in preparation and "FROM tools" in preparation
    # custom_{id} is no name a tool may have: the tool is read by its id, not looked up by
    # that name first (services/router.py, Router._custom_in).
    assert not any("tools.name =" in s for s in reads[-1].statements), described
