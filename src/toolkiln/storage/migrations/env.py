"""Alembic environment: runs on the connection the caller hands in (see Database.migrate)."""

from __future__ import annotations

from alembic import context

from toolkiln.storage.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only through Database.migrate
    raise RuntimeError("Run migrations with `toolkiln migrate`.")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
