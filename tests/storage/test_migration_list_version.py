"""Migration 0017 (``workspaces.list_version``) on a database that holds workspaces from
before, on SQLite and PostgreSQL: they start at version 0, a list-changing audit row moves
its own workspace's version at commit and nothing else does, and the downgrade drops the
column with every row kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from tests.storage.test_migration_list_indexes import _alembic, _database
from toolkiln.domain.ids import utcnow
from toolkiln.domain.records import AuditRow
from toolkiln.storage.database import Database
from toolkiln.storage.tables import metadata


def _versions(db: Database) -> dict[str, int]:
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT id, list_version FROM workspaces ORDER BY id"))
        return {r[0]: r[1] for r in rows}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_old_workspaces_start_at_zero_and_only_list_changes_move_them(
    backend: str, tmp_path: Path
) -> None:
    with _database(backend, tmp_path) as db:
        with db.engine.begin() as conn:
            _alembic(conn, "upgrade", "0016")
            for ws in ("wa", "wb"):
                conn.execute(
                    sa.text(
                        "INSERT INTO workspaces (id, name, policy, created_at) "
                        "VALUES (:w, :w, '{}', :t)"
                    ),
                    {"w": ws, "t": utcnow()},
                )
        assert db.migrate() is not None
        with db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert [d for d in diff if "list_version" in repr(d)] == []
        assert _versions(db) == {"wa": 0, "wb": 0}

        with db.transaction() as tx:
            tx.audit.add(AuditRow("wa", "tool.invoked"))  # changes no list
        assert _versions(db) == {"wa": 0, "wb": 0}
        with db.transaction() as tx:
            tx.audit.add_many([AuditRow("wa", "tool.updated"), AuditRow("wa", "tool.deleted")])
            tx.audit.add(AuditRow("wb", "workspace.policy_updated"))
        assert _versions(db) == {"wa": 1, "wb": 1}  # once per transaction and workspace
        with pytest.raises(RuntimeError), db.transaction() as tx:
            tx.audit.add(AuditRow("wa", "tool.disabled"))
            raise RuntimeError("rolled back")
        assert _versions(db) == {"wa": 1, "wb": 1}

        with db.engine.begin() as conn:
            _alembic(conn, "downgrade", "0016")
        with db.engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("workspaces")}
            count = conn.execute(sa.text("SELECT count(*) FROM workspaces")).scalar()
        assert "list_version" not in columns and count == 2
