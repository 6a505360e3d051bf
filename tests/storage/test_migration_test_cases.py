"""Migration 0006 gives tools and versions stored before it no test cases and both callers."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from toolkiln.domain.ids import utcnow
from toolkiln.storage.database import MIGRATIONS, Database


def test_rows_from_before_read_as_no_cases_and_every_caller(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'old.db'}")
    with db.engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0005")
        now = utcnow()
        conn.execute(
            sa.text(
                "INSERT INTO workspaces (id, name, policy, created_at) VALUES ('w', 'w', '{}', :t)"
            ),
            {"t": now},
        )
        conn.execute(
            sa.text(
                "INSERT INTO tools (id, workspace_id, name, description, language, code,"
                " input_schema, enable_globally, timeout_ms, status, usage_count, failure_count,"
                " version, created_at, updated_at) VALUES ('t', 'w', 'old', '', 'python',"
                " 'def main(**p):\n    return {}', '{}', 0, 5000, 'active', 0, 0, 1, :t, :t)"
            ),
            {"t": now},
        )
        conn.execute(
            sa.text(
                "INSERT INTO tool_versions (tool_id, version, language, code, description,"
                " input_schema, timeout_ms, created_at) VALUES ('t', 1, 'python', 'x', '', '{}',"
                " 5000, :t)"
            ),
            {"t": now},
        )
    db.migrate()
    with db.transaction(readonly=True) as tx:
        tool = tx.tools.get("t")
        version = tx.tools.version("t", 1)
    db.dispose()
    assert tool is not None and version is not None
    assert tool.definition.test_cases == [] and tool.definition.allowed_callers == [
        "direct",
        "code",
    ]
    assert version.definition.test_cases == [] and version.definition.allowed_callers == [
        "direct",
        "code",
    ]
