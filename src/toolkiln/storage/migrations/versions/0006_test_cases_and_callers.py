"""test cases and allowed callers, on tools and their versions

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    for table in ("tools", "tool_versions"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("test_cases", JSONType, nullable=False, server_default=sa.text("'[]'"))
            )
            batch_op.add_column(
                sa.Column(
                    "allowed_callers",
                    JSONType,
                    nullable=False,
                    server_default=sa.text('\'["direct", "code"]\''),
                )
            )


def downgrade() -> None:
    for table in ("tools", "tool_versions"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("allowed_callers")
            batch_op.drop_column("test_cases")
