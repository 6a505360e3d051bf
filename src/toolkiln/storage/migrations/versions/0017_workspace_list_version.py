"""workspaces.list_version: a number that moves, in the same transaction, with every change
to what the workspace's agents' tool lists show; the lists are cached by it

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


# Plain ALTER TABLE on both databases (SQLite has DROP COLUMN since 3.35): a batch copy of
# ``workspaces`` would drop the table the other tables' foreign keys point at.


def upgrade() -> None:
    op.add_column(
        "workspaces",
        sa.Column("list_version", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_column("workspaces", "list_version")
