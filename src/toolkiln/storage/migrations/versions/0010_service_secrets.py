"""service_secrets: secrets the service makes for itself, shared by every replica

The key that signs file links was generated into each replica's data directory when
TOOLKILN_FILE_SIGNING_KEY was not set, so a link made by one replica was refused by the
others (any replica answers any request, links included). A generated key now
lives here: the first replica to start stores it, the others read the same.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_secrets",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("service_secrets")
