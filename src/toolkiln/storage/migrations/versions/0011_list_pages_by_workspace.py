"""tools and outbox: an index on (workspace_id, seq) for each workspace's pages

A list's page is ``WHERE workspace_id = :ws AND seq > :after ORDER BY seq LIMIT n`` (keyset
paging; the cursor holds ``seq`` sealed, domain/opaque.py). With an index on ``seq`` alone
(the primary key) or on ``workspace_id`` alone, the database walks other workspaces' rows,
or every row of the workspace and sorts them, for each page; on (workspace_id, seq) a page
is one range of the index, as the audit's pages already are (``ix_audit_workspace``). The
outbox's index on ``workspace_id`` alone is replaced (the new one serves what it served).
Only indexes change: every row stays.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tools", schema=None) as batch_op:
        batch_op.create_index("ix_tools_workspace_seq", ["workspace_id", "seq"], unique=False)
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_workspace_seq", ["workspace_id", "seq"], unique=False)
        batch_op.drop_index("ix_outbox_workspace_id")


def downgrade() -> None:
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_workspace_id", ["workspace_id"], unique=False)
        batch_op.drop_index("ix_outbox_workspace_seq")
    with op.batch_alter_table("tools", schema=None) as batch_op:
        batch_op.drop_index("ix_tools_workspace_seq")
