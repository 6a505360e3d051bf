"""tool_call_stats: a tool's calls per minute and outcome, with duration buckets

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

BUCKETS = 25  # domain/stats.py BUCKETS when this revision was written


def upgrade() -> None:
    op.create_table(
        "tool_call_stats",
        sa.Column("tool_id", sa.String(32), primary_key=True),
        sa.Column("minute", sa.Integer, primary_key=True),
        sa.Column("code", sa.String(32), primary_key=True),
        sa.Column("calls", sa.Integer, nullable=False),
        *(sa.Column(f"d{i}", sa.Integer, nullable=False) for i in range(BUCKETS)),
    )


def downgrade() -> None:
    op.drop_table("tool_call_stats")
