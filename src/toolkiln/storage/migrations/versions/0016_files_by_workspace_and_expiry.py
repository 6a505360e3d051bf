"""files: indexes on (workspace, expiry), for a workspace's quota, and on expiry, for the
pruning of files whose link expired

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_files_workspace_expires", "files", ["workspace_id", "expires_at"])
    op.create_index("ix_files_expires", "files", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_files_expires", table_name="files")
    op.drop_index("ix_files_workspace_expires", table_name="files")
