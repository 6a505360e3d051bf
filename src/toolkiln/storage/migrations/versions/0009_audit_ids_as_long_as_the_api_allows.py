"""audit.tool_call_id and audit.agent_id take the 128 characters the API allows

The API accepts a tool_call_id (and an agent_id in an invoke body) of up to 128 characters
and ``tool_calls`` stores that many, but the audit columns held 64: on PostgreSQL a longer
id failed the call's audit insert (a 500). SQLite does not enforce a VARCHAR length, so
only PostgreSQL is altered (its ALTER keeps every row; widening a varchar rewrites nothing).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

COLUMNS = ("tool_call_id", "agent_id")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for column in COLUMNS:
        op.alter_column("audit", column, type_=sa.String(128), existing_type=sa.String(64))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for column in COLUMNS:
        op.alter_column("audit", column, type_=sa.String(64), existing_type=sa.String(128))
