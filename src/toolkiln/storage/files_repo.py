"""Files surfaced by tools (``files``): stored, read by a signed link, counted against their
workspace's quota while their link lasts, and deleted once it has expired."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from toolkiln.storage.moments import utc as _utc
from toolkiln.storage.tables import files


class SqlFiles:
    def __init__(self, conn: Connection) -> None:
        self._c = conn

    def add(self, record: dict[str, Any]) -> None:
        self._c.execute(files.insert().values(**record))

    def get(self, file_id: str) -> dict[str, Any] | None:
        r = self._c.execute(files.select().where(files.c.id == file_id)).mappings().first()
        if r is None:
            return None
        row = dict(r)
        row["expires_at"] = _utc(row["expires_at"])
        row["created_at"] = _utc(row["created_at"])
        return row

    def held(self, workspace_id: str, now: datetime) -> tuple[int, int]:
        """The files of the workspace whose link has not expired, and their bytes (by the
        (workspace, expiry) index)."""
        q = sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(files.c.size), 0)).where(
            files.c.workspace_id == workspace_id, files.c.expires_at > now
        )
        count, size = self._c.execute(q).one()
        return int(count), int(size)

    def prune(self, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` files whose link expired before ``before`` (by the expiry
        index); how many."""
        oldest = (
            sa.select(files.c.id).where(files.c.expires_at <= before).limit(limit).scalar_subquery()
        )
        done = self._c.execute(files.delete().where(files.c.id.in_(oldest)))
        return int(done.rowcount or 0)
