"""Replicas started at the same moment on a new database all start: migrations take a lock
(a PostgreSQL advisory lock; SQLite's write lock), and whoever waits finds the schema done."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import PG_URL
from tests.reliability.harness import TOOLKILN, fresh_postgres_database
from toolkiln.services.access import AccessService
from toolkiln.storage.database import Database

REPLICAS = 6
TOKEN = "tk_together-admin-token"


@pytest.fixture
def fresh_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A database nobody has migrated yet."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    with fresh_postgres_database(PG_URL) as url:
        yield url


def _head(url: str) -> list[str]:
    db = Database(url)
    try:
        with db.engine.connect() as conn:
            return [r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))]
    finally:
        db.dispose()


def test_migrations_started_at_one_moment_all_succeed(fresh_url: str) -> None:
    # A barrier releases every migrator at once: without the lock, several of them find
    # no alembic_version table and all try to create the schema.
    barrier = threading.Barrier(REPLICAS)
    failures: list[BaseException] = []

    issued: list[object] = []

    def replica() -> None:
        db = Database(fresh_url, pool_size=1)
        try:
            barrier.wait(30)
            db.migrate()
            # Then each bootstraps the admin token, as `serve` does: one creates it.
            barrier.wait(30)
            issued.append(AccessService(db.transaction).bootstrap(TOKEN))
        except BaseException as exc:
            failures.append(exc)
        finally:
            db.dispose()

    threads = [threading.Thread(target=replica, daemon=True) for _ in range(REPLICAS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a migrator is stuck"
    assert not failures, failures
    assert len(_head(fresh_url)) == 1
    assert len([i for i in issued if i is not None]) == 1


def test_replica_processes_started_together_all_start(tmp_path: Path) -> None:
    # Real processes on PostgreSQL (the thread test above covers SQLite's lock).
    with fresh_postgres_database(PG_URL) as url:
        _start_together(url, tmp_path)


def _start_together(fresh_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKILN_")}
    procs = [
        subprocess.Popen(
            [TOOLKILN, "migrate"],
            env={
                **env,
                "TOOLKILN_DATABASE_URL": fresh_url,
                "TOOLKILN_DATA_DIR": str(tmp_path / f"r{i}"),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    results = [(p.wait(120), p.stderr.read() if p.stderr else "") for p in procs]
    assert [code for code, _ in results] == [0, 0, 0], results
    assert len(_head(fresh_url)) == 1
