"""tool-call ids are unique per workspace, not globally

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _rebuild(primary_key: list[str]) -> None:
    """A new table with the other primary key, the rows copied over, then swapped in:
    the one way that works alike on SQLite and PostgreSQL."""
    json_type = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
    op.create_table(
        "tool_calls_new",
        sa.Column("workspace_id", sa.String(32), nullable=False),
        sa.Column("id", sa.String(128), nullable=False),
        sa.Column("tool_id", sa.String(32)),
        sa.Column("version", sa.Integer),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("error_code", sa.String(32)),
        sa.Column("result", json_type, nullable=False),
        sa.Column("agent_id", sa.String(128)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(*primary_key, name=f"pk_tool_calls_{len(primary_key)}"),
    )
    columns = (
        "workspace_id, id, tool_id, version, kind, status, error_code, result, agent_id, created_at"
    )
    op.execute(f"INSERT INTO tool_calls_new ({columns}) SELECT {columns} FROM tool_calls")
    op.drop_index("ix_tool_calls_tool", table_name="tool_calls")
    op.drop_table("tool_calls")
    op.rename_table("tool_calls_new", "tool_calls")
    op.create_index("ix_tool_calls_tool", "tool_calls", ["tool_id", "created_at"])


def upgrade() -> None:
    _rebuild(["workspace_id", "id"])


def downgrade() -> None:
    _rebuild(["id"])
