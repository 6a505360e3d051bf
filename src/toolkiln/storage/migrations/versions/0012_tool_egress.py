"""egress: the hosts a tool version's code may reach through http_request

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    for table in ("tools", "tool_versions"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(
                sa.Column("egress", JSONType, nullable=False, server_default=sa.text("'[]'"))
            )


def downgrade() -> None:
    for table in ("tools", "tool_versions"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("egress")
