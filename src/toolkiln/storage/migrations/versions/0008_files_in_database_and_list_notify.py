"""files in the database; NOTIFY on tool-list changes (PostgreSQL)

Stored files move into the database so that every replica serves every link (rows made
before this migration keep no content: their links, an hour long at most, answer 404).
On PostgreSQL a trigger on the audit table notifies channel ``toolkiln_tool_lists`` for each
row whose event can change some agent's tool list (the events of
``toolkiln.services.agents.LIST_CHANGING_EVENTS`` when this was written; a test keeps them
equal), which wakes every replica's MCP watcher.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

EVENTS = (
    "tool.created",
    "tool.updated",
    "tool.deleted",
    "tool.enabled",
    "tool.disabled",
    "agent.tool_enabled",
    "agent.tool_disabled",
    "agent.deleted",
    "workspace.policy_updated",
)


def upgrade() -> None:
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.add_column(sa.Column("content", sa.LargeBinary(), nullable=True))
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "CREATE FUNCTION toolkiln_notify_tool_lists() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM pg_notify('toolkiln_tool_lists', NEW.id::text); RETURN NULL; END $$"
    )
    events = ", ".join(f"'{e}'" for e in EVENTS)
    op.execute(
        "CREATE TRIGGER audit_tool_lists AFTER INSERT ON audit FOR EACH ROW "
        f"WHEN (NEW.event IN ({events})) EXECUTE FUNCTION toolkiln_notify_tool_lists()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_tool_lists ON audit")
        op.execute("DROP FUNCTION IF EXISTS toolkiln_notify_tool_lists()")
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.drop_column("content")
