"""Migration 0011 (an index on (workspace_id, seq) for the tool and outbox pages) on a
database that holds rows from before, on SQLite and PostgreSQL: the rows stay, the lists
page through them with sealed cursors, the schema is what ``storage/tables.py`` says, and
the downgrade puts the old index back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from tests.conftest import PG_URL
from tests.reliability.harness import fresh_postgres_database
from toolkiln.domain.ids import utcnow
from toolkiln.domain.opaque import Kind, Positions
from toolkiln.services.paging import after, page_of
from toolkiln.storage.database import MIGRATIONS, Database
from toolkiln.storage.tables import metadata

ROWS = 7


def _seq(row: Any) -> int:
    return int(row.seq if hasattr(row, "seq") else row["seq"])


def _id(row: Any) -> str:
    return str(row.id if hasattr(row, "id") else row["id"])


@contextmanager
def _database(backend: str, tmp_path: Path) -> Iterator[Database]:
    if backend == "sqlite":
        db = Database(f"sqlite:///{tmp_path / 'old.db'}")
        try:
            yield db
        finally:
            db.dispose()
        return
    with fresh_postgres_database(PG_URL) as url:
        db = Database(url)
        try:
            yield db
        finally:
            db.dispose()


def _alembic(conn: sa.Connection, action: str, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    getattr(command, action)(cfg, revision)


def _indexes(db: Database, table: str) -> set[str]:
    with db.engine.connect() as conn:
        return {str(i["name"]) for i in sa.inspect(conn).get_indexes(table)}


def _fill(conn: sa.Connection) -> None:
    """Two workspaces' tools and mail, interleaved, as a service before 0011 wrote them."""
    now = utcnow()
    for ws in ("wa", "wb"):
        conn.execute(
            sa.text(
                "INSERT INTO workspaces (id, name, policy, created_at) VALUES (:w, :w, '{}', :t)"
            ),
            {"w": ws, "t": now},
        )
    for i in range(ROWS):
        for ws in ("wa", "wb"):
            conn.execute(
                sa.text(
                    "INSERT INTO tools (id, workspace_id, name, description, language, code,"
                    " input_schema, enable_globally, timeout_ms, status, usage_count,"
                    " failure_count, version, created_at, updated_at) VALUES (:id, :w, :n, '',"
                    " 'python', 'def main(**p):\n    return {}', '{}', false, 5000, 'active', 0,"
                    " 0, 1, :t, :t)"
                ),
                {"id": f"{ws}-t{i}", "w": ws, "n": f"t{i}", "t": now},
            )
            conn.execute(
                sa.text(
                    "INSERT INTO outbox (id, workspace_id, message_id, recipients, subject,"
                    " body_text, source, created_at) VALUES (:id, :w, '<m@x>',"
                    " '{\"to\": [\"a@b.c\"], \"cc\": []}', 's', 'b', 'api', :t)"
                ),
                {"id": f"{ws}-m{i}", "w": ws, "t": now},
            )


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_old_rows_page_by_workspace_after_the_upgrade_and_the_downgrade_restores(
    backend: str, tmp_path: Path
) -> None:
    with _database(backend, tmp_path) as db:
        with db.engine.begin() as conn:
            _alembic(conn, "upgrade", "0010")
            _fill(conn)
        assert "ix_outbox_workspace_id" in _indexes(db, "outbox")
        assert db.migrate() is not None

        assert "ix_tools_workspace_seq" in _indexes(db, "tools")
        assert _indexes(db, "outbox") >= {"ix_outbox_workspace_seq"}
        assert "ix_outbox_workspace_id" not in _indexes(db, "outbox")
        with db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        # Indexes only (SQLite keeps the VARCHAR lengths 0009 widened on PostgreSQL alone).
        assert [d for d in diff if isinstance(d, tuple) and "index" in d[0]] == []

        positions = Positions(bytes(32))

        def pages(list_of: Callable[..., list[Any]], kind: Kind, size: int) -> list[str]:
            """Every page of workspace wa's list, as a service pages it (services/paging)."""
            got: list[str] = []
            cursor: str | None = None
            while True:
                with db.transaction(readonly=True) as tx:
                    rows = list_of(tx, after(positions, kind, cursor), size + 1)
                page = page_of(rows, size, _seq, positions, kind)
                got += [_id(r) for r in page.items]
                if (cursor := page.next_cursor) is None:
                    return got

        got_tools = pages(lambda tx, start, n: tx.tools.page("wa", start, n), "tools-cursor", 2)
        got_mail = pages(lambda tx, start, n: tx.outbox.page("wa", start, n), "outbox-cursor", 3)
        assert got_tools == [f"wa-t{i}" for i in range(ROWS)]
        assert got_mail == [f"wa-m{i}" for i in range(ROWS)]

        with db.engine.begin() as conn:
            _alembic(conn, "downgrade", "0010")
        assert "ix_tools_workspace_seq" not in _indexes(db, "tools")
        assert "ix_outbox_workspace_id" in _indexes(db, "outbox")
