"""workspace_secrets: values http_request sends toward their hosts, sealed at rest

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(JSONB(), "postgresql")
Moment = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "workspace_secrets",
        sa.Column("workspace_id", sa.String(32), sa.ForeignKey("workspaces.id"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("hosts", JSONType, nullable=False),
        sa.Column("sealed", sa.Text, nullable=False),
        sa.Column("created_at", Moment, nullable=False),
        sa.Column("updated_at", Moment, nullable=False),
        sa.Column("last_used_at", Moment),
    )


def downgrade() -> None:
    op.drop_table("workspace_secrets")
