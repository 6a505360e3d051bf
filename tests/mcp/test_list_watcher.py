"""The MCP tool-list watcher tells each workspace of its own changes, on both backends, and
on PostgreSQL also of a row that became visible below the newest id it had seen (ids are
taken at insert, rows appear at commit): a look that read only ids over the newest one
seen missed such a workspace's change for good (found by review, 2026-12-06)."""

from __future__ import annotations

import secrets
from collections.abc import Collection
from datetime import UTC, datetime

import anyio
import anyio.abc
import pytest
import sqlalchemy as sa

from toolkiln.app import Runtime
from toolkiln.mcp_server import server
from toolkiln.mcp_server.server import Listeners, tool_list_watcher
from toolkiln.storage.tables import audit


class Told(Listeners):
    """Listeners that keep what they were told (the MCP sessions are tested elsewhere)."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[Collection[str] | None] = []
        self.changed_event = anyio.Event()

    async def changed(self, workspaces: Collection[str] | None) -> None:
        self.told.append(None if workspaces is None else set(workspaces))
        self.changed_event.set()
        self.changed_event = anyio.Event()


def _row(workspace: str) -> dict[str, object]:
    return {
        "workspace_id": workspace,
        "event": "tool.created",
        "source": "api",
        "data": {},
        "created_at": datetime.now(UTC),
    }


def _commit_row(rt: Runtime, workspace: str) -> None:
    with rt.database.engine.begin() as conn:
        conn.execute(audit.insert().values(**_row(workspace)))


async def _until(told: Told, predicate: object, what: str) -> None:
    with anyio.fail_after(15):
        while not predicate():  # type: ignore[operator]
            await told.changed_event.wait()
    assert predicate(), what  # type: ignore[operator]


async def _watching(tasks: anyio.abc.TaskGroup, runtime: Runtime, told: Told) -> None:
    """The watcher started in ``tasks``, once it has made its first look."""
    looked = anyio.Event()
    tasks.start_soon(tool_list_watcher(runtime.services, told), looked.set)
    with anyio.fail_after(15):
        await looked.wait()


def test_each_workspace_is_told_of_its_own_changes(runtime: Runtime) -> None:
    x, y = f"ws-x-{secrets.token_hex(3)}", f"ws-y-{secrets.token_hex(3)}"
    told = Told()

    async def run() -> None:
        async with anyio.create_task_group() as tasks:
            await _watching(tasks, runtime, told)
            await anyio.to_thread.run_sync(lambda: _commit_row(runtime, x))
            await _until(told, lambda: {x} in told.told, "x was not told")
            await anyio.to_thread.run_sync(lambda: _commit_row(runtime, y))
            await _until(told, lambda: {y} in told.told, "y was not told")
            tasks.cancel_scope.cancel()

    anyio.run(run)
    assert all(t is not None and len(t) == 1 for t in told.told), told.told


def test_a_row_committed_below_the_newest_id_seen_is_told(runtime: Runtime) -> None:
    if runtime.database.is_sqlite:
        pytest.skip("SQLite has one writer: ids become visible in their order")
    late, early = f"ws-late-{secrets.token_hex(3)}", f"ws-early-{secrets.token_hex(3)}"
    told = Told()

    async def run() -> None:
        async with anyio.create_task_group() as tasks:
            await _watching(tasks, runtime, told)
            # The late row takes its id first and commits after the early one.
            conn = runtime.database.engine.connect()
            try:
                tx = conn.begin()
                conn.execute(audit.insert().values(**_row(late)))
                await anyio.to_thread.run_sync(lambda: _commit_row(runtime, early))
                await _until(told, lambda: {early} in told.told, "the early row was not told")
                tx.commit()
            finally:
                conn.close()
            await _until(told, lambda: {late} in told.told, "the late row was never told")
            tasks.cancel_scope.cancel()

    anyio.run(run)
    with runtime.database.engine.connect() as c:
        ids = dict(
            c.execute(
                sa.select(audit.c.workspace_id, audit.c.id).where(
                    audit.c.workspace_id.in_([late, early])
                )
            ).all()
        )
    assert ids[late] < ids[early], "the test did not make the order it is about"


def test_a_look_reads_only_recent_rows(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once LATE_S has passed, a look no longer reads the rows older looks saw: a
    long-running service's looks read what changed lately, not its last WINDOW_IDS ids."""
    monkeypatch.setattr(server, "LATE_S", 0.5)
    old = f"ws-old-{secrets.token_hex(3)}"
    for _ in range(30):
        _commit_row(runtime, old)
    seen: list[set[str]] = []
    agents = runtime.services.agents
    real = agents.list_changes

    def recorded(window: int, floor: int = 0) -> tuple[int, list[tuple[int, str]]]:
        marker, rows = real(window, floor)
        seen.append({workspace for _, workspace in rows})
        return marker, rows

    monkeypatch.setattr(agents, "list_changes", recorded)
    told = Told()

    async def run() -> None:
        async with anyio.create_task_group() as tasks:
            await _watching(tasks, runtime, told)
            for name in (f"ws-a-{secrets.token_hex(3)}", f"ws-b-{secrets.token_hex(3)}"):
                await anyio.sleep(0.6)
                await anyio.to_thread.run_sync(lambda n=name: _commit_row(runtime, n))
                await _until(told, lambda n=name: {n} in told.told, f"{name} was not told")
            tasks.cancel_scope.cancel()

    anyio.run(run)
    assert old in seen[0], "the first look did not read the rows it is about"
    assert old not in seen[-1], seen[-1]
