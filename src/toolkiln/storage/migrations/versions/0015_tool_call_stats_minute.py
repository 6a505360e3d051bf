"""tool_call_stats: an index on minute, for the pruning of minutes no window reads

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_tool_call_stats_minute", "tool_call_stats", ["minute"])


def downgrade() -> None:
    op.drop_index("ix_tool_call_stats_minute", table_name="tool_call_stats")
